"""The event log as an operator reads it: one JSON object per line, segments that rotate and
get compressed, and a reader that returns every complete record in order, compressed or not,
including while the log is still being written."""

from __future__ import annotations

import calendar
import gzip
import json
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import msgspec
import pytest

from pigeon.cli.main import main
from pigeon.logs import reader as reader_module
from pigeon.logs import writer as writer_module
from pigeon.logs.reader import follow, merged_lines, read_lines, read_records, segments
from pigeon.logs.records import AnyRecord, Quarantine, Reception, Rejection, Response
from pigeon.logs.writer import LogWriter, compress_segment
from pigeon.smtp.replies import Reply

_SEGMENT_NAME = re.compile(r"(\d{8}-\d{6})-(\d{6})-w(\d+)\.jsonl(\.gz)?")


# --- helpers -----------------------------------------------------------------------------
def quarantine(n: int) -> Quarantine:
    return Quarantine(timestamp=1_700_000_000.0 + n, id=f"{n:016x}", reason=f"reason {n}")


def reception() -> Reception:
    return Reception(
        timestamp=1_700_000_000.5,
        id="0382666f65800040",
        session="s1",
        sender="sender@example.org",
        recipients=["a@example.com", "b@example.com"],
        queue="default@example.com",
        size=1234,
        peer="192.0.2.1:40000",
        helo="client.example.org",
        protocol="ESMTPS",
        response=Response.of(Reply(250, "2.0.0", ("OK id=0382666f65800040",))),
        tls="TLSv1.3 TLS_AES_256_GCM_SHA384",
    )


def rejection() -> Rejection:
    return Rejection(
        timestamp=1_700_000_001.0,
        session="s1",
        peer="192.0.2.1:40000",
        command="RCPT",
        response=Response(550, "No such user", "5.1.1"),
        sender="sender@example.org",
        recipients=["nobody@example.com"],
    )


def gzip_lines(path: Path) -> list[bytes]:
    with gzip.open(path, "rb") as stream:
        return stream.read().splitlines()


def lines_of(*numbers: int) -> list[bytes]:
    """The lines the writer writes for `quarantine(n)` records (node left empty)."""
    return [msgspec.json.encode(quarantine(n)) for n in numbers]


def ids(lines: list[bytes]) -> list[int]:
    return [int(json.loads(line)["id"], 16) for line in lines]


def opened_writer(directory: Path, **options: object) -> LogWriter:
    log = LogWriter(directory, **options)  # type: ignore[arg-type]
    log.open(None)
    return log


class Follower:
    """`follow()` running in a thread until it has yielded `want` lines (or 10 s passed)."""

    def __init__(self, directory: Path, want: int) -> None:
        self.lines: list[bytes] = []
        self._progress: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._want = want
        self._thread = threading.Thread(target=self._run, args=(directory,), name="test-follow")
        self._thread.start()

    def _run(self, directory: Path) -> None:
        for line in follow(directory, poll=0.002, stop_after=10.0):
            self.lines.append(line)
            self._progress.put(len(self.lines))
            if len(self.lines) >= self._want:
                break

    def wait_for(self, count: int) -> None:
        """Block until the follower has yielded `count` lines."""
        while len(self.lines) < count:
            self._progress.get(timeout=5)

    def join(self) -> list[bytes]:
        self._thread.join(10)
        assert not self._thread.is_alive(), f"follow() stopped at {len(self.lines)} of {self._want} lines"
        return self.lines


# --- the format ------------------------------------------------------------------------------
def test_each_record_is_one_json_object_per_line_with_type_first(tmp_path: Path) -> None:
    log = opened_writer(tmp_path, node="mx1.example.org")
    log.write(reception())
    log.write(rejection())
    log.write(quarantine(7))
    assert log.current_segment is not None

    # Without an event loop every record reaches the file at once.
    raw = log.current_segment.read_bytes()
    log.close()

    lines = raw.split(b"\n")
    assert lines[-1] == b""
    objects = [json.loads(line) for line in lines[:-1]]
    assert [next(iter(obj)) for obj in objects] == ["type", "type", "type"]
    assert [obj["type"] for obj in objects] == ["Reception", "Rejection", "Quarantine"]
    assert {obj["node"] for obj in objects} == {"mx1.example.org"}
    assert objects[1]["response"] == {"code": 550, "text": "No such user", "enhanced": "5.1.1"}
    # Absent optional fields are left out, never written as null.
    assert "auth_user" not in objects[0]
    assert "helo" not in objects[1]
    assert all(value is not None for obj in objects for value in obj.values())


