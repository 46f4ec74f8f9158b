"""Segments: medium bodies appended to shared files, made durable by one fsync per commit.

A body in the database is written twice (to the WAL at its commit, to the database at the
checkpoint) and freed page by page when its message is delivered. Measured relaying 50 KiB
messages, that made the spool write about 140 KB per message. A body from `[spool]
segment_from` up to `inline_limit` instead gets a place at the end of the active segment file
(`segments/<id>`) when its reception ends; the commit thread writes it there, once, then
fdatasyncs the segment (one flush for every body of the batch, whatever their number), then
commits rows of a few dozen bytes.

Each segment's live bytes are counted in the `segment` table, in the transaction that stores
or frees a body, so the count is exact after any crash. A segment that is not the active one,
has no reception still writing into it and no live byte left is deleted (row, then file, once
that is durable). A closed segment whose live bytes fall under a quarter of its size is
compacted: its bodies are copied to the active segment and their rows moved there in one
commit, so a few deferred messages do not pin a whole segment on disk for days.

Threads: the event loop reserves places (`reserve`) and reads (`pread` on descriptors kept
open); the commit thread writes and flushes (`write`, `flush`), and so does the committer's
early thread, for bodies waiting for the next commit (`pigeon.spool.commit`). Writing on the loop cost it
40-100 us a body, and up to 4 ms when the page being appended to was under writeback: the
commit thread does it beside the loop, as SQLite's WAL writes were done. A descriptor is
closed on the loop, after its file is gone, so a read that found a body's row just before it
moved still reads the old copy. A row is committed only after its bytes are written and
flushed, so a read never meets a place that was reserved but not yet written.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from pigeon.fsync import fsync_directory
from pigeon.message import SpoolId, format_id
from pigeon.spool.spool import SpoolError, SpoolFull, SpoolWriteError

COMPACT_BELOW: Final = 4  # a closed segment is compacted once its live bytes are under 1/4 of its size


class Segment:
    """One segment file, open for reading (and, while it is the active one, for appending)."""

    __slots__ = ("created_synced", "end", "fd", "id", "path", "writers")

    def __init__(self, segment_id: int, path: Path, fd: int, end: int, *, new: bool) -> None:
        self.id = segment_id
        self.path = path
        self.fd = fd
        self.end = end  # where the next reservation goes (event loop)
        self.created_synced = not new  # its directory entry is durable (commit thread)
        self.writers = 0  # bodies placed here whose store has not committed or been abandoned


class Segments:
    """The spool's segment files: the one being appended to, and older ones still holding bodies."""

    def __init__(self, directory: Path, ids: Callable[[], SpoolId], *, segment_size: int) -> None:
        self.directory = directory
        self._ids = ids
        self._segment_size = segment_size
        self._all: dict[int, Segment] = {}
        self._active: Segment | None = None
        self._unflushed: dict[int, Segment] = {}  # written since the last flush (commit thread)
        self._flushing = threading.Lock()  # guards `_unflushed`
        self._syncing = threading.Lock()  # held by the flush under way
        self._failed_flushes = 0  # (counted under `_syncing`) see `flush`
        self.bytes = 0
        """Bytes in every segment file, dead ones too (what they take on disk)."""
        self.room: Callable[[], int] | None = None
        """Bytes the spool may still grow by, if it is capped (`[spool] max_size`)."""
        self.orphans: list[Path] = []
        self.retired: Callable[[Segment], None] = lambda segment: None
        """Told (event loop) when a closed segment has no reception writing into it any more."""

    # --- life cycle -------------------------------------------------------------------------
    def open(self, known: Iterable[int]) -> None:
        """Open the segments the database names (event loop, at the spool's open). Appending
        always starts a new segment: the tail of an old one may hold a torn write.

        Files it does not name are listed in `orphans`, now, before this run creates any: an
        earlier run's segment that no committed store reached (it died first), or one dropped
        just before a crash. No row can ever name them (new bodies go to new segments)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        known = set(known)
        names = {format_id(segment_id) for segment_id in known}
        self.orphans = [path for path in self.directory.iterdir() if path.name not in names]
        for segment_id in known:
            path = self.directory / format_id(segment_id)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # its bodies are reported missing when read, and set aside
            segment = Segment(segment_id, path, fd, os.fstat(fd).st_size, new=False)
            self._all[segment_id] = segment
            self.bytes += segment.end

    def close(self) -> None:
        for segment in self._all.values():
            os.close(segment.fd)
        self._all.clear()
        self._active = None
        self.bytes = 0

    # --- the event loop: reserving, reading -----------------------------------------------------
    @property
    def active_id(self) -> int | None:
        return None if self._active is None else self._active.id

    def reserve(self, size: int) -> tuple[Segment, int]:
        """A place for a body of `size` bytes at the end of the active segment, for `write`.
        The caller owes the segment a `release()` once the body's store committed or was
        abandoned. A place never written is a hole no row points at."""
        if self.room is not None and size > self.room():
            raise SpoolFull(f"spool full: a {size}-byte body does not fit under [spool] max_size")
        segment = self._active
        if segment is None or segment.end >= self._segment_size:
            segment = self._rotate()
        offset = segment.end
        segment.end += size
        self.bytes += size
        segment.writers += 1
        return segment, offset

    # --- the commit thread: writing, flushing ---------------------------------------------------
    def write(self, segment: Segment, offset: int, data: bytes) -> None:
        """Write a body at its place (commit thread, before the commit that records it; again
        if that commit is retried, so that the retry's flush covers freshly written pages)."""
        try:
            _pwrite_all(segment.fd, data, offset)
        except OSError as error:
            raise _spool_error(error, segment.path) from error
        with self._flushing:
            self._unflushed[segment.id] = segment

    def mark(self) -> int:
        """The token `flush(since=...)` checks: take it before writing what it must cover.
        (Not under `_syncing`: the early thread writes while a flush is under way. A failure
        counted after this read concerns pages written before it, or these: either way `flush`
        raises; one counted before it concerns pages written before these.)"""
        return self._failed_flushes

    def flush(self, since: int) -> None:
        """Make every body written before this call durable: one fdatasync per segment written
        to (commit thread, after the batch's writes, before its COMMIT; or the committer's early
        thread, for bodies waiting for the next batch). Flushes run one at a time: one that
        finds nothing left to flush has waited for the one that took it, so it returns only
        once those bytes are durable too.

        An fdatasync error is told once, to one flush of the file (Linux since 4.13), and the
        pages it concerned may be lost while the next fdatasync says 0: with two threads
        writing, that flush may not be the one whose bodies were lost. So every failure is
        counted, and a flush raises when any failed since `since` (`mark()`, taken before its
        bodies were written): they are written again, then flushed again."""
        with self._syncing:
            with self._flushing:
                segments, self._unflushed = list(self._unflushed.values()), {}
            for index, segment in enumerate(segments):
                try:
                    os.fdatasync(segment.fd)
                    if not segment.created_synced:
                        fsync_directory(segment.path.parent)
                        segment.created_synced = True
                except OSError as error:
                    self._failed_flushes += 1
                    with self._flushing:  # still to be made durable, by the retry's writes and flush
                        self._unflushed.update((s.id, s) for s in segments[index:])
                    raise _spool_error(error, segment.path) from error
            if self._failed_flushes != since:
                raise SpoolWriteError("a segment's fdatasync failed after these bodies were written: written again")

    def release(self, segment: Segment) -> None:
        """A body appended to `segment` is committed or abandoned."""
        segment.writers -= 1
        if segment.writers == 0 and segment is not self._active:
            self.retired(segment)

    def read(self, segment_id: int, offset: int, size: int) -> bytes:
        segment = self._all.get(segment_id)
        if segment is None:
            raise SpoolWriteError(f"segment file segments/{format_id(segment_id)} is missing")
        try:
            data = os.pread(segment.fd, size, offset)
        except OSError as error:
            raise SpoolWriteError(
                f"segment segments/{format_id(segment_id)} cannot be read: {error.strerror}"
            ) from error
        if len(data) != size:
            raise SpoolWriteError(
                f"segment segments/{format_id(segment_id)} ends before a body ({len(data)} of {size} bytes at {offset})"
            )
        return data

    def get(self, segment_id: int) -> Segment | None:
        return self._all.get(segment_id)

    def size_of(self, segment_id: int) -> int:
        segment = self._all.get(segment_id)
        return 0 if segment is None else segment.end

    def forget(self, segment_id: int) -> None:
        """The segment's file is gone (event loop): close its descriptor."""
        segment = self._all.pop(segment_id, None)
        if segment is not None:
            os.close(segment.fd)
            self.bytes -= segment.end

    def close_active(self, segment_id: int) -> None:
        """Stop appending to the active segment if it is `segment_id` and no store is writing
        to it (event loop): it is retired, and the next body starts a new one."""
        segment = self._active
        if segment is not None and segment.id == segment_id and segment.writers == 0:
            self._active = None
            self.retired(segment)

    def _rotate(self) -> Segment:
        old = self._active
        segment_id = self._ids()
        path = self.directory / format_id(segment_id)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise _spool_error(error, path) from error
        segment = Segment(segment_id, path, fd, 0, new=True)
        self._all[segment_id] = segment
        self._active = segment
        if old is not None and old.writers == 0:
            self.retired(old)
        return segment


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written == 0:
            raise OSError(errno.EIO, "short write")
        offset += written
        view = view[written:]


def _spool_error(error: OSError, path: Path) -> SpoolError:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return SpoolFull(f"spool disk full ({path}): {error.strerror}")
    return SpoolWriteError(f"spool write failed ({path}): {error.strerror}")
