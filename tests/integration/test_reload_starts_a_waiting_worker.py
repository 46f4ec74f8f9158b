"""A reload the node refused (a policy module that does not load) does not make a worker's
restart worse than it must be: a worker killed meanwhile cannot start on the broken file, and
`/healthz` says why; the SIGHUP after the file is fixed starts it at once, not when its growing
wait (1, 2, 4 ... 30 s) runs out."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import textwrap
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess

POLICY = """
    from pigeon.policy import Changes
    def on_message(message):
        return Changes(add_headers=[("X-Policy", "{version}")])
"""


def _write_policy(path: Path, version: str) -> None:
    path.write_text(textwrap.dedent(POLICY.format(version=version)))


def _hangup(pigeon: PigeonProcess) -> None:
    assert pigeon.process is not None
    pigeon.process.send_signal(signal.SIGHUP)


def _healthz(pigeon: PigeonProcess) -> tuple[int, dict[str, Any]]:
    status, body = pigeon.http_get("/healthz")
    return status, json.loads(body)


def _inject(pigeon: PigeonProcess, email: str) -> tuple[int, Any]:
    body = {
        "envelope_sender": "a@example.org",
        "recipients": [{"email": email}],
        "content": "From: a@example.org\r\nSubject: x\r\n\r\nhi\r\n",
    }
    return pigeon.http_post("/api/v1/inject", body, pigeon.local_token)


def _per_shard(spool: Path) -> dict[str, int]:
    counts = {}
    for db in spool.glob("shard-*/spool.db"):
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            counts[db.parent.name] = conn.execute("SELECT count(*) FROM message").fetchone()[0]
    return counts


@pytest.mark.timeout(180)
def test_a_worker_that_cannot_start_on_a_broken_policy_module_starts_at_once_on_the_sighup_after_the_fix(
    tmp_path: Path,
) -> None:
    module = tmp_path / "policy.py"
    _write_policy(module, "v1")
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, policy={"module": str(module)}) as pigeon:
        module.write_text("def on_message(message:\n")  # a syntax error
        _hangup(pigeon)
        pigeon.wait_stderr("reload: the policy module stays as it was", count=2)

        os.kill(pigeon.shard_owner(0), signal.SIGKILL)
        # It cannot start on the file as it is, over and over, each wait longer: 2 s, 4 s,
        # then 8 s after its third failure.
        said = pigeon.wait_stderr("worker 0 exited with status 2", count=3, timeout=60)
        assert "restarting in 8s" in said, said
        status, health = _healthz(pigeon)
        assert status == 503 and health["status"] == "down", health
        down = health["workers"][0]
        assert down["status"] == "down", down
        # What the operator reads there names the module and what is wrong with it.
        assert str(module) in down["error"] and "SyntaxError" in down["error"], down
        # The other worker serves meanwhile (degraded: it runs the module as it was).
        assert health["workers"][1]["status"] == "degraded", health

        _write_policy(module, "v2")
        fixed_at = time.monotonic()
        _hangup(pigeon)
        while True:
            status, health = _healthz(pigeon)
            if status == 200 and health["workers"][0]["status"] == "ok":
                break
            # As long as a start takes (a few seconds on a busy machine), not the 8 s left of its
            # wait on top of it.
            assert time.monotonic() - fixed_at < 6, health
            time.sleep(0.05)
        assert "reload: starting worker 0 again now" in pigeon.stderr()

        # Mail is taken by both workers (the supervisor hands injections round-robin, to a worker
        # once it has seen it answer), each running the fixed module.
        sent = 0
        while min(_per_shard(pigeon.spool_path).values()) == 0:
            assert time.monotonic() - fixed_at < 10, _per_shard(pigeon.spool_path)
            status, answer = _inject(pigeon, f"r{sent}@example.net")
            assert status == 200 and answer["accepted"] == 1, answer
            sent += 1
        stored = pigeon.spool_messages()
        assert [m["envelope"].headers_added for m in stored] == [["X-Policy: v2"]] * sent
        assert set(_per_shard(pigeon.spool_path)) == {"shard-0", "shard-1"}
