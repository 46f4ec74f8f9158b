"""The default spool: SQLite in WAL mode with `synchronous=FULL`, plus files for large bodies.

Layout under the spool directory:

    spool.db      message (envelope, queue, schedule), body (inline data), quarantine
    data/<id>     bodies larger than `inline_limit`

Message metadata and body bytes live in separate tables, so a retry that rewrites the
attempt count and due time does not rewrite the body. Several messages of one reception
(one per destination domain) share one body row.

Only the group-commit thread writes. Readers open their own connections (WAL lets them
read while the writer commits).
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from pigeon.message import ENVELOPE_ENCODER, IdGenerator, SpoolId
from pigeon.spool.body import Body, BodyWriter
from pigeon.spool.commit import BatchObserver, GroupCommitter
from pigeon.spool.recovery import recover
from pigeon.spool.spool import NewMessage, RecoveryReport, SpoolBusy, SpoolCorrupt

SCHEMA_VERSION: Final = 1
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS body (
    id INTEGER PRIMARY KEY,
    size INTEGER NOT NULL,
    data BLOB                       -- NULL: the body is in data/<id as 16 hex digits>
);
CREATE TABLE IF NOT EXISTS message (
    id INTEGER PRIMARY KEY,
    body INTEGER NOT NULL,
    queue TEXT NOT NULL,
    created REAL NOT NULL,
    size INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    due REAL NOT NULL,
    envelope BLOB NOT NULL          -- msgpack of pigeon.message.Envelope
);
CREATE INDEX IF NOT EXISTS message_due ON message (due);
CREATE TABLE IF NOT EXISTS quarantine (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    reason TEXT NOT NULL,
    body INTEGER,
    queue TEXT,
    envelope BLOB
);
"""
_INSERT_BODY: Final = "INSERT INTO body (id, size, data) VALUES (?, ?, ?)"
_INSERT_MESSAGE: Final = (
    "INSERT INTO message (id, body, queue, created, size, attempts, due, envelope) VALUES (?, ?, ?, ?, ?, 0, ?, ?)"
)


class SqliteSpool:
    """Durable message store for one shard. `open()` it before use, `close()` at the end."""

    def __init__(
        self,
        directory: Path,
        *,
        shard: int = 0,
        inline_limit: int = 256 * 1024,
        commit_window: float = 0.0,
        max_batch: int = 1024,
        max_size: int | None = None,
        observer: BatchObserver | None = None,
    ) -> None:
        self.directory = directory
        self.db_path = directory / "spool.db"
        self.data_dir = directory / "data"
        self._shard = shard
        self._inline_limit = inline_limit
        self._max_size = max_size
        self._ids = IdGenerator(shard)
        self._count = 0
        self._lock_fd: int | None = None
        self._committer = GroupCommitter(self._connect, window=commit_window, max_batch=max_batch, observer=observer)

    # --- life cycle ------------------------------------------------------------------------
    def open(self, loop: asyncio.AbstractEventLoop) -> RecoveryReport:
        """Create or check the spool, quarantine unreadable entries, start the writer."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            return self._open_checked(loop)
        except BaseException:
            self._unlock()
            raise

    def _open_checked(self, loop: asyncio.AbstractEventLoop) -> RecoveryReport:
        try:
            conn = self._connect()
            try:
                self._migrate(conn)
                report = recover(conn, self.data_dir)
                last = conn.execute(
                    "SELECT max(coalesce((SELECT max(id) FROM message), 0),"
                    " coalesce((SELECT max(id) FROM body), 0),"
                    " coalesce((SELECT max(id) FROM quarantine), 0))"
                ).fetchone()[0]
            finally:
                conn.close()
        except sqlite3.DatabaseError as error:
            raise SpoolCorrupt(
                f"spool database {self.db_path} cannot be read ({error}); "
                "move it aside to start with an empty spool, and keep it to recover its messages"
            ) from error
        self._ids = IdGenerator(self._shard, last)
        self._count = report.messages
        self._committer.start(loop)
        return report

    def close(self) -> None:
        """Finish the writes already queued, then stop. Later writes fail with SpoolClosed."""
        self._committer.close()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _lock(self) -> None:
        # Two processes appending to one shard would hand out the same ids: refuse.
        fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise SpoolBusy(
                f"spool {self.directory} is in use by another Pigeon process (pid {holder}); "
                "stop it, or give this one another [spool] path"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    # --- writing ---------------------------------------------------------------------------
    def new_ids(self, n: int) -> list[SpoolId]:
        return [self._ids.next() for _ in range(n)]

    def body_writer(self, body_id: SpoolId) -> BodyWriter:
        return BodyWriter(body_id, self.data_dir, self._inline_limit)

    def store(self, body: Body, messages: list[NewMessage]) -> asyncio.Future[None]:
        """Store one reception: its body and its messages, in one durable transaction."""
        rows = [
            (m.id, body.id, m.queue, m.created, body.size, m.due, ENVELOPE_ENCODER.encode(m.envelope)) for m in messages
        ]
        future = self._committer.submit(_StoreReception(body, rows))
        future.add_done_callback(functools.partial(self._stored, len(rows)))
        return future

    @property
    def count(self) -> int:
        """Messages in the spool (committed)."""
        return self._count

    def _stored(self, n: int, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._count += n

    # --- connections -------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise SpoolCorrupt(f"spool database {self.db_path} cannot use WAL mode (got {mode!r})")
        conn.execute("PRAGMA synchronous=FULL")  # fsync the WAL at every COMMIT
        conn.execute("PRAGMA busy_timeout=10000")
        if self._max_size is not None:
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count={max(self._max_size // page_size, 16)}")
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SpoolCorrupt(f"spool schema version {version} is newer than this Pigeon ({SCHEMA_VERSION})")
        if version < SCHEMA_VERSION:
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


class _StoreReception:
    __slots__ = ("body", "rows")

    def __init__(self, body: Body, rows: Sequence[tuple[object, ...]]) -> None:
        self.body = body
        self.rows = rows

    def apply(self, conn: sqlite3.Connection) -> None:
        body = self.body
        conn.execute(_INSERT_BODY, (body.id, body.size, body.data))
        conn.executemany(_INSERT_MESSAGE, self.rows)

    def prepare(self) -> None:
        body = self.body
        body.sync()  # raises again if an earlier try failed: a retry must not skip the fsync
        if body.path is not None:
            _fsync_directory(body.path.parent)

    def abandon(self) -> None:
        self.body.discard()


def _fsync_directory(directory: Path) -> None:
    # A new file's directory entry is only durable once the directory itself is fsynced.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