def test_records_round_trip_through_read_records(tmp_path: Path) -> None:
    written: list[AnyRecord] = [reception(), rejection(), quarantine(1)]
    log = opened_writer(tmp_path, node="mx1")
    for record in written:
        log.write(record)
    log.close()

    assert read_records(tmp_path) == [msgspec.to_builtins(record) for record in written]
    decoded = [msgspec.json.decode(line, type=AnyRecord) for line in read_lines(tmp_path)]
    assert decoded == written
    assert all(record.node == "mx1" for record in decoded)


def test_empty_segment_is_removed_at_close(tmp_path: Path) -> None:
    log = opened_writer(tmp_path)
    log.rotate()  # nothing written: the segment is kept, not rotated
    log.close()
    assert list(tmp_path.iterdir()) == []
    assert read_records(tmp_path) == []


# --- rotation and compression ----------------------------------------------------------------
def test_size_rotation_compresses_closed_segments_and_keeps_every_record_in_order(tmp_path: Path) -> None:
    log = opened_writer(tmp_path, max_segment_size=300)
    for n in range(40):
        log.write(quarantine(n))
    log.close()

    names = sorted(path.name for path in tmp_path.iterdir())
    assert len(names) > 5
    assert all(name.endswith(".jsonl.gz") for name in names), names
    assert ids(list(read_lines(tmp_path))) == list(range(40))
    first = gzip_lines(tmp_path / names[0])
    assert first
    assert ids(first) == list(range(len(first)))


def test_reader_returns_records_across_compressed_and_plain_segments_in_order(tmp_path: Path) -> None:
    first_run = opened_writer(tmp_path, max_segment_size=300)
    for n in range(15):
        first_run.write(quarantine(n))
    first_run.close()
    second_run = opened_writer(tmp_path, max_segment_size=300, compress=False)
    for n in range(15, 30):
        second_run.write(quarantine(n))
    second_run.close()

    kinds = {path.name.endswith(".gz") for path in segments(tmp_path)}
    assert kinds == {True, False}
    assert ids(list(read_lines(tmp_path))) == list(range(30))


def test_reader_sees_every_record_while_segments_are_being_compressed(tmp_path: Path) -> None:
    log = opened_writer(tmp_path, max_segment_size=200)
    for n in range(60):
        log.write(quarantine(n))
        if n % 10 == 9:
            assert ids(list(read_lines(tmp_path))) == list(range(n + 1))
    log.close()


def test_segment_names_sort_by_the_time_they_were_started(tmp_path: Path) -> None:
    before = time.time()
    log = opened_writer(tmp_path, shard=3, max_segment_size=1, compress=False)
    started: list[str] = []
    for n in range(5):
        assert log.current_segment is not None
        started.append(log.current_segment.name)
        log.write(quarantine(n))  # one record fills a segment: the next write goes to a new one
    log.close()

    assert started == sorted(started)
    assert len(set(started)) == 5
    for name in started:
        match = _SEGMENT_NAME.fullmatch(name)
        assert match is not None, name
        assert match.group(3) == "3"
        started_at = calendar.timegm(time.strptime(match.group(1), "%Y%m%d-%H%M%S")) + int(match.group(2)) / 1e6
        assert before - 0.01 <= started_at <= time.time()
    assert [segment.name for segment in segments(tmp_path)] == started


def test_plain_segment_left_by_a_previous_run_is_compressed_at_next_open(tmp_path: Path) -> None:
    leftover = tmp_path / "20240101-000000-000000-w0.jsonl"
    leftover.write_bytes(msgspec.json.encode(quarantine(1)) + b"\n" + msgspec.json.encode(quarantine(2)) + b"\n")
    other_worker = tmp_path / "20240101-000000-000001-w1.jsonl"  # another worker's: not ours to touch
    other_worker.write_bytes(msgspec.json.encode(quarantine(3)) + b"\n")
    (tmp_path / "20240101-000000-000000-w0.jsonl.gz.tmp").write_bytes(b"half a gzip from a crash")

    log = opened_writer(tmp_path)
    log.write(quarantine(4))
    log.close()

    assert not leftover.exists()
    assert gzip_lines(tmp_path / "20240101-000000-000000-w0.jsonl.gz") == lines_of(1, 2)
    assert other_worker.exists()
    assert not list(tmp_path.glob("*.tmp"))
    assert ids(list(read_lines(tmp_path))) == [1, 2, 3, 4]


