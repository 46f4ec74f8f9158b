"""The default spool: SQLite in WAL mode with `synchronous=FULL`, plus files for large bodies.

Layout under the spool directory:

    spool.db        message (envelope, queue, schedule), body (inline data), quarantine
    segments/<id>   bodies from `segment_from` up to `inline_limit`, appended (`segments.py`)
    data/<id>       bodies larger than `inline_limit`
    reserve         room kept for delivery on a disk that fills up, with no `max_size` (`reserve.py`)

Message metadata and body bytes live in separate tables, so a retry that rewrites the
attempt count and due time does not rewrite the body. Several messages of one reception
(one per destination domain) share one body row.

Only the group-commit thread writes. Readers open their own connections (WAL lets them
read while the writer commits).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, Final, NamedTuple, TypeVar

from pigeon.flock import LockHeld, take_pid_lock
from pigeon.fsync import fsync_directory
from pigeon.message import ENVELOPE_ENCODER, Envelope, IdGenerator, Message, SpoolId, format_id, node_start
from pigeon.spool import recovery
from pigeon.spool.body import Body, BodyFiles, BodyWriter, Receiving
from pigeon.spool.commit import BatchObserver, GroupCommitter, Operation
from pigeon.spool.reserve import Reserve, remove_reserve
from pigeon.spool.segments import COMPACT_BELOW, Segment, Segments
from pigeon.spool.spool import (
    NewMessage,
    Quarantined,
    RecoveryReport,
    Settling,
    SpoolBusy,
    SpoolClosed,
    SpoolCorrupt,
    SpoolDiskFull,
    SpoolError,
    SpoolFull,
    SpoolWriteError,
)

_log = logging.getLogger(__name__)
SCHEMA_VERSION: Final = 6
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS body (
    id INTEGER PRIMARY KEY,
    size INTEGER NOT NULL,
    data BLOB,                      -- NULL: in a segment, or else in data/<id as 16 hex digits>
    segment INTEGER,                -- the segment holding the body ...
    at INTEGER                      -- ... and where in it
);
CREATE INDEX IF NOT EXISTS body_segment ON body (segment) WHERE segment IS NOT NULL;
CREATE TABLE IF NOT EXISTS segment (
    id INTEGER PRIMARY KEY,         -- segments/<id as 16 hex digits>
    live INTEGER NOT NULL           -- bytes of the bodies still in it
);
CREATE TABLE IF NOT EXISTS body_ref (
    body INTEGER PRIMARY KEY,       -- a body shared by several messages (one per domain) ...
    refs INTEGER NOT NULL           -- ... and how many still use it; the last one frees it
);
CREATE TABLE IF NOT EXISTS message (
    id INTEGER PRIMARY KEY,
    body INTEGER NOT NULL,
    queue TEXT NOT NULL,
    created REAL NOT NULL,
    size INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    due REAL NOT NULL,
    envelope BLOB NOT NULL          -- msgpack of pigeon.message.Envelope: the recipients still to do
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
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY,        -- the record's "seq": unique, increasing
    record BLOB NOT NULL            -- a terminal log record, committed with the change it reports
);
CREATE TABLE IF NOT EXISTS admin_rule (
    id TEXT PRIMARY KEY,            -- an operator's standing bounce or suspension
    rule BLOB NOT NULL              -- msgpack of pigeon.queue.admin.Rule
);
"""
_MIGRATIONS: Final = {
    # 1 -> 2: shared bodies count their messages; terminal records go through the outbox.
    1: """
ALTER TABLE body ADD COLUMN refs INTEGER NOT NULL DEFAULT 1;
UPDATE body SET refs = (SELECT count(*) FROM message WHERE message.body = body.id);
CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, record BLOB NOT NULL);
""",
    # 2 -> 3: reference counts move out of the body rows (updating a row rewrites its blob).
    2: """
CREATE TABLE IF NOT EXISTS body_ref (body INTEGER PRIMARY KEY, refs INTEGER NOT NULL);
INSERT INTO body_ref (body, refs) SELECT id, refs FROM body WHERE refs > 1;
ALTER TABLE body DROP COLUMN refs;
""",
    # 3 -> 4: operators' standing rules (bounce, suspend) survive a restart.
    3: """
CREATE TABLE IF NOT EXISTS admin_rule (id TEXT PRIMARY KEY, rule BLOB NOT NULL);
""",
    # 4 -> 5: medium bodies are appended to segments.
    4: """
ALTER TABLE body ADD COLUMN segment INTEGER;
ALTER TABLE body ADD COLUMN at INTEGER;
CREATE INDEX IF NOT EXISTS body_segment ON body (segment) WHERE segment IS NOT NULL;
CREATE TABLE IF NOT EXISTS segment (id INTEGER PRIMARY KEY, live INTEGER NOT NULL);
""",
    # 5 -> 6: no table changes, but envelopes may carry what an operator asked of a message
    # being sent (hold or bounce it, rebind it, if that attempt does not deliver it): a Pigeon
    # of schema 5 would read such an envelope with the mark dropped and deliver the message,
    # so it must refuse the spool, not start on it.
    5: "",
}
_INSERT_BODY: Final = "INSERT INTO body (id, size, data, segment, at) VALUES (?, ?, ?, ?, ?)"
_INSERT_MESSAGE: Final = (
    "INSERT INTO message (id, body, queue, created, size, attempts, due, envelope) VALUES (?, ?, ?, ?, ?, 0, ?, ?)"
)
_INSERT_OUTBOX: Final = "INSERT INTO outbox (seq, record) VALUES (?, ?)"
_PEEK: Final = (
    "SELECT CAST(queue AS BLOB), CASE WHEN instr(queue, '@') > 0 THEN NULL ELSE CAST(envelope AS BLOB) END"
    " FROM message WHERE id = ?"
)
_CORRUPT: Final = frozenset({"SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_CORRUPT_INDEX", "SQLITE_CORRUPT_SEQUENCE"})
_NO_ROOM: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
_PAGE_SIZE: Final = 16384
_WAL_SHARE: Final = 16  # under [spool] max_size, the WAL is held to this share of it
_WAL_INDEX: Final = 32 * 1024  # the WAL's index (spool.db-shm) for a WAL of that size
_T = TypeVar("_T")
_NEARLY_FULL: Final = 1024 * 1024  # bytes free under which an I/O error opening the spool means "disk full"
_ROOM_FRESH: Final = 0.01  # seconds a reading of `room()` serves receptions of inline bodies


