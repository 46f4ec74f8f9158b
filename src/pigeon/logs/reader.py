"""Reading log segments back: every segment in order, compressed or not, and tailing.

Used by `pigeon logs` and by the tests, which assert on what the logs say rather than on
Pigeon's internals.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

from pigeon.logs.writer import COMPRESSED_SUFFIX, SEGMENT_SUFFIX


def segments(directory: Path) -> list[Path]:
    """Every segment, oldest first.

    A segment present in both forms was being compressed when the process stopped: the
    plain file is complete, the .gz may not be, so the plain one is read.
    """
    found: dict[str, Path] = {}
    for path in directory.glob("*" + SEGMENT_SUFFIX + "*"):
        if path.name.endswith(COMPRESSED_SUFFIX):
            found.setdefault(path.name[: -len(COMPRESSED_SUFFIX)], path)
        elif path.name.endswith(SEGMENT_SUFFIX):
            found[path.name[: -len(SEGMENT_SUFFIX)]] = path
    return [found[stem] for stem in sorted(found)]


def read_lines(directory: Path) -> Iterator[bytes]:
    """Every complete record line (without its newline), oldest segment first."""
    for path in segments(directory):
        yield from _lines_of(path)


def read_records(directory: Path) -> list[dict[str, object]]:
    """Every record, decoded. For tests and small tools."""
    decoder = msgspec.json.Decoder(dict[str, object])
    return [decoder.decode(line) for line in read_lines(directory)]


def follow(directory: Path, *, poll: float = 0.25, stop_after: float | None = None) -> Iterator[bytes]:
    """Every record so far, then new ones as they are written, across rotations.

    Segments older than the newest are read whole. The newest is tailed; when a newer one
    appears, the rest of the tailed one is read (the writer has closed it: even if it was
    compressed and removed meanwhile, the open file still reads) and the tail moves on.
    A line without its newline at the end of a closed segment was cut by a crash: skipped.
    """
    started = time.monotonic()
    done: set[str] = set()
    tailing: str | None = None
    stream: BinaryIO | None = None
    pending = b""
    try:
        while stop_after is None or time.monotonic() - started < stop_after:
            found = segments(directory)
            progressed = False
            for path in found[:-1]:
                stem = _stem(path)
                if stem in done or stem == tailing:
                    continue
                done.add(stem)
                yield from _lines_of(path)
                progressed = True
            newest = found[-1] if found else None
            if newest is not None and _stem(newest) != tailing and _stem(newest) not in done:
                if stream is not None:
                    for line in (pending + stream.read()).split(b"\n")[:-1]:
                        if line:
                            yield line
                    stream.close()
                    stream = None
                if tailing is not None:
                    done.add(tailing)
                pending = b""
                tailing = _stem(newest)
                if newest.name.endswith(COMPRESSED_SUFFIX):
                    done.add(tailing)
                    yield from _lines_of(newest)
                else:
                    stream = open(newest, "rb")  # noqa: SIM115 - closed on rotation or exit
                progressed = True
            if stream is not None:
                chunk = stream.read()
                if chunk:
                    *complete, pending = (pending + chunk).split(b"\n")
                    for line in complete:
                        if line:
                            yield line
                    progressed = True
            if not progressed:
                time.sleep(poll)
    finally:
        if stream is not None:
            stream.close()


def _lines_of(path: Path) -> Iterator[bytes]:
    opener = gzip.open if path.name.endswith(COMPRESSED_SUFFIX) else open
    try:
        with opener(path, "rb") as stream:
            for line in stream:
                # A line without its newline is a record still being written: skip it.
                if line.endswith(b"\n") and len(line) > 1:
                    yield line[:-1]
    except FileNotFoundError:
        # Compressed away while we looked: read the compressed twin instead.
        twin = path.with_name(path.name + ".gz")
        if not path.name.endswith(COMPRESSED_SUFFIX) and twin.exists():
            yield from _lines_of(twin)
    except (OSError, EOFError):
        return  # a .gz cut short (the disk lost it): nothing more can be read from it


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (COMPRESSED_SUFFIX, SEGMENT_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
