"""Message bodies as they arrive: in memory while small, in a spool file once large.

The listener writes each `DataChunk` straight into a `BodyWriter`, which keeps the chunks as
they came and joins them once at the end (a message of one chunk is not copied at all):
the joined bytes are what the spool stores and what delivery sends from memory. A body of
`segment_from` bytes or more gets a place in the active segment when it ends, where the
group-commit thread writes it (see `pigeon.spool.segments`); past `inline_limit` the bytes go
to `data/<id>` in the spool directory as they arrive, written on the event loop. Either way
the commit thread makes them durable just before the transaction that records them.
SQLite's own advice ("Internal Versus External BLOBs") is that small blobs read faster from
the database and large ones from files.

A write failure (ENOSPC, EIO) is remembered, not raised mid-stream: the message is refused
with 451 at its end, when the client is listening for a reply.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pigeon.message import SpoolId, format_id
from pigeon.spool.segments import Segment, Segments
from pigeon.spool.spool import SpoolError, SpoolFull, SpoolWriteError


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
        self.release()

    def release(self) -> None:
        """The store of this body is over, committed or not (event loop): its segment may be
        retired once no other store is writing to it. Only the first call counts."""
        if self.segments is not None and self.segment is not None and not self.released:
            self.segments.release(self.segment)
        self.released = True


class BodyWriter:
    """Accumulates one message's bytes. Call `finish()` once, or `discard()`."""

    __slots__ = ("_chunks", "_dir", "_error", "_file", "_id", "_limit", "_path", "_segment_from", "_segments", "size")

    def __init__(
        self,
        body_id: SpoolId,
        data_dir: Path,
        inline_limit: int,
        segments: Segments | None = None,
        segment_from: int = 0,
    ) -> None:
        self._id = body_id
        self._dir = data_dir
        self._limit = inline_limit
        self._segments = segments
        self._segment_from = segment_from
        self._chunks: list[bytes] | None = []
        self._file: BinaryIO | None = None
        self._path: Path | None = None
        self._error: SpoolError | None = None
        self.size = 0

    def write(self, data: bytes) -> None:
        if self._error is not None:
            return
        self.size += len(data)
        try:
            if self._chunks is not None:
                self._chunks.append(data)
                if self.size > self._limit:
                    self._spill()
            else:
                assert self._file is not None
                self._file.write(data)
        except OSError as error:
            self._error = _spool_error(error, self._path)
            self._drop()

    def finish(self) -> Body:
        """The finished body. Raises the SpoolError that a write met, if any."""
        if self._error is not None:
            raise self._error
        chunks = self._chunks
        data = None if chunks is None else b"".join(chunks)
        body = Body(self._id, self.size, data, self._path, self._file)
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
        self._chunks = None

    def _spill(self) -> None:
        self._path = self._dir / format_id(self._id)
        # "xb": a body file is only ever created once; an existing one is a bug, not data.
        self._file = open(self._path, "xb", buffering=256 * 1024)  # noqa: SIM115 - closed by Body.sync
        assert self._chunks is not None
        self._file.writelines(self._chunks)
        self._chunks = None

    def _drop(self) -> None:
        _remove(self._file, self._path)
        self._file = None
        self._path = None


def _remove(file: BinaryIO | None, path: Path | None) -> None:
    if file is not None:
        file.close()
    if path is not None:
        path.unlink(missing_ok=True)


def _spool_error(error: OSError, path: Path | None) -> SpoolError:
    where = f" ({path})" if path else ""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return SpoolFull(f"spool disk full{where}: {error.strerror}")
    return SpoolWriteError(f"spool write failed{where}: {error.strerror}")
