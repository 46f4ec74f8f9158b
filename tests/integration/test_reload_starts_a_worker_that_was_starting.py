"""A SIGHUP that comes while a worker is starting (after it has read a file that does not load,
before it has given up on it) counts for it as for a worker waiting to be started again: the
operator may have fixed the file, so a worker that then fails its start is started again at
once, on what the SIGHUP read, not after its growing wait (1, 2, 4 ... 30 s)."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess

GOOD = """
    from pigeon.policy import Changes
    def on_message(message):
        return Changes(add_headers=[("X-Policy", "{version}")])
"""
# Broken: it raises as it is imported. While `slow` exists, only after it has said it is being
# imported (`entered`) and slept: the window in which the operator fixes the file and SIGHUPs.
BROKEN = """
    import os, time
    from pathlib import Path
    if Path({slow!r}).exists():
        Path({entered!r}).write_text(str(os.getpid()))
        time.sleep({pause})
    raise RuntimeError("broken on purpose")
"""


def _hangup(pigeon: PigeonProcess) -> None:
    assert pigeon.process is not None
    pigeon.process.send_signal(signal.SIGHUP)


@pytest.mark.timeout(120)
def test_a_sighup_while_a_worker_starts_on_a_broken_file_starts_it_again_at_once_when_that_start_fails(
    tmp_path: Path,
) -> None:
    module = tmp_path / "policy.py"
    slow, entered = tmp_path / "slow", tmp_path / "entered"
    module.write_text(textwrap.dedent(GOOD.format(version="v1")))
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, policy={"module": str(module)}) as pigeon:
        module.write_text(textwrap.dedent(BROKEN.format(slow=str(slow), entered=str(entered), pause=4)))
        _hangup(pigeon)
        pigeon.wait_stderr("reload: the policy module stays as it was", count=2)

        slow.touch()
        os.kill(pigeon.shard_owner(0), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not entered.exists():  # worker 0 is starting again, and has read the broken module
            assert time.monotonic() < deadline, pigeon.stderr()
            time.sleep(0.02)

        module.write_text(textwrap.dedent(GOOD.format(version="v2")))
        slow.unlink()
        _hangup(pigeon)
        pigeon.wait_stderr("to 1 still starting once they are")
        # The start under way fails anyway (it had read the module before the fix) ...
        said = pigeon.wait_stderr("worker 0 exited with status 2", timeout=20)
        failed = next(line for line in said.splitlines() if "worker 0 exited with status 2" in line)
        # ... and is followed by the next at once: the SIGHUP came after that start began.
        assert "restarting now" in failed and "restarting in" not in failed, failed
        deadline = time.monotonic() + 30
        while True:
            status, body = pigeon.http_get("/healthz")
            health = json.loads(body)
            if status == 200 and health["workers"][0]["status"] == "ok":
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.05)
        assert pigeon.stderr().count("worker 0 exited with status 2") == 1, pigeon.stderr()
