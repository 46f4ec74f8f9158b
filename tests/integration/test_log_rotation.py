"""`[log] max_segment_size` and `max_segment_age` as a node keeps them: a segment is closed and
gzipped soon after its first record is `max_segment_age` old, even on a node that has gone idle
(and an idle node makes no stream of empty segments); no closed segment is over
`max_segment_size` unless one record alone is; nothing is lost or doubled at a rotation."""

from __future__ import annotations

import gzip
import itertools
import json
import time
from pathlib import Path
from typing import Any

from tests.integration.test_log_durability import send
from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until

BODY = b"Subject: log rotation\r\n\r\n" + b"hello\r\n" * 20


def _gzipped(log: Path) -> list[dict[str, Any]]:
    """The records of the closed (gzipped) segments, oldest first."""
    return [
        json.loads(line)
        for path in sorted(log.glob("*.jsonl.gz"))
        for line in gzip.decompress(path.read_bytes()).splitlines()
    ]


def test_an_idle_nodes_segment_is_gzipped_soon_after_max_segment_age_and_no_empty_segments_follow(
    tmp_path: Path,
) -> None:
    # Found from outside: with max_segment_age = "1m" a segment was rotated ~112 s after it
    # opened, and on a node that then went idle the rotated segment stayed open and plain
    # until the node stopped (a `find -name '*.jsonl.gz'` prune and a shipper never saw it).
    log = tmp_path / "node" / "log"
    with PigeonProcess(tmp_path / "node", log={"max_segment_age": "2s"}) as pigeon:
        send(pigeon, messages=3, rejections=2)
        logged = wait_until(lambda: (found := pigeon.records()) and len(found) == 5 and found)
        first = min(r["timestamp"] for r in logged)

        wait_until(lambda: len(_gzipped(log)) == 5, timeout=10)
        closed_after = time.time() - first
        assert closed_after < 2 + 1.5, f"the segment was gzipped {closed_after:.1f}s after its first record"
        assert sorted(json.dumps(r) for r in _gzipped(log)) == sorted(json.dumps(r) for r in logged)

        time.sleep(5)  # idle for over two ages: the empty segment is kept, not rotated
        assert len(list(log.glob("*.jsonl.gz"))) == 1
        plain = list(log.glob("*.jsonl"))
        assert len(plain) == 1 and plain[0].stat().st_size == 0

        send(pigeon, messages=1)  # the node goes on in that segment, which closes in turn
        wait_until(lambda: len(_gzipped(log)) == 6, timeout=10)
    assert len(list(log.glob("*.jsonl.gz"))) == 2
    assert not list(log.glob("*.jsonl"))  # the empty one started at the rotation is removed at stop


def test_no_closed_segment_is_over_max_segment_size_and_each_is_full_to_within_a_record(tmp_path: Path) -> None:
    # Found from outside: with max_segment_size = "64KiB" every closed segment was over it, the
    # largest 285,413 bytes: the size was looked at only after a write of up to 1 MiB.
    log = tmp_path / "node" / "log"
    with PigeonProcess(tmp_path / "node", log={"max_segment_size": "4KiB"}) as pigeon:
        send(pigeon, messages=40)
        for _ in range(40):
            send(pigeon, messages=0, rejections=5)  # (more in one session and it is cut off)
        pigeon.wait_records("Rejection", 200)
    segments = [gzip.decompress(path.read_bytes()) for path in sorted(log.glob("*.jsonl.gz"))]
    assert not list(log.glob("*.jsonl"))
    assert len(segments) > 10
    sizes = [len(segment) for segment in segments]
    assert max(sizes) <= 4096, sizes
    for segment, following in itertools.pairwise(segments):
        # Rotated only when the next record would not fit.
        assert len(segment) + len(following.split(b"\n", 1)[0]) + 1 > 4096
    lines = [line for segment in segments for line in segment.splitlines()]
    assert len(lines) == len(set(lines)) == 240  # none lost, none twice
    kinds = [json.loads(line)["type"] for line in lines]
    assert kinds.count("Reception") == 40 and kinds.count("Rejection") == 200
