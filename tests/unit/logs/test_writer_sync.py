"""`LogWriter.sync()`: what it returns is durable. A failing log disk keeps the records in memory
(bounded) and says so; a partial write, a failed write, a dropped record or a failed fsync never
counts as durable; a rotated segment is closed only after an fsync covered it."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from pigeon.logs import writer as writer_module
from pigeon.logs.reader import read_lines
from pigeon.logs.records import Quarantine
from pigeon.logs.writer import LogWriteError, LogWriter


def line(n: int) -> bytes:
    return msgspec.json.encode(Quarantine(timestamp=1_700_000_000.0 + n, id=f"{n:016x}", reason=f"reason {n}"))


def numbers(directory: Path) -> list[int]:
    return [int(msgspec.json.decode(raw)["id"], 16) for raw in read_lines(directory)]


class Disk:
    """Stands in for `os.write` and `os.fsync` of the writer: can fail, cut writes short, and
    remembers what each fsync covered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.write_limit: int | None = None  # bytes the next write may take before the disk fills
        self.fsync_fails = False
        self.fsynced: list[tuple[int, bytes]] = []  # (fd, the file's content when fsynced)
        self._write: Callable[[int, bytes | memoryview], int] = os.write
        self._fsync: Callable[[int], None] = os.fsync
        monkeypatch.setattr(os, "write", self.write)  # the writer's os is this one
        monkeypatch.setattr(os, "fsync", self.fsync)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.write_limit is not None:
            take, self.write_limit = self.write_limit, None
            self.full = True
            return self._write(fd, data[:take]) if take else 0
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.fsync_fails:
            raise OSError(errno.EIO, "Input/output error")
        self._fsync(fd)
        self.fsynced.append((fd, Path(f"/proc/self/fd/{fd}").read_bytes()))


def cannot_truncate(fd: int, length: int) -> None:
    """Stands in for `os.ftruncate` where a log segment cannot be cut back (an I/O error)."""
    assert os.readlink(f"/proc/self/fd/{fd}").endswith(".jsonl")
    raise OSError(errno.EIO, "Input/output error")


def plain_segments(directory: Path) -> list[Path]:
    return list(directory.glob("*.jsonl"))


def opened(directory: Path, **options: object) -> LogWriter:
    log = LogWriter(directory, **options)  # type: ignore[arg-type]
    log.open(asyncio.get_running_loop())
    return log


async def test_sync_returns_once_every_record_written_before_it_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    log = opened(tmp_path)
    tickets = [log.write_raw(line(n)) for n in range(3)]
    assert [log.settled(t) for t in tickets] == [None, None, None]
    segment = log.current_segment
    assert segment is not None

    await log.sync()

    assert len(disk.fsynced) == 1  # one fsync for the three, after they were written
    assert disk.fsynced[0][1] == b"".join(line(n) + b"\n" for n in range(3))
    assert [log.settled(t) for t in tickets] == [True, True, True]
    await log.sync()  # nothing new: no second fsync
    assert len(disk.fsynced) == 1
    log.close()


async def test_write_error_keeps_records_in_memory_and_sync_raises_until_the_disk_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    log = opened(tmp_path)
    disk.full = True
    tickets = [log.write_raw(line(n)) for n in range(5)]

    with pytest.raises(LogWriteError) as raised:
        await log.sync()
    assert isinstance(raised.value, OSError)
    assert "No space left on device" in str(raised.value)
    assert log.error is not None and "No space left on device" in log.error
    assert log.pending == 5
    assert log.write_errors >= 1
    assert [log.settled(t) for t in tickets] == [None] * 5

    disk.full = False
    await log.sync()
    assert log.error is None
    assert log.pending == 0
    assert [log.settled(t) for t in tickets] == [True] * 5
    log.close()
    assert numbers(tmp_path) == list(range(5))  # each once, in order


async def test_a_write_cut_short_that_cannot_be_taken_back_counts_only_the_whole_lines_and_finishes_the_cut_one_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    monkeypatch.setattr(os, "ftruncate", cannot_truncate)
    log = opened(tmp_path)
    first, second, third = line(1), line(2), line(3)
    disk.write_limit = len(first) + 1 + 7  # the first record whole, 7 bytes of the second
    tickets = [log.write_raw(first), log.write_raw(second), log.write_raw(third)]

    with pytest.raises(LogWriteError):
        await log.sync()
    assert [log.settled(t) for t in tickets] == [True, None, None]
    assert log.pending == 2
    log.rotate()  # must not move on while the second record is half in this segment
    assert log.current_segment is not None
    assert len(plain_segments(tmp_path)) == 1

    disk.full = False
    await log.sync()
    assert [log.settled(t) for t in tickets] == [True, True, True]
    log.close()
    assert numbers(tmp_path) == [1, 2, 3]


async def test_a_write_cut_short_by_a_full_disk_leaves_only_whole_lines_in_the_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    log = opened(tmp_path)
    first, second = line(1), line(2)
    disk.write_limit = len(first) + 1 + 7  # the first record whole, 7 bytes of the second
    tickets = [log.write_raw(first), log.write_raw(second)]
    log.flush()

    segment = log.current_segment
    assert segment is not None
    assert segment.read_bytes() == first + b"\n"  # the 7 bytes are taken back
    left = log.abandon()  # a stop with the disk still full: the record is handed back whole
    assert left == [(tickets[1], second)]
    log.close()
    assert numbers(tmp_path) == [1]


