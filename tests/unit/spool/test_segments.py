"""Segments: medium bodies are appended to shared files, made durable before the commit that
records them, read back intact, and their space is given back once the bodies are freed, by
removing empty segments and compacting mostly empty ones, across restarts and crashes."""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from pigeon.message import ENVELOPE_ENCODER, Envelope, Message, Recipient, format_id
from pigeon.spool.segments import Segments
from pigeon.spool.spool import NewMessage, SpoolFull, SpoolWriteError
from pigeon.spool.sqlite import SCHEMA_VERSION, SqliteSpool
from tests.unit.spool.test_group_commit import opened, rows

FROM = 1000  # bodies from this size go to segments in these tests


def make_spool(path: Path, *, segment_size: int = 1 << 20) -> SqliteSpool:
    return SqliteSpool(path, inline_limit=64 * 1024, segment_from=FROM, segment_size=segment_size)


def segment_files(spool: SqliteSpool) -> list[str]:
    return sorted(path.name for path in (spool.directory / "segments").iterdir())


async def store(spool: SqliteSpool, data: bytes) -> Message:
    body_id, message_id = spool.new_ids(2)
    writer = spool.body_writer(body_id)
    for start in range(0, len(data), 700):
        writer.write(data[start : start + 700])
    body = writer.finish()
    now = time.time()
    await spool.store(
        body,
        [NewMessage(message_id, "q@example.com", Envelope("s@example.org", [Recipient("r@example.com")]), now, now)],
    )
    message = spool.get(message_id)
    assert message is not None
    return message


async def deliver(spool: SqliteSpool, message: Message) -> None:
    await spool.settle(message, None, attempts=1, due=0.0)


async def settled(spool: SqliteSpool, rounds: int = 50) -> None:
    """Let the work the spool schedules after a commit (drops, compactions) run to its end."""
    for _ in range(rounds):
        await asyncio.sleep(0.01)
        await spool.make_due([], 0.0)  # a commit after whatever was submitted meanwhile


def body_of(n: int, size: int = 3000) -> bytes:
    return (f"message {n} ".encode() * size)[:size]


