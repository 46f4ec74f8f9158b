"""The SQLite spool's write path: a reception is durable when its future resolves, writes that
arrive together share one commit, and every failure reaches the caller as a typed SpoolError
that carries the SMTP reply, with nothing half-written left behind."""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import msgspec
import pytest

from pigeon.message import ENVELOPE_DECODER, AfterAttempt, Envelope, Recipient, SpoolId, format_id, id_time, parse_id
from pigeon.spool import body as body_module
from pigeon.spool.body import Body, BodyWriter
from pigeon.spool.commit import LINGER_AFTER
from pigeon.spool.spool import (
    NewMessage,
    RecoveryReport,
    Settling,
    SpoolBusy,
    SpoolClosed,
    SpoolError,
    SpoolFull,
)
from pigeon.spool.sqlite import SqliteSpool


# --- helpers -----------------------------------------------------------------------------
@contextmanager
def opened(spool: SqliteSpool) -> Iterator[None]:
    """Open `spool` on the running loop for the duration of the block."""
    spool.open(asyncio.get_running_loop())
    try:
        yield
    finally:
        spool.close()


def envelope(*recipients: str, sender: str = "sender@example.org") -> Envelope:
    return Envelope(sender, [Recipient(address) for address in recipients or ("rcpt@example.com",)])


def reception(
    spool: SqliteSpool, data: bytes, *domains: str, recipients_per_message: int = 1
) -> tuple[Body, list[NewMessage]]:
    """A finished body and one message per destination domain, as the listener builds them."""
    domains = domains or ("example.com",)
    body_id, *message_ids = spool.new_ids(1 + len(domains))
    writer = spool.body_writer(body_id)
    for start in range(0, len(data), 1000):
        writer.write(data[start : start + 1000])
    body = writer.finish()
    now = time.time()
    messages = [
        NewMessage(
            message_id,
            f"default@{domain}",
            envelope(*(f"user{n}@{domain}" for n in range(recipients_per_message))),
            now,
            now,
        )
        for message_id, domain in zip(message_ids, domains, strict=True)
    ]
    return body, messages


async def store(spool: SqliteSpool, data: bytes, *domains: str) -> tuple[Body, list[NewMessage]]:
    body, messages = reception(spool, data, *domains)
    await spool.store(body, messages)
    return body, messages