async def test_a_failed_fsync_never_counts_the_records_it_covered_even_after_a_later_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    log = opened(tmp_path)
    before = [log.write_raw(line(n)) for n in range(3)]
    disk.fsync_fails = True
    with pytest.raises(LogWriteError, match="fsync"):
        await log.sync()
    assert log.error is not None and "Input/output error" in log.error

    disk.fsync_fails = False
    after = [log.write_raw(line(n)) for n in range(3, 5)]
    await log.sync()  # these are durable; the earlier ones stay unconfirmed
    assert [log.settled(t) for t in before] == [False] * 3
    assert [log.settled(t) for t in after] == [True] * 2
    assert log.error is None
    log.close()
    assert numbers(tmp_path) == list(range(5))  # written once each: never written again


async def test_sync_raises_for_records_lost_before_it_was_called_even_if_another_sync_covered_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    log = opened(tmp_path)
    mine = log.write_raw(line(1))
    disk.fsync_fails = True
    other = asyncio.ensure_future(log.sync())  # someone else's sync fails on my record
    await asyncio.sleep(0)
    disk.fsync_fails = False
    with pytest.raises(LogWriteError):
        await log.sync()
    with pytest.raises(LogWriteError):
        await other
    assert log.settled(mine) is False
    log.close()


async def test_past_the_memory_bound_records_are_dropped_but_the_one_half_written_that_cannot_be_taken_back_is_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    monkeypatch.setattr(os, "ftruncate", cannot_truncate)
    log = opened(tmp_path, max_buffer=2000)
    told: list[tuple[int, bytes]] = []
    log.on_drop = told.extend
    first = log.write_raw(line(0))
    disk.write_limit = 10  # ten bytes of record 0 reach the file, then the disk is full
    log.flush()
    tickets = [first] + [log.write_raw(line(n)) for n in range(1, 40)]
    await asyncio.sleep(0)  # dropped at the end of the loop turn, not inside a write()

    assert log.dropped > 0
    dropped = [t for t, _ in told]
    assert dropped == tickets[1 : 1 + len(dropped)]
    assert [raw for _, raw in told] == [line(n) for n in range(1, 1 + len(dropped))]
    assert all(log.settled(t) is False for t in dropped)
    with pytest.raises(LogWriteError):
        await log.sync()

    disk.full = False
    with pytest.raises(LogWriteError, match="not made durable"):
        await log.sync()  # the dropped records were written before this call
    assert log.error is None
    later = log.write_raw(line(40))
    await log.sync()  # later records are not blamed for them
    assert log.settled(later)
    log.close()
    kept = [n for n in range(40) if tickets[n] not in dropped] + [40]
    assert numbers(tmp_path) == kept
    assert kept[0] == 0  # the half-written record was completed, not cut into garbage


async def test_a_rotated_segment_is_fsynced_before_it_is_closed_and_compressed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    disk = Disk(monkeypatch)
    fsync = disk.fsync

    def recording_fsync(fd: int) -> None:
        fsync(fd)
        events.append(f"fsync {fd}")

    compress = writer_module.compress_segment

    def recording_compress(path: Path) -> None:
        events.append(f"compress {path.name}")
        compress(path)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(writer_module, "compress_segment", recording_compress)
    log = opened(tmp_path, max_segment_size=200)
    first = log.current_segment
    assert first is not None
    tickets = [log.write_raw(line(n)) for n in range(3)]
    log.flush()  # past 200 bytes: rotates
    assert log.current_segment != first
    assert not any(e.startswith("compress") for e in events)  # not before its fsync

    await log.sync()
    for _ in range(50):
        if any(e.startswith("compress") for e in events):
            break
        await asyncio.sleep(0.01)
    fsyncs = [i for i, e in enumerate(events) if e.startswith("fsync")]
    compressed = events.index(f"compress {first.name}")
    assert fsyncs and fsyncs[0] < compressed
    assert all(log.settled(t) for t in tickets)
    log.close()
    assert numbers(tmp_path) == [0, 1, 2]


async def test_close_reports_records_it_could_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk = Disk(monkeypatch)
    log = opened(tmp_path)
    disk.full = True
    for n in range(7):
        log.write_raw(line(n))
    log.close()
    assert log.dropped == 7
    assert "7 records could not be written" in caplog.text


async def test_a_segment_is_rotated_max_segment_age_after_its_first_record_whenever_it_was_started(
    tmp_path: Path,
) -> None:
    # Found from outside: the age was looked at every min(age, 60 s) from the writer's start,
    # so a segment started in between (by size) was rotated up to twice its age late.
    loop = asyncio.get_running_loop()
    log = opened(tmp_path, max_segment_size=200, max_segment_age=1.0)
    await asyncio.sleep(0.5)
    for n in range(3):
        log.write_raw(line(n))  # past 200 bytes: a new segment starts now, half an age in
    log.flush()
    started = log.current_segment
    log.write_raw(line(3))
    log.flush()
    begun = loop.time()
    for _ in range(300):
        if log.current_segment != started:
            break
        await asyncio.sleep(0.01)
    assert 0.95 <= loop.time() - begun <= 1.25
    assert started is not None
    gzipped = started.with_name(started.name + ".gz")
    for _ in range(200):  # no record comes: it is closed all the same
        if gzipped.exists() and not started.exists():
            break
        await asyncio.sleep(0.01)
    assert gzipped.exists() and not started.exists()
    log.close()
    assert numbers(tmp_path) == [0, 1, 2, 3]
