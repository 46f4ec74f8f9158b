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
    """Every segment, oldest first. A segment present in both forms is read compressed."""
    found: dict[str, Path] = {}
    for path in directory.glob("*" + SEGMENT_SUFFIX + "*"):
        if path.name.endswith(COMPRESSED_SUFFIX):
            found[path.name[: -len(COMPRESSED_SUFFIX)]] = path
        elif path.name.endswith(SEGMENT_SUFFIX):
            found.setdefault(path.name[: -len(SEGMENT_SUFFIX)], path)
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
    """Every record so far, then new ones as they are written (across rotations)."""
    started = time.monotonic()
    done = segments(directory)
    for path in done[:-1]:
        yield from _lines_of(path)
    current = done[-1] if done else None
    stream: BinaryIO | None = open(current, "rb") if current and current.suffix != ".gz" else None  # noqa: SIM115
    if current is not None and stream is None:
        yield from _lines_of(current)
    pending = b""
    seen = {p.name for p in done}
    try:
        while stop_after is None or time.monotonic() - started < stop_after:
            if stream is not None:
                chunk = stream.read()
                if chunk:
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    yield from (line for line in complete if line)
                    continue
            newer = [p for p in segments(directory) if p.name not in seen and _stem(p) > _stem_or_empty(current)]
            if newer:
                nxt = newer[0]
                seen.add(nxt.name)
                if stream is not None:
                    rest = stream.read()
                    stream.close()
                    if rest:
                        pending += rest
                    if pending.strip():
                        yield pending.rstrip(b"\n")
                pending = b""
                current = nxt
                if nxt.name.endswith(COMPRESSED_SUFFIX):
                    yield from _lines_of(nxt)
                    stream = None
                else:
                    stream = open(nxt, "rb")  # noqa: SIM115
                continue
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
        return  # a truncated .gz from a crash mid-compression; its plain twin is read instead


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (COMPRESSED_SUFFIX, SEGMENT_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _stem_or_empty(path: Path | None) -> str:
    return _stem(path) if path is not None else ""