def rows(db_path: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    """Query the spool database with a fresh connection, as another process would."""
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def data_files(spool: SqliteSpool) -> set[str]:
    return {path.name for path in spool.data_dir.iterdir()}


# --- durability ----------------------------------------------------------------------------
async def test_stored_reception_is_visible_to_a_fresh_connection_when_store_returns(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path)
    with opened(spool):
        body, messages = await store(spool, b"Subject: hi\r\n\r\nhello\r\n", "example.com", "example.net")

        stored = rows(spool.db_path, "SELECT id, body, queue, size, attempts, envelope FROM message ORDER BY id")
        assert [(r[0], r[1], r[2], r[3], r[4]) for r in stored] == [
            (messages[0].id, body.id, "default@example.com", body.size, 0),
            (messages[1].id, body.id, "default@example.net", body.size, 0),
        ]
        assert ENVELOPE_DECODER.decode(stored[0][5]) == messages[0].envelope
        assert rows(spool.db_path, "SELECT id, size, data FROM body") == [
            (body.id, len(b"Subject: hi\r\n\r\nhello\r\n"), b"Subject: hi\r\n\r\nhello\r\n")
        ]


async def test_receptions_submitted_in_one_loop_turn_share_commits(tmp_path: Path) -> None:
    batches: list[int] = []
    spool = SqliteSpool(tmp_path, observer=lambda size, seconds: batches.append(size))
    with opened(spool):
        futures = [spool.store(*reception(spool, f"message {n}\r\n".encode())) for n in range(50)]
        await asyncio.gather(*futures)

        assert sum(batches) == 50
        assert max(batches) > 1
        assert len(batches) < 50
        assert rows(spool.db_path, "SELECT count(*) FROM message") == [(50,)]


async def test_later_submissions_gather_into_the_next_commit_while_one_is_in_flight(tmp_path: Path) -> None:
    batches: list[int] = []
    spool = SqliteSpool(tmp_path, observer=lambda size, seconds: batches.append(size))
    with opened(spool):
        first = spool.store(*reception(spool, b"first\r\n"))
        await asyncio.sleep(0)  # the first batch (of one) is now committing
        rest = [spool.store(*reception(spool, f"later {n}\r\n".encode())) for n in range(20)]
        await asyncio.gather(first, *rest)

        assert batches[0] == 1
        assert sum(batches) == 21
        assert max(batches[1:]) > 1


async def test_a_busy_spool_lingers_before_its_next_commit_so_one_fsync_serves_more(tmp_path: Path) -> None:
    batches: list[tuple[int, float]] = []
    spool = SqliteSpool(
        tmp_path, commit_window=0.3, observer=lambda size, seconds: batches.append((size, time.monotonic()))
    )
    with opened(spool):
        first = spool.store(*reception(spool, b"first\r\n"))
        await asyncio.sleep(0)  # the first batch (of one) is now committing
        waiting = [spool.store(*reception(spool, f"busy {n}\r\n".encode())) for n in range(LINGER_AFTER)]
        await first
        first_done = time.monotonic()
        await asyncio.sleep(0.1)  # within the window: these join the lingering batch
        late = [spool.store(*reception(spool, f"late {n}\r\n".encode())) for n in range(3)]
        await asyncio.gather(*waiting, *late)
        waited = time.monotonic() - first_done

        assert [size for size, _ in batches] == [1, LINGER_AFTER + 3]
        assert waited >= 0.29
        assert rows(spool.db_path, "SELECT count(*) FROM message") == [(1 + LINGER_AFTER + 3,)]


async def test_a_few_writes_after_a_commit_are_committed_at_once(tmp_path: Path) -> None:
    batches: list[int] = []
    spool = SqliteSpool(tmp_path, commit_window=5.0, observer=lambda size, seconds: batches.append(size))
    with opened(spool):
        first = spool.store(*reception(spool, b"first\r\n"))
        await asyncio.sleep(0)
        few = [spool.store(*reception(spool, f"few {n}\r\n".encode())) for n in range(LINGER_AFTER - 1)]
        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(first, *few), 2.0)

        assert time.monotonic() - started < 2.0  # nowhere near the 5 s window
        assert batches == [1, LINGER_AFTER - 1]
        lone = time.monotonic()
        await asyncio.wait_for(spool.store(*reception(spool, b"lone\r\n")), 2.0)
        assert time.monotonic() - lone < 2.0


async def test_a_full_batch_stops_the_linger(tmp_path: Path) -> None:
    batches: list[int] = []
    spool = SqliteSpool(tmp_path, commit_window=5.0, max_batch=8, observer=lambda size, seconds: batches.append(size))
    with opened(spool):
        first = spool.store(*reception(spool, b"first\r\n"))
        await asyncio.sleep(0)
        waiting = [spool.store(*reception(spool, f"busy {n}\r\n".encode())) for n in range(LINGER_AFTER)]
        await first  # the next batch now lingers for up to 5 s ...
        more = [spool.store(*reception(spool, f"more {n}\r\n".encode())) for n in range(8 - LINGER_AFTER)]
        await asyncio.wait_for(asyncio.gather(*waiting, *more), 2.0)  # ... until it is full

        assert batches == [1, 8]


async def test_one_failing_reception_does_not_fail_the_others_in_its_commit(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path)
    with opened(spool):
        good_body, good_messages = reception(spool, b"good\r\n")
        bad_body, _ = reception(spool, b"bad\r\n")
        # The second reception reuses the first one's message id: its INSERT fails.
        duplicate = [NewMessage(good_messages[0].id, "q@example.com", envelope(), time.time(), time.time())]
        good, bad, also_good = (
            spool.store(good_body, good_messages),
            spool.store(bad_body, duplicate),
            spool.store(*reception(spool, b"also good\r\n")),
        )
        results = await asyncio.gather(good, bad, also_good, return_exceptions=True)

        assert results[0] is None
        assert isinstance(results[1], SpoolError)
        assert (results[1].reply.code, results[1].reply.enhanced) == (451, "4.3.0")
        assert results[2] is None
        assert spool.count == 2
        assert rows(spool.db_path, "SELECT count(*) FROM message") == [(2,)]
        assert rows(spool.db_path, "SELECT count(*) FROM body WHERE id = ?", bad_body.id) == [(0,)]


