"""JSON-lines log segments: append, rotate by size and age, fsync on demand, compress once closed.

Records written during one turn of the event loop go to the file in a single `write()` at
the end of that turn, so a burst of records costs one system call. Writing does not fsync:
`await sync()` does, in a thread, for everything written so far (one fsync serves every
record since the last one). The outbox (`pigeon.logs.outbox`) forgets a committed record
only once a sync has covered it, so a record is as durable as the change it reports.

Every record gets a ticket, its number in this writer's stream (`write()` returns it), and
`settled(ticket)` says what became of it: durable, never going to be (it was dropped from
memory, or written before an fsync that failed), or not known yet. A record counts as
written only when its whole line, newline included, is in the file: a partial write does
not count. Its head is taken back out of the file at once (ftruncate to the last whole
line), and the whole line stays in memory until it is written whole; should the truncation
fail too, the rest of that line is written next, before anything else, so a segment never
holds two halves of different records. Either way a record given up on (`abandon`, `on_drop`)
is handed back whole, never as the part the file lacks.

When the log disk fails (ENOSPC, EIO), records stay in memory, writes are retried every
second, and `error` says what is wrong until a write and a sync succeed again. Past
`max_buffer` bytes, the records waiting are dropped from memory (`on_drop` is told which),
except the one whose head is already in the file.

Segments are named `<UTC time>-<microseconds>-w<shard>.jsonl`, so names sort by age. A
segment takes whole records up to `max_segment_size` (one record alone may be larger), and is
rotated `max_segment_age` after its first record was written (an empty one never is). A
segment is closed (and gzipped in a background thread, `.jsonl.gz`, written beside it and
renamed into place before the plain file is removed) only after an fsync covered all of it:
a rotation hands the old segment to the next sync. Segments left plain by a crash are
compressed at the next start. A closed segment holds whole lines only: the head of a record
cut short at its end (the disk filled up mid-write, then a crash or a stop) is left out as it
is closed, compressed or not, so `zcat segment | jq` reads every line of it.

BUGS: after an fsync error Linux may have dropped the pages it could not write, and a later
fsync cannot tell. So records written before a failed fsync are never counted durable by
this run: their outbox rows stay, and the next start compares them with what the log holds.
"""

from __future__ import annotations

import asyncio
import errno
import gzip
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec

from pigeon.logs.records import Record

_log = logging.getLogger(__name__)
_MAX_BUFFER: Final = 64 * 1024 * 1024  # past this, a log disk that keeps failing costs records, not memory
_FLUSH_AT: Final = 1024 * 1024
_COPY_CHUNK: Final = 1024 * 1024
_FLUSH_GAP: Final = 0.005  # under load, at most one write per this many seconds
_RETRY_AFTER: Final = 1.0  # seconds between attempts while writes fail
_REPORT_EVERY: Final = 60.0  # seconds between "still failing" reports
SEGMENT_SUFFIX: Final = ".jsonl"
COMPRESSED_SUFFIX: Final = ".jsonl.gz"

DropHandler = Callable[[list[tuple[int, bytes]]], None]
"""Told the (ticket, line) of records dropped from memory, on the loop, as they are dropped."""


class LogWriteError(OSError):
    """Records could not be made durable: not written, dropped from memory, or fsync failed."""


class _Segment:
    __slots__ = ("fd", "last", "path")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd: int | None = fd
        self.last = 0  # ticket of the last record written to it (set when it is rotated out)


