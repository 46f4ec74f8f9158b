"""Segments: medium bodies appended to shared files, made durable by one fsync per commit.

A body in the database is written twice (to the WAL at its commit, to the database at the
checkpoint) and freed page by page when its message is delivered. Measured relaying 50 KiB
messages, that made the spool write about 140 KB per message, and the commits' fsyncs, not
the CPU, set the rate. A body from `[spool] segment_from` up to `inline_limit` is instead
appended, once, to the active segment file (`segments/<id>`) when its reception ends, and
the commit that records it first fdatasyncs the segment: one flush for every body the batch
holds, whatever their number, and the database commit carries rows of a few dozen bytes.

Each segment's live bytes are counted in the `segment` table, in the transaction that stores
or frees a body, so the count is exact after any crash. A segment that is not the active one,
has no reception still writing into it and no live byte left is deleted (row, then file, once
that is durable). A closed segment whose live bytes fall under a quarter of its size is
compacted: its bodies are copied to the active segment and their rows moved there in one
commit, so a few deferred messages do not pin a whole segment on disk for days.

Threads: the event loop appends and reads (`pwrite`, `pread` on descriptors kept open); the
commit thread calls `sync`. The two share only `written` and `synced`, each written by one
thread. A descriptor is closed on the loop, after its file is gone, so a read that found a
body's row just before it moved still reads the old copy.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from pigeon.message import SpoolId, format_id
from pigeon.spool.spool import SpoolError, SpoolFull, SpoolWriteError

COMPACT_BELOW: Final = 4  # a closed segment is compacted once its live bytes are under 1/4 of its size


class Segment:
    """One segment file, open for reading (and, while it is the active one, for appending)."""

    __slots__ = ("_sync_lock", "created_synced", "end", "fd", "id", "path", "synced", "writers", "written")

    def __init__(self, segment_id: int, path: Path, fd: int, written: int, *, new: bool) -> None:
        self.id = segment_id
        self.path = path
        self.fd = fd
        self.end = written  # where the next append goes (event loop)
        self.written = written  # bytes whose appends have returned (event loop; read by `sync`)
        self.synced = 0 if new else written  # bytes known durable (commit thread)
        self.created_synced = not new  # its directory entry is durable
        self.writers = 0  # bodies appended here whose store has not committed or been abandoned
        self._sync_lock = threading.Lock()

    def sync(self, upto: int) -> None:
        """Make the first `upto` bytes durable (commit thread); a no-op if they already are."""
        if self.synced >= upto and self.created_synced:
            return
        with self._sync_lock:
            if self.synced >= upto and self.created_synced:
                return
            # Everything appended so far rides on this flush: `written` moves only once a write
            # has returned (the loop runs while `pwritev` holds no GIL; `end` would be too far).
            end = self.written
            try:
                os.fdatasync(self.fd)
                if not self.created_synced:
                    _fsync_directory(self.path.parent)
                    self.created_synced = True
            except OSError as error:
                raise _spool_error(error, self.path) from error
            self.synced = max(self.synced, end)


class Segments:
    """The spool's segment files: the one being appended to, and older ones still holding bodies."""

    def __init__(self, directory: Path, ids: Callable[[], SpoolId], *, segment_size: int) -> None:
        self.directory = directory
        self._ids = ids
        self._segment_size = segment_size
        self._all: dict[int, Segment] = {}
        self._active: Segment | None = None
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

    # --- the event loop: appending, reading --------------------------------------------------
    @property
    def active_id(self) -> int | None:
        return None if self._active is None else self._active.id

    def append(self, chunks: list[bytes], size: int) -> tuple[Segment, int]:
        """Write one body at the end of the active segment; returns where it is. The caller
        owes the segment a `release()` once the body's store committed or was abandoned.
        Raises SpoolError (the segment keeps the torn bytes: no row will ever point there)."""
        if self.room is not None and size > self.room():
            raise SpoolFull(f"spool full: a {size}-byte body does not fit under [spool] max_size")
        segment = self._active
        if segment is None or segment.end >= self._segment_size:
            segment = self._rotate()
        offset = segment.end
        segment.end += size
        self.bytes += size
        segment.writers += 1
        try:
            _pwrite_all(segment.fd, chunks, offset)
        except OSError as error:
            self.release(segment)
            raise _spool_error(error, segment.path) from error
        segment.written = segment.end
        return segment, offset

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

    def file_size(self, segment_id: int) -> int | None:
        """The segment's size on disk, None if it is missing (any thread: reads the file)."""
        try:
            return os.stat(self.directory / format_id(segment_id)).st_size
        except OSError:
            return None

    def closed_ids(self) -> list[int]:
        return [segment_id for segment_id in self._all if self._active is None or segment_id != self._active.id]

    def size_of(self, segment_id: int) -> int:
        segment = self._all.get(segment_id)
        return 0 if segment is None else segment.end

    def forget(self, segment_id: int) -> None:
        """The segment's file is gone (event loop): close its descriptor."""
        segment = self._all.pop(segment_id, None)
        if segment is not None:
            os.close(segment.fd)
            self.bytes -= segment.end

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


def _pwrite_all(fd: int, chunks: list[bytes], offset: int) -> None:
    views = [memoryview(chunk) for chunk in chunks if chunk]
    while views:
        written = os.pwritev(fd, views[:1024], offset)
        if written == 0:
            raise OSError(errno.EIO, "short write")
        offset += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if written:
            views[0] = views[0][written:]


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _spool_error(error: OSError, path: Path) -> SpoolError:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return SpoolFull(f"spool disk full ({path}): {error.strerror}")
    return SpoolWriteError(f"spool write failed ({path}): {error.strerror}")