async def test_a_dsn_and_the_outcome_it_reports_commit_together_or_not_at_all(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path)
    with opened(spool):
        _, [kept] = await store(spool, b"bounced, but its DSN fails\r\n")
        _, [ended] = await store(spool, b"bounced\r\n")
        failing, ok = spool.get(kept.id), spool.get(ended.id)
        assert failing is not None and ok is not None
        [seq_failing, seq_ok] = spool.new_ids(2)
        bad_body, _ = reception(spool, b"DSN that cannot be stored\r\n")
        # Its INSERT fails (an id already taken), in a batch with one that works: the batch is
        # retried one operation per transaction, and the bounce must not go without its DSN.
        duplicate = [NewMessage(kept.id, "example.org", envelope(sender=""), time.time(), time.time())]
        dsn_body, [dsn] = reception(spool, b"DSN\r\n", "example.org")
        results = await asyncio.gather(
            spool.store(bad_body, duplicate, settles=Settling(failing, None, 1, 0.0, [(seq_failing, b"{}")])),
            spool.store(dsn_body, [dsn], settles=Settling(ok, None, 1, 0.0, [(seq_ok, b"{}")])),
            return_exceptions=True,
        )

        assert isinstance(results[0], SpoolError) and results[1] is None
        assert rows(spool.db_path, "SELECT id FROM message ORDER BY id") == [(kept.id,), (dsn.id,)]
        assert rows(spool.db_path, "SELECT seq FROM outbox") == [(seq_ok,)]
        assert rows(spool.db_path, "SELECT count(*) FROM body WHERE id IN (?, ?)", ok.body_id, bad_body.id) == [(0,)]
        assert spool.count == 2


async def test_an_operators_mark_is_written_to_the_row_unless_an_outcome_moved_it_on_first(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path)
    with opened(spool):
        _, [first, second] = await store(spool, b"being sent\r\n", "example.com", "example.net")
        mark = AfterAttempt("hold", "wait", "ops")
        marked = msgspec.structs.replace(first.envelope, after_attempt=mark)
        await spool.rewrite_envelope(first.id, marked, attempts=0)
        row = spool.get(first.id)
        assert row is not None and row.envelope.after_attempt == mark and row.attempts == 0
        # The attempt's outcome was submitted first (and kept one recipient): the mark it
        # applied is not written back over it.
        message = spool.get(second.id)
        assert message is not None
        settled = spool.settle(message, message.envelope, attempts=1, due=5.0)
        late = spool.rewrite_envelope(
            second.id, msgspec.structs.replace(message.envelope, after_attempt=mark), attempts=0
        )
        await asyncio.gather(settled, late)
        row = spool.get(second.id)
        assert row is not None and row.envelope.after_attempt is None and (row.attempts, row.due) == (1, 5.0)


# --- ids -----------------------------------------------------------------------------------
async def test_new_ids_are_unique_and_increasing_across_calls(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path, shard=5)
    with opened(spool):
        ids = spool.new_ids(5000) + spool.new_ids(1) + spool.new_ids(3000)

    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert {spool_id & 0x3F for spool_id in ids} == {5}  # the shard is in every id


def test_spool_id_prints_as_16_hex_digits_and_parses_back() -> None:
    spool_id = SpoolId(0x0382666F65800040)
    assert format_id(spool_id) == "0382666f65800040"
    assert parse_id("0382666f65800040") == spool_id
    assert parse_id(format_id(1)) == 1
    assert format_id(1) == "0000000000000001"
    with pytest.raises(ValueError, match="16 hex digits"):
        parse_id("abc")
    with pytest.raises(ValueError, match="16 hex digits"):
        parse_id("zzzzzzzzzzzzzzzz")


async def test_new_id_carries_the_time_it_was_made(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path)
    with opened(spool):
        before = time.time()
        (spool_id,) = spool.new_ids(1)
        after = time.time()
    assert before - 0.002 <= id_time(spool_id) <= after + 0.002
    assert parse_id(format_id(spool_id)) == spool_id