def test_leftover_segment_is_compressed_even_when_its_compression_starts_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leftover = tmp_path / "20240101-000000-000000-w0.jsonl"
    leftover.write_bytes(b"".join(line + b"\n" for line in lines_of(1, 2, 3)))
    tmp_created, release = threading.Event(), threading.Event()
    copy = shutil.copyfileobj

    def copy_when_released(source: BinaryIO, sink: BinaryIO, length: int = 0) -> None:
        tmp_created.set()  # the compressor has created <segment>.gz.tmp
        release.wait(5)
        copy(source, sink, length)

    class CompressorScheduledFirst(LogWriter):
        """The compression thread gets the CPU before open() goes on: a schedule the OS may pick."""

        def _close_segment(self, path: Path) -> None:
            super()._close_segment(path)
            tmp_created.wait(5)

    monkeypatch.setattr(writer_module.shutil, "copyfileobj", copy_when_released)
    log = CompressorScheduledFirst(tmp_path)
    log.open(None)
    release.set()
    log.write(quarantine(4))
    log.close()

    assert not leftover.exists()
    assert (tmp_path / "20240101-000000-000000-w0.jsonl.gz").exists()
    assert ids(list(read_lines(tmp_path))) == [1, 2, 3, 4]


def test_compress_segment_replaces_the_plain_file_with_an_identical_gzip(tmp_path: Path) -> None:
    plain = tmp_path / "20240101-000000-000000-w0.jsonl"
    content = b"".join(line + b"\n" for line in lines_of(*range(100)))
    plain.write_bytes(content)

    compress_segment(plain)

    assert not plain.exists()
    assert gzip.decompress((tmp_path / (plain.name + ".gz")).read_bytes()) == content
    assert sorted(p.name for p in tmp_path.iterdir()) == [plain.name + ".gz"]


# --- partial records -----------------------------------------------------------------------
def test_partially_written_last_line_is_not_returned(tmp_path: Path) -> None:
    segment = tmp_path / "20240101-000000-000000-w0.jsonl"
    whole = lines_of(1, 2)
    segment.write_bytes(whole[0] + b"\n" + whole[1] + b"\n" + b'{"type":"Quarantine","timest')

    assert list(read_lines(tmp_path)) == whole

    compress_segment(segment)  # a crashed run's segment, compressed at the next start
    assert list(read_lines(tmp_path)) == whole


def test_a_record_cut_short_at_the_end_of_a_segment_is_left_out_when_it_is_compressed(tmp_path: Path) -> None:
    # Found from outside: a record cut short by a full disk (then kill -9) stayed in the
    # gzipped segment, and `zcat segment | jq` failed on it. Closed segments hold whole lines.
    segment = tmp_path / "20240101-000000-000000-w0.jsonl"
    whole = b"".join(line + b"\n" for line in lines_of(1, 2))
    segment.write_bytes(whole + b'{"type":"Quarantine","timest')

    compress_segment(segment)

    assert gzip.decompress((tmp_path / (segment.name + ".gz")).read_bytes()) == whole


def test_a_record_cut_short_in_a_segment_left_plain_is_left_out_at_the_next_open(tmp_path: Path) -> None:
    crashed = tmp_path / "20240101-000000-000000-w0.jsonl"
    crashed.write_bytes(lines_of(1)[0] + b"\n" + b'{"type":"Quarantine","timest')

    log = opened_writer(tmp_path, compress=False)  # the start after the crash
    log.write(quarantine(2))
    log.close()

    assert crashed.read_bytes() == lines_of(1)[0] + b"\n"
    assert ids(list(read_lines(tmp_path))) == [1, 2]


def test_blank_lines_are_not_records(tmp_path: Path) -> None:
    segment = tmp_path / "20240101-000000-000000-w0.jsonl"
    whole = lines_of(1, 2)
    segment.write_bytes(whole[0] + b"\n\n" + whole[1] + b"\n")
    assert list(read_lines(tmp_path)) == whole


