"""Start-up check of the spool: every entry is readable, or set aside in quarantine.

Runs once, before the writer thread starts, on the spool's own connection:

* each message's envelope must decode and its body must exist (inline, or a file of the
  recorded size); an entry that fails is moved, with the reason, to the `quarantine`
  table. Its body is kept. Nothing is deleted that a client was given a 250 for;
* body rows that no message or quarantine entry refers to are removed (their messages
  were all delivered, or never committed);
* files in `data/` with no body row are removed: their transaction never committed, so
  no client was told the message was accepted.

KumoMTA deletes corrupt entries with only a trace line; we keep them for an operator.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import msgspec

from pigeon.message import ENVELOPE_DECODER, SpoolId, format_id
from pigeon.spool.spool import Quarantined, RecoveryReport


def recover(conn: sqlite3.Connection, data_dir: Path) -> RecoveryReport:
    quarantined = _check_messages(conn, data_dir)
    if quarantined:
        _quarantine(conn, quarantined)
    orphan_bodies = _remove_orphan_bodies(conn, data_dir)
    orphan_files = _remove_orphan_files(conn, data_dir)
    messages = conn.execute("SELECT count(*) FROM message").fetchone()[0]
    return RecoveryReport(messages, tuple(quarantined), orphan_bodies, orphan_files)


def _check_messages(conn: sqlite3.Connection, data_dir: Path) -> list[Quarantined]:
    bad: list[Quarantined] = []
    # Read text as bytes: one row with invalid UTF-8 must not stop the whole scan.
    conn.text_factory = bytes
    try:
        rows = conn.execute(
            "SELECT m.id, m.queue, typeof(m.queue), m.envelope, typeof(m.envelope),"
            " b.id, b.size, b.data IS NULL, typeof(b.data)"
            " FROM message m LEFT JOIN body b ON b.id = m.body"
        )
        file_sizes: dict[int, int | None] = {}
        for spool_id, queue, queue_type, envelope, envelope_type, body_id, size, in_file, data_type in rows:
            reason = _problem(
                queue, queue_type, envelope, envelope_type, body_id, size, in_file, data_type, data_dir, file_sizes
            )
            if reason is not None:
                bad.append(Quarantined(SpoolId(spool_id), reason))
    finally:
        conn.text_factory = str
    return bad


def _problem(
    queue: bytes | None,
    queue_type: bytes,
    envelope: bytes | None,
    envelope_type: bytes,
    body_id: int | None,
    size: object,
    in_file: int,
    data_type: bytes,
    data_dir: Path,
    file_sizes: dict[int, int | None],
) -> str | None:
    if queue_type != b"text" or not queue:
        return "queue name missing"
    try:
        queue.decode("utf-8")
    except UnicodeDecodeError:
        return "queue name is not UTF-8"
    if envelope_type != b"blob" or envelope is None:
        return "envelope is not a blob"
    try:
        decoded = ENVELOPE_DECODER.decode(envelope)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        return f"envelope does not decode: {error}"
    if not decoded.recipients:
        return "envelope has no recipients"
    if body_id is None:
        return "body missing"
    if not isinstance(size, int):
        return "body size missing"
    if in_file:
        if body_id not in file_sizes:
            try:
                file_sizes[body_id] = (data_dir / format_id(body_id)).stat().st_size
            except OSError:
                file_sizes[body_id] = None
        actual = file_sizes[body_id]
        if actual is None:
            return f"body file data/{format_id(body_id)} missing"
        if actual != size:
            return f"body file data/{format_id(body_id)} has {actual} bytes, expected {size}"
    elif data_type != b"blob":
        return f"body data is {data_type.decode()}, expected a blob"
    return None


def _quarantine(conn: sqlite3.Connection, entries: list[Quarantined]) -> None:
    now = time.time()
    conn.execute("BEGIN IMMEDIATE")
    try:
        for entry in entries:
            conn.execute(
                "INSERT OR REPLACE INTO quarantine (id, at, reason, body, queue, envelope)"
                " SELECT id, ?, ?, body, queue, envelope FROM message WHERE id = ?",
                (now, entry.reason, entry.id),
            )
            conn.execute("DELETE FROM message WHERE id = ?", (entry.id,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _remove_orphan_bodies(conn: sqlite3.Connection, data_dir: Path) -> int:
    orphans = conn.execute(
        "SELECT id, data IS NULL FROM body"
        " WHERE id NOT IN (SELECT body FROM message)"
        " AND id NOT IN (SELECT body FROM quarantine WHERE body IS NOT NULL)"
    ).fetchall()
    if not orphans:
        return 0
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany("DELETE FROM body WHERE id = ?", [(body_id,) for body_id, _ in orphans])
    conn.execute("DELETE FROM body_ref WHERE body NOT IN (SELECT id FROM body)")
    conn.execute("COMMIT")
    for body_id, in_file in orphans:
        if in_file:
            (data_dir / format_id(body_id)).unlink(missing_ok=True)
    return len(orphans)


def _remove_orphan_files(conn: sqlite3.Connection, data_dir: Path) -> int:
    known = {format_id(row[0]) for row in conn.execute("SELECT id FROM body WHERE data IS NULL")}
    removed = 0
    for path in data_dir.iterdir():
        if path.name not in known:
            path.unlink(missing_ok=True)
            removed += 1
    return removed
