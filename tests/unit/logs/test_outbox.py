"""The outbox: a committed record's row is forgotten only once an fsync covered its line; a log
that cannot be written keeps the rows (and saves the records that have none), everything is
logged exactly once when it works again or at the next start, and the start-up comparison
looks in every log a shard's records may be in and says whether a crash or a stop left them."""

from __future__ import annotations

import asyncio
import collections
import errno
import gzip
import json
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest

from pigeon.logs.outbox import (
    CLEAN_STOP,
    Outbox,
    finish_outbox,
    mark_clean_stop,
    recover_outbox_lines,
    take_clean_stop,
    writers_of,
)
from pigeon.logs.reader import read_records
from pigeon.logs.records import Delivery, Rejection, Response
from pigeon.logs.writer import LogWriter
from pigeon.spool.spool import Spool
from pigeon.spool.sqlite import SqliteSpool

QUICK = 0.01  # forget cycle period in these tests


# --- helpers -------------------------------------------------------------------------------------
def delivery(n: int) -> Delivery:
    return Delivery(
        timestamp=1_700_000_000.0 + n,
        id=f"{n:016x}",
        queue="default@example.com",
        sender="sender@example.org",
        recipient=f"user{n}@example.com",
        size=100,
        attempt=1,
        response=Response(250, "OK", "2.0.0"),
    )


def rejection(n: int) -> Rejection:
    return Rejection(timestamp=1_700_000_000.0 + n, session=f"s{n}", peer="192.0.2.1:1", command="RCPT",
                     response=Response(550, "no such user", "5.1.1"))  # fmt: skip


def outbox_rows(spool: SqliteSpool) -> list[int]:
    conn = sqlite3.connect(spool.db_path)
    try:
        return [seq for (seq,) in conn.execute("SELECT seq FROM outbox ORDER BY seq")]
    finally:
        conn.close()


def segment_lines(directory: Path) -> list[dict[str, object]]:
    """Every line of every segment, plain or gzipped, as a JSON tool reads it (`zcat | jq`):
    fails on one that is no JSON record."""
    lines: list[dict[str, object]] = []
    for path in sorted(directory.iterdir()):
        if path.name.endswith(".jsonl.gz"):
            data = gzip.decompress(path.read_bytes())
        elif path.name.endswith(".jsonl"):
            data = path.read_bytes()
        else:
            continue
        assert not data or data.endswith(b"\n"), f"{path.name} ends with part of a line"
        lines += [json.loads(raw) for raw in data.splitlines()]
    return lines


def logged(directory: Path, kind: str | None = None) -> list[dict[str, object]]:
    return [r for r in read_records(directory) if kind is None or r["type"] == kind]


async def commit(outbox: Outbox, spool: SqliteSpool, numbers: range) -> list[int]:
    """What intake and settlement do: seal records, commit them with a change, then hand them over."""
    sealed = outbox.seal(spool, [delivery(n) for n in numbers])
    await spool.outbox_add(sealed)  # stands for the change's transaction
    outbox.committed(spool, sealed)
    return [seq for seq, _ in sealed]


