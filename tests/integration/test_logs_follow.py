"""`pigeon logs --follow` keeps up with a writer that rotates and compresses segments every few
records: every record once, in the order written, and it does not exit."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from pigeon.logs.records import Quarantine
from pigeon.logs.writer import LogWriter

RECORDS = 3000


def test_follow_prints_every_record_once_in_order_while_segments_rotate_and_are_compressed(tmp_path: Path) -> None:
    # Found from outside: with [log] max_segment_size = "8KiB" and steady traffic, 3 of 8
    # `pigeon logs -f` runs exited 1 (FileNotFoundError): the segment it had listed was gzipped
    # before it opened it. Two rotations between two looks also printed a later segment first.
    follower = subprocess.Popen(
        [sys.executable, "-m", "pigeon", "logs", "--follow", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    printed: list[bytes] = []
    reading = threading.Thread(target=lambda: printed.extend(follower.stdout or ()), name="read-follow")
    reading.start()
    try:
        log = LogWriter(tmp_path, max_segment_size=400, compress=True)  # a segment per 4 records
        log.open(None)
        for n in range(RECORDS):
            log.write(Quarantine(timestamp=1_700_000_000.0 + n, id=f"{n:016x}", reason="segment test"))
            if n % 20 == 0:
                time.sleep(0.001)  # steady traffic, not one burst
        log.close()
        deadline = time.monotonic() + 60
        while len(printed) < RECORDS and follower.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert follower.poll() is None, (follower.stderr.read() if follower.stderr else b"").decode()[-2000:]
    finally:
        follower.terminate()
        follower.wait(10)
        reading.join(10)
    assert len(list(tmp_path.glob("*.jsonl.gz"))) > 500
    assert [int(json.loads(line)["id"], 16) for line in printed] == list(range(RECORDS))
