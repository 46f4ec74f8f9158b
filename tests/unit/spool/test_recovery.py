"""Opening a spool after damage: unreadable entries are set aside in quarantine with a reason
(by the check that follows the open, or when first read), leftovers of uncommitted writes are
removed, everything else is kept, and a database that cannot be read at all stops start-up
with advice for the operator."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from pigeon.message import ENVELOPE_ENCODER, Envelope, Recipient, SpoolId, format_id
from pigeon.spool.spool import NewMessage, Quarantined, RecoveryReport, SpoolCorrupt
from pigeon.spool.sqlite import SqliteSpool

INLINE_LIMIT = 64
SMALL = b"Subject: small\r\n\r\nhi\r\n"  # kept in the database
LARGE = b"Subject: large\r\n\r\n" + b"x" * 200 + b"\r\n"  # spilled to data/<id>


# --- helpers -----------------------------------------------------------------------------
@asynccontextmanager
async def opened(directory: Path) -> AsyncIterator[tuple[SqliteSpool, RecoveryReport]]:
    """Open the spool and run its check to the end, as a node does once it serves."""
    spool = SqliteSpool(directory, inline_limit=INLINE_LIMIT)
    spool.open(asyncio.get_running_loop())
    try:
        yield spool, await spool.check()
    finally:
        spool.close()


async def fill(directory: Path, *bodies: bytes) -> list[tuple[SpoolId, SpoolId]]:
    """Store one single-domain reception per body, close the spool: [(message id, body id)]."""
    stored = []
    async with opened(directory) as (spool, _):
        for data in bodies:
            body_id, message_id = spool.new_ids(2)
            writer = spool.body_writer(body_id)
            writer.write(data)
            now = time.time()
            envelope = Envelope("sender@example.org", [Recipient("rcpt@example.com")])
            await spool.store(writer.finish(), [NewMessage(message_id, "default@example.com", envelope, now, now)])
            stored.append((message_id, body_id))
    return stored


def execute(directory: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(directory / "spool.db", isolation_level=None)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def message_ids(directory: Path) -> list[int]:
    return [row[0] for row in execute(directory, "SELECT id FROM message ORDER BY id")]  # type: ignore[misc]


# --- quarantine ------------------------------------------------------------------------------
async def test_message_with_garbage_envelope_is_quarantined_and_the_others_kept(tmp_path: Path) -> None:
    (first, _), (bad, bad_body), (third, _) = await fill(tmp_path, SMALL, SMALL, LARGE)
    execute(tmp_path, "UPDATE message SET envelope = ? WHERE id = ?", b"\xc1\xc1 not msgpack", bad)

    async with opened(tmp_path) as (spool, report):
        assert [entry.id for entry in report.quarantined] == [bad]
        assert report.quarantined[0].reason.startswith("envelope does not decode")
        assert report.messages == 2
        assert spool.count == 2

    assert message_ids(tmp_path) == [first, third]
    kept = execute(tmp_path, "SELECT id, reason, body, queue, envelope FROM quarantine")
    assert kept == [(bad, report.quarantined[0].reason, bad_body, "default@example.com", b"\xc1\xc1 not msgpack")]
    # The body of a quarantined message is kept for the operator.
    assert execute(tmp_path, "SELECT data FROM body WHERE id = ?", bad_body) == [(SMALL,)]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("UPDATE message SET envelope = ? WHERE id = ?", "envelope does not decode"),
        ("UPDATE message SET envelope = CAST(? AS TEXT) WHERE id = ?", "envelope is not a blob"),
        ("UPDATE message SET queue = ? WHERE id = ?", "queue name missing"),
    ],
    ids=["wrong-shape", "text-envelope", "empty-queue"],
)
async def test_message_with_unreadable_envelope_or_queue_is_quarantined_with_the_reason(
    tmp_path: Path, damage: str, reason: str
) -> None:
    ((message, _),) = await fill(tmp_path, SMALL)
    value: object = b"not an envelope" if "CAST" in damage else ENVELOPE_ENCODER.encode([1, 2, 3])
    execute(tmp_path, damage, "" if "queue" in damage else value, message)

    async with opened(tmp_path) as (_, report):
        assert [(entry.id, entry.reason.split(":")[0]) for entry in report.quarantined] == [(message, reason)]
    assert message_ids(tmp_path) == []


@pytest.mark.parametrize("column", ["envelope", "queue"])
async def test_message_with_text_that_is_not_utf8_is_quarantined_not_fatal(tmp_path: Path, column: str) -> None:
    (kept, _), (bad, _) = await fill(tmp_path, SMALL, SMALL)
    execute(tmp_path, f"UPDATE message SET {column} = CAST(? AS TEXT) WHERE id = ?", b"\xff\xfe garbage", bad)

    async with opened(tmp_path) as (spool, report):
        assert [entry.id for entry in report.quarantined] == [bad]
        assert spool.count == 1
    assert message_ids(tmp_path) == [kept]


async def test_message_whose_envelope_has_no_recipients_is_quarantined(tmp_path: Path) -> None:
    ((message, _),) = await fill(tmp_path, SMALL)
    empty = ENVELOPE_ENCODER.encode(Envelope("sender@example.org", []))
    execute(tmp_path, "UPDATE message SET envelope = ? WHERE id = ?", empty, message)

    async with opened(tmp_path) as (_, report):
        assert report.quarantined == (Quarantined(message, "envelope has no recipients"),)


async def test_message_whose_body_row_is_gone_is_quarantined(tmp_path: Path) -> None:
    ((message, body),) = await fill(tmp_path, SMALL)
    execute(tmp_path, "DELETE FROM body WHERE id = ?", body)

    async with opened(tmp_path) as (_, report):
        assert report.quarantined == (Quarantined(message, "body missing"),)


async def test_message_whose_inline_body_is_not_a_blob_is_quarantined(tmp_path: Path) -> None:
    ((message, body),) = await fill(tmp_path, SMALL)
    execute(tmp_path, "UPDATE body SET data = 'text' WHERE id = ?", body)

    async with opened(tmp_path) as (_, report):
        assert report.quarantined == (Quarantined(message, "body data is text, expected a blob"),)


async def test_message_whose_body_file_was_deleted_is_quarantined_naming_the_file(tmp_path: Path) -> None:
    (kept, _), (lost, lost_body) = await fill(tmp_path, LARGE, LARGE)
    (tmp_path / "data" / format_id(lost_body)).unlink()

    async with opened(tmp_path) as (spool, report):
        assert report.quarantined == (Quarantined(lost, f"body file data/{format_id(lost_body)} missing"),)
        assert spool.count == 1
    assert message_ids(tmp_path) == [kept]
    assert execute(tmp_path, "SELECT id, reason FROM quarantine") == [(lost, report.quarantined[0].reason)]


async def test_message_whose_body_file_is_truncated_is_quarantined_and_the_file_kept(tmp_path: Path) -> None:
    ((message, body),) = await fill(tmp_path, LARGE)
    path = tmp_path / "data" / format_id(body)
    path.write_bytes(LARGE[:50])

    async with opened(tmp_path) as (_, report):
        reason = f"body file data/{format_id(body)} has 50 bytes, expected {len(LARGE)}"
        assert report.quarantined == (Quarantined(message, reason),)
        assert report.orphan_files_removed == 0
    assert path.read_bytes() == LARGE[:50]


async def test_every_message_sharing_a_lost_body_file_is_quarantined(tmp_path: Path) -> None:
    ((message, body),) = await fill(tmp_path, LARGE)
    # A second message of the same reception (another destination domain) shares the body.
    twin = message + 1
    execute(
        tmp_path,
        "INSERT INTO message (id, body, queue, created, size, attempts, due, envelope)"
        " SELECT ?, body, 'default@example.net', created, size, attempts, due, envelope FROM message WHERE id = ?",
        twin,
        message,
    )
    (tmp_path / "data" / format_id(body)).unlink()

    async with opened(tmp_path) as (_, report):
        assert sorted(entry.id for entry in report.quarantined) == [message, twin]


async def test_quarantined_entry_stays_quarantined_and_is_not_reported_again(tmp_path: Path) -> None:
    ((message, _),) = await fill(tmp_path, SMALL)
    execute(tmp_path, "UPDATE message SET envelope = ? WHERE id = ?", b"\xc1", message)
    async with opened(tmp_path) as (_, report):
        assert len(report.quarantined) == 1

    async with opened(tmp_path) as (_, report):
        assert report == RecoveryReport(0, (), 0, 0)
    assert execute(tmp_path, "SELECT id FROM quarantine") == [(message,)]


# --- read before the check has come to it ---------------------------------------------------------
class Told(list[Quarantined]):
    """What the spool told of entries set aside (once the move is durable)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def tell(self, entries: list[Quarantined]) -> None:
        self.extend(entries)
        self.changed.set()


