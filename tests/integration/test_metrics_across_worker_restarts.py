"""On a node of several workers, /metrics counters never go back: not when a worker is killed
and started again, nor while one does not answer (its counters are as it last said them, and
`pigeon_workers_answered` says how many did)."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until
from tests.support.tools import smtp_source


def scrape(pigeon: PigeonProcess) -> dict[str, float]:
    """The unlabelled samples of /metrics (waiting as long as the node takes: a stopped worker
    is waited for a few seconds)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{pigeon.http_port}/metrics", timeout=30) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        name: float(value)
        for line in text.splitlines()
        if line and not line.startswith("#") and "{" not in line
        for name, value in [line.split()]
    }


def send(pigeon: PigeonProcess, messages: int) -> None:
    result = smtp_source(
        pigeon.smtp_port, "-s", "10", "-l", "1000", "-m", str(messages), "-f", "a@src.test", "-t", "r@x.test"
    )
    assert result.returncode == 0, result.stderr


def worker_pid(pigeon: PigeonProcess, index: int) -> int:
    return pigeon.shard_owner(index)


def restarted(pigeon: PigeonProcess, index: int, times: int) -> bool:
    status, body = pigeon.http_get("/healthz")
    return status == 200 and json.loads(body)["workers"][index]["restarts"] == times


def test_counters_do_not_go_back_when_a_worker_is_killed_or_stops_answering(tmp_path: Path) -> None:
    # Found from outside: kill -9 of a worker took pigeon_messages_received_total from 214 to
    # 106 for good, and a stopped worker's numbers were left out of the sum.
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        # Until both workers took some: which one accepts a connection is the kernel's choice,
        # and on a loaded machine one of them took all of the first hundred.
        sent = 0
        while sent < 500:
            send(pigeon, 100)
            sent += 100
            if {int(m["id"], 16) & 63 for m in pigeon.spool_messages()} == {0, 1}:
                break
        assert {int(m["id"], 16) & 63 for m in pigeon.spool_messages()} == {0, 1}  # both took some
        before = scrape(pigeon)
        assert before["pigeon_messages_received_total"] == sent

        os.kill(worker_pid(pigeon, 1), signal.SIGKILL)
        wait_until(lambda: restarted(pigeon, 1, 1))
        after = scrape(pigeon)
        assert after["pigeon_messages_received_total"] == sent
        assert after["pigeon_spool_commit_batch_size_count"] >= before["pigeon_spool_commit_batch_size_count"]
        assert after["pigeon_workers"] == after["pigeon_workers_answered"] == 2

        send(pigeon, 20)
        assert scrape(pigeon)["pigeon_messages_received_total"] == sent + 20

        stopped = worker_pid(pigeon, 0)
        os.kill(stopped, signal.SIGSTOP)
        try:
            hung = scrape(pigeon)
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert hung["pigeon_messages_received_total"] == sent + 20
        assert hung["pigeon_workers_answered"] == 1
        assert scrape(pigeon)["pigeon_workers_answered"] == 2
