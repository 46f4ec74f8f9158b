"""kill -9 under load: every message a client was told 250 for survives, exactly once."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.tools import SMTP_SOURCE, require

QUEUED = re.compile(r"<<< 250 (?:2\.0\.0 )?Ok: queued as ([0-9a-f]{16})")


def _acknowledged(transcript: Path) -> list[str]:
    return QUEUED.findall(transcript.read_text(errors="replace"))


# Its waits add up to more than the default per-test timeout on a slow machine.
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("sent", "kill_after", "size"),
    # The kill comes with each shard past its first WAL checkpoint (about 700 of these 5 KiB
    # messages) and 20 sessions mid-transaction, most of the load still to come; -m slow
    # sends the full 20,000. 50 KiB bodies are appended to segments (small ones, so that
    # several are full and some dropped or compacted before the kill).
    [
        (5000, 2000, 5120),
        (1500, 600, 51200),
        pytest.param(20_000, 4000, 5120, marks=pytest.mark.slow),
    ],
)
def test_kill_9_under_load_loses_nothing_acknowledged(tmp_path: Path, sent: int, kill_after: int, size: int) -> None:
    root = tmp_path / "node"
    transcript = tmp_path / "smtp-source.log"
    config = {"node": {"workers": 2}, "log": {"level": "info"}, "spool": {"segment_size": "2MiB"}}
    pigeon = PigeonProcess(root, **config).start()
    with open(transcript, "wb") as out:
        source = subprocess.Popen(
            [
                require(SMTP_SOURCE),
                "-v",
                "-s",
                "20",
                "-l",
                str(size),
                "-m",
                str(sent),
                "-f",
                "a@src.test",
                "-t",
                "r@sink.test",
                f"127.0.0.1:{pigeon.smtp_port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while len(_acknowledged(transcript)) < kill_after and time.monotonic() < deadline:
            assert source.poll() is None, "smtp-source finished before the kill: raise -m"
            time.sleep(0.2)
        pigeon.kill()  # SIGKILL to the supervisor and both workers at once
        killed_at = len(_acknowledged(transcript))
    finally:
        try:
            source.wait(30)
        except subprocess.TimeoutExpired:
            source.kill()
            source.wait()

    acknowledged = _acknowledged(transcript)
    assert killed_at >= kill_after
    assert len(acknowledged) == len(set(acknowledged))

    pigeon = PigeonProcess(root, **config).start()
    try:
        pigeon.wait_stderr(" 0 quarantined", count=2)  # both shards checked clean after the start
        stored = pigeon.spool_messages()
        assert pigeon.metric("pigeon_spool_quarantined_total") == 0
    finally:
        pigeon.stop()

    stored_ids = [m["id"] for m in stored]
    missing = set(acknowledged) - set(stored_ids)
    assert not missing, f"{len(missing)} acknowledged messages lost"
    message_ids = [m["data"].split(b"Message-Id: ", 1)[1].split(b"\r\n", 1)[0] for m in stored]
    assert len(message_ids) == len(set(message_ids)), "a message was stored twice"
    # Committed but not yet answered when the process died: at most one per open session.
    assert len(stored) - len(acknowledged) <= 20