async def told_of(told: Told, count: int) -> None:
    async with asyncio.timeout(5):
        while len(told) < count:
            told.changed.clear()
            await told.changed.wait()


@contextmanager
def opened_unchecked(directory: Path) -> Iterator[tuple[SqliteSpool, Told]]:
    """The spool just opened, its check not run: what reads see before it comes to a row."""
    spool = SqliteSpool(directory, inline_limit=INLINE_LIMIT)
    told = Told()
    spool.on_quarantine = told.tell
    spool.open(asyncio.get_running_loop())
    try:
        yield spool, told
    finally:
        spool.close()


@pytest.mark.parametrize("reader", ["due", "scan", "get"])
async def test_unreadable_message_read_before_the_check_is_left_out_and_quarantined(
    tmp_path: Path, reader: str
) -> None:
    (first, _), (bad, bad_body), (third, _) = await fill(tmp_path, SMALL, SMALL, LARGE)
    execute(tmp_path, "UPDATE message SET envelope = ? WHERE id = ?", b"\xc1\xc1 not msgpack", bad)

    with opened_unchecked(tmp_path) as (spool, told):
        if reader == "due":
            found = [m.id for m in spool.due(time.time() + 60, (float("-inf"), 0), 10)]
        elif reader == "scan":
            found = [m.id for m in spool.scan(0, 10)]
        else:
            found = [m.id for spool_id in (first, bad, third) if (m := spool.get(spool_id)) is not None]
        assert found == [first, third]  # never handed to delivery or to an operator's listing
        await told_of(told, 1)
        assert told == [Quarantined(bad, told[0].reason)]
        assert told[0].reason.startswith("envelope does not decode")
        assert spool.count == 2
        assert [m.id for m in spool.scan(0, 10)] == [first, third]
        report = await spool.check()  # the check after the start finds it already set aside
        assert report.quarantined == tuple(told)
        assert len(told) == 1  # told once

    assert message_ids(tmp_path) == [first, third]
    kept = execute(tmp_path, "SELECT id, reason, body, envelope FROM quarantine")
    assert kept == [(bad, told[0].reason, bad_body, b"\xc1\xc1 not msgpack")]


