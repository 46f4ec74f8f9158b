"""Message bodies as they arrive: in memory while small, in a spool file once large.

The listener writes each `DataChunk` straight into a `BodyWriter`, which keeps the chunks as
they came and joins them once at the end (a message of one chunk is not copied at all):
the joined bytes are what the spool stores and what delivery sends from memory. What bodies
still being received hold in memory is counted (`Receiving`): past `[spool] inline_total`, the
body whose write passes it goes to a file as a large one does, so clients that stall before
their final dot cost the shard disk, not memory (2,000 of them held 0.5 GB otherwise). A body of
`segment_from` bytes or more gets a place in the active segment when it ends, where the
group-commit thread writes it (see `pigeon.spool.segments`); past `inline_limit` the bytes go
to `data/<id>` in the spool directory as they arrive, written on the event loop. Either way
the commit thread makes them durable just before the transaction that records them.
SQLite's own advice ("Internal Versus External BLOBs") is that small blobs read faster from
the database and large ones from files.

A write failure (ENOSPC, EIO) is remembered, not raised mid-stream: the message is refused
with 451 at its end, when the client is listening for a reply. So is a file that would pass
`[spool] max_size`: under a cap, a spilled body claims its bytes from `BodyFiles` as it
grows, and stops being written (its file removed) once the spool has no room left for it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from pigeon.message import SpoolId, format_id, parse_id
from pigeon.spool.segments import Segment, Segments
from pigeon.spool.spool import SpoolError, SpoolFull, SpoolWriteError

_FILE_BUFFER: Final = 16 * 1024
CLAIM_STEP: Final = 1024 * 1024
"""A growing body file claims room this much ahead (less when room is short), so that a
large body asks the spool for its room once a MiB rather than once a chunk."""


class BodyFiles:
    """The bytes of a capped spool's body files (`data/`), which `[spool] max_size` counts.

    A running total, so that no reception lists or stats the directory: the files of earlier
    runs are counted once after the open (`count`, in a thread); a file being written claims
    room as it grows (`claim`, which asks the spool's `room` once per `CLAIM_STEP`) and gives
    back what it did not use (`give_back`); a file removed is taken off (`freed`).

    Threads: claims on the event loop, frees in the commit thread or the check's; one lock.
    """

    def __init__(self, room: Callable[[], int], first: int) -> None:
        self._room = room
        self._first = first  # files named by an id below this one are earlier runs' ...
        self._earlier: int | None = None  # ... and hold these bytes, once counted
        self._freed_early: set[int] = set()  # earlier runs' files freed before the count ended
        self._bytes = 0  # claimed since the open, minus what was given back or freed
        self._lock = threading.Lock()
        self._counted = threading.Event()

    def count(self, data_dir: Path) -> None:
        """Count the files earlier runs left in `data_dir`: once, in a thread, after the open.
        Raises OSError if the directory cannot be listed (what was counted so far stands)."""
        sizes: dict[int, int] = {}
        try:
            with os.scandir(data_dir) as entries:
                for entry in entries:
                    try:
                        body_id = parse_id(entry.name)
                        if body_id < self._first:
                            sizes[body_id] = entry.stat(follow_symlinks=False).st_size
                    except (ValueError, OSError):
                        continue  # not a body file, or removed meanwhile
        finally:
            with self._lock:
                self._earlier = sum(size for body_id, size in sizes.items() if body_id not in self._freed_early)
                self._freed_early.clear()
            self._counted.set()

    @property
    def counted(self) -> bool:
        """Whether the earlier runs' files are counted (`total` answers at once)."""
        return self._counted.is_set()

    @property
    def total(self) -> int:
        """Bytes of the body files, and of the room claimed for those being written. Just
        after the open, waits for the earlier runs' files to be counted."""
        self._counted.wait()
        with self._lock:
            assert self._earlier is not None
            return self._earlier + self._bytes

    def claim(self, needed: int) -> int:
        """Room for a body file to grow by `needed` bytes (event loop): the bytes granted, up
        to a step more than needed, or 0 if `needed` does not fit in the spool's room."""
        room = self._room()
        if room < needed:
            return 0
        # A quarter of what is left at most, so that bodies written side by side all get some.
        granted = needed + min(CLAIM_STEP, (room - needed) // 4)
        with self._lock:
            self._bytes += granted
        return granted

    def give_back(self, size: int) -> None:
        """Room claimed but not used, or a body file that was never committed (removed)."""
        with self._lock:
            self._bytes -= size

    def freed(self, body_id: int, size: int) -> None:
        """A committed body file (or an orphan) is about to be removed (any thread). Called
        before the unlink, so that an earlier run's file still being counted is left out of
        the count whether the count has seen it or not."""
        with self._lock:
            if self._earlier is None and body_id < self._first:
                self._freed_early.add(body_id)
            else:
                self._bytes -= size


class Receiving:
    """The bytes that a shard's bodies still being received hold in memory, in all, and the
    most they may (`[spool] inline_total`). Event loop only."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0


@dataclass(slots=True)
class Body:
    """A finished body: inline bytes, bytes in a segment, or a spool file not yet fsynced."""

    id: SpoolId
    size: int
    data: bytes | None
    path: Path | None
    file: BinaryIO | None  # open until the commit thread fsyncs and closes it
    sync_error: SpoolError | None = None
    segment: Segment | None = None  # where the commit thread writes `data`, at `offset`
    offset: int = 0
    segments: Segments | None = None  # writes `data` to `segment`, and is owed a `release`
    released: bool = False
    files: BodyFiles | None = None  # counts `path`'s `size` bytes against [spool] max_size

    def sync(self) -> None:
        """fsync the spool file, or write the body at its place in its segment, for the spool
        to flush once for the whole batch (commit thread). No-op for inline bodies.

        A file's failure sticks: a later call (the commit retrying this body alone) raises it
        again rather than taking a closed file for a durable one. A segment's body is written
        again by each call.
        """
        if self.sync_error is not None:
            raise self.sync_error
        if self.segment is not None:
            assert self.data is not None
            # Written, not flushed: the spool flushes every segment once for the whole batch.
            assert self.segments is not None
            self.segments.write(self.segment, self.offset, self.data)
        if self.file is not None:
            try:
                self.file.flush()
                os.fsync(self.file.fileno())
            except OSError as error:
                self.sync_error = _spool_error(error, self.path)
                raise self.sync_error from error
            finally:
                self.file.close()
                self.file = None

    def discard(self) -> None:
        """Remove what was written: the body will not be stored."""
        _remove(self.file, self.path)
        self.file = None
        if self.files is not None:
            self.files.give_back(self.size)
            self.files = None
        self.release()

    def release(self) -> None:
        """The store of this body is over, committed or not (event loop): its segment may be
        retired once no other store is writing to it. Only the first call counts."""
        if self.segments is not None and self.segment is not None and not self.released:
            self.segments.release(self.segment)
        self.released = True


class BodyWriter:
    """Accumulates one message's bytes. Call `finish()` once, or `discard()`."""

    __slots__ = (
        "_chunks",
        "_claimed",
        "_dir",
        "_error",
        "_file",
        "_files",
        "_id",
        "_limit",
        "_path",
        "_receiving",
        "_segment_from",
        "_segments",
        "size",
    )

    def __init__(
        self,
        body_id: SpoolId,
        data_dir: Path,
        inline_limit: int,
        segments: Segments | None = None,
        segment_from: int = 0,
        files: BodyFiles | None = None,
        receiving: Receiving | None = None,
    ) -> None:
        """`files`: where a spilled body claims room, under `[spool] max_size` (None: no cap).
        `receiving`: what the shard's bodies being received hold in memory (None: no limit but
        `inline_limit`)."""
        self._id = body_id
        self._receiving = receiving
        self._dir = data_dir
        self._limit = inline_limit
        self._segments = segments
        self._segment_from = segment_from
        self._chunks: list[bytes] | None = []
        self._file: BinaryIO | None = None
        self._path: Path | None = None
        self._error: SpoolError | None = None
        self._files = files
        self._claimed = 0  # room claimed from `files` for the spilled file
        self.size = 0

    def write(self, data: bytes) -> None:
        if self._error is not None:
            return
        self.size += len(data)
        try:
            if self._chunks is not None:
                self._chunks.append(data)
                receiving = self._receiving
                if receiving is None:
                    if self.size > self._limit and self._claim():
                        self._spill()
                else:
                    receiving.held += len(data)
                    if (self.size > self._limit or receiving.held > receiving.limit) and self._claim():
                        self._spill()
            elif self._claim():
                assert self._file is not None
                self._file.write(data)
        except OSError as error:
            self._error = _spool_error(error, self._path)
            self._drop()

    def finish(self) -> Body:
        """The finished body. Raises the SpoolError that a write met, if any."""
        chunks = self._chunks
        self._let_go()
        if self._error is not None:
            raise self._error
        data = None if chunks is None else b"".join(chunks)
        body = Body(self._id, self.size, data, self._path, self._file)
        if self._files is not None and self._path is not None:
            self._files.give_back(self._claimed - self.size)  # the body keeps its `size` bytes
            body.files = self._files
            self._claimed = 0
        segments = self._segments
        if data and segments is not None and self.size >= self._segment_from:
            body.segment, body.offset = segments.reserve(self.size)
            body.segments = segments
        self._chunks = None
        self._file = None
        self._path = None
        return body

    def discard(self) -> None:
        self._drop()
        self._let_go()
        self._chunks = None

    def _let_go(self) -> None:
        """The chunks held in memory are no longer the reception's: written out, joined into
        the finished body (whose memory the queue's body budget counts), or dropped."""
        if self._receiving is not None and self._chunks is not None:
            self._receiving.held -= self.size
            self._chunks = None

    def _claim(self) -> bool:
        """Whether a spilled body of `size` bytes has room under `[spool] max_size`. If not,
        the refusal is remembered, as a write error is, and what was written is dropped."""
        files = self._files
        if files is None or self.size <= self._claimed:
            return True
        granted = files.claim(self.size - self._claimed)
        if granted:
            self._claimed += granted
            return True
        self._error = SpoolFull(f"spool full: a body of {self.size} bytes or more does not fit under [spool] max_size")
        self._drop()
        self._let_go()
        return False

    def _spill(self) -> None:
        self._path = self._dir / format_id(self._id)
        # "xb": a body file is only ever created once; an existing one is a bug, not data.
        # A small buffer: it gathers small reads into fewer writes (larger ones pass straight
        # through), and is memory each stalled client holds (256 KiB, 2,000 clients: 0.5 GB).
        self._file = open(self._path, "xb", buffering=_FILE_BUFFER)  # noqa: SIM115 - closed by Body.sync
        assert self._chunks is not None
        self._file.writelines(self._chunks)
        self._let_go()
        self._chunks = None

    def _drop(self) -> None:
        _remove(self._file, self._path)
        self._file = None
        self._path = None
        if self._files is not None and self._claimed:
            self._files.give_back(self._claimed)
            self._claimed = 0


def _remove(file: BinaryIO | None, path: Path | None) -> None:
    if file is not None:
        # Closing flushes the file's buffer, which may meet the full disk again: the file is
        # closed all the same, and it is being thrown away.
        with contextlib.suppress(OSError):
            file.close()
    if path is not None:
        path.unlink(missing_ok=True)


def _spool_error(error: OSError, path: Path | None) -> SpoolError:
    where = f" ({path})" if path else ""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return SpoolFull(f"spool disk full{where}: {error.strerror}")
    return SpoolWriteError(f"spool write failed{where}: {error.strerror}")