class LogWriter:
    """Appends records to the current segment of one log directory."""

    def __init__(
        self,
        directory: Path,
        *,
        node: str = "",
        shard: int = 0,
        max_segment_size: int = 128 * 1024 * 1024,
        max_segment_age: float = 3600.0,
        compress: bool = True,
        max_buffer: int = _MAX_BUFFER,
    ) -> None:
        self.directory = directory
        self._node = node
        self._shard = shard
        self._max_size = max_segment_size
        self._max_age = max_segment_age
        self._compress = compress
        self._max_buffer = max_buffer
        self._encoder = msgspec.json.Encoder()
        self._buf = bytearray()
        self._queued = 0  # tickets handed out: the last record's
        self._unwritten: deque[int] = deque()  # tickets of the records in _buf (whole lines), oldest first
        self._partial = 0  # bytes of the first line in _buf already in the file (its head)
        self._synced = 0  # every ticket up to this one is settled: durable, unless in _lost
        self._lost: list[tuple[int, int]] = []  # ticket ranges (inclusive) never durable
        self._segment: _Segment | None = None
        self._retiring: list[_Segment] = []  # rotated out, waiting for the fsync that lets them close
        self._fd_lock = threading.Lock()  # the sync thread holds it while it fsyncs
        self._sync_lock: asyncio.Lock | None = None
        self._size = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_scheduled = False
        self._drop_scheduled = False
        self._last_flush = float("-inf")
        self._age_timer: asyncio.TimerHandle | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._compressors: list[threading.Thread] = []
        self._write_error: str | None = None
        self._cannot_open = False  # the last attempt to open a new segment failed
        self._sync_error: str | None = None
        self._failing_since = 0.0
        self._reported_at = 0.0
        self.write_errors = 0  # failed writes and fsyncs
        self.dropped = 0  # records dropped from memory
        self.on_drop: DropHandler | None = None

    # --- what it is doing ------------------------------------------------------------------
    @property
    def current_segment(self) -> Path | None:
        return self._segment.path if self._segment is not None else None

    @property
    def error(self) -> str | None:
        """What went wrong with the last write or fsync, while it is still wrong."""
        return self._write_error or self._sync_error

    @property
    def pending(self) -> int:
        """Records in memory, not yet (entirely) in the file."""
        return len(self._unwritten)

    def written(self, ticket: int) -> bool:
        """The record's whole line is in the file (or it was dropped from memory)."""
        return ticket <= self._written

    def settled(self, ticket: int) -> bool | None:
        """True: the record is durable. False: it never will be from this run (dropped from
        memory, or its fsync failed). None: not known yet (no sync has covered it)."""
        if any(low <= ticket <= high for low, high in self._lost):
            return False
        return True if ticket <= self._synced else None

    # --- life cycle ------------------------------------------------------------------------
    def open(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start a new segment; compress plain segments an earlier run left behind."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._loop = loop
        mine = f"-w{self._shard}{SEGMENT_SUFFIX}"
        for partial in self.directory.glob(f"*{mine}.gz.tmp"):
            partial.unlink(missing_ok=True)  # a compression cut short: its plain segment is still here
        for leftover in sorted(self.directory.glob("*" + mine)):
            self._close_segment(leftover)
        self._segment = self._new_segment()

    def close(self) -> None:
        """Flush, fsync, close and compress the segments; wait for compressions.

        Blocks on the fsync: call it last, when nothing else waits on the loop. Records that
        cannot be written are reported (and counted in `dropped`).
        """
        self.flush()
        for timer in (self._age_timer, self._retry):  # (after the flush, which may set them)
            if timer is not None:
                timer.cancel()
        self._age_timer = self._retry = None
        segments = [*self._retiring, *([self._segment] if self._segment is not None else [])]
        upto = self._written
        try:
            self._fsync_segments(segments)
            self._settle(upto, failed=False)
        except OSError as error:
            self._settle(upto, failed=True)
            self._sync_failed(error)
        with self._fd_lock:
            for segment in segments:
                if segment.fd is not None:
                    os.close(segment.fd)
                    segment.fd = None
        if self._unwritten:
            left = self._abandon()
            _log.error(
                "log: %d records could not be written to %s (%s) and were dropped at close; "
                "those committed through the spool's outbox stay there and are written at the next start",
                len(left),
                self.directory,
                self.error,
            )
        current, size = self._segment, self._size
        self._segment = None
        for segment in self._retiring:
            self._close_segment(segment.path)
        self._retiring.clear()
        if current is not None:
            if size == 0:
                current.path.unlink(missing_ok=True)
            else:
                self._close_segment(current.path)
        for thread in self._compressors:
            thread.join()
        self._compressors.clear()

    # --- writing ---------------------------------------------------------------------------
    def encode(self, record: Record) -> bytes:
        """The record's line, without the newline, as `write()` would write it."""
        record.node = self._node
        return self._encoder.encode(record)

    def write(self, record: Record) -> int:
        """Queue a record; it reaches the file at the end of this loop turn (at most
        `_FLUSH_GAP` later when records keep coming). Returns its ticket."""
        return self.write_raw(self.encode(record))

    def write_raw(self, line: bytes) -> int:
        """Queue an encoded record (from `encode()`, possibly stored meanwhile). Returns its ticket."""
        self._buf += line
        self._buf += b"\n"
        self._queued += 1
        self._unwritten.append(self._queued)
        loop = self._loop
        if self._write_error is not None and loop is not None:
            # Failing: the retry timer writes. Meanwhile only keep memory bounded.
            if len(self._buf) > self._max_buffer:
                self._drop_soon()
        elif len(self._buf) >= _FLUSH_AT:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            if loop is None:
                self.flush()
            elif loop.time() - self._last_flush >= _FLUSH_GAP:
                loop.call_soon(self.flush)
            else:
                # Busy: gather the records of the next few loop turns into one write.
                loop.call_at(self._last_flush + _FLUSH_GAP, self.flush)
        return self._queued

    def flush(self) -> None:
        """Write buffered records to the segment now (no fsync). Never raises: a failure is
        kept in `error` and retried.

        A segment takes whole records up to `max_segment_size`: the records that would take
        it past go to the next one (in a second write, once a segment), so a segment is over
        the size only when its one record is. One whose head is in the file is finished there."""
        self._flush_scheduled = False
        if self._loop is not None:
            self._last_flush = self._loop.time()
        bounded = True  # False once a new segment could not be opened: the rest goes on here
        while self._buf:
            segment = self._segment
            if segment is None or segment.fd is None:
                return
            if self._size + len(self._buf) - self._partial <= self._max_size or not bounded:
                end = len(self._buf)  # all of it fits: the usual case, one comparison
            else:
                end = self._fitting()
                if not end:
                    bounded = self._switch()
                    continue
            if not self._write_out(segment, end):
                return
            if self._write_error is not None and bounded:
                self._write_recovered()
            if self._age_timer is None and self._loop is not None:
                # Its first records: it is rotated `max_segment_age` from now.
                self._age_timer = self._loop.call_later(self._max_age, self._check_age)
        if bounded and self._size >= self._max_size:
            self._switch()

    def _fitting(self) -> int:
        """Bytes of the buffer the current segment takes within `max_segment_size`: its whole
        lines that fit; at least the line whose head is in it, or a first line however long.
        0: the next line would take it past the size, and goes to a new segment."""
        buf = self._buf
        room = max(0, self._max_size - self._size + self._partial)  # buffer bytes that fit
        end = buf.rfind(b"\n", 0, room) + 1
        if end or (self._size and not self._partial):
            return end
        return buf.index(b"\n", self._partial) + 1

    def _write_out(self, segment: _Segment, end: int) -> bool:
        """Write the buffer up to `end` (the end of a line) to `segment`. False: it failed,
        and the failure is kept in `error`, with a retry to come."""
        assert segment.fd is not None
        start = self._partial  # the head of a line cut short earlier is in the file already
        written, failure = start, None
        try:
            with memoryview(self._buf) as view:
                while written < end:
                    with view[written:end] as rest:
                        written += os.write(segment.fd, rest)
        except OSError as error:
            failure = error
        if written > start:
            self._advance(written - start)
        if failure is not None:
            self._take_back_partial(segment)
            self._write_failed(segment.path, failure)
            return False
        return True

    async def sync(self) -> None:
        """Flush what is buffered and fsync it (in a thread): when this returns, every record
        written before the call is durable. Raises LogWriteError (an OSError) if one of them
        is not: it could not be written, was dropped from memory, or its fsync failed."""
        target, floor = self._queued, self._synced
        if self._sync_lock is None:
            self._sync_lock = asyncio.Lock()
        async with self._sync_lock:
            # A sync that ran meanwhile may have covered them; a segment rotated since still
            # needs one to close, even when it holds nothing new (an idle node's last one).
            if self._synced < target or self._retiring:
                self.flush()
                if self._written > self._synced or self._retiring:  # else nothing new reached the file
                    await self._fsync()
        if self._unwritten and self._unwritten[0] <= target:
            raise LogWriteError(errno.EIO, f"log records not written: {self.error}")
        lost = sum(max(0, min(high, target) - max(low, floor + 1) + 1) for low, high in self._lost)
        if lost:
            raise LogWriteError(errno.EIO, f"{lost} log records were not made durable: {self.error or 'dropped'}")

    def rotate(self) -> None:
        """Start a new segment; the old one closes (and is compressed) once an fsync covers it."""
        self.flush()
        self._switch()

    def _switch(self) -> bool:
        """Start a new segment, the buffer flushed or not; the old one is handed to a sync.
        False: the current one goes on (it is empty, a record is half in it, or no new
        segment could be opened: that is kept in `error`, and tried again in a second)."""
        old = self._segment
        if old is None or old.fd is None or self._size == 0:
            return False  # nothing in it: keep using it
        if self._partial:
            return False  # a record is half in it: its rest goes there first
        try:
            new = self._new_segment()
        except OSError as error:
            self._write_failed(old.path, error)
            self._cannot_open = True
            if self._loop is not None and self._retry is None:  # (even with nothing waiting to be written)
                self._retry = self._loop.call_later(_RETRY_AFTER, self._retry_flush)
            return False
        old.last = self._written
        self._retiring.append(old)
        self._segment = new
        if self._cannot_open:
            self._cannot_open = False
            if self._write_error is not None and not self._buf:
                self._write_recovered()  # a segment could be opened, and everything is written
        if self._loop is None:
            self._fsync_now()
        else:
            task = self._loop.create_task(self._sync_quietly())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return True

    def abandon(self) -> list[tuple[int, bytes]]:
        """Give up on the records not yet written (at stop, with the disk still failing):
        returns their (ticket, line) and counts them as dropped. Later records go to a new
        segment if one record's head is already in the current one."""
        left = self._abandon()
        if left and self.on_drop is not None:
            self.on_drop(left)
        return left

    # --- the buffer ----------------------------------------------------------------------------
    @property
    def _written(self) -> int:
        """Every ticket up to this one is in the file (or was dropped)."""
        return self._unwritten[0] - 1 if self._unwritten else self._queued

    def _advance(self, written: int) -> None:
        """`written` more bytes of the buffer, after the `_partial` ones, are in the file. Whole
        lines leave the buffer; the head of one cut short stays, with the rest of its line."""
        self._size += written
        upto = self._partial + written
        if upto == len(self._buf):
            self._buf.clear()
            self._unwritten.clear()
            self._partial = 0
            return
        complete = self._buf.count(b"\n", self._partial, upto)
        if complete:
            end = self._buf.rfind(b"\n", 0, upto) + 1
            for _ in range(complete):
                self._unwritten.popleft()
            del self._buf[:end]
            self._partial = upto - end
        else:
            self._partial = upto

    def _take_back_partial(self, segment: _Segment) -> None:
        """A write failed with the head of a line in the file: cut the file back to its last
        whole line, so that no crash or stop can leave the head there. (A disk that is full
        still lets a file shrink.) If it cannot be cut, the rest of the line goes next."""
        if not self._partial or segment.fd is None:
            return
        try:
            os.ftruncate(segment.fd, self._size - self._partial)
        except OSError as error:
            _log.error("log: cannot take back the %d bytes of a record cut short at the end of %s: %s; "
                       "the rest of it is written there first", self._partial, segment.path.name, error)  # fmt: skip
            return
        self._size -= self._partial
        self._partial = 0

    def _drop_soon(self) -> None:
        # Not in the middle of a caller's write(): `on_drop` must see every ticket handed out.
        if self._loop is None:
            self._drop()
        elif not self._drop_scheduled:
            self._drop_scheduled = True
            self._loop.call_soon(self._drop)

    def _drop(self) -> None:
        """Memory bound reached: drop every waiting record but the one half in the file."""
        self._drop_scheduled = False
        if len(self._buf) <= self._max_buffer:
            return  # written meanwhile
        keep = self._buf.index(b"\n") + 1 if self._partial else 0
        tickets = list(self._unwritten)[1 if self._partial else 0 :]
        if not tickets:
            return
        lines = bytes(self._buf[keep:]).split(b"\n")[:-1]
        del self._buf[keep:]
        while len(self._unwritten) > (1 if self._partial else 0):
            self._unwritten.pop()
        self._mark_lost(tickets[0], tickets[-1])
        self.dropped += len(tickets)
        _log.error(
            "log: %d records dropped from memory (bound: %g MiB waiting for %s, which cannot be written: %s)",
            len(tickets),
            self._max_buffer / (1024 * 1024),
            self.directory,
            self.error,
        )
        if self.on_drop is not None:
            self.on_drop(list(zip(tickets, lines, strict=True)))

    def _abandon(self) -> list[tuple[int, bytes]]:
        if not self._unwritten:
            return []
        lines = bytes(self._buf).split(b"\n")[:-1]  # whole lines, the one cut short too
        tickets = list(self._unwritten)
        self._mark_lost(tickets[0], tickets[-1])
        self.dropped += len(tickets)
        self._buf.clear()
        self._unwritten.clear()
        if self._partial and self._segment is not None and self._segment.fd is not None:
            # That record's head ends the segment (it could not be cut off): readers skip it, the
            # segment is cut after its last newline as it closes, and the next record goes to another.
            self._partial = 0
            self._segment.last = self._written
            self._retiring.append(self._segment)
            try:
                self._segment = self._new_segment()
            except OSError:
                self._segment = None
        self._partial = 0
        return list(zip(tickets, lines, strict=True))

    def _mark_lost(self, low: int, high: int) -> None:
        merged: list[tuple[int, int]] = []
        for start, end in sorted([*self._lost, (low, high)]):
            if merged and start <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        self._lost = merged

    # --- failures --------------------------------------------------------------------------
    def _write_failed(self, path: Path, error: OSError) -> None:
        self.write_errors += 1
        now = time.monotonic()
        first = self.error is None
        self._write_error = f"cannot write {path.name}: {error.strerror or error}"
        if first:
            self._failing_since = now
        if first or now - self._reported_at >= _REPORT_EVERY:
            self._reported_at = now
            _log.error(
                "log: %s; %d records wait in memory, retrying every %.0fs",
                self._write_error,
                len(self._unwritten),
                _RETRY_AFTER,
            )
        if len(self._buf) > self._max_buffer:
            self._drop_soon()
        if self._loop is not None and self._retry is None and self._unwritten:
            self._retry = self._loop.call_later(_RETRY_AFTER, self._retry_flush)

    def _retry_flush(self) -> None:
        self._retry = None
        self.flush()

    def _write_recovered(self) -> None:
        _log.warning(
            "log: %s can be written again after %.0fs; every record kept in memory is written",
            self.directory,
            time.monotonic() - self._failing_since,
        )
        self._write_error = None

    # --- fsync -------------------------------------------------------------------------------
    async def _fsync(self) -> None:
        """fsync the retiring segments and the current one, up to what is written now."""
        upto = self._written
        segments = [*self._retiring, *([self._segment] if self._segment is not None else [])]
        retiring = list(self._retiring)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self._fsync_segments, segments)
        except OSError as error:
            self._settle(upto, failed=True)
            self._retire(retiring)
            self._sync_failed(error)
            raise LogWriteError(error.errno or errno.EIO, f"log fsync failed: {self._sync_error}") from error
        self._settle(upto, failed=False)
        self._retire(retiring)
        if self._sync_error is not None:
            _log.warning("log: fsync works again")
            self._sync_error = None

    def _fsync_now(self) -> None:
        """Without an event loop: fsync and close the rotated segments here."""
        upto, retiring = self._written, list(self._retiring)
        try:
            self._fsync_segments(retiring)
        except OSError as error:
            self._settle(upto, failed=True)
            self._sync_failed(error)
        self._retire(retiring)

    def _fsync_segments(self, segments: list[_Segment]) -> None:
        with self._fd_lock:
            for segment in segments:
                if segment.fd is not None:
                    try:
                        os.fsync(segment.fd)
                    except OSError as error:
                        error.filename = str(segment.path)
                        raise

    async def _sync_quietly(self) -> None:
        try:
            await self.sync()
        except OSError:
            pass  # kept in `error`; the records stay in the outbox

    def _settle(self, upto: int, *, failed: bool) -> None:
        if upto <= self._synced:
            return
        if failed:
            self._mark_lost(self._synced + 1, upto)
        self._synced = upto

    def _retire(self, segments: list[_Segment]) -> None:
        """Close the rotated segments a sync has just covered (or given up on), and compress them."""
        for segment in segments:
            if segment in self._retiring:
                self._retiring.remove(segment)
                if segment.fd is not None:
                    os.close(segment.fd)
                    segment.fd = None
                self._close_segment(segment.path)

    def _sync_failed(self, error: OSError) -> None:
        self.write_errors += 1
        self._sync_error = f"cannot fsync {Path(error.filename or '?').name}: {error.strerror or error}"
        _log.error(
            "log: %s; the records it held are not counted as logged: "
            "their outbox rows stay, and the next start writes those the log does not hold",
            self._sync_error,
        )

    # --- segments --------------------------------------------------------------------------
    def _new_segment(self) -> _Segment:
        now = time.time()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        micros = int((now % 1) * 1_000_000)
        path = self.directory / f"{stamp}-{micros:06d}-w{self._shard}{SEGMENT_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self._size = 0
        if self._age_timer is not None:  # the next segment's is set by its first records
            self._age_timer.cancel()
            self._age_timer = None
        return _Segment(path, fd)

    def _close_segment(self, path: Path) -> None:
        if not self._compress:
            drop_cut_line(path)
            return
        self._compressors = [t for t in self._compressors if t.is_alive()]
        thread = threading.Thread(target=compress_segment, args=(path,), name="log-compress")
        thread.start()
        self._compressors.append(thread)

    def _check_age(self) -> None:
        """The current segment's first records are `max_segment_age` old: rotate it. An empty
        segment never gets here, so an idle node starts no stream of empty ones."""
        self._age_timer = None
        aged = self._segment
        self.rotate()
        if aged is not None and self._segment is aged and self._size and self._loop is not None:
            # Not rotated (a record half in it, or no new segment could be opened): try again soon.
            if self._age_timer is not None:
                self._age_timer.cancel()
            self._age_timer = self._loop.call_later(_RETRY_AFTER, self._check_age)