async def test_message_whose_body_file_is_missing_is_not_read_before_the_check(tmp_path: Path) -> None:
    (kept, _), (lost, lost_body) = await fill(tmp_path, LARGE, LARGE)
    (tmp_path / "data" / format_id(lost_body)).unlink()

    with opened_unchecked(tmp_path) as (spool, told):
        assert [m.id for m in spool.due(time.time() + 60, (float("-inf"), 0), 10)] == [kept]
        await told_of(told, 1)
        assert told == [Quarantined(lost, f"body file data/{format_id(lost_body)} missing")]


async def test_entry_read_twice_before_its_quarantine_commits_is_told_once(tmp_path: Path) -> None:
    ((bad, _),) = await fill(tmp_path, SMALL)
    execute(tmp_path, "UPDATE message SET envelope = ? WHERE id = ?", b"\xc1", bad)

    with opened_unchecked(tmp_path) as (spool, told):
        assert spool.scan(0, 10) == []
        assert spool.scan(0, 10) == []  # same loop turn: the first move is not committed yet
        await told_of(told, 1)
        await asyncio.sleep(0.05)
        assert len(told) == 1
        assert spool.count == 0
    assert execute(tmp_path, "SELECT id FROM quarantine") == [(bad,)]


async def test_body_file_of_a_reception_in_progress_survives_the_check(tmp_path: Path) -> None:
    await fill(tmp_path, LARGE)

    with opened_unchecked(tmp_path) as (spool, _):
        # A large body is written to data/ before its row commits: the check runs meanwhile.
        body_id, message_id = spool.new_ids(2)
        writer = spool.body_writer(body_id)
        writer.write(LARGE)
        report = await spool.check()
        assert report.orphan_files_removed == 0
        envelope = Envelope("sender@example.org", [Recipient("rcpt@example.com")])
        now = time.time()
        await spool.store(writer.finish(), [NewMessage(message_id, "default@example.com", envelope, now, now)])
        message = spool.get(message_id)
        assert message is not None
        assert spool.body(message.body_id) == LARGE


