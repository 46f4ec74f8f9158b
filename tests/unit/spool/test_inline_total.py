"""`[spool] inline_total`: what bodies being received hold in memory is counted, the body whose
bytes pass the total goes to a file, and every way a reception ends gives its bytes back (a
count that leaked would send every later body to a file)."""

from __future__ import annotations

from pathlib import Path

from pigeon.message import SpoolId, format_id
from pigeon.spool.body import BodyFiles, BodyWriter, Receiving


def writer(path: Path, receiving: Receiving, n: int, files: BodyFiles | None = None) -> BodyWriter:
    return BodyWriter(SpoolId(n), path, 256 * 1024, receiving=receiving, files=files)


def test_bodies_stay_in_memory_until_their_total_passes_the_limit_then_the_next_bytes_go_to_a_file(
    tmp_path: Path,
) -> None:
    receiving = Receiving(100_000)
    first, second = writer(tmp_path, receiving, 1), writer(tmp_path, receiving, 2)
    first.write(b"a" * 60_000)
    second.write(b"b" * 30_000)
    assert receiving.held == 90_000 and list(tmp_path.iterdir()) == []
    second.write(b"b" * 30_000)  # 120,000 in all: this body goes to its file, with all it had
    assert receiving.held == 60_000
    assert (tmp_path / format_id(2)).exists()
    second.write(b"b" * 1000)  # and what comes later goes there too
    body = second.finish()
    body.sync()
    assert body.data is None and body.path is not None
    assert body.path.read_bytes() == b"b" * 61_000
    done = first.finish()
    assert done.data == b"a" * 60_000 and receiving.held == 0


def test_a_discarded_body_a_failed_one_and_a_finished_one_give_their_bytes_back(tmp_path: Path) -> None:
    receiving = Receiving(1 << 20)
    discarded = writer(tmp_path, receiving, 1)
    discarded.write(b"x" * 5000)
    discarded.discard()
    assert receiving.held == 0
    full = BodyFiles(lambda: 0, 1)  # a spool with no room left: the spill is refused
    full.count(tmp_path)
    refused = writer(tmp_path, Receiving(1000), 2, files=full)
    refused.write(b"x" * 5000)
    assert refused._receiving is not None and refused._receiving.held == 0
    finished = writer(tmp_path, receiving, 3)
    finished.write(b"y" * 7000)
    finished.finish()
    finished.discard()  # (a second end counts nothing)
    assert receiving.held == 0