@pytest.mark.parametrize("text", ["-000000000000001", "+000000000000001", "0x00000000000001", "0000_0000_000001"])
def test_parse_id_rejects_text_that_is_not_16_hex_digits(text: str) -> None:
    with pytest.raises(ValueError, match="16 hex digits"):
        parse_id(text)


# --- bodies --------------------------------------------------------------------------------
async def test_body_larger_than_inline_limit_is_stored_in_a_data_file(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path, inline_limit=4096)
    large = bytes(range(256)) * 16 + b"!"  # 4097 bytes
    with opened(spool):
        body, _ = await store(spool, large)

        assert data_files(spool) == {format_id(body.id)}
        assert len(format_id(body.id)) == 16
        assert (spool.data_dir / format_id(body.id)).read_bytes() == large
        assert rows(spool.db_path, "SELECT size, data FROM body WHERE id = ?", body.id) == [(4097, None)]


async def test_body_of_exactly_inline_limit_stays_in_the_database(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path, inline_limit=4096)
    exact = b"x" * 4096
    with opened(spool):
        body, _ = await store(spool, exact)

        assert data_files(spool) == set()
        assert rows(spool.db_path, "SELECT size, data FROM body WHERE id = ?", body.id) == [(4096, exact)]


def test_body_that_cannot_be_spilled_fails_at_finish_with_a_spool_error(tmp_path: Path) -> None:
    writer = BodyWriter(SpoolId(1), tmp_path / "no-such-directory", inline_limit=10)
    writer.write(b"x" * 8)
    writer.write(b"y" * 8)  # crosses the limit: the spill file cannot be created
    writer.write(b"z" * 8)  # later writes are ignored, not raised

    with pytest.raises(SpoolError) as caught:
        writer.finish()
    assert (caught.value.reply.code, caught.value.reply.enhanced) == (451, "4.3.0")
    assert "no-such-directory" in str(caught.value)
    assert not (tmp_path / "no-such-directory").exists()


def test_a_body_whose_spill_file_fills_the_disk_fails_at_finish_not_mid_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a flaky test on a full tmpfs: the spill file's buffer met ENOSPC, and closing the
    # file (to drop it) flushed the buffer into ENOSPC again, out of write() and so out of the
    # listener's data_received: the connection dropped with no answer. /dev/full is that disk.
    def onto_a_full_disk(path: Path, mode: str, buffering: int) -> BinaryIO:
        assert mode == "xb"  # (a spill file)
        return open("/dev/full", "wb", buffering=buffering)

    monkeypatch.setattr(body_module, "open", onto_a_full_disk, raising=False)
    writer = BodyWriter(SpoolId(3), tmp_path, inline_limit=10)
    writer.write(b"x" * 20)  # spilled: held in the file's buffer
    writer.write(b"y" * 64 * 1024)  # past the buffer: the write meets the full disk
    writer.write(b"z" * 8)  # later writes are ignored, not raised

    with pytest.raises(SpoolError) as caught:
        writer.finish()
    assert (caught.value.reply.code, caught.value.reply.enhanced) == (452, "4.3.1")


def test_discarded_body_leaves_no_file(tmp_path: Path) -> None:
    writer = BodyWriter(SpoolId(7), tmp_path, inline_limit=10)
    writer.write(b"x" * 100)
    assert (tmp_path / format_id(7)).exists()
    writer.discard()
    assert list(tmp_path.iterdir()) == []


# --- count and close -----------------------------------------------------------------------
async def test_count_tracks_stored_messages_and_survives_a_restart(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path)
    with opened(spool):
        assert spool.count == 0
        await store(spool, b"one\r\n", "a.example", "b.example", "c.example")
        assert spool.count == 3
        await store(spool, b"two\r\n")
        assert spool.count == 4

    again = SqliteSpool(tmp_path)
    with opened(again):
        assert again.count == 4
        assert (await again.check()).messages == 4


async def test_store_after_close_fails_with_spool_closed_and_keeps_no_body_file(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path, inline_limit=16)
    spool.open(asyncio.get_running_loop())
    await store(spool, b"before close\r\n")
    body, messages = reception(spool, b"a body large enough to be spilled to a file\r\n")
    spill = spool.data_dir / format_id(body.id)
    assert spill.exists()
    spool.close()

    with pytest.raises(SpoolClosed) as caught:
        await spool.store(body, messages)
    assert (caught.value.reply.code, caught.value.reply.enhanced) == (421, "4.3.2")
    assert not spill.exists()
    assert spool.count == 1
    assert rows(spool.db_path, "SELECT count(*) FROM message") == [(1,)]