async def test_count_is_known_at_once_and_follows_the_changes_made_while_counting(tmp_path: Path) -> None:
    stored = await fill(tmp_path, SMALL, SMALL, LARGE)

    with opened_unchecked(tmp_path) as (spool, _):
        # Changes committed right after the open, while the count may still be running.
        (old,) = spool.scan(0, 1)
        envelope = Envelope("sender@example.org", [Recipient("rcpt@example.com")])
        now = time.time()
        changes = [spool.settle(old, None, attempts=1, due=now)]
        for _ in range(2):
            body_id, message_id = spool.new_ids(2)
            writer = spool.body_writer(body_id)
            writer.write(SMALL)
            new = NewMessage(message_id, "default@example.com", envelope, now, now)
            changes.append(spool.store(writer.finish(), [new]))
        await asyncio.gather(*changes)
        assert spool.count == len(stored) + 1
    assert len(message_ids(tmp_path)) == len(stored) + 1


# --- leftovers of uncommitted writes -----------------------------------------------------------
async def test_body_rows_without_a_message_are_removed_with_their_files(tmp_path: Path) -> None:
    ((message, body),) = await fill(tmp_path, LARGE)
    inline_orphan, file_orphan = body + 1, body + 2
    execute(tmp_path, "INSERT INTO body (id, size, data) VALUES (?, 3, x'414243')", inline_orphan)
    execute(tmp_path, "INSERT INTO body (id, size, data) VALUES (?, 3, NULL)", file_orphan)
    (tmp_path / "data" / format_id(file_orphan)).write_bytes(b"ABC")

    async with opened(tmp_path) as (_, report):
        assert report.orphan_bodies_removed == 2
        assert report.orphan_files_removed == 0
        assert report.quarantined == ()
    assert execute(tmp_path, "SELECT id FROM body") == [(body,)]
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [format_id(body)]
    assert message_ids(tmp_path) == [message]


async def test_files_in_data_without_a_body_row_are_removed(tmp_path: Path) -> None:
    ((_, body),) = await fill(tmp_path, LARGE)
    data = tmp_path / "data"
    (data / format_id(body + 1)).write_bytes(b"never committed")
    (data / "stray").write_bytes(b"junk")

    async with opened(tmp_path) as (_, report):
        assert report.orphan_files_removed == 2
        assert report.orphan_bodies_removed == 0
    assert sorted(p.name for p in data.iterdir()) == [format_id(body)]
    assert (data / format_id(body)).read_bytes() == LARGE


async def test_partial_body_files_of_a_run_killed_mid_reception_are_removed_at_the_next_start(
    tmp_path: Path,
) -> None:
    ((_, body),) = await fill(tmp_path, LARGE)
    data = tmp_path / "data"
    # A run killed mid-reception: its files are named by ids it made after its last commit.
    spool = SqliteSpool(tmp_path, inline_limit=INLINE_LIMIT)
    spool.open(asyncio.get_running_loop())
    partials = spool.new_ids(2)
    spool.close()
    for partial in partials:
        (data / format_id(partial)).write_bytes(b"x" * 1000)

    with opened_unchecked(tmp_path) as (spool, _):
        # And this run's reception in progress, whose row has not committed yet.
        writing = spool.new_ids(1)[0]
        writer = spool.body_writer(writing)
        writer.write(LARGE)
        report = await spool.check()
        assert report.orphan_files_removed == 2
        assert sorted(p.name for p in data.iterdir()) == sorted([format_id(body), format_id(writing)])
        writer.discard()


