"""A worker that dies is started again after a wait that doubles only while it keeps dying
soon after its start (a crash loop): one that had run fine for a while is started again after
the first, shortest wait, however often it was restarted before, so its shard's mail does not
wait out a back-off earned long ago."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.support.process import PigeonProcess

KILLED = "worker 0 was killed by SIGKILL (it said no more: see its messages above); restarting in"


def _kill_worker_0(pigeon: PigeonProcess) -> None:
    os.kill(pigeon.shard_owner(0), signal.SIGKILL)


def _wait_serving(pigeon: PigeonProcess, restarts: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        status, body = pigeon.http_get("/healthz")
        worker = json.loads(body)["workers"][0]
        if status == 200 and worker["restarts"] == restarts and worker["status"] == "ok":
            return
        assert time.monotonic() < deadline, body
        time.sleep(0.1)


def test_a_worker_that_ran_fine_is_restarted_after_the_shortest_wait_and_a_crash_loop_waits_longer(
    tmp_path: Path,
) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        _kill_worker_0(pigeon)
        assert f"{KILLED} 1s" in pigeon.wait_stderr(KILLED)
        _wait_serving(pigeon, restarts=1)
        time.sleep(6.5)  # it runs fine for a while: past the supervisor's 5 s
        _kill_worker_0(pigeon)
        said = pigeon.wait_stderr(KILLED, count=2)
        assert said.count(f"{KILLED} 1s") == 2, said
        _wait_serving(pigeon, restarts=2)
        _kill_worker_0(pigeon)  # at once, again: a crash loop, whose wait grows
        said = pigeon.wait_stderr(KILLED, count=3)
        assert f"{KILLED} 2s" in said, said