async def test_close_commits_receptions_still_waiting_for_a_batch(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path)
    spool.open(asyncio.get_running_loop())
    futures = [spool.store(*reception(spool, f"m{n}\r\n".encode())) for n in range(5)]
    spool.close()  # before the loop ever ran the batch

    await asyncio.gather(*futures)
    assert rows(spool.db_path, "SELECT count(*) FROM message") == [(5,)]


async def test_a_store_s_then_runs_as_its_commit_completes_not_a_loop_turn_later(tmp_path: Path) -> None:
    """The listener answers 250 from `then`: each loop turn more would wait for every other
    callback and read of a busy worker."""
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    spool = SqliteSpool(tmp_path, observer=lambda size, seconds: loop.call_soon(seen.append, "next loop turn"))
    with opened(spool):
        heard: list[bool] = []

        def then(future: asyncio.Future[None]) -> None:
            heard.append(future.exception() is None)
            seen.append("then")

        await spool.store(*reception(spool, b"hello\r\n"), then=then)
        await asyncio.sleep(0)
        assert seen == ["then", "next loop turn"]
        assert heard == [True]  # once, though it is a done callback of the future too
        assert spool.count == 1  # (counted before the caller hears of it)


async def test_a_store_s_then_hears_a_refusal_once(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path)
    spool.open(asyncio.get_running_loop())
    spool.close()
    heard: list[BaseException | None] = []
    with pytest.raises(SpoolClosed):
        await spool.store(*reception(spool, b"too late\r\n"), then=lambda f: heard.append(f.exception()))
    await asyncio.sleep(0)
    assert len(heard) == 1 and isinstance(heard[0], SpoolClosed)


# --- full, busy ----------------------------------------------------------------------------
async def test_full_spool_refuses_with_452_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    # An empty spool's database takes 176 KiB (11 pages of 16 KiB), its WAL's allowance 112 KiB:
    # this leaves about 224 KiB.
    spool = SqliteSpool(tmp_path, max_size=512 * 1024, inline_limit=1024)
    stored: list[Body] = []
    with opened(spool):
        for n in range(500):
            # Alternate bodies kept in the database and bodies spilled to data/ files: either
            # may be the one refused, by its writer (a file) or by the store.
            data = (b"%d " % n) * (150 if n % 2 else 400)
            try:
                body, messages = reception(spool, data, recipients_per_message=30)
                await spool.store(body, messages)
            except SpoolFull as full:
                error = full
                break
            stored.append(body)
        else:
            pytest.fail("a 512 KiB spool accepted 500 receptions")

        assert (error.reply.code, error.reply.enhanced) == (452, "4.3.1")
        assert len(stored) > 5
        assert spool.count == len(stored)
        assert rows(spool.db_path, "SELECT count(*) FROM message") == [(len(stored),)]
        assert rows(spool.db_path, "SELECT count(*) FROM body") == [(len(stored),)]
        assert data_files(spool) == {format_id(body.id) for body in stored if body.data is None}

    again = SqliteSpool(tmp_path)
    with opened(again):
        assert await again.check() == RecoveryReport(len(stored), (), 0, 0)


async def test_second_open_of_the_same_spool_is_refused_as_busy(tmp_path: Path) -> None:
    first = SqliteSpool(tmp_path)
    with opened(first):
        second = SqliteSpool(tmp_path)
        with pytest.raises(SpoolBusy, match=f"pid {os.getpid()}"):
            second.open(asyncio.get_running_loop())

    third = SqliteSpool(tmp_path)  # once the first has closed, the spool can be opened again
    with opened(third):
        assert third.count == 0