async def test_reopening_a_clean_spool_changes_nothing(tmp_path: Path) -> None:
    stored = await fill(tmp_path, SMALL, LARGE, SMALL, LARGE)

    async with opened(tmp_path) as (spool, report):
        assert report == RecoveryReport(4, (), 0, 0)
        assert spool.count == 4
    assert message_ids(tmp_path) == [message for message, _ in stored]
    assert execute(tmp_path, "SELECT count(*) FROM quarantine") == [(0,)]
    assert len(list((tmp_path / "data").iterdir())) == 2


async def test_reopening_an_empty_directory_creates_an_empty_spool(tmp_path: Path) -> None:
    async with opened(tmp_path / "new") as (spool, report):
        assert report == RecoveryReport(0, (), 0, 0)
        assert spool.db_path.exists()
        assert spool.data_dir.is_dir()


# --- ids after a restart -------------------------------------------------------------------------
async def test_ids_after_reopen_are_greater_than_every_stored_id(tmp_path: Path) -> None:
    stored = await fill(tmp_path, SMALL, LARGE)
    existing = [i for pair in stored for i in pair]

    async with opened(tmp_path) as (spool, _):
        new = spool.new_ids(100)
    assert min(new) > max(existing)


@pytest.mark.parametrize("table", ["message", "body", "quarantine", "outbox"])
async def test_ids_stay_increasing_when_the_clock_went_back_since_the_last_run(tmp_path: Path, table: str) -> None:
    ((message, _),) = await fill(tmp_path, SMALL)
    future = message + (3600 * 1000 << 22)  # an id made by a clock one hour ahead
    if table == "message":
        execute(tmp_path, "UPDATE message SET id = ? WHERE id = ?", future, message)
    elif table == "body":
        execute(tmp_path, "INSERT INTO body (id, size, data) VALUES (?, 0, x'')", future)
        execute(tmp_path, "UPDATE message SET body = ? WHERE id = ?", future, message)
    elif table == "quarantine":
        execute(tmp_path, "INSERT INTO quarantine (id, at, reason) VALUES (?, 0, 'test')", future)
    else:  # a record the log could not take, kept to be written at the next start
        execute(tmp_path, "INSERT INTO outbox (seq, record) VALUES (?, x'7b7d')", future)

    async with opened(tmp_path) as (spool, _):
        new = spool.new_ids(10)
    assert min(new) > future
    assert new == sorted(set(new))


# --- unreadable database -------------------------------------------------------------------------
async def test_file_that_is_not_a_database_stops_open_with_advice(tmp_path: Path) -> None:
    (tmp_path / "spool.db").write_bytes(b"this is not a SQLite database, just some text " * 100)

    spool = SqliteSpool(tmp_path)
    with pytest.raises(SpoolCorrupt) as caught:
        spool.open(asyncio.get_running_loop())
    spool.close()
    message = str(caught.value)
    assert str(tmp_path / "spool.db") in message
    assert "move it aside" in message
    assert "keep it" in message
    assert (tmp_path / "spool.db").read_bytes().startswith(b"this is not a SQLite database")


async def test_a_spool_of_schema_5_is_taken_to_6_which_a_pigeon_that_drops_after_attempt_marks_refuses(
    tmp_path: Path,
) -> None:
    # Envelopes may carry a hold, bounce or rebind asked of a message being sent, which a Pigeon
    # of schema 5 reads with the mark dropped (and delivers the message): schema 6 tells it to
    # refuse the spool (its "written by a newer Pigeon") instead.
    (message_id, _), *_ = await fill(tmp_path, SMALL)
    execute(tmp_path, "PRAGMA user_version = 5")
    async with opened(tmp_path) as (spool, report):
        assert report.messages == 1 and spool.get(message_id) is not None
    assert execute(tmp_path, "PRAGMA user_version") == [(6,)]


async def test_spool_from_a_newer_pigeon_is_not_opened(tmp_path: Path) -> None:
    await fill(tmp_path, SMALL)
    execute(tmp_path, "PRAGMA user_version = 99")

    spool = SqliteSpool(tmp_path)
    with pytest.raises(SpoolCorrupt) as caught:
        spool.open(asyncio.get_running_loop())
    spool.close()
    assert len(message_ids(tmp_path)) == 1
    message = str(caught.value)  # a rollback: say what to do, and not to set the mail aside
    assert "schema version 99, written by a newer Pigeon" in message
    assert "nothing was changed: start the newer Pigeon again" in message
    assert "do not move it aside" in message
