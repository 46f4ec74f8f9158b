"""`pigeon inject` whose node goes away mid-request: the node stores each recipient's message as
it goes, so some may be in its spool, to be delivered. That is not "nothing was accepted, run it
again later" (75, which sends those twice) but its own exit status, 76, with where to find out
which were taken."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.test_cli import pigeon_cli
from tests.support.ports import free_port
from tests.support.process import PigeonProcess

RECIPIENTS = 1000
SENDER = "me@example.org"
# Each recipient is a few milliseconds: the request lasts seconds, whatever the machine, and the
# messages of the first ones are stored meanwhile.
SLOW_POLICY = "import asyncio\n\nasync def on_rcpt_to(rcpt):\n    await asyncio.sleep(0.005)\n"


def _slow_node(root: Path, workers: int) -> PigeonProcess:
    root.mkdir(parents=True)
    (root / "slowrcpt.py").write_text(SLOW_POLICY)
    return PigeonProcess(root, node={"workers": workers}, policy={"module": "slowrcpt"})


def _stored(pigeon: PigeonProcess) -> dict[int, int]:
    """Messages in each spool shard, by shard."""
    counts = {}
    for db in sorted(pigeon.spool_path.glob("shard-*/spool.db")):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            (count,) = conn.execute("SELECT count(*) FROM message").fetchone()
            counts[int(db.parent.name.removeprefix("shard-"))] = count
        finally:
            conn.close()
    return counts


def _inject_many(pigeon: PigeonProcess) -> subprocess.Popen[str]:
    recipients = [arg for index in range(RECIPIENTS) for arg in ("--to", f"x{index}@example.net")]
    command = [sys.executable, "-m", "pigeon", "inject", "-c", str(pigeon.config_path), "--from", SENDER,
               *recipients, "--text", "hi"]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _first_stored(pigeon: PigeonProcess, cli: subprocess.Popen[str]) -> int:
    """The shard in which the request's first message is stored, once it is."""
    deadline = time.monotonic() + 30
    while not any((counts := _stored(pigeon)).values()):
        assert cli.poll() is None, cli.communicate()
        assert time.monotonic() < deadline, "no message stored in 30s"
        time.sleep(0.01)
    return next(shard for shard, count in counts.items() if count)


def _assert_told_some_may_be_taken(cli: subprocess.Popen[str]) -> str:
    out, err = cli.communicate(timeout=60)
    assert cli.returncode == 76, (cli.returncode, out, err)
    assert "cannot reach" not in err and "Traceback" not in err, err
    assert "some recipients may have been accepted" in err
    assert "running this again would send those twice" in err
    assert "--type Reception | jq -c" in err
    return err


def test_a_node_killed_mid_injection_exits_76_and_its_log_names_what_it_took(tmp_path: Path) -> None:
    with _slow_node(tmp_path / "node", workers=1) as pigeon:
        started = time.time()
        cli = _inject_many(pigeon)
        _first_stored(pigeon, cli)
        pigeon.kill()
        err = _assert_told_some_may_be_taken(cli)
        assert f"pigeon: the connection to http://127.0.0.1:{pigeon.http_port} ended before the node answered" in err
        stored = {message["id"]: message["recipients"] for message in pigeon.spool_messages()}
        assert 0 < len(stored) < RECIPIENTS
        # What it says to look for, once the node runs again, is what it took: no more, no less.
        found = re.search(r"\.timestamp >= (\d+)", err)
        assert found is not None and int(found.group(1)) >= started - 2, err  # this request's, not older ones'
        pigeon.start()
        deadline = time.monotonic() + 10
        while True:
            said = {
                record["id"]: record["recipients"]
                for record in pigeon.records("Reception")
                if record["protocol"] == "HTTP"
                and record["sender"] == SENDER
                and record["timestamp"] >= int(found.group(1))
            }
            if said == stored or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert said == stored


def test_a_worker_killed_mid_injection_exits_76_with_the_supervisors_word(tmp_path: Path) -> None:
    with _slow_node(tmp_path / "node", workers=2) as pigeon:
        cli = _inject_many(pigeon)
        shard = _first_stored(pigeon, cli)
        os.kill(pigeon.shard_owner(shard), signal.SIGKILL)
        err = _assert_told_some_may_be_taken(cli)
        assert f"pigeon: 502: worker {shard} failed during the request" in err
        assert 0 < sum(_stored(pigeon).values()) < RECIPIENTS


@contextmanager
def hanging_up() -> Iterator[str]:
    """A stand-in node on loopback that reads each request whole, then closes without answering."""
    listener = socket.create_server(("127.0.0.1", free_port()))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += connection.recv(65536)
                found = re.search(rb"Content-Length: (\d+)", data, re.I)
                while len(data.partition(b"\r\n\r\n")[2]) < (int(found.group(1)) if found else 0):
                    data += connection.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # (wakes the accept: closing alone does not)
        listener.close()
        thread.join(5)


@pytest.mark.parametrize("json", [False, True])
def test_a_request_left_unanswered_is_not_taken_for_a_node_never_reached(json: bool) -> None:
    with hanging_up() as url:
        result = pigeon_cli("inject", "--url", url, "--token", "t" * 24, "--from", SENDER, "--to", "a@example.net",
                            "--text", "hi", *(["--json"] if json else []))  # fmt: skip
    assert result.returncode == 76, result.stderr
    assert f"pigeon: the connection to {url} ended before the node answered" in result.stderr
    assert "cannot reach" not in result.stderr and "Traceback" not in result.stderr