def test_segment_present_in_both_forms_is_read_once(tmp_path: Path) -> None:
    segment = tmp_path / "20240101-000000-000000-w0.jsonl"
    content = b"".join(line + b"\n" for line in lines_of(*range(10)))
    segment.write_bytes(content)
    (tmp_path / (segment.name + ".gz")).write_bytes(gzip.compress(content))  # compressed, plain not yet removed

    assert segments(tmp_path) == [segment]  # the plain copy is complete for sure
    assert ids(list(read_lines(tmp_path))) == list(range(10))


def test_truncated_gzip_is_read_from_its_plain_twin(tmp_path: Path) -> None:
    # If the .gz reached the disk short (say, a disk that lies about fsync), while the plain
    # segment is still there, the plain one is read.
    segment = tmp_path / "20240101-000000-000000-w0.jsonl"
    content = b"".join(line + b"\n" for line in lines_of(*range(50)))
    segment.write_bytes(content)
    (tmp_path / (segment.name + ".gz")).write_bytes(gzip.compress(content)[:60])

    assert ids(list(read_lines(tmp_path))) == list(range(50))


# --- following -----------------------------------------------------------------------------
def test_follow_yields_existing_records_then_records_written_after_it_started(tmp_path: Path) -> None:
    log = opened_writer(tmp_path)
    for n in range(3):
        log.write(quarantine(n))
    follower = Follower(tmp_path, want=6)
    follower.wait_for(3)

    for n in range(3, 6):
        log.write(quarantine(n))
    lines = follower.join()
    log.close()

    assert ids(lines) == list(range(6))


def test_follow_tails_the_current_segment_of_every_worker(tmp_path: Path) -> None:
    worker0 = opened_writer(tmp_path, shard=0)
    worker1 = opened_writer(tmp_path, shard=1)
    follower = Follower(tmp_path, want=4)
    worker0.write(quarantine(0))
    follower.wait_for(1)
    worker1.write(quarantine(1))  # the other worker's segment is the older one by name
    follower.wait_for(2)
    worker0.write(quarantine(2))
    worker1.write(quarantine(3))
    lines = follower.join()
    worker0.close()
    worker1.close()

    assert sorted(ids(lines)) == [0, 1, 2, 3]
    assert ids(lines)[:2] == [0, 1]


def test_follow_continues_across_rotations(tmp_path: Path) -> None:
    log = opened_writer(tmp_path, max_segment_size=300, compress=False)
    for n in range(10):
        log.write(quarantine(n))
    follower = Follower(tmp_path, want=30)
    follower.wait_for(10)

    for n in range(10, 30):
        log.write(quarantine(n))  # every few records start a new segment
        follower.wait_for(n + 1)  # one record at a time (bursts are tested below)
    lines = follower.join()
    log.close()

    assert len(list(tmp_path.iterdir())) > 5
    assert ids(lines) == list(range(30))


def _followed_while_the_writer_moves(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    second_look: Callable[[LogWriter, Path], list[Path]],
    stop_after: float,
) -> tuple[list[bytes], int]:
    """The six records follow() yields from a writer of three, where follow()'s second look at
    the directory is `second_look` (what the writer does meanwhile, and what the look finds);
    and how many looks it took."""
    log = opened_writer(tmp_path, compress=False)
    for n in range(3):
        log.write(quarantine(n))
    listings = 0

    def listing(directory: Path) -> list[Path]:
        nonlocal listings
        listings += 1
        return second_look(log, directory) if listings == 2 else segments(directory)

    monkeypatch.setattr(reader_module, "segments", listing)
    lines = []
    for line in follow(tmp_path, poll=0.001, stop_after=stop_after):
        lines.append(line)
        if len(lines) == 6:
            break
    log.close()
    return lines, listings


def test_follow_yields_records_one_by_one_when_a_burst_ends_a_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def the_writer_rotates(log: LogWriter, directory: Path) -> list[Path]:
        # The writer appends two records and rotates while follow() lists the directory.
        log.write(quarantine(3))
        log.write(quarantine(4))
        log.rotate()
        log.write(quarantine(5))
        return segments(directory)

    lines, _ = _followed_while_the_writer_moves(tmp_path, monkeypatch, the_writer_rotates, stop_after=0.3)

    assert lines == [msgspec.json.encode(quarantine(n)) for n in range(6)]


