"""Checking the spool after a start: every entry is readable, or set aside in quarantine.

Opening the spool reads no message, so a node holding a million deferred messages answers
at once (reading and decoding them all took 3.5 s of the 4.7 s it needed to start). The
check happens in two places instead:

* whenever messages are read (`due`, `scan`, `get`): a row whose queue name or envelope
  does not decode, or whose body is missing, is left out of the answer and set aside, so it
  is never delivered or listed;
* in the background, once the node serves (`SqliteSpool.check`): every row stored before the
  open, in short chunks, so an entry nobody reads for days is set aside now, as before; then
  the leftovers of writes that never committed are removed.

An entry set aside moves, with the reason, to the `quarantine` table. Its body is kept.
Nothing is deleted that a client was given a 250 for. Moving it is a write, so it goes
through the group commit like every other write, and the commit checks the row again: one
delivered meanwhile, or already set aside by the other path, is skipped, so each entry is
reported once.

Leftovers: body rows that no message or quarantine entry refers to (their messages were all
delivered, or never committed), and files in `data/` with no body row (their transaction
never committed, so no client was told the message was accepted). New bodies are written
to `data/<id>` before their row commits, so the sweep only touches ids below the first one
this open hands out (which includes the partial files of a run killed mid-reception: their
ids are above the last committed one, but ids are time-ordered), and other names only if
they are older than the open.

KumoMTA deletes corrupt entries with only a trace line; we keep them for an operator.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

import msgspec

from pigeon.message import ENVELOPE_DECODER, Message, SpoolId, format_id, parse_id
from pigeon.spool.spool import Quarantined

SEGMENT_DIR: Final = "segments"

ROW: Final = (
    "m.id, m.body, CAST(m.queue AS BLOB), typeof(m.queue), m.created, m.size, m.attempts, m.due,"
    " CAST(m.envelope AS BLOB), typeof(m.envelope), b.id, b.size, typeof(b.data), b.segment, b.at"
    " FROM message m LEFT JOIN body b ON b.id = m.body"
)
"""What a message is read with: its columns as stored (as bytes, so that text which is not
UTF-8 cannot fail the whole read) and what its body row says, for `read_row`."""

Row = tuple[
    int,
    int,
    bytes | None,
    str,
    float,
    int,
    int,
    float,
    bytes | None,
    str,
    int | None,
    object,
    str | None,
    object,
    object,
]
CHUNK: Final = 2000  # rows per read transaction of the background check: short, so the WAL can be checkpointed


def read_row(row: Row, data_dir: Path, file_sizes: dict[int, int | None] | None = None) -> Message | str:
    """The message a `ROW` holds, or why it cannot be used (the reason an operator reads).
    Segments are in `segments/`, beside `data_dir`.

    `file_sizes` caches the size of body files and segments shared by several rows of one pass."""
    spool_id, body_ref, queue, queue_type, created, size, attempts, due, envelope, envelope_type = row[:10]
    body_id, body_size, data_type, segment, at = row[10:]
    if queue_type != "text" or not queue:
        return "queue name missing"
    try:
        queue_name = queue.decode("utf-8")
    except UnicodeDecodeError:
        return "queue name is not UTF-8"
    if envelope_type != "blob" or envelope is None:
        return "envelope is not a blob"
    try:
        decoded = ENVELOPE_DECODER.decode(envelope)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        return f"envelope does not decode: {error}"
    if not decoded.recipients:
        return "envelope has no recipients"
    if body_id is None:
        return "body missing"
    if not isinstance(body_size, int):
        return "body size missing"
    if data_type == "null" and segment is not None:
        if not isinstance(segment, int) or not isinstance(at, int) or at < 0:
            return f"body {format_id(body_id)} has no place in a segment"
        actual = _file_size(data_dir.parent / SEGMENT_DIR, segment, file_sizes)
        if actual is None:
            return f"segment file {SEGMENT_DIR}/{format_id(segment)} missing"
        if actual < at + body_size:
            return f"segment file {SEGMENT_DIR}/{format_id(segment)} ends before body {format_id(body_id)}"
    elif data_type == "null":
        actual = _file_size(data_dir, body_id, file_sizes)
        if actual is None:
            return f"body file data/{format_id(body_id)} missing"
        if actual != body_size:
            return f"body file data/{format_id(body_id)} has {actual} bytes, expected {body_size}"
    elif data_type != "blob":
        return f"body data is {data_type}, expected a blob"
    return Message(
        id=SpoolId(spool_id),
        queue=queue_name,
        envelope=decoded,
        created=created,
        size=size,
        body_id=SpoolId(body_ref),
        attempts=attempts,
        due=due,
    )


def _file_size(directory: Path, file_id: int, cache: dict[int, int | None] | None) -> int | None:
    # Body and segment ids come from one generator: one cache serves both.
    if cache is not None and file_id in cache:
        return cache[file_id]
    try:
        found: int | None = os.stat(directory / format_id(file_id)).st_size
    except OSError:
        found = None
    if cache is not None:
        cache[file_id] = found
    return found


# --- the background check (its own read connection, in a thread) ----------------------------------
def unreadable(conn: sqlite3.Connection, data_dir: Path, after: int, last: int) -> tuple[list[Quarantined], int, int]:
    """One chunk of the background check: rows with `after` < id <= `last`. Returns the
    unreadable ones, the last id read (the next chunk's `after`), and how many were read."""
    rows = conn.execute(f"SELECT {ROW} WHERE m.id > ? AND m.id <= ? ORDER BY m.id LIMIT ?", (after, last, CHUNK))
    bad: list[Quarantined] = []
    file_sizes: dict[int, int | None] = {}
    read = 0
    for row in rows:
        read += 1
        after = row[0]
        checked = read_row(row, data_dir, file_sizes)
        if isinstance(checked, str):
            bad.append(Quarantined(SpoolId(after), checked))
    return bad, after, read


def orphan_bodies(conn: sqlite3.Connection, last: int) -> list[int]:
    """Body rows (stored before the open: ids up to `last`) that nothing refers to.

    One statement, so it sees messages and quarantine at one instant. Such a body stays an
    orphan: a message is only ever stored with a new body, in the body's own transaction."""
    rows = conn.execute(
        "SELECT id FROM body WHERE id <= ?"
        " AND id NOT IN (SELECT body FROM message)"
        " AND id NOT IN (SELECT body FROM quarantine WHERE body IS NOT NULL)",
        (last,),
    )
    return [body_id for (body_id,) in rows]


def remove_orphan_files(
    conn: sqlite3.Connection,
    data_dir: Path,
    first: int,
    opened_at: float,
    removing: Callable[[int, int], None] | None = None,
) -> int:
    """Remove files in `data/` that no body row keeps: those named by an id below `first`,
    the first id this open handed out (a reception of this run writes its file before its
    row commits, always with a later id; an earlier run killed mid-reception left files with
    ids between its last commit and `first`), and any other name older than the open. Returns how many were removed.
    `removing(id, size)` is told of each body file before it goes (`BodyFiles.freed`).
    (Segments no row names are found at the open: `Segments.open`.)"""
    removed = 0
    with os.scandir(data_dir) as entries:
        for entry in entries:
            try:
                body_id: int | None = parse_id(entry.name)
            except ValueError:
                body_id = None
            if body_id is None:
                keep = entry.stat(follow_symlinks=False).st_mtime >= opened_at
            else:
                keep = body_id >= first or _has_file(conn, body_id)
            if keep:
                continue
            if body_id is not None and removing is not None:
                try:
                    removing(body_id, entry.stat(follow_symlinks=False).st_size)
                except FileNotFoundError:
                    continue
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                continue  # freed meanwhile
            removed += 1
    return removed


def _has_file(conn: sqlite3.Connection, body_id: int) -> bool:
    found = conn.execute("SELECT 1 FROM body WHERE id = ? AND data IS NULL AND segment IS NULL", (body_id,))
    return found.fetchone() is not None


# --- the writes, through the group commit ------------------------------------------------------------
class SetAside:
    """Move unreadable messages to quarantine. Its result: those moved, with their reasons."""

    __slots__ = ("data_dir", "entries")

    def __init__(self, entries: Iterable[Quarantined], data_dir: Path) -> None:
        self.entries = list(entries)
        self.data_dir = data_dir

    def apply(self, conn: sqlite3.Connection) -> list[Quarantined]:
        now = time.time()
        moved = []
        for entry in self.entries:
            # Read again in the write transaction: only a row that is still there and still
            # unreadable moves (a body file may have been restored, or the row delivered).
            row = conn.execute(f"SELECT {ROW} WHERE m.id = ?", (entry.id,)).fetchone()
            if row is None:
                continue
            reason = read_row(row, self.data_dir)
            if not isinstance(reason, str):
                continue
            conn.execute(
                "INSERT OR REPLACE INTO quarantine (id, at, reason, body, queue, envelope)"
                " SELECT id, ?, ?, body, queue, envelope FROM message WHERE id = ?",
                (now, reason, entry.id),
            )
            conn.execute("DELETE FROM message WHERE id = ?", (entry.id,))
            moved.append(Quarantined(entry.id, reason))
        return moved

    def prepare(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class RemoveBodies:
    """Delete orphan body rows (see `orphan_bodies`): `free` names them to the spool's batch
    hook, which deletes them, counts their segments' bytes and removes their files once the
    deletion is durable."""

    __slots__ = ("free", "ids")

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def apply(self, conn: sqlite3.Connection) -> None:
        for start in range(0, len(self.ids), 500):
            chunk = self.ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            conn.execute(f"DELETE FROM body_ref WHERE body IN ({marks})", chunk)
        self.free = self.ids

    def prepare(self) -> None:
        pass

    def abandon(self) -> None:
        pass