# --- fsync failures ------------------------------------------------------------------------
class _FailingFile:
    """A spilled body file whose data cannot reach the disk (EIO at flush/fsync)."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    def flush(self) -> None:
        raise OSError(errno.EIO, "Input/output error")

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        self._file.close()


async def test_body_that_cannot_be_fsynced_alone_is_refused(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path, inline_limit=16)
    with opened(spool):
        body, messages = reception(spool, b"x" * 100)
        body.file = _FailingFile(body.file)  # type: ignore[arg-type]

        with pytest.raises(SpoolError, match="Input/output error"):
            await spool.store(body, messages)
        assert spool.count == 0
        assert rows(spool.db_path, "SELECT count(*) FROM message") == [(0,)]
        assert data_files(spool) == set()


async def test_body_that_cannot_be_fsynced_is_refused_even_when_it_shares_a_commit(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path, inline_limit=16)
    with opened(spool):
        failing_body, failing_messages = reception(spool, b"x" * 100)
        failing_body.file = _FailingFile(failing_body.file)  # type: ignore[arg-type]
        failing = spool.store(failing_body, failing_messages)
        healthy = spool.store(*reception(spool, b"y" * 100))
        results = await asyncio.gather(failing, healthy, return_exceptions=True)

        assert results[1] is None
        assert isinstance(results[0], SpoolError)
        assert rows(spool.db_path, "SELECT count(*) FROM message WHERE id = ?", failing_messages[0].id) == [(0,)]


# --- after the commit ----------------------------------------------------------------------------
async def test_a_freed_body_file_that_cannot_be_removed_does_not_fail_or_replay_its_committed_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spool = SqliteSpool(tmp_path, inline_limit=16)
    with opened(spool):
        body, messages = await store(spool, b"x" * 100)  # its body is a data file
        assert data_files(spool) == {format_id(body.id)}
        message = spool.get(messages[0].id)
        assert message is not None
        unlink = Path.unlink

        def refuse_in_data_dir(path: Path, missing_ok: bool = False) -> None:
            if path.parent == spool.data_dir:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            unlink(path, missing_ok=missing_ok)

        monkeypatch.setattr(Path, "unlink", refuse_in_data_dir)
        # One commit: the settlement that frees that body (its removal then fails), and a new
        # reception. Both have outbox records: applied twice, their INSERTs would collide.
        delivered, received = spool.new_ids(2)
        settled = spool.settle(message, None, attempts=1, due=0.0, records=[(delivered, b'{"type":"Delivery"}')])
        new_body, new_messages = reception(spool, b"another\r\n")
        stored = spool.store(new_body, new_messages, [(received, b'{"type":"Reception"}')])
        results = await asyncio.gather(settled, stored, return_exceptions=True)

        assert results == [None, None]
        assert spool.count == 1
        assert rows(spool.db_path, "SELECT id FROM message") == [(new_messages[0].id,)]
        assert rows(spool.db_path, "SELECT id FROM body") == [(new_body.id,)]
        assert rows(spool.db_path, "SELECT seq FROM outbox ORDER BY seq") == [(delivered,), (received,)]
        assert "cannot remove freed body file" in caplog.text
        assert data_files(spool) == {format_id(body.id)}  # left behind ...
    monkeypatch.undo()
    again = SqliteSpool(tmp_path, inline_limit=16)
    with opened(again):
        report = await again.check()
        assert report.orphan_files_removed == 1  # ... for the check after the next start to remove
        assert report.messages == 1


async def test_an_after_commit_step_that_raises_is_logged_and_the_batch_stays_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spool = SqliteSpool(tmp_path, inline_limit=16)
    with opened(spool):
        _, messages = await store(spool, b"x" * 100)
        message = spool.get(messages[0].id)
        assert message is not None
        free_bodies = spool._before_commit

        def failing_after(conn: sqlite3.Connection, ops: list[object]) -> object:
            after = free_bodies(conn, ops)  # type: ignore[arg-type]

            def fail() -> None:
                if after is not None:
                    after()
                raise OSError(errno.EIO, "Input/output error")

            return fail

        monkeypatch.setattr(spool._committer, "_before_commit", failing_after)
        (seq,) = spool.new_ids(1)
        await spool.settle(message, None, attempts=1, due=0.0, records=[(seq, b'{"type":"Delivery"}')])

        assert rows(spool.db_path, "SELECT count(*) FROM message") == [(0,)]
        assert rows(spool.db_path, "SELECT seq FROM outbox") == [(seq,)]
        assert "committed, but the clean-up after the commit failed" in caplog.text