def test_follow_keeps_a_writers_order_when_it_closed_two_segments_between_two_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rest of the segment being tailed comes before the segments closed after it.
    def two_rotations(log: LogWriter, directory: Path) -> list[Path]:
        log.write(quarantine(3))
        log.rotate()
        log.write(quarantine(4))
        log.rotate()
        log.write(quarantine(5))
        return segments(directory)

    lines, _ = _followed_while_the_writer_moves(tmp_path, monkeypatch, two_rotations, stop_after=0.5)

    assert lines == lines_of(*range(6))


def test_follow_goes_on_when_the_segment_it_listed_is_compressed_before_it_opens_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found from outside: `pigeon logs -f` with 8 KiB segments and steady traffic exited with
    # FileNotFoundError when the newest segment it had listed was rotated and gzipped before
    # it opened it. It is read from its .gz then, each record once, and the tail goes on.
    def listed_then_rotated_twice(log: LogWriter, directory: Path) -> list[Path]:
        log.write(quarantine(3))
        log.rotate()
        log.write(quarantine(4))
        listed = segments(directory)  # ends with the segment that holds 4
        log.rotate()
        log.write(quarantine(5))
        compress_segment(listed[-1])  # as the writer's thread does, before follow() opens it
        return listed

    lines, listings = _followed_while_the_writer_moves(tmp_path, monkeypatch, listed_then_rotated_twice, stop_after=0.5)

    assert listings > 2
    assert lines == lines_of(*range(6))


def test_follow_reads_compressed_segments_and_stops_after_the_given_time(tmp_path: Path) -> None:
    log = opened_writer(tmp_path, max_segment_size=300)
    for n in range(20):
        log.write(quarantine(n))
    log.close()

    started = time.monotonic()
    lines = list(follow(tmp_path, poll=0.01, stop_after=0.1))
    assert time.monotonic() - started < 2
    assert ids(lines) == list(range(20))


def test_follow_does_not_yield_a_partial_line_left_by_a_crash(tmp_path: Path) -> None:
    crashed = tmp_path / "20240101-000000-000000-w0.jsonl"
    crashed.write_bytes(lines_of(1)[0] + b"\n" + b'{"type":"Quarantine","timest')
    follower = Follower(tmp_path, want=3)
    follower.wait_for(1)

    log = opened_writer(tmp_path)  # the restarted node starts a new segment
    log.write(quarantine(2))
    log.write(quarantine(3))
    lines = follower.join()
    log.close()

    assert lines == lines_of(1, 2, 3)


def test_pigeon_logs_merges_the_workers_records_by_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Found from outside: `pigeon logs` printed one worker's segment after the other's, though
    # the README says "in order". Each worker writes its own segment; their times interleave.
    first, second = opened_writer(tmp_path, shard=0), opened_writer(tmp_path, shard=1)
    for n in range(10):
        (first if n % 2 == 0 else second).write(quarantine(n))
    first.close()
    second.close()
    assert len(segments(tmp_path)) == 2
    assert sorted(ids(list(read_lines(tmp_path)))) == list(range(10))
    assert ids(list(merged_lines(tmp_path))) == list(range(10))
    assert main(["logs", "--dir", str(tmp_path)]) == 0
    assert ids(capsys.readouterr().out.encode().splitlines()) == list(range(10))


class _Growing:
    """A segment as a reader sees it while its writer appends: the end of one read is half a
    record, and the next read finds its rest (and more) written meanwhile."""

    def __init__(self, *reads: bytes) -> None:
        self._reads = reads

    def __enter__(self) -> _Growing:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __iter__(self) -> object:
        return iter(self._reads)


def test_a_record_being_written_ends_the_read_and_its_rest_is_never_read_as_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / f"20260101-000000-000000-w0{writer_module.SEGMENT_SUFFIX}").write_bytes(b"")
    reads = (
        b'{"type":"Quarantine","id":1}\n',
        b'{"type":"Quarantine",',
        b'"id":2}\n',
        b'{"type":"Quarantine","id":3}\n',
    )
    monkeypatch.setattr(reader_module, "open", lambda path, mode: _Growing(*reads), raising=False)
    assert read_records(tmp_path) == [{"type": "Quarantine", "id": 1}]
