"""JSON-lines log segments: append, rotate by size and age, compress once closed.

Records written during one turn of the event loop go to the file in a single `write()` at
the end of that turn, so a burst of records costs one system call and a `kill -9` loses at
most the records of the turn in progress. Logs are not fsynced: the spool is the durable
store, the logs are its account.

Segments are named `<UTC time>-<microseconds>-w<shard>.jsonl`, so names sort by age.
A closed segment is gzipped in a background thread (`.jsonl.gz`, written beside it and
renamed into place before the plain file is removed); segments left plain by a crash are
compressed at the next start.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Final

import msgspec

from pigeon.logs.records import Record

_log = logging.getLogger(__name__)
_MAX_BUFFER: Final = 64 * 1024 * 1024  # past this, a log disk that keeps failing costs records, not memory
_FLUSH_AT: Final = 1024 * 1024
_FLUSH_GAP: Final = 0.005  # under load, at most one write per this many seconds
SEGMENT_SUFFIX: Final = ".jsonl"
COMPRESSED_SUFFIX: Final = ".jsonl.gz"


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
    ) -> None:
        self.directory = directory
        self._node = node
        self._shard = shard
        self._max_size = max_segment_size
        self._max_age = max_segment_age
        self._compress = compress
        self._encoder = msgspec.json.Encoder()
        self._buf = bytearray()
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._opened_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_scheduled = False
        self._last_flush = float("-inf")
        self._age_timer: asyncio.TimerHandle | None = None
        self._compressors: list[threading.Thread] = []
        self.dropped = 0

    @property
    def current_segment(self) -> Path | None:
        return self._path

    def open(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start a new segment; compress plain segments an earlier run left behind."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._loop = loop
        mine = f"-w{self._shard}{SEGMENT_SUFFIX}"
        for partial in self.directory.glob(f"*{mine}.gz.tmp"):
            partial.unlink(missing_ok=True)  # a compression cut short: its plain segment is still here
        for leftover in sorted(self.directory.glob("*" + mine)):
            self._close_segment(leftover)
        self._new_segment()
        if loop is not None:
            self._arm_age_timer()

    def encode(self, record: Record) -> bytes:
        """The record's line, without the newline, as `write()` would write it."""
        record.node = self._node
        return self._encoder.encode(record)

    def write(self, record: Record) -> None:
        """Queue a record; it reaches the file at the end of this loop turn (at most
        `_FLUSH_GAP` later when records keep coming)."""
        self.write_raw(self.encode(record))

    def write_raw(self, line: bytes) -> None:
        """Queue an encoded record (from `encode()`, possibly stored meanwhile)."""
        self._buf += line
        self._buf += b"\n"
        if len(self._buf) >= _FLUSH_AT:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            loop = self._loop
            if loop is None:
                self.flush()
            elif loop.time() - self._last_flush >= _FLUSH_GAP:
                loop.call_soon(self.flush)
            else:
                # Busy: gather the records of the next few loop turns into one write. Nothing
                # durable depends on this file being current (the outbox covers a crash).
                loop.call_at(self._last_flush + _FLUSH_GAP, self.flush)

    def flush(self) -> None:
        """Write buffered records to the segment now (no fsync)."""
        self._flush_scheduled = False
        if self._loop is not None:
            self._last_flush = self._loop.time()
        if not self._buf or self._fd is None:
            return
        try:
            view = memoryview(self._buf)
            written = 0
            while written < len(view):
                written += os.write(self._fd, view[written:])
            view.release()
        except OSError as error:
            view.release()
            del self._buf[:written]
            self._size += written
            if len(self._buf) > _MAX_BUFFER:
                self.dropped += self._buf.count(b"\n")
                self._buf.clear()
            _log.error("cannot write log segment %s: %s (%d records dropped so far)", self._path, error, self.dropped)
            return
        self._size += written
        self._buf.clear()
        if self._size >= self._max_size:
            self.rotate()

    def rotate(self) -> None:
        """Close the current segment (compressing it) and start a new one."""
        self.flush()
        if self._fd is not None and self._size == 0:
            return  # nothing in it: keep using it
        old = self._path
        self._close_fd()
        if old is not None:
            self._close_segment(old)
        self._new_segment()

    def close(self) -> None:
        """Flush, close and compress the current segment; wait for compressions."""
        if self._age_timer is not None:
            self._age_timer.cancel()
            self._age_timer = None
        self.flush()
        old, size = self._path, self._size
        self._close_fd()
        if old is not None:
            if size == 0:
                old.unlink(missing_ok=True)
            else:
                self._close_segment(old)
        for thread in self._compressors:
            thread.join()
        self._compressors.clear()

    # --- segments --------------------------------------------------------------------------
    def _new_segment(self) -> None:
        now = time.time()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        micros = int((now % 1) * 1_000_000)
        path = self.directory / f"{stamp}-{micros:06d}-w{self._shard}{SEGMENT_SUFFIX}"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self._path = path
        self._size = 0
        self._opened_at = time.monotonic()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._path = None

    def _close_segment(self, path: Path) -> None:
        if not self._compress:
            return
        self._compressors = [t for t in self._compressors if t.is_alive()]
        thread = threading.Thread(target=compress_segment, args=(path,), name="log-compress")
        thread.start()
        self._compressors.append(thread)

    def _arm_age_timer(self) -> None:
        assert self._loop is not None
        self._age_timer = self._loop.call_later(min(self._max_age, 60.0), self._check_age)

    def _check_age(self) -> None:
        if time.monotonic() - self._opened_at >= self._max_age:
            self.rotate()
        self._arm_age_timer()


def compress_segment(path: Path) -> None:
    """gzip `path` to `path.gz`, atomically, then remove `path`."""
    target = path.with_name(path.name + ".gz")
    partial = path.with_name(path.name + ".gz.tmp")
    try:
        with open(path, "rb") as source, open(partial, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, filename=path.name) as sink:
                shutil.copyfileobj(source, sink, 1024 * 1024)
            raw.flush()
            os.fsync(raw.fileno())  # the .gz is whole on disk before the plain copy goes
        os.replace(partial, target)
        path.unlink()
    except OSError as error:
        partial.unlink(missing_ok=True)
        _log.error("cannot compress log segment %s: %s (left uncompressed)", path, error)