async def until(condition: Callable[[], object], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


class Disk:
    """`os.write` and `os.fsync` that can fail or wait, and an account of what happened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.write_limit: int | None = None  # bytes the next write may take before the disk fills
        self.fsync_allowed = threading.Event()
        self.fsync_allowed.set()
        self.events: list[str] = []
        self._write, self._fsync = os.write, os.fsync
        monkeypatch.setattr(os, "write", self.write)
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
        self.fsync_allowed.wait(10)
        self._fsync(fd)
        self.events.append("fsync")


@pytest.fixture
async def spool(tmp_path: Path) -> AsyncIterator[SqliteSpool]:
    spool = SqliteSpool(tmp_path / "spool" / "shard-0")
    spool.open(asyncio.get_running_loop())
    yield spool
    spool.close()


def writer(tmp_path: Path, **options: object) -> LogWriter:
    log = LogWriter(tmp_path / "log", **options)  # type: ignore[arg-type]
    log.open(asyncio.get_running_loop())
    return log


# --- forgetting --------------------------------------------------------------------------------
async def test_rows_are_forgotten_only_after_the_fsync_that_covered_their_lines(
    tmp_path: Path, spool: SqliteSpool, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    log = writer(tmp_path)

    class Forgetting:
        """The spool, as the outbox sees it, noting each deletion of rows among the disk's
        events (a stand-in: a compiled SqliteSpool's methods cannot be replaced on it)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(spool, name)

        def outbox_written(self, seqs: list[int]) -> asyncio.Future[None]:
            disk.events.append(f"forget {len(seqs)}")
            return spool.outbox_written(seqs)

    outbox = Outbox(log, {0: cast(Spool, Forgetting())}, forget_after=QUICK)
    disk.fsync_allowed.clear()  # the disk takes its time
    seqs = await commit(outbox, spool, range(5))
    await asyncio.sleep(0.2)  # many forget periods
    assert len(logged(tmp_path / "log")) == 5  # in the file (page cache) ...
    assert outbox_rows(spool) == seqs  # ... but not known durable: the rows stay
    assert disk.events == []

    disk.fsync_allowed.set()
    await until(lambda: not outbox_rows(spool))
    assert disk.events[:2] == ["fsync", "forget 5"]  # one fsync for the five, then one deletion
    await outbox.close()
    log.close()


async def test_one_fsync_and_one_deletion_serve_every_record_of_a_forget_period(
    tmp_path: Path, spool: SqliteSpool, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    log = writer(tmp_path)
    outbox = Outbox(log, {0: spool}, forget_after=0.2)
    for start in range(0, 100, 10):
        await commit(outbox, spool, range(start, start + 10))
    await until(lambda: not outbox_rows(spool))
    assert disk.events.count("fsync") <= 2
    await outbox.close()
    log.close()


async def test_a_record_committed_late_with_a_lower_seq_is_not_forgotten_with_the_logged_ones(
    tmp_path: Path, spool: SqliteSpool
) -> None:
    log = writer(tmp_path)
    outbox = Outbox(log, {0: spool}, forget_after=QUICK)
    early = outbox.seal(spool, [delivery(1)])  # sealed first (say, a settlement waiting for its DSN) ...
    late = outbox.seal(spool, [delivery(2)])
    await spool.outbox_add(late)
    outbox.committed(spool, late)
    await spool.outbox_add(early)  # ... committed last; the process dies before it is logged
    await until(lambda: late[0][0] not in outbox_rows(spool))
    await asyncio.sleep(0.05)
    assert outbox_rows(spool) == [early[0][0]]  # so the next start logs it
    await outbox.close()
    log.close()


# --- a failing log disk ------------------------------------------------------------------------
async def test_write_errors_keep_the_rows_and_each_record_is_logged_once_when_the_disk_recovers(
    tmp_path: Path, spool: SqliteSpool, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    log = writer(tmp_path)
    outbox = Outbox(log, {0: spool}, forget_after=QUICK)
    disk.full = True
    seqs = await commit(outbox, spool, range(20))
    log.write(rejection(1))
    await asyncio.sleep(0.2)
    assert outbox_rows(spool) == seqs
    assert log.error is not None and "No space left on device" in log.error
    assert log.pending == 21

    disk.full = False
    await until(lambda: not outbox_rows(spool))
    assert log.error is None
    assert log.pending == 0
    await outbox.close()
    log.close()
    records = logged(tmp_path / "log")
    assert collections.Counter(r.get("seq") for r in records if r["type"] == "Delivery") == {
        f"{s:016x}": 1 for s in seqs
    }
    assert len(logged(tmp_path / "log", "Rejection")) == 1


async def test_past_the_memory_bound_every_record_is_kept_in_the_outbox_and_logged_once_when_the_disk_recovers(
    tmp_path: Path, spool: SqliteSpool, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    log = writer(tmp_path, max_buffer=4000)
    outbox = Outbox(log, {0: spool}, forget_after=QUICK)
    disk.full = True
    seqs: list[int] = []
    for n in range(0, 60, 6):
        seqs += await commit(outbox, spool, range(n, n + 3))
        for m in range(n + 3, n + 6):
            log.write(rejection(m))  # records with no row of their own
    await until(lambda: log.dropped > 0 and not outbox._spilling)
    assert outbox.lost == 0
    assert outbox.unlogged == log.dropped
    outbox_dropped_deliveries = len(set(seqs) & outbox._unlogged.get(0, set()))
    rows = outbox_rows(spool)
    assert set(seqs) <= set(rows)  # terminal records keep theirs
    assert len(rows) > len(seqs)  # and dropped rejections got one

    disk.full = False
    await until(lambda: not outbox_rows(spool) and outbox.unlogged == 0)
    assert log.error is None
    await outbox.close()
    log.close()
    records = logged(tmp_path / "log")
    deliveries = collections.Counter(r["id"] for r in records if r["type"] == "Delivery")
    rejections = collections.Counter(r["session"] for r in records if r["type"] == "Rejection")
    assert deliveries == {f"{n:016x}": 1 for n in range(60) if n % 6 < 3}
    assert rejections == {f"s{n}": 1 for n in range(60) if n % 6 >= 3}
    saved = [r for r in records if r["type"] == "Rejection" and "seq" in r]
    assert len(saved) == log.dropped - outbox_dropped_deliveries  # dropped ones carry their row's seq


async def test_stop_with_the_log_disk_full_says_how_many_records_wait_in_the_outbox_and_the_next_start_logs_them_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk = Disk(monkeypatch)
    loop = asyncio.get_running_loop()
    spool = SqliteSpool(tmp_path / "spool" / "shard-0")
    spool.open(loop)
    log = writer(tmp_path)
    outbox = Outbox(log, {0: spool}, forget_after=QUICK)
    await commit(outbox, spool, range(3))
    await until(lambda: not outbox_rows(spool))  # logged normally
    disk.full = True
    seqs = await commit(outbox, spool, range(3, 10))
    for n in range(10, 14):
        log.write(rejection(n))

    await outbox.close()
    spool.close()
    log.close()
    assert "11 records could not be written before stopping (cannot write" in caplog.text
    assert "No space left on device" in caplog.text
    assert "they stay in the spool's outbox and are written at the next start" in caplog.text
    assert (spool.directory / CLEAN_STOP).exists()
    assert len(outbox_rows(spool)) == 11

    disk.full = False
    caplog.clear()
    spool = SqliteSpool(tmp_path / "spool" / "shard-0")
    spool.open(loop)
    found = recover_outbox_lines(spool, tmp_path / "log")
    assert found.last_stop is not None and "No space left on device" in found.last_stop
    assert not (spool.directory / CLEAN_STOP).exists()
    log = writer(tmp_path)
    outbox = Outbox(log, {0: spool}, forget_after=QUICK)
    finish_outbox(outbox, found)
    await until(lambda: not outbox_rows(spool))
    await outbox.close()
    spool.close()
    log.close()
    assert "11 records kept in the outbox were not logged before the last stop" in caplog.text
    assert "crash" not in caplog.text
    records = logged(tmp_path / "log")
    assert collections.Counter(r["id"] for r in records if r["type"] == "Delivery") == {
        f"{n:016x}": 1 for n in range(10)
    }
    assert sorted(r["session"] for r in records if r["type"] == "Rejection") == [f"s{n}" for n in range(10, 14)]
    assert {r["seq"] for r in records if r["type"] == "Delivery"} >= {f"{s:016x}" for s in seqs}


@pytest.mark.parametrize("truncate", [True, False], ids=["taken-back", "cannot-be-taken-back"])
async def test_a_record_cut_short_by_a_full_log_disk_is_logged_whole_once_after_a_stop_and_no_line_is_a_fragment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, truncate: bool
) -> None:
    # Records without an outbox row of their own (InboundDelivery, Rejection): the disk fills up in
    # the middle of one of them, the node stops, and the next start has room again. The head of
    # the one cut short is taken back out of the file at once, or (where that fails too) left
    # out as its segment closes; either way the record is kept whole and logged whole.
    disk = Disk(monkeypatch)
    if not truncate:
        truncate_file = os.ftruncate

        def cannot_truncate(fd: int, length: int) -> None:  # a log segment (the spool's lock file can)
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".jsonl"):
                raise OSError(errno.EIO, "Input/output error")
            truncate_file(fd, length)

        monkeypatch.setattr(os, "ftruncate", cannot_truncate)
    loop = asyncio.get_running_loop()
    spool = SqliteSpool(tmp_path / "spool" / "shard-0")
    spool.open(loop)
    log = writer(tmp_path)
    outbox = Outbox(log, {0: spool}, forget_after=QUICK)
    first = log.encode(rejection(0))
    disk.write_limit = 2 * (len(first) + 1) + 30  # two records whole, 30 bytes of the third
    for n in range(20):
        log.write(rejection(n))
    await asyncio.sleep(0)  # the end of this loop turn writes them
    assert log.error is not None

    await outbox.close()
    spool.close()
    log.close()
    assert "18 records could not be written before stopping" in caplog.text

    disk.full = False
    spool = SqliteSpool(tmp_path / "spool" / "shard-0")
    spool.open(loop)
    found = recover_outbox_lines(spool, tmp_path / "log")
    log = writer(tmp_path)
    outbox = Outbox(log, {0: spool}, forget_after=QUICK)
    finish_outbox(outbox, found)
    await until(lambda: not outbox_rows(spool))
    await outbox.close()
    spool.close()
    log.close()
    lines = segment_lines(tmp_path / "log")  # every line is a JSON record
    assert collections.Counter(r["session"] for r in lines) == {f"s{n}": 1 for n in range(20)}
    assert ("cut short" in caplog.text) is not truncate  # only a head that stayed is left out


async def test_a_failed_fsync_keeps_the_rows_for_the_next_start_which_writes_only_what_the_log_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    spool = SqliteSpool(tmp_path / "spool" / "shard-0")
    spool.open(loop)
    log = writer(tmp_path)
    outbox = Outbox(log, {0: spool}, forget_after=QUICK)
    fsync = os.fsync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    seqs = await commit(outbox, spool, range(4))
    await until(lambda: outbox.unconfirmed == 4)
    monkeypatch.setattr(os, "fsync", fsync)
    await commit(outbox, spool, range(4, 6))
    await until(lambda: outbox_rows(spool) == seqs)  # the later ones are forgotten, these wait
    await outbox.close()
    spool.close()
    log.close()
    assert "4 records were written but their fsync failed" in caplog.text

    spool = SqliteSpool(tmp_path / "spool" / "shard-0")
    spool.open(loop)
    found = recover_outbox_lines(spool, tmp_path / "log")
    assert (found.present, found.missing) == (seqs, [])  # they did reach the file
    log = writer(tmp_path)
    outbox = Outbox(log, {0: spool}, forget_after=QUICK)
    finish_outbox(outbox, found)
    await until(lambda: not outbox_rows(spool))
    await outbox.close()
    spool.close()
    log.close()
    assert collections.Counter(r["id"] for r in logged(tmp_path / "log")) == {f"{n:016x}": 1 for n in range(6)}


# --- start-up ------------------------------------------------------------------------------------
def write_segment(directory: Path, name: str, lines: list[bytes]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(b"".join(line + b"\n" for line in lines))


def sealed_lines(spool: SqliteSpool, numbers: range) -> list[tuple[int, bytes]]:
    encoder = msgspec.json.Encoder()
    sealed = []
    for n, seq in zip(numbers, spool.new_ids(len(numbers)), strict=True):
        record = delivery(n)
        record.seq = f"{seq:016x}"
        sealed.append((seq, encoder.encode(record)))
    return sealed


def test_a_shards_records_may_be_in_the_log_of_any_worker_that_owned_or_adopted_it() -> None:
    assert writers_of(0) == [0]
    assert writers_of(1) == [0, 1]  # its own worker, or worker 0 of a one-worker run
    assert writers_of(3) == [0, 1, 3]  # 3 % 1, 3 % 2, 3 % 3, and worker 3
    assert writers_of(5) == [0, 1, 2, 5]


async def test_an_adopted_shards_records_in_the_adopting_workers_log_are_not_written_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    adopted = SqliteSpool(tmp_path / "spool" / "shard-1", shard=1)
    adopted.open(loop)
    sealed = sealed_lines(adopted, range(6))
    await adopted.outbox_add(sealed)
    # Shard 1's worker logged the first two before it stopped; then a one-worker run adopted
    # the shard, logged two more to worker 0's log, and crashed before forgetting them.
    write_segment(tmp_path / "log", "20240101-000000-000000-w1.jsonl", [line for _, line in sealed[:2]])
    write_segment(tmp_path / "log", "20240101-000100-000000-w0.jsonl", [line for _, line in sealed[2:4]])

    found = recover_outbox_lines(adopted, tmp_path / "log")
    assert found.present == [seq for seq, _ in sealed[:4]]
    assert found.missing == sealed[4:]
    assert found.last_stop is None
    log = LogWriter(tmp_path / "log", shard=0, compress=False)
    log.open(loop)
    outbox = Outbox(log, {1: adopted}, forget_after=QUICK)
    finish_outbox(outbox, found)
    await until(lambda: not outbox_rows(adopted))
    await outbox.close()
    adopted.close()
    log.close()
    assert "2 records kept in the outbox were not logged before a crash" in caplog.text
    assert collections.Counter(r["id"] for r in logged(tmp_path / "log")) == {f"{n:016x}": 1 for n in range(6)}


async def test_records_are_looked_for_in_every_segment_written_since_they_were_made(tmp_path: Path) -> None:
    # Not only in the last three: a record whose fsync failed waits while segments rotate.
    spool = SqliteSpool(tmp_path / "spool" / "shard-0")
    spool.open(asyncio.get_running_loop())
    sealed = sealed_lines(spool, range(1))
    await spool.outbox_add(sealed)
    (seq, line), other = sealed[0], msgspec.json.encode(delivery(99))
    started = time.time() - 1
    for n in range(6):  # six segments since the record was made; it is in the second
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started + n * 0.1))
        write_segment(tmp_path / "log", f"{stamp}-{n:06d}-w0.jsonl", [line if n == 1 else other])

    found = recover_outbox_lines(spool, tmp_path / "log")
    spool.close()
    assert (found.present, found.missing) == ([seq], [])


def test_clean_stop_marker_is_read_once(tmp_path: Path) -> None:
    mark_clean_stop(tmp_path, "cannot write x.jsonl: No space left on device")
    assert json.loads((tmp_path / CLEAN_STOP).read_bytes())["log_error"].endswith("No space left on device")
    assert take_clean_stop(tmp_path) == "cannot write x.jsonl: No space left on device"
    assert take_clean_stop(tmp_path) is None
    mark_clean_stop(tmp_path, None)
    assert take_clean_stop(tmp_path) == ""


# --- seq as a JSON reader sees it ----------------------------------------------------------------
async def test_seqs_are_exact_and_unique_to_a_json_reader_whose_numbers_are_doubles(
    tmp_path: Path, spool: SqliteSpool
) -> None:
    # Found from outside: seqs are ids (about 2.55e17, past 2^53), which jq and JavaScript read as
    # doubles: two seqs in a row read the same, and a dedupe by (node, seq) dropped real records.
    log = writer(tmp_path)
    outbox = Outbox(log, {0: spool}, forget_after=QUICK)
    seqs = await commit(outbox, spool, range(50))
    log.write(rejection(1))
    await outbox.close()
    log.close()
    as_js = [json.loads(json.dumps(r), parse_int=float) for r in logged(tmp_path / "log", "Delivery")]
    assert [r["seq"] for r in as_js] == [f"{seq:016x}" for seq in seqs]  # the form `id` has
    assert len({r["seq"] for r in as_js}) == 50


async def test_a_saved_record_without_a_seq_gets_its_rows_seq_in_the_form_id_has(
    tmp_path: Path, spool: SqliteSpool
) -> None:
    log = writer(tmp_path)
    outbox = Outbox(log, {0: spool}, forget_after=QUICK)
    ((_, seq, line),) = outbox.write_numbered([rejection(1)])
    await outbox.close()
    log.close()
    assert json.loads(line)["seq"] == f"{seq:016x}"
    (record,) = logged(tmp_path / "log", "Rejection")
    assert record["seq"] == f"{seq:016x}"


async def test_after_an_upgrade_an_outbox_row_whose_line_has_a_numeric_seq_is_found_in_the_log(
    tmp_path: Path,
) -> None:
    # The previous version wrote seqs as JSON numbers, in the log and in the outbox's lines: a
    # start after the upgrade must find those already logged, or it would log them twice.
    spool = SqliteSpool(tmp_path / "spool" / "shard-0")
    spool.open(asyncio.get_running_loop())
    encoder = msgspec.json.Encoder()
    old: list[tuple[int, bytes]] = []
    for n, seq in zip(range(4), spool.new_ids(4), strict=True):
        line = encoder.encode(delivery(n))
        old.append((seq, line[:-1] + b',"seq":%d}' % seq))  # as the previous version wrote it
    new = sealed_lines(spool, range(4, 6))
    await spool.outbox_add(old + new)
    write_segment(tmp_path / "log", "20240101-000000-000000-w0.jsonl", [old[0][1], old[1][1], new[0][1]])

    found = recover_outbox_lines(spool, tmp_path / "log")
    spool.close()
    assert found.present == [old[0][0], old[1][0], new[0][0]]
    assert found.missing == [old[2], old[3], new[1]]