async def test_a_medium_body_is_stored_in_a_segment_and_read_back_intact(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    with opened(spool):
        small = await store(spool, b"x" * (FROM - 1))
        medium = await store(spool, body_of(1))
        assert spool.body(medium.body_id) == body_of(1)
        assert spool.body(small.body_id) == b"x" * (FROM - 1)
    (segment,) = rows(spool.db_path, "SELECT segment FROM body WHERE id = ?", medium.body_id)[0]
    assert rows(spool.db_path, "SELECT data IS NULL, segment IS NULL FROM body WHERE id = ?", small.body_id) == [(0, 1)]
    assert rows(spool.db_path, "SELECT data FROM body WHERE id = ?", medium.body_id) == [(None,)]
    assert rows(spool.db_path, "SELECT id, live FROM segment") == [(segment, 3000)]
    assert segment_files(spool) == [format_id(segment)]  # type: ignore[arg-type]


async def test_bodies_in_segments_survive_a_restart(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    with opened(spool):
        stored = [await store(spool, body_of(n)) for n in range(5)]
    again = make_spool(tmp_path)
    with opened(again):
        report = await again.check()
        assert report.messages == 5 and report.quarantined == ()
        assert [again.body(message.body_id) for message in stored] == [body_of(n) for n in range(5)]
        # A new run appends to a new segment, never after a possibly torn tail.
        await store(again, body_of(9))
        assert len(segment_files(again)) == 2


async def test_a_failed_segment_fsync_refuses_the_message_and_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = make_spool(tmp_path)
    with opened(spool):
        real = os.fdatasync

        def failing(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", failing)
        with pytest.raises(SpoolWriteError, match="Input/output error"):
            await store(spool, body_of(1))
        monkeypatch.setattr(os, "fdatasync", real)
        assert spool.count == 0
    assert rows(spool.db_path, "SELECT count(*) FROM message") == [(0,)]
    assert rows(spool.db_path, "SELECT count(*) FROM body") == [(0,)]


async def test_a_full_segment_is_removed_once_every_body_in_it_is_delivered(tmp_path: Path) -> None:
    spool = make_spool(tmp_path, segment_size=8000)  # three 3000-byte bodies fill one
    with opened(spool):
        first = [await store(spool, body_of(n)) for n in range(3)]
        later = await store(spool, body_of(3))  # starts the second segment
        assert len(segment_files(spool)) == 2
        for message in first:
            await deliver(spool, message)
        await settled(spool)
        assert len(segment_files(spool)) == 1
        assert spool.body(later.body_id) == body_of(3)
    assert rows(spool.db_path, "SELECT live FROM segment") == [(3000,)]


async def test_the_active_segment_stays_when_emptied_and_goes_once_it_is_full_and_empty(tmp_path: Path) -> None:
    spool = make_spool(tmp_path, segment_size=5000)
    with opened(spool):
        first = await store(spool, body_of(1))
        await deliver(spool, first)
        await settled(spool)
        assert len(segment_files(spool)) == 1  # still being appended to
        second = await store(spool, body_of(2))  # the segment is full after this one
        await store(spool, body_of(3))  # ... so this one starts the next
        await deliver(spool, second)
        await settled(spool)
        assert len(segment_files(spool)) == 1


async def test_a_mostly_empty_segment_is_compacted_into_the_active_one(tmp_path: Path) -> None:
    spool = make_spool(tmp_path, segment_size=30_000)
    with opened(spool):
        old = [await store(spool, body_of(n)) for n in range(10)]  # 30,000 bytes: full
        await store(spool, body_of(10))  # the next segment
        (old_segment,) = rows(spool.db_path, "SELECT segment FROM body WHERE id = ?", old[0].body_id)[0]
        for message in old[:8]:  # 6,000 of 30,000 bytes left: under a quarter
            await deliver(spool, message)
        await settled(spool)
        assert format_id(old_segment) not in segment_files(spool)  # type: ignore[arg-type]
        assert [spool.body(message.body_id) for message in old[8:]] == [body_of(8), body_of(9)]
        assert rows(spool.db_path, "SELECT count(*) FROM segment WHERE id = ?", old_segment) == [(0,)]
    # What compaction wrote is durable: a new run reads the moved bodies.
    again = make_spool(tmp_path)
    with opened(again):
        assert (await again.check()).quarantined == ()
        assert [again.body(message.body_id) for message in old[8:]] == [body_of(8), body_of(9)]


async def test_a_body_delivered_while_its_segment_is_compacted_is_not_brought_back(tmp_path: Path) -> None:
    spool = make_spool(tmp_path, segment_size=30_000)
    with opened(spool):
        old = [await store(spool, body_of(n)) for n in range(10)]
        await store(spool, body_of(10))
        for message in old[:7]:
            await deliver(spool, message)  # 9,000 bytes left: not yet compacted
        # Delivering the eighth starts the compaction; the ninth is delivered at once, in the
        # next commit, while the copies are being made.
        eighth = asyncio.ensure_future(deliver(spool, old[7]))
        ninth = asyncio.ensure_future(deliver(spool, old[8]))
        await asyncio.gather(eighth, ninth)
        await settled(spool)
        assert spool.get(old[8].id) is None
        assert rows(spool.db_path, "SELECT count(*) FROM body WHERE id = ?", old[8].body_id) == [(0,)]
        assert spool.body(old[9].body_id) == body_of(9)
        live = rows(spool.db_path, "SELECT sum(live) FROM segment")[0][0]
        held = rows(spool.db_path, "SELECT sum(size) FROM body WHERE segment IS NOT NULL")[0][0]
        assert live == held == 2 * 3000


async def test_a_missing_segment_sets_its_messages_aside_with_the_reason(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    with opened(spool):
        message = await store(spool, body_of(1))
    (segment,) = rows(spool.db_path, "SELECT segment FROM body WHERE id = ?", message.body_id)[0]
    (tmp_path / "segments" / format_id(segment)).unlink()  # type: ignore[arg-type]
    again = make_spool(tmp_path)
    with opened(again):
        report = await again.check()
        assert [entry.id for entry in report.quarantined] == [message.id]
        assert "segment file segments/" in report.quarantined[0].reason and "missing" in report.quarantined[0].reason


async def test_a_segment_cut_short_sets_aside_only_the_bodies_past_its_end(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    with opened(spool):
        kept, lost = await store(spool, body_of(1)), await store(spool, body_of(2))
    (segment,) = rows(spool.db_path, "SELECT segment FROM body WHERE id = ?", kept.body_id)[0]
    os.truncate(tmp_path / "segments" / format_id(segment), 4000)  # type: ignore[arg-type]
    again = make_spool(tmp_path)
    with opened(again):
        report = await again.check()
        assert [entry.id for entry in report.quarantined] == [lost.id]
        assert "ends before body" in report.quarantined[0].reason
        assert again.body(kept.body_id) == body_of(1)


async def test_a_segment_no_row_names_is_removed_at_the_next_start(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    with opened(spool):
        message = await store(spool, body_of(1))
        # A reception appended but never committed (the process died before its commit).
        writer = spool.body_writer(spool.new_ids(1)[0])
        writer.write(body_of(2))
        writer.finish()
    # ... an old segment emptied, whose drop did not happen before the crash ...
    dropped = tmp_path / "segments" / format_id(spool.new_ids(1)[0] - 10**9)
    dropped.write_bytes(b"old bytes")
    # ... and the segment that had just been started: no store into it had committed, and its
    # id is above every id the database holds.
    started = tmp_path / "segments" / format_id(spool.new_ids(1)[0] + 10**9)
    started.write_bytes(b"new bytes")
    again = make_spool(tmp_path)
    with opened(again):
        report = await again.check()
        assert not dropped.exists() and not started.exists()
        assert report.orphan_files_removed == 2
        assert again.body(message.body_id) == body_of(1)
        await store(again, body_of(3))  # this run's own segment is kept
        await again.check()
        assert len(segment_files(again)) == 2


async def test_an_emptied_segment_left_by_a_crash_is_dropped_at_the_next_start(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    with opened(spool):
        message = await store(spool, body_of(1))
        await deliver(spool, message)  # the active segment: kept, with no live byte
    assert rows(spool.db_path, "SELECT live FROM segment") == [(0,)]
    again = make_spool(tmp_path)
    with opened(again):
        await again.check()
        await settled(again)
        assert segment_files(again) == []
    assert rows(spool.db_path, "SELECT count(*) FROM segment") == [(0,)]


async def test_a_spool_of_the_previous_schema_is_migrated_and_keeps_its_bodies(tmp_path: Path) -> None:
    # Schema 4, as Pigeon wrote it before segments, holding one message.
    conn = sqlite3.connect(tmp_path / "spool.db")
    conn.executescript(
        """
        PRAGMA journal_mode=WAL;
        CREATE TABLE body (id INTEGER PRIMARY KEY, size INTEGER NOT NULL, data BLOB);
        CREATE TABLE body_ref (body INTEGER PRIMARY KEY, refs INTEGER NOT NULL);
        CREATE TABLE message (id INTEGER PRIMARY KEY, body INTEGER NOT NULL, queue TEXT NOT NULL,
            created REAL NOT NULL, size INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
            due REAL NOT NULL, envelope BLOB NOT NULL);
        CREATE INDEX message_due ON message (due);
        CREATE TABLE quarantine (id INTEGER PRIMARY KEY, at REAL NOT NULL, reason TEXT NOT NULL,
            body INTEGER, queue TEXT, envelope BLOB);
        CREATE TABLE outbox (seq INTEGER PRIMARY KEY, record BLOB NOT NULL);
        CREATE TABLE admin_rule (id TEXT PRIMARY KEY, rule BLOB NOT NULL);
        PRAGMA user_version = 4;
        """
    )
    envelope = ENVELOPE_ENCODER.encode(Envelope("s@example.org", [Recipient("r@example.com")]))
    conn.execute("INSERT INTO body VALUES (1, 500, ?)", (b"y" * 500,))
    conn.execute("INSERT INTO message VALUES (2, 1, 'q@example.com', 0, 500, 0, 0, ?)", (envelope,))
    conn.commit()
    conn.close()
    spool = make_spool(tmp_path)
    with opened(spool):
        assert (await spool.check()).quarantined == ()
        message = spool.get(2)
        assert message is not None and spool.body(message.body_id) == b"y" * 500
        newer = await store(spool, body_of(1))
        assert spool.body(newer.body_id) == body_of(1)
        await deliver(spool, message)
    assert rows(spool.db_path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


async def test_max_size_counts_the_bytes_in_segments(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path, inline_limit=64 * 1024, segment_from=FROM, max_size=512 * 1024)
    with opened(spool):
        stored, refused = 0, None
        for n in range(100):  # 4 MB, eight times the cap
            try:
                await store(spool, body_of(n, 40_000))
            except SpoolFull as error:
                refused = error
                break
            stored += 1
        assert refused is not None and "max_size" in str(refused)
        assert 3 <= stored < 10
        assert spool.room() < 40_000


async def test_bodies_stored_together_are_written_beside_the_loop_and_flushed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = make_spool(tmp_path)
    with opened(spool):
        await store(spool, body_of(0))  # the segment exists, its directory entry is durable
        loop_thread = threading.current_thread()
        writers: list[threading.Thread] = []
        flushes: list[int] = []
        real_pwrite, real_fdatasync = os.pwrite, os.fdatasync

        def pwrite(fd: int, data: memoryview, offset: int) -> int:
            writers.append(threading.current_thread())
            return real_pwrite(fd, data, offset)

        def fdatasync(fd: int) -> None:
            flushes.append(fd)
            real_fdatasync(fd)

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        stored = await asyncio.gather(*(store(spool, body_of(n)) for n in range(1, 11)))
        assert len(writers) == 10 and loop_thread not in writers
        assert len(flushes) == 1  # one commit, one flush for its ten bodies
        assert [spool.body(message.body_id) for message in stored] == [body_of(n) for n in range(1, 11)]


async def test_a_flush_that_fails_once_is_retried_with_the_bodies_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed fdatasync the kernel may forget the pages it could not write: the retry
    writes the bodies again before flushing, so what it commits is on disk."""
    spool = make_spool(tmp_path)
    with opened(spool):
        real_pwrite, real_fdatasync = os.pwrite, os.fdatasync
        calls: list[str] = []

        def pwrite(fd: int, data: memoryview, offset: int) -> int:
            calls.append("write")
            return real_pwrite(fd, data, offset)

        def fdatasync(fd: int) -> None:
            calls.append("flush")
            if calls.count("flush") == 1:
                raise OSError(errno.EIO, "Input/output error")
            real_fdatasync(fd)

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        stored = await asyncio.gather(store(spool, body_of(1)), store(spool, body_of(2)))
        assert calls[:3] == ["write", "write", "flush"]  # the batch, whose flush failed ...
        assert calls[3:5] == ["write", "flush"]  # ... then each body alone, written again
        assert [spool.body(message.body_id) for message in stored] == [body_of(1), body_of(2)]


async def test_an_empty_body_stays_in_the_database_even_with_segments_from_zero(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path, segment_from=0)
    with opened(spool):
        message = await store(spool, b"")
    again = SqliteSpool(tmp_path, segment_from=0)
    with opened(again):
        assert (await again.check()).quarantined == ()
        assert again.body(message.body_id) == b""


async def test_under_max_size_the_space_of_delivered_mail_is_given_back_while_running(tmp_path: Path) -> None:
    """The active segment's dead bytes count against the cap: emptied, it is given back,
    or a cap under the segment size would refuse medium mail for good."""
    spool = SqliteSpool(tmp_path, inline_limit=64 * 1024, segment_from=FROM, max_size=2 * 1024 * 1024)
    with opened(spool):
        for n in range(60):  # 3 MB through a 2 MiB cap, each delivered before the next
            await deliver(spool, await store(spool, body_of(n, 50_000)))
            await settled(spool, rounds=4)
        assert spool.room() > 1024 * 1024


async def test_a_segment_emptied_while_it_was_active_is_compacted_once_closed(tmp_path: Path) -> None:
    spool = make_spool(tmp_path, segment_size=30_000)
    with opened(spool):
        old = [await store(spool, body_of(n)) for n in range(10)]
        (old_segment,) = rows(spool.db_path, "SELECT segment FROM body WHERE id = ?", old[0].body_id)[0]
        for message in old[:8]:  # delivered while their segment still takes new bodies
            await deliver(spool, message)
        await settled(spool)
        assert format_id(old_segment) in segment_files(spool)  # type: ignore[arg-type]
        await store(spool, body_of(10))  # the segment is full: a new one starts, the old one closes
        await settled(spool)
        assert format_id(old_segment) not in segment_files(spool)  # type: ignore[arg-type]
        assert [spool.body(message.body_id) for message in old[8:]] == [body_of(8), body_of(9)]


async def test_bodies_waiting_for_the_next_commit_are_written_and_flushed_while_the_one_before_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next batch's COMMIT then waits for its WAL's fsync alone, not for its segment's first:
    its bodies were made durable beside the commit before it (the early thread), once."""
    spool = make_spool(tmp_path)
    with opened(spool):
        await store(spool, body_of(0))  # the segment exists, its directory entry is durable
        real_pwrite, real_fdatasync = os.pwrite, os.fdatasync
        writes: list[str] = []
        flushes: list[str] = []
        early_written = threading.Event()

        def pwrite(fd: int, data: memoryview, offset: int) -> int:
            writes.append(threading.current_thread().name)
            if writes.count("spool-early") == 5:
                early_written.set()
            return real_pwrite(fd, data, offset)

        def fdatasync(fd: int) -> None:
            flushes.append(threading.current_thread().name)
            if len(flushes) == 1:  # the first batch's: held until the next batch's bodies are written
                assert early_written.wait(5)
            real_fdatasync(fd)

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        first = asyncio.ensure_future(store(spool, body_of(1)))
        await asyncio.sleep(0.01)  # its batch is in flight
        later = [asyncio.ensure_future(store(spool, body_of(n))) for n in range(2, 7)]
        stored = await asyncio.gather(first, *later)
        assert writes == ["spool-commit"] + ["spool-early"] * 5  # each body written once
        assert flushes == ["spool-commit", "spool-early"]  # the second batch flushed nothing itself
        assert [spool.body(message.body_id) for message in stored] == [body_of(n) for n in range(1, 7)]


def test_a_flush_returns_only_once_what_a_flush_under_way_took_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads flush (the commit thread, the early one): the one that finds nothing left to
    flush must not let its COMMIT go before the other's fdatasync has ended."""
    segments = Segments(tmp_path, iter(range(1, 100)).__next__, segment_size=1 << 20)
    segments.open([])
    segment, offset = segments.reserve(10)
    segments.write(segment, offset, b"0123456789")
    release = threading.Event()
    events: list[str] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        release.wait(5)
        real_fdatasync(fd)
        events.append("durable")

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    under_way = threading.Thread(target=segments.flush, args=(segments.mark(),))
    under_way.start()
    time.sleep(0.05)  # it took the segment, and waits in its fdatasync

    def second() -> None:
        segments.flush(segments.mark())
        events.append("second flush returned")

    other = threading.Thread(target=second)
    other.start()
    time.sleep(0.1)
    release.set()
    under_way.join(5)
    other.join(5)
    segments.close()
    assert events == ["durable", "second flush returned"]


def test_bodies_written_before_a_failed_flush_are_not_taken_as_durable_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linux tells an fdatasync error once, to one flush; the next says 0 though the pages may be
    lost. With the early thread and the commit thread writing to one segment, the flush that
    got the error may be the other thread's: a body written before it must not count as
    durable, whichever flush comes next."""
    segments = Segments(tmp_path, iter(range(1, 100)).__next__, segment_size=1 << 20)
    segments.open([])
    since = segments.mark()  # the commit thread's batch starts writing
    mine, at = segments.reserve(10)
    segments.write(mine, at, b"0123456789")
    real_fdatasync = os.fdatasync
    failing = [True]

    def fdatasync(fd: int) -> None:
        if failing and failing.pop():
            raise OSError(errno.EIO, "Input/output error")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    other_since = segments.mark()  # the early thread's flush takes the segment, and fails
    with pytest.raises(SpoolWriteError):
        segments.flush(other_since)
    with pytest.raises(SpoolWriteError, match="written again"):
        segments.flush(since)  # its fdatasync says 0 now: the batch must not commit
    again = segments.mark()  # the retry writes its body again, then flushes: durable
    segments.write(mine, at, b"0123456789")
    segments.flush(again)
    segments.release(mine)
    segments.close()