def compress_segment(path: Path) -> None:
    """gzip `path` to `path.gz`, atomically, then remove `path`. A record cut short at its
    end is left out first (`drop_cut_line`)."""
    target = path.with_name(path.name + ".gz")
    partial = path.with_name(path.name + ".gz.tmp")
    drop_cut_line(path)
    try:
        with open(path, "rb") as source, open(partial, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, filename=path.name) as sink:
                shutil.copyfileobj(source, sink, _COPY_CHUNK)
            raw.flush()
            os.fsync(raw.fileno())  # the .gz is whole on disk before the plain copy goes
        os.replace(partial, target)
        path.unlink()
    except OSError as error:
        partial.unlink(missing_ok=True)
        _log.error("cannot compress log segment %s: %s (left uncompressed)", path, error)


def drop_cut_line(path: Path) -> None:
    """Cut a closed plain segment after its last newline.

    What follows it is the head of a record cut short, by a crash or by a disk that filled up
    in the middle of a write: never a record (one the spool's outbox holds is logged again
    whole), and a JSON-lines tool (`zcat segment | jq`) would fail on it."""
    try:
        with open(path, "r+b") as stream:
            size = stream.seek(0, os.SEEK_END)
            end = size
            while end > 0:
                start = max(0, end - 65536)
                stream.seek(start)
                newline = stream.read(end - start).rfind(b"\n")
                if newline >= 0:
                    end = start + newline + 1
                    break
                end = start
            if end == size:
                return
            stream.truncate(end)
    except OSError as error:
        _log.error("cannot drop the record cut short at the end of log segment %s: %s", path, error)
        return
    _log.warning("log segment %s ended with %d bytes of a record cut short (a crash, or a full disk): "
                 "left out", path.name, size - end)  # fmt: skip
