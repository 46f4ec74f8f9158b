"""An admin write whose node goes away once it has the request (a node of one worker, or the
supervisor of several, killed mid-request) may have been carried out in part: 11,000 of 40,000
messages bounced, a standing bounce or a suspension's end kept. The command says so, as it does
of a worker that went away mid-request (exit 75, "it may have carried out part of the
request"), never "cannot reach", which says nothing was done."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_cli import pigeon_cli
from tests.integration.test_inject_unanswered import hanging_up
from tests.integration.test_worker_timeout import _fill
from tests.support.process import PigeonProcess

QUEUED = 20_000  # per shard: a bounce of them takes a second or more, time to kill the node mid-way
MAY_HAVE = "it may have carried out part of the request (see `pigeon queue operations`"


def _stored(pigeon: PigeonProcess) -> int:
    total = 0
    for db in pigeon.spool_path.glob("shard-*/spool.db"):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            (count,) = conn.execute("SELECT count(*) FROM message").fetchone()
        finally:
            conn.close()
        total += count
    return total


def _wait_until_bouncing(pigeon: PigeonProcess, cli: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert cli.poll() is None, cli.communicate()
        status, answer = pigeon.http_call("GET", "/api/v1/admin/operations", token=pigeon.local_token)
        assert status == 200, answer
        if any(row["running"] and row["acted_on"] for row in answer["operations"]):
            return
        assert time.monotonic() < deadline, answer
        time.sleep(0.02)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-worker-node", "supervisor"])
def test_a_node_killed_mid_bounce_is_said_to_have_maybe_acted_exit_75(tmp_path: Path, workers: int) -> None:
    root = tmp_path / "node"
    _fill(root / "spool", shards=workers, count=QUEUED)
    with PigeonProcess(root, node={"workers": workers}, delivery={"enabled": True}) as pigeon:
        command = [sys.executable, "-m", "pigeon", "bounce", "-c", str(pigeon.config_path), "--domain", "big.example"]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as cli:
            _wait_until_bouncing(pigeon, cli)
            assert pigeon.process is not None
            os.kill(pigeon.process.pid, signal.SIGKILL)  # the node's one process, or the supervisor only
            out, err = cli.communicate(timeout=60)
        pigeon.kill()
        assert cli.returncode == 75, (out, err)
        assert f"pigeon: the connection to http://127.0.0.1:{pigeon.http_port} ended before the node answered" in err
        assert MAY_HAVE in err and "`pigeon logs --type AdminBounce`" in err, err
        assert "cannot reach" not in err and "Traceback" not in err
        assert 0 < _stored(pigeon) < workers * QUEUED  # it had bounced some, and not all


@pytest.mark.parametrize(
    ("command", "shown_by"),
    [
        (("bounce", "--tenant", "k1", "--duration", "1h"), "`pigeon bounce --list`"),
        (("suspend", "--tenant", "k1"), "`pigeon suspend --list`"),
        (("resume", "16bf153e5139"), "`pigeon suspend --list`"),
        (("retry", "--domain", "example.net"), "the node's log"),
        (("shaping", "end", "16bf153e5139"), "`pigeon shaping status`"),
    ],
)
def test_a_write_left_unanswered_may_have_been_carried_out_exit_75(command: tuple[str, ...], shown_by: str) -> None:
    with hanging_up() as url:
        result = pigeon_cli(*command, "--url", url, "--token", "t" * 24)
    assert result.returncode == 75, result.stderr
    assert f"pigeon: the connection to {url} ended before the node answered" in result.stderr
    assert MAY_HAVE in result.stderr and shown_by in result.stderr
    assert "cannot reach" not in result.stderr and "Traceback" not in result.stderr


def test_a_read_left_unanswered_says_the_node_went_away_not_that_it_was_not_reached() -> None:
    with hanging_up() as url:
        result = pigeon_cli("queue", "summary", "--url", url, "--token", "t" * 24)
    assert result.returncode == 3, result.stderr
    assert f"pigeon: the connection to {url} ended before the node answered" in result.stderr
    assert "cannot reach" not in result.stderr and "may have carried out" not in result.stderr