def stored_rules(directory: Path) -> list[tuple[str, bytes]]:
    """The admin rules the spool in `directory` keeps (`SqliteSpool.rules`), read while no process
    has it open (a supervisor before it starts its workers): none if there is no spool there, or
    one from before rules were kept. Raises `sqlite3.Error` for a spool that cannot be read."""
    path = directory / "spool.db"
    if not path.exists():
        return []
    conn = sqlite3.connect(path, isolation_level=None, timeout=5)
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'admin_rule'").fetchone() is None:
            return []
        return [(rule_id, bytes(rule)) for rule_id, rule in conn.execute("SELECT id, rule FROM admin_rule")]
    finally:
        conn.close()


class SqliteSpool:
    """Durable message store for one shard. `open()` it before use, `close()` at the end."""

    def __init__(
        self,
        directory: Path,
        *,
        shard: int = 0,
        inline_limit: int = 256 * 1024,
        segment_from: int = 16 * 1024,
        segment_size: int = 64 * 1024 * 1024,
        commit_window: float = 0.002,
        max_batch: int = 1024,
        max_size: int | None = None,
        reserve: int = 0,
        inline_total: int | None = None,
        observer: BatchObserver | None = None,
        node: str = "",
    ) -> None:
        self.directory = directory
        self.db_path = directory / "spool.db"
        self._wal_paths = (directory / "spool.db-wal", directory / "spool.db-shm")
        self._wal_allowance = 0  # set when the database is opened under a cap
        self._empty_database = 0  # bytes of the database with no rows (its tables' and indexes' root pages)
        self.data_dir = directory / "data"
        self._shard = shard
        self._inline_limit = inline_limit
        self._receiving = None if inline_total is None else Receiving(inline_total)
        self._segment_from = segment_from
        self._segments = Segments(directory / "segments", lambda: self._ids.next(), segment_size=segment_size)
        self._segments.retired = self._retire
        if max_size is not None:
            self._segments.room = self.room
        # An emptied active segment this big is given back at once (see `_before_commit`); under
        # a `max_size`, sooner, or dead bytes could fill the cap.
        self._give_back = _GIVE_BACK if max_size is None else min(_GIVE_BACK, max_size // 8)
        self._compacting: set[int] = set()
        self._compactions: set[asyncio.Task[None]] = set()
        self._max_size = max_size
        # With no cap, nothing else keeps room for the writes that settle delivered mail.
        # (`reserve`: its largest size; 0, as in a spool opened by a tool or a test, keeps none.)
        self._reserve = (
            None if max_size is not None or reserve <= 0 else Reserve(directory / "reserve", self._free, reserve)
        )
        if self._reserve is None and directory.is_dir():
            remove_reserve(directory / "reserve")  # one an earlier run kept
        self._files: BodyFiles | None = None  # under a max_size: the bytes in data/, counted
        self._files_counting: threading.Thread | None = None
        self._room_left = 0  # what `room()` said at `_room_asked`, minus inline bodies taken since
        self._room_asked = -_ROOM_FRESH
        # Ids are unique on the node by its shards; its name keeps them apart from other nodes'.
        self._id_start = node_start(node) if node else 0
        self._ids = IdGenerator(shard, start=self._id_start)
        self._count = 0  # messages stored minus messages removed since the open ...
        self._counted: int | None = None  # ... plus these, counted in the background from the open
        self._counting: threading.Thread | None = None
        self._opened_last = 0  # the highest id stored before the open
        self._opened_first = 0  # below every id this open hands out
        self._opened_at = 0.0
        self._setting_aside: set[int] = set()  # ids on their way to quarantine ...
        self._set_asides: set[asyncio.Future[list[Quarantined]]] = set()  # ... in these commits
        self._quarantined: list[Quarantined] = []
        self._checking = threading.Lock()  # held by a thread of the background check
        self._closing = threading.Event()
        self.on_quarantine: Callable[[list[Quarantined]], None] = lambda entries: None
        """Told of entries set aside in quarantine, once that is durable (on the event loop)."""
        self._lock_fd: int | None = None
        self._reader: sqlite3.Connection | None = None
        self._committer = GroupCommitter(
            self._connect,
            window=commit_window,
            max_batch=max_batch,
            observer=observer,
            before_commit=self._before_commit,
            flush=self._segments,
            no_room=None if self._reserve is None else self._give_back_reserve,
        )

    # --- life cycle ------------------------------------------------------------------------
    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Create the spool or migrate it, start the writer. Reads no message: unreadable
        entries are set aside when first read, and by `check()`, which should follow.

        Raises `SpoolDiskFull` when there is no room to open it (try again later),
        `SpoolCorrupt` when the database is not one, `SpoolBusy` when another process has it.
        """
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._lock()
        except OSError as error:
            if error.errno not in _NO_ROOM:
                raise
            raise self._disk_full(error.strerror or str(error)) from error
        if self._reserve is not None:
            self._reserve.open(self.disk_size())  # (its size sets the WAL's: before any connection)
        try:
            self._open_checked(loop)
        except BaseException:
            self._unlock()
            raise

    def _open_checked(self, loop: asyncio.AbstractEventLoop) -> None:
        counter = None
        try:
            conn = self._connect()
            try:
                self._migrate(conn, self.db_path)
                # Outbox seqs come from the same generator, and rows may stay there across a
                # restart (a log that could not be written): a new id must not meet one of them.
                last = conn.execute(
                    "SELECT max(coalesce((SELECT max(id) FROM message), 0),"
                    " coalesce((SELECT max(id) FROM body), 0),"
                    " coalesce((SELECT max(id) FROM quarantine), 0),"
                    " coalesce((SELECT max(seq) FROM outbox), 0),"
                    " coalesce((SELECT max(id) FROM segment), 0))"
                ).fetchone()[0]
                segments = [segment_id for (segment_id,) in conn.execute("SELECT id FROM segment")]
                # Empty, the database is its first page and a root page per table and index.
                roots = conn.execute("SELECT count(*) FROM sqlite_master WHERE rootpage > 0").fetchone()[0]
                self._empty_database = (1 + roots) * conn.execute("PRAGMA page_size").fetchone()[0]
            finally:
                conn.close()
            # Counting a million rows takes 10 ms from the page cache, 0.5 s from the disk: in
            # a thread, in a read transaction begun before the writer starts, so that adding
            # the changes committed since gives the count.
            counter = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
            counter.execute("BEGIN")
            counter.execute("SELECT 1 FROM message LIMIT 1").fetchall()
        except sqlite3.DatabaseError as error:
            if counter is not None:
                counter.close()
            raise self._open_error(error) from error
        self._ids = IdGenerator(self._shard, last, self._id_start)
        # A run killed mid-reception leaves body files named by ids above `last` (their rows
        # never committed). Ids are time-ordered, so every id this run hands out comes after
        # this one: the files named below it are earlier runs', the others this run's.
        first = self._ids.next()
        self._segments.open(segments)
        if self._max_size is not None:
            # Listing data/ costs a stat per large body: in a thread, like the count of messages.
            self._files = BodyFiles(self.room, first)
            self._files_counting = threading.Thread(target=self._count_files, name="spool-files", daemon=True)
            self._files_counting.start()
        self._room_asked = -_ROOM_FRESH
        self._opened_last = last
        self._opened_first = first
        self._opened_at = time.time()
        self._count = 0
        self._counted = None
        self._closing.clear()
        self._counting = threading.Thread(target=self._count_messages, args=(counter,), name="spool-count", daemon=True)
        self._counting.start()
        self._committer.start(loop)

    def _count_messages(self, conn: sqlite3.Connection) -> None:
        try:
            self._counted = conn.execute("SELECT count(*) FROM message").fetchone()[0]
        except sqlite3.Error as error:
            self._counted = 0
            _log.error("spool %s: cannot count its messages (%s); the count is of changes since", self.directory, error)
        finally:
            conn.close()

    def _count_files(self) -> None:
        assert self._files is not None
        try:
            self._files.count(self.data_dir)
        except OSError as error:
            _log.error(
                "spool %s: cannot count its body files (%s); [spool] max_size counts only new ones",
                self.directory,
                error,
            )

    def _open_error(self, error: sqlite3.DatabaseError) -> SpoolError:
        """What an error opening the database means. Only a file SQLite does not recognise
        is corrupt: a full disk or a permission problem says nothing about the spool, and
        moving a healthy spool aside would set aside every message it holds."""
        name = getattr(error, "sqlite_errorname", "")
        if name in _CORRUPT:
            return SpoolCorrupt(
                f"spool database {self.db_path} cannot be read ({error}); "
                "move it aside to start with an empty spool, and keep it to recover its messages"
            )
        # A write that found no room may be reported as an I/O error (a WAL or -shm file
        # SQLite could not extend): with the disk (nearly) full, that is what it means.
        nearly_full = 0 <= self._free() < _NEARLY_FULL
        if name == "SQLITE_FULL" or (name.startswith(("SQLITE_IOERR", "SQLITE_CANTOPEN")) and nearly_full):
            return self._disk_full(str(error))
        return SpoolWriteError(
            f"spool database {self.db_path} cannot be opened ({name or type(error).__name__}: {error}); "
            "check the file system and the permissions of the spool directory (the spool itself may be intact)"
        )

    def _disk_full(self, detail: str) -> SpoolDiskFull:
        return SpoolDiskFull(
            f"spool {self.directory}: its disk is full ({detail}; {self._free()} bytes free): "
            "the spool is intact, do not move it; free some space on that file system"
        )

    def room(self) -> int:
        """Bytes the spool may still grow by: its disk's free space, or what `max_size` leaves
        of the database (its WAL too), its segments and its body files if that is less (-1 if the file
        system cannot say). Just after the open, waits for the body files to be counted."""
        free = self._free()
        if self._reserve is not None:
            self._reserve.refusing()  # taken again if there is room for it now
            return self._reserve.room(free)
        if self._max_size is None or (self._reader is None and not self.db_path.exists()):
            return free
        page_size, pages, unused = (
            self._read().execute("SELECT * FROM pragma_page_size, pragma_page_count, pragma_freelist_count").fetchone()
        )
        files = 0 if self._files is None else self._files.total
        # The WAL and its index are files on the disk like any other. The WAL's allowance is
        # set aside whole, however much of it is in use now: deliveries write to it too, and
        # they must not push a full spool past its cap.
        wal = 0
        for path in self._wal_paths:
            with contextlib.suppress(OSError):
                wal += os.stat(path).st_size
        wal = max(wal, self._wal_allowance)
        left: int = self._max_size - (pages - unused) * page_size - wal - self._segments.bytes - files
        return left if free < 0 else min(free, left)

    def room_now(self) -> int | None:
        """`room()` (below 0 when the spool is past its `max_size`) without waiting: None while
        it is unknown (the body files of earlier runs not counted yet, or the file system
        cannot say)."""
        if self._files is not None and not self._files.counted:
            return None
        room = self.room()
        return None if room == -1 and self._max_size is None else room

    def capacity(self) -> int | None:
        """The room an empty shard has under `max_size` (None without one): the cap less the
        database with no rows and the WAL's allowance. What `room()` says with nothing stored."""
        if self._max_size is None:
            return None
        return self._max_size - self._empty_database - self._wal_allowance

    def disk_size(self) -> int:
        """Bytes of the spool's file system, free or not (-1 if it cannot say)."""
        stat = self._file_system()
        return -1 if stat is None else stat.f_blocks * stat.f_frsize

    def _free(self) -> int:
        """Bytes an unprivileged writer may still use on the spool's file system (-1 if it
        cannot say)."""
        stat = self._file_system()
        return -1 if stat is None else stat.f_bavail * stat.f_frsize

    def _file_system(self) -> os.statvfs_result | None:
        try:
            return os.statvfs(self.directory)
        except OSError:
            return None

    def close(self) -> None:
        """Finish the writes already queued, then stop. Later writes fail with SpoolClosed."""
        self._closing.set()
        with self._checking:  # a step of the check in progress ends at its chunk's end
            pass
        if self._counting is not None:
            self._counting.join()
        if self._files_counting is not None:
            self._files_counting.join()
        for task in self._compactions:
            task.cancel()
        self._committer.close()
        self._segments.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _lock(self) -> None:
        # Two processes appending to one shard would hand out the same ids: refuse.
        try:
            self._lock_fd = take_pid_lock(self.directory / "lock", 0o644)
        except LockHeld as held:
            raise SpoolBusy(
                f"spool {self.directory} is in use by another Pigeon process (pid {held.holder}); "
                "stop it, or give this one another [spool] path"
            ) from None

    # --- writing ---------------------------------------------------------------------------
    def new_ids(self, n: int) -> list[SpoolId]:
        return [self._ids.next() for _ in range(n)]

    def body_writer(self, body_id: SpoolId) -> BodyWriter:
        return BodyWriter(
            body_id, self.data_dir, self._inline_limit, self._segments, self._segment_from, self._files, self._receiving
        )

    def store(
        self,
        body: Body,
        messages: list[NewMessage],
        records: Sequence[tuple[int, bytes]] = (),
        *,
        settles: Settling | None = None,
        then: Callable[[asyncio.Future[None]], None] | None = None,
    ) -> asyncio.Future[None]:
        """Store one reception: its body, its messages and their records, in one durable
        transaction, with the outcome it `settles` if any (a DSN: both commit, or neither).
        `then`: see `Spool.store` and `GroupCommitter.submit`.

        Under a `max_size`, a body for the database that does not fit fails with SpoolFull (a
        file or a segment claimed its room as it was written). A DSN is let through: it
        settles, and so frees, the message it reports on, and the database's own cap holds it."""
        refusal = None
        if settles is None and self._reserve is not None and self._reserve.refusing():
            refusal = SpoolFull(_KEPT_FOR_DELIVERY)
        elif settles is None and body.path is None and body.segment is None and not self._admits(body.size):
            refusal = SpoolFull(f"spool full: a {body.size}-byte body does not fit under [spool] max_size")
        if refusal is not None:
            body.discard()
            refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            refused.set_exception(refusal)
            if then is not None:
                refused.add_done_callback(then)
            return refused
        rows = [
            (m.id, body.id, m.queue, m.created, body.size, m.due, ENVELOPE_ENCODER.encode(m.envelope)) for m in messages
        ]
        settle = None if settles is None else self._settle_op(settles)
        finished = settles is not None and settles.remaining is None
        count = len(rows) - finished

        def stored(future: asyncio.Future[None]) -> None:
            if body.segments is not None:
                body.release()
            self._stored(count, future)  # (before the caller's: its messages are counted when it hears of them)
            if then is not None:
                then(future)

        return self._committer.submit(_StoreReception(body, rows, records, settle, self._reserve), then=stored)

    def _admits(self, size: int) -> bool:
        """Whether a body of `size` bytes for the database fits under `max_size`. `room()`
        (a statvfs and a query) is asked at most every `_ROOM_FRESH` seconds, and before a
        refusal; the bodies taken in between are subtracted from its answer."""
        if self._max_size is None:
            return True
        now = time.monotonic()
        if size > self._room_left or now - self._room_asked >= _ROOM_FRESH:
            self._room_left, self._room_asked = self.room(), now
            if size > self._room_left:
                return False
        self._room_left -= size
        return True

    @property
    def shard(self) -> int:
        return self._shard

    @property
    def count(self) -> int:
        """Messages in the spool (committed). Just after the open, waits for them to be counted."""
        if self._counted is None and self._counting is not None:
            self._counting.join()
        return (self._counted or 0) + self._count

    # --- delivery: reading due messages, settling them ---------------------------------------
    def due(self, now: float, after: tuple[float, int], limit: int) -> list[Message]:
        """Messages due by `now`, in (due, id) order, strictly after `after`. Loop thread."""
        return self._messages(
            "WHERE (m.due, m.id) > (?, ?) AND m.due <= ? ORDER BY m.due, m.id LIMIT ?", (after[0], after[1], now, limit)
        )

    def get(self, spool_id: int) -> Message | None:
        found = self._messages("WHERE m.id = ?", (spool_id,))
        return found[0] if found else None

    def peek(self, spool_id: int) -> tuple[str, bytes | None] | None:
        # (SQLite reads a column only when it is asked for: a large envelope's overflow pages
        # are not read for a queue name that has a tenant part.)
        row = self._read().execute(_PEEK, (spool_id,)).fetchone()
        if row is None or not isinstance(row[0], bytes):
            return None
        try:
            return row[0].decode("utf-8"), row[1]
        except UnicodeDecodeError:
            return None

    def body(self, body_id: int) -> bytes:
        """A stored body's bytes. Raises SpoolError if it cannot be read."""
        row = self._read().execute("SELECT data, segment, at, size FROM body WHERE id = ?", (body_id,)).fetchone()
        if row is None:
            raise SpoolWriteError(f"body {format_id(body_id)} is not in the spool")
        if row[0] is not None:
            data: bytes = row[0]
            return data
        if row[1] is not None:
            return self._segments.read(row[1], row[2], row[3])
        try:
            return (self.data_dir / format_id(body_id)).read_bytes()
        except OSError as error:
            raise SpoolWriteError(f"body file data/{format_id(body_id)} cannot be read: {error.strerror}") from error

    def stored_body(self, body_id: int) -> bytes | BinaryIO:
        """A stored body to be read by an operator (`pigeon inspect --content`): its bytes when
        it is in the database or a segment (at most `inline_limit`, which delivery reads whole
        too), else its file, open, to be read in pieces: a body of gigabytes is not held. An
        open file reads on if the message is delivered (and its file removed) meanwhile.
        Raises SpoolError if it cannot be read."""
        row = self._read().execute("SELECT data, segment FROM body WHERE id = ?", (body_id,)).fetchone()
        if row is None or row[0] is not None or row[1] is not None:
            return self.body(body_id)
        try:
            return (self.data_dir / format_id(body_id)).open("rb")
        except OSError as error:
            raise SpoolWriteError(f"body file data/{format_id(body_id)} cannot be read: {error.strerror}") from error

    def settle(
        self,
        message: Message,
        remaining: Envelope | None,
        *,
        attempts: int,
        due: float,
        records: Sequence[tuple[int, bytes]] = (),
        queue: str | None = None,
    ) -> asyncio.Future[None]:
        """Record a delivery attempt's outcome, durably, with its terminal log records.

        `remaining` is the envelope with the recipients still to do, or None when the
        message is finished (removed; its body too if no other message shares it).
        """
        future = self._committer.submit(self._settle_op(Settling(message, remaining, attempts, due, records, queue)))
        if remaining is None:
            future.add_done_callback(functools.partial(self._stored, -1))
        return future

    @staticmethod
    def _settle_op(outcome: Settling) -> _Settle:
        remaining = outcome.remaining
        envelope = None if remaining is None else ENVELOPE_ENCODER.encode(remaining)
        message = outcome.message
        return _Settle(
            message.id, message.body_id, outcome.attempts, outcome.due, envelope, outcome.records, outcome.queue
        )

    def rewrite_envelope(self, spool_id: int, envelope: Envelope, *, attempts: int) -> asyncio.Future[None]:
        """Store `envelope` as the message's, unless an outcome moved its attempts on since
        (`Spool.rewrite_envelope`). Committed in order with the shard's other writes: an
        outcome submitted after this lands after it, over it."""
        return self._committer.submit(_RewriteEnvelope(spool_id, ENVELOPE_ENCODER.encode(envelope), attempts))

    def scan(self, after: int, limit: int) -> list[Message]:
        """Messages in id order, strictly after `after` (bulk admin operations walk with it)."""
        return self._messages("WHERE m.id > ? ORDER BY m.id LIMIT ?", (after, limit))

    def _messages(self, where: str, params: tuple[object, ...]) -> list[Message]:
        """The messages a query finds; an unreadable one is left out and set aside."""
        found: list[Message] = []
        bad: list[Quarantined] = []
        for row in self._read().execute(f"SELECT {recovery.ROW} {where}", params):
            message = recovery.read_row(row, self.data_dir)
            if isinstance(message, str):
                bad.append(Quarantined(SpoolId(row[0]), message))
            else:
                found.append(message)
        if bad:
            self._set_aside(bad)
        return found

    # --- the check after a start (see `pigeon.spool.recovery`) ---------------------------------
    async def check(self) -> RecoveryReport:
        """Check every message stored before the open, setting aside the unreadable ones, then
        remove orphan bodies and files. Runs in threads, beside the node's work; what it sets
        aside is told to `on_quarantine` too. The report counts what this open set aside so far."""
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._in_check, self._check_messages, loop)
        # What the check found is on its way to quarantine: its report waits for those commits.
        await asyncio.gather(*self._set_asides, return_exceptions=True)
        bodies = await asyncio.to_thread(self._in_check, recovery.orphan_bodies, self._opened_last)
        if bodies:
            await self._committer.submit(recovery.RemoveBodies(bodies))
        await self._tidy_segments()
        removing = None if self._files is None else self._files.freed
        removed = await asyncio.to_thread(
            self._in_check, recovery.remove_orphan_files, self.data_dir, self._opened_first, self._opened_at, removing
        )
        removed += await asyncio.to_thread(self._remove_orphan_segments)
        return RecoveryReport(self.count, tuple(self._quarantined), len(bodies), removed)

    def _in_check(self, step: Callable[..., _T], *args: object) -> _T:
        """Run one step of the check on a read connection of its own (a worker thread).
        `close()` waits for a step in progress, and the next one does not start."""
        with self._checking:
            if self._closing.is_set():
                raise SpoolClosed("spool closed during its check")
            conn = sqlite3.connect(self.db_path, isolation_level=None)
            try:
                conn.execute("PRAGMA query_only=1")
                return step(conn, *args)
            finally:
                conn.close()

    def _check_messages(self, conn: sqlite3.Connection, loop: asyncio.AbstractEventLoop) -> None:
        after = 0
        while not self._closing.is_set():
            bad, after, read = recovery.unreadable(conn, self.data_dir, after, self._opened_last)
            if bad:
                loop.call_soon_threadsafe(self._set_aside, bad)
            if read < recovery.CHUNK:
                return

    def _remove_orphan_segments(self) -> int:
        removed = 0
        for path in self._segments.orphans:
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as error:
                _log.error("spool %s: cannot remove orphan segment %s: %s", self.directory, path.name, error)
                continue
            removed += 1
        self._segments.orphans = []
        return removed

    async def _tidy_segments(self) -> None:
        """Segments of an earlier run are all closed: drop the empty ones (a crash may have
        come between their last free and their drop), compact the mostly empty ones."""
        for segment_id, live in self._read().execute("SELECT id, live FROM segment").fetchall():
            if segment_id == self._segments.active_id:
                continue
            if live <= 0:
                await self._committer.submit(_DropSegment(segment_id))
            elif live * COMPACT_BELOW < self._segments.size_of(segment_id):
                self._compact_soon(segment_id)

    def _set_aside(self, entries: list[Quarantined]) -> None:
        """Move unreadable entries to quarantine (event loop). Each is submitted once at a
        time; if the commit fails, the next read of the entry tries again."""
        fresh = [entry for entry in entries if entry.id not in self._setting_aside]
        if not fresh:
            return
        self._setting_aside.update(entry.id for entry in fresh)
        future = self._committer.submit(recovery.SetAside(fresh, self.data_dir))
        self._set_asides.add(future)
        future.add_done_callback(functools.partial(self._set_aside_done, fresh))

    def _set_aside_done(self, entries: list[Quarantined], future: asyncio.Future[list[Quarantined]]) -> None:
        self._set_asides.discard(future)
        self._setting_aside.difference_update(entry.id for entry in entries)
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            _log.error(
                "spool %s: cannot set aside %d unreadable entries (%s): skipped, and set aside when read again",
                self.directory,
                len(entries),
                error,
            )
            return
        moved = future.result()
        if moved:
            self._count -= len(moved)
            self._quarantined += moved
            self.on_quarantine(moved)

    def make_due(self, rows: Sequence[tuple[int, float]], due: float) -> asyncio.Future[int]:
        """Bring these messages' next attempt forward to `due` (later ones only), each (id, due
        as read) only if its due is still the one read (`Spool.make_due`): how many it changed."""
        return self._committer.submit(_MakeDue(list(rows), due))

    def queue_counts(self, now: float, held: float) -> list[tuple[str, int, int, int, float, int, int, float | None]]:
        """Per scheduled queue: messages, how many are due, how many are held (due at `held`
        or later), the oldest's creation time, the id of one of its messages (to tell which
        rules hold the queue), how many are due later (not held), and when the first of those is.

        Reads every row: call it from a thread (it opens its own connection, so it never
        holds up the loop's reader or the writer).
        """
        conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True)
        # A queue name that is not UTF-8 is set aside when its row is read; until then, it
        # must not fail the whole count.
        conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
        try:
            return conn.execute(
                "SELECT queue, count(*), sum(due <= ?), sum(due >= ?), min(created), min(id),"
                " sum(due > ? AND due < ?), min(CASE WHEN due > ? AND due < ? THEN due END)"
                " FROM message GROUP BY queue",
                (now, held, now, held, now, held),
            ).fetchall()
        finally:
            conn.close()

    def rules(self) -> list[tuple[str, bytes]]:
        return [(rule_id, bytes(rule)) for rule_id, rule in self._read().execute("SELECT id, rule FROM admin_rule")]

    def save_rule(self, rule_id: str, rule: bytes | None) -> asyncio.Future[None]:
        """Store an admin rule (or, with None, drop it)."""
        return self._committer.submit(_SaveRule(rule_id, rule))

    def outbox(self, seqs: Sequence[int] | None = None) -> list[tuple[int, bytes]]:
        """Records committed but not yet known durable in the log: all of them, or those `seqs`."""
        reader = self._read()
        if seqs is None:
            return [
                (seq, bytes(record)) for seq, record in reader.execute("SELECT seq, record FROM outbox ORDER BY seq")
            ]
        found: list[tuple[int, bytes]] = []
        for start in range(0, len(seqs), 500):
            chunk = seqs[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = reader.execute(f"SELECT seq, record FROM outbox WHERE seq IN ({marks}) ORDER BY seq", chunk)
            found += [(seq, bytes(record)) for seq, record in rows]
        return found

    def outbox_written(self, seqs: Sequence[int]) -> asyncio.Future[None]:
        """These records are durable in the log (fsynced): forget them. Exactly these: a record
        committed meanwhile with a lower `seq` may not be in the log yet."""
        return self._committer.submit(_OutboxDone(list(seqs)))

    def outbox_add(self, records: Sequence[tuple[int, bytes]]) -> asyncio.Future[None]:
        """Keep (seq, line) records the log could not take, to be logged later (`seq` from `new_ids`)."""
        return self._committer.submit(_OutboxAdd(list(records)))

    def _before_commit(self, conn: sqlite3.Connection, ops: list[Operation]) -> Callable[[], None] | None:
        """Over the whole batch, in its transaction: delete the bodies its settlements freed (one
        statement), bring the segments' live bytes up to date, drop the segments left empty.
        Returns what removes their files once the commit is durable."""
        live: dict[int, int] = {}
        for op in ops:
            for segment_id, change in getattr(op, "segment_changes", ()):
                live[segment_id] = live.get(segment_id, 0) + change
        ids = [body for op in ops for body in getattr(op, "free", ())]
        files: list[tuple[int, int]] = []  # (body, size) of the body files freed
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = conn.execute(
                f"DELETE FROM body WHERE id IN ({marks}) RETURNING id, data IS NULL, segment, size", chunk
            ).fetchall()
            for body, no_data, segment_id, size in rows:
                if segment_id is not None:
                    live[segment_id] = live.get(segment_id, 0) - size
                elif no_data:
                    files.append((body, size))
        dropped = [segment_id for op in ops for segment_id in getattr(op, "dropped", ())]
        for segment_id, change in live.items():
            if change > 0:
                conn.execute(
                    "INSERT INTO segment (id, live) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET live = live + ?",
                    (segment_id, change, change),
                )
            elif change < 0:
                row = conn.execute(
                    "UPDATE segment SET live = live + ? WHERE id = ? RETURNING live", (change, segment_id)
                ).fetchone()
                if row is not None and self._closed_segment(segment_id):
                    if row[0] <= 0:
                        conn.execute("DELETE FROM segment WHERE id = ?", (segment_id,))
                        dropped.append(segment_id)
                    elif row[0] * COMPACT_BELOW < self._segments.size_of(segment_id):
                        self._from_any_thread(self._compact_soon, segment_id)
                elif row is not None and row[0] <= 0 and self._segments.size_of(segment_id) >= self._give_back:
                    # The active segment holds nothing live: start a new one and give its
                    # space back, rather than carry dead bytes until it is full.
                    self._from_any_thread(self._segments.close_active, segment_id)
        if not files and not dropped:
            return None
        counted = self._files
        paths = [self.data_dir / format_id(body) for body, _ in files]
        paths += [self._segments.directory / format_id(segment_id) for segment_id in dropped]

        def unlink() -> None:
            # After the COMMIT: a file that stays is an orphan the next start removes.
            if counted is not None:
                for body, size in files:
                    counted.freed(body, size)
            for path in paths:
                try:
                    path.unlink(missing_ok=True)
                except OSError as error:
                    _log.error("spool: cannot remove freed body file %s: %s (left for the next start)", path, error)
            for segment_id in dropped:
                self._from_any_thread(self._segments.forget, segment_id)

        return unlink

    def _give_back_reserve(self, conn: sqlite3.Connection) -> bool:
        """A write found the disk full (commit thread): give back the reserve, so that it is
        tried again with that room, and cut the WAL back (a checkpoint that finds readers in
        the way waits for them 0.1 s, not the writer's 10). Reception stops until it is taken
        again (`Reserve.refusing`)."""
        assert self._reserve is not None
        if not self._reserve.give_back():
            return False
        try:
            conn.execute("PRAGMA busy_timeout=100")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as error:
            _log.warning("spool %s: cannot checkpoint its WAL on a full disk: %s", self.directory, error)
        finally:
            conn.execute("PRAGMA busy_timeout=10000")
        return True

    def _closed_segment(self, segment_id: int) -> bool:
        """No body will ever be appended to this segment again (any thread: a segment stops
        being the active one once, and then takes no new writer)."""
        segment = self._segments.get(segment_id)
        return segment_id != self._segments.active_id and (segment is None or segment.writers == 0)

    def _from_any_thread(self, callback: Callable[[int], None], segment_id: int) -> None:
        """Run `callback(segment_id)` on the event loop, later (the batch hook runs on the loop,
        or in the commit thread when a batch is retried)."""
        loop = self._committer.loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(callback, segment_id)
        except RuntimeError:
            pass  # the loop is closed: the next start finishes the work

    def _retire(self, segment: Segment) -> None:
        """A closed segment has no store writing into it any more (event loop): if nothing it
        holds is live, drop it."""
        if self._committer.closed:
            return
        future = self._committer.submit(_DropSegment(segment.id))
        future.add_done_callback(functools.partial(self._retired, segment.id))

    def _retired(self, segment_id: int, future: asyncio.Future[int]) -> None:
        """A closed segment that could not be dropped is compacted if it is mostly empty: the
        frees that emptied it may all have come while it was still being appended to."""
        if future.cancelled():
            return
        if future.exception() is not None:
            _log.error("spool %s: dropping an empty segment failed: %s", self.directory, future.exception())
            return
        live = future.result()
        if live > 0 and live * COMPACT_BELOW < self._segments.size_of(segment_id):
            self._compact_soon(segment_id)

    def _compact_soon(self, segment_id: int) -> None:
        if segment_id in self._compacting or self._committer.closed:
            return
        if self._reserve is not None and self._reserve.given_back:
            return  # a copy needs room before it frees any: not on a full disk
        self._compacting.add(segment_id)
        task = asyncio.get_running_loop().create_task(self._compact(segment_id))
        self._compactions.add(task)
        task.add_done_callback(self._compactions.discard)

    async def _compact(self, segment_id: int) -> None:
        """Copy the bodies still in a mostly empty closed segment to the active one, a few MB
        per commit; the last move leaves it empty, and it is dropped."""
        try:
            rows = self._read().execute("SELECT id, at, size FROM body WHERE segment = ?", (segment_id,)).fetchall()
            moves: list[tuple[int, int, int, bytes]] = []
            pending = 0
            for index, (body_id, at, size) in enumerate(rows):
                if self._segments.get(segment_id) is None:
                    return  # emptied and dropped meanwhile
                moves.append((body_id, at, size, self._segments.read(segment_id, at, size)))
                pending += size
                if pending >= _COMPACT_CHUNK or index == len(rows) - 1:
                    await self._move(segment_id, moves)
                    moves, pending = [], 0
        except SpoolError as error:
            _log.error("spool %s: cannot compact segment %s: %s", self.directory, format_id(segment_id), error)
        finally:
            self._compacting.discard(segment_id)

    async def _move(self, segment_id: int, moves: list[tuple[int, int, int, bytes]]) -> None:
        bodies = []
        try:
            for body_id, at, size, data in moves:
                segment, offset = self._segments.reserve(size)
                bodies.append(_Moved(body_id, segment_id, at, size, segment, offset, data))
            await self._committer.submit(_MoveBodies(bodies, self._segments))
        finally:
            for moved in bodies:
                self._segments.release(moved.to)

    def _read(self) -> sqlite3.Connection:
        if self._reader is None:
            self._reader = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
            self._reader.execute("PRAGMA query_only=1")
        return self._reader

    def _stored(self, n: int, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._count += n

    # --- connections -------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
        # A new spool gets 16 KiB pages (an existing one keeps its own): a body takes a
        # quarter of the WAL frames, and SQLite writes each frame with its own system calls.
        conn.execute(f"PRAGMA page_size={_PAGE_SIZE}")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise SpoolCorrupt(f"spool database {self.db_path} cannot use WAL mode (got {mode!r})")
        conn.execute("PRAGMA synchronous=FULL")  # fsync the WAL at every COMMIT
        conn.execute("PRAGMA busy_timeout=10000")
        if self._max_size is not None:
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count={max(self._max_size // page_size, 16)}")
            # The WAL counts against the cap too (`room`). Left to SQLite's defaults it grows
            # to 1,000 pages (16 MiB) before a checkpoint and never shrinks: more than a small
            # cap. Under a cap it is checkpointed at a sixteenth of it and cut back to that.
            pages = max(4, min(1000, self._max_size // _WAL_SHARE // page_size))
            conn.execute(f"PRAGMA wal_autocheckpoint={pages}")
            wal = 32 + (pages + 1) * (24 + page_size)  # its header, and its frames at a checkpoint
            conn.execute(f"PRAGMA journal_size_limit={wal}")
            self._wal_allowance = wal + _WAL_INDEX
        elif self._reserve is not None:
            # Checkpointed at half the reserve: on a full disk, the checkpoint may have to grow
            # the database by every page in the WAL, and the reserve must cover it.
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA wal_autocheckpoint={self._reserve.wal_pages(page_size)}")
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection, path: Path) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SpoolCorrupt(
                f"spool {path} has schema version {version}, written by a newer Pigeon (this one reads up "
                f"to {SCHEMA_VERSION}); nothing was changed: start the newer Pigeon again (a spool a newer Pigeon "
                "migrated cannot go back; do not move it aside, it holds the mail)"
            )
        if version == 0:
            conn.executescript(_SCHEMA)
        else:
            for step in range(version, SCHEMA_VERSION):
                conn.executescript(_MIGRATIONS[step])
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


_KEPT_FOR_DELIVERY: Final = "spool full: its disk is full, and the room left is kept for delivering the mail it holds"


class _StoreReception:
    """A reception, and maybe the outcome it reports (`settle`: a DSN's), in one transaction."""

    __slots__ = ("body", "free", "records", "reserve", "rows", "segment_changes", "settle")

    def __init__(
        self,
        body: Body,
        rows: Sequence[tuple[object, ...]],
        records: Sequence[tuple[int, bytes]],
        settle: _Settle | None = None,
        reserve: Reserve | None = None,
    ) -> None:
        self.body = body
        self.rows = rows
        self.records = records
        self.settle = settle
        self.reserve = reserve

    def apply(self, conn: sqlite3.Connection) -> None:
        if self.settle is None and self.reserve is not None and self.reserve.given_back:
            # The disk filled while it waited for its commit (or in its commit, tried again
            # now): what room is left goes to delivery. A DSN goes in: it settles a message.
            raise SpoolFull(_KEPT_FOR_DELIVERY)
        body = self.body
        if body.segment is None:
            conn.execute(_INSERT_BODY, (body.id, body.size, body.data, None, None))
            self.segment_changes: tuple[tuple[int, int], ...] = ()
        else:
            conn.execute(_INSERT_BODY, (body.id, body.size, None, body.segment.id, body.offset))
            self.segment_changes = ((body.segment.id, body.size),)
        conn.executemany(_INSERT_MESSAGE, self.rows)
        if len(self.rows) > 1:
            conn.execute("INSERT INTO body_ref (body, refs) VALUES (?, ?)", (body.id, len(self.rows)))
        if self.records:
            conn.executemany(_INSERT_OUTBOX, self.records)
        self.free: tuple[int, ...] = ()
        if self.settle is not None:
            self.settle.apply(conn)
            self.free = self.settle.free

    @property
    def early(self) -> bool:
        """A body in a segment or a file of its own: written and flushed before its batch if
        one is in flight (`pigeon.spool.commit`)."""
        return self.body.segment is not None or self.body.file is not None

    def prepare(self) -> None:
        body = self.body
        body.sync()  # raises again if an earlier try failed: a retry must not skip the fsync
        if body.path is not None:
            fsync_directory(body.path.parent)

    def abandon(self) -> None:
        self.body.discard()


_COMPACT_CHUNK: Final = 4 * 1024 * 1024  # bytes of bodies moved per commit when compacting
_GIVE_BACK: Final = 1024 * 1024


class _Moved(NamedTuple):
    body: int
    segment: int  # where it was ...
    at: int
    size: int
    to: Segment  # ... and where it is copied
    offset: int
    data: bytes


class _MoveBodies:
    """Point bodies at their copies in the active segment (compaction). A body freed since it
    was copied is left alone: its copy is dead bytes."""

    __slots__ = ("moves", "segment_changes", "segments")

    def __init__(self, moves: list[_Moved], segments: Segments) -> None:
        self.moves = moves
        self.segments = segments

    def apply(self, conn: sqlite3.Connection) -> None:
        changes = []
        for moved in self.moves:
            updated = conn.execute(
                "UPDATE body SET segment = ?, at = ? WHERE id = ? AND segment = ? AND at = ?",
                (moved.to.id, moved.offset, moved.body, moved.segment, moved.at),
            ).rowcount
            if updated:
                changes += [(moved.segment, -moved.size), (moved.to.id, moved.size)]
        self.segment_changes = changes

    def prepare(self) -> None:
        for moved in self.moves:
            self.segments.write(moved.to, moved.offset, moved.data)  # flushed with the batch

    def abandon(self) -> None:
        pass


class _DropSegment:
    """Delete a closed segment's row if nothing it holds is live; its file goes after the commit."""

    __slots__ = ("dropped", "segment")

    def __init__(self, segment: int) -> None:
        self.segment = segment

    def apply(self, conn: sqlite3.Connection) -> int:
        """Returns the segment's live bytes (0 when it is dropped)."""
        row = conn.execute("SELECT live FROM segment WHERE id = ?", (self.segment,)).fetchone()
        if row is not None and row[0] > 0:
            self.dropped: tuple[int, ...] = ()
            live: int = row[0]
            return live
        conn.execute("DELETE FROM segment WHERE id = ?", (self.segment,))
        self.dropped = (self.segment,)
        return 0

    def prepare(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class _Settle:
    __slots__ = ("attempts", "body_id", "due", "envelope", "free", "message_id", "queue", "records")

    def __init__(
        self,
        message_id: int,
        body_id: int,
        attempts: int,
        due: float,
        envelope: bytes | None,
        records: Sequence[tuple[int, bytes]],
        queue: str | None = None,
    ) -> None:
        self.queue = queue
        self.message_id = message_id
        self.body_id = body_id
        self.attempts = attempts
        self.due = due
        self.envelope = envelope
        self.records = records

    def apply(self, conn: sqlite3.Connection) -> None:
        # Freeing the body (reading its overflow pages) is left to the commit thread, in one
        # statement for the whole batch: `free` names the body if this was its last message.
        self.free: tuple[int, ...] = ()
        if self.envelope is None:
            deleted = conn.execute("DELETE FROM message WHERE id = ?", (self.message_id,)).rowcount
            if deleted:
                shared = conn.execute(
                    "UPDATE body_ref SET refs = refs - 1 WHERE body = ? RETURNING refs", (self.body_id,)
                ).fetchone()
                if shared is None:
                    self.free = (self.body_id,)
                elif shared[0] <= 0:
                    conn.execute("DELETE FROM body_ref WHERE body = ?", (self.body_id,))
                    self.free = (self.body_id,)
        elif self.queue is not None:
            conn.execute(
                "UPDATE message SET attempts = ?, due = ?, envelope = ?, queue = ? WHERE id = ?",
                (self.attempts, self.due, self.envelope, self.queue, self.message_id),
            )
        else:
            conn.execute(
                "UPDATE message SET attempts = ?, due = ?, envelope = ? WHERE id = ?",
                (self.attempts, self.due, self.envelope, self.message_id),
            )
        if self.records:
            conn.executemany(_INSERT_OUTBOX, self.records)

    def prepare(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class _RewriteEnvelope:
    __slots__ = ("attempts", "envelope", "message_id")

    def __init__(self, message_id: int, envelope: bytes, attempts: int) -> None:
        self.message_id, self.envelope, self.attempts = message_id, envelope, attempts

    def apply(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            "UPDATE message SET envelope = ? WHERE id = ? AND attempts = ?",
            (self.envelope, self.message_id, self.attempts),
        )

    def prepare(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class _OutboxDone:
    __slots__ = ("seqs",)

    def __init__(self, seqs: list[int]) -> None:
        self.seqs = seqs

    def apply(self, conn: sqlite3.Connection) -> None:
        conn.executemany("DELETE FROM outbox WHERE seq = ?", [(seq,) for seq in self.seqs])

    def prepare(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class _OutboxAdd:
    __slots__ = ("records",)

    def __init__(self, records: list[tuple[int, bytes]]) -> None:
        self.records = records

    def apply(self, conn: sqlite3.Connection) -> None:
        conn.executemany(_INSERT_OUTBOX, self.records)

    def prepare(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class _MakeDue:
    __slots__ = ("due", "rows")

    def __init__(self, rows: list[tuple[int, float]], due: float) -> None:
        self.rows, self.due = rows, due

    def apply(self, conn: sqlite3.Connection) -> int:
        """How many rows it changed: those whose due is still the one read (a compare-and-set:
        a hold by id that landed since, at `HELD`, stays held)."""
        cursor = conn.executemany(
            "UPDATE message SET due = ? WHERE id = ? AND due = ? AND due > ?",
            [(self.due, spool_id, read, self.due) for spool_id, read in self.rows],
        )
        changed: int = cursor.rowcount  # (summed over the rows by executemany)
        return max(changed, 0)

    def prepare(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class _SaveRule:
    __slots__ = ("rule", "rule_id")

    def __init__(self, rule_id: str, rule: bytes | None) -> None:
        self.rule_id, self.rule = rule_id, rule

    def apply(self, conn: sqlite3.Connection) -> None:
        if self.rule is None:
            conn.execute("DELETE FROM admin_rule WHERE id = ?", (self.rule_id,))
        else:
            conn.execute("INSERT OR REPLACE INTO admin_rule (id, rule) VALUES (?, ?)", (self.rule_id, self.rule))

    def prepare(self) -> None:
        pass

    def abandon(self) -> None:
        pass
