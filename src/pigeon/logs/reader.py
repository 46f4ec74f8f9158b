"""Reading log segments back: every segment in order, compressed or not, and tailing.

Used by `pigeon logs` and by the tests, which assert on what the logs say rather than on
Pigeon's internals.
"""

from __future__ import annotations

import calendar
import contextlib
import gzip
import heapq
import itertools
import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Final

import msgspec

from pigeon.logs.writer import COMPRESSED_SUFFIX, SEGMENT_SUFFIX

_log = logging.getLogger(__name__)


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


class _Stamped(msgspec.Struct):
    timestamp: float = 0.0


_STAMP: Final = msgspec.json.Decoder(_Stamped)


def _timestamp(line: bytes) -> float:
    try:
        return _STAMP.decode(line).timestamp
    except msgspec.DecodeError:
        return 0.0


def merged_lines(directory: Path, *, since: float | None = None) -> Iterator[bytes]:
    """Every complete record line: each writer's (worker's) records in the order it wrote them
    (commit order, not strictly by `timestamp`), the writers' streams merged by `timestamp`.
    (`read_lines` gives one writer's segment after another where their times overlap.)
    `since`: the segments that hold only records from before then are not read (see `_from`)."""
    streams = [
        itertools.chain.from_iterable(_lines_of(path) for path in _from(found, since))
        for found in _by_writer(segments(directory)).values()
    ]
    return heapq.merge(*streams, key=_timestamp)


def _from(found: list[Path], since: float | None) -> list[Path]:
    """One writer's segments (oldest first) but those it closed before `since`: a record is
    written before its writer starts its next segment, and stamped before it is written, so a
    segment whose successor started before `since` holds nothing from `since` on. (Records
    written late from the spool's outbox carry older times, in later segments: unaffected.)
    Without this, `pigeon logs --since 2m` read a week of log to print two minutes of it."""
    if since is None:
        return found
    first = 0
    while first + 1 < len(found) and 0.0 < segment_started(found[first + 1]) <= since:
        first += 1
    return found[first:]


def read_records(directory: Path) -> list[dict[str, object]]:
    """Every record, decoded. For tests and small tools."""
    decoder = msgspec.json.Decoder(dict[str, object])
    return [decoder.decode(line) for line in read_lines(directory)]


def follow(
    directory: Path, *, poll: float = 0.25, stop_after: float | None = None, since: float | None = None
) -> Iterator[bytes]:
    """Every record so far, then new ones as they are written, across rotations.

    Each writer (worker) has its own current segment; all of them are tailed at once.
    `since`: the segments that hold only records from before then are not read (`_from`).
    """
    started = time.monotonic()
    tails: dict[str, _Tail] = {}
    try:
        while stop_after is None or time.monotonic() - started < stop_after:
            progressed = False
            for writer, found in _by_writer(segments(directory)).items():
                tail = tails.setdefault(writer, _Tail())
                yield from tail.step(_from(found, since))
                progressed |= tail.progressed
            if not progressed:
                time.sleep(poll)
    finally:
        for tail in tails.values():
            tail.close()


class _Tail:
    """Follows the segments of one writer, oldest first.

    Segments older than its newest are read whole. The newest is tailed; when a newer one
    appears, the rest of the tailed one is read first (the writer has closed it: even if it
    was compressed and removed meanwhile, the open file still reads), then any segment the
    writer closed since, in order, and the tail moves on.
    The newest may be gone by the time it is opened (rotated and compressed since it was
    listed): it is closed then, and its .gz twin is read whole instead.
    A line without its newline at the end of a closed segment was cut by a crash: skipped.
    """

    def __init__(self) -> None:
        self.done: set[str] = set()
        self.tailing: str | None = None
        self.stream: BinaryIO | None = None
        self.pending = b""
        self.progressed = False

    def step(self, found: list[Path]) -> Iterator[bytes]:
        self.progressed = False
        newest = found[-1] if found else None
        if newest is not None and self.tailing is not None and segment_stem(newest) != self.tailing:
            # The writer has moved on: the rest of the tailed segment comes before any later one.
            self.progressed = True
            if self.stream is not None:
                for line in (self.pending + self.stream.read()).split(b"\n")[:-1]:
                    if line:
                        yield line
                self.close()
            self.done.add(self.tailing)
            self.tailing = None
            self.pending = b""
        for path in found[:-1]:
            stem = segment_stem(path)
            if stem in self.done or stem == self.tailing:
                continue
            self.done.add(stem)
            self.progressed = True
            yield from _lines_of(path)
        if newest is not None and segment_stem(newest) != self.tailing and segment_stem(newest) not in self.done:
            self.progressed = True
            self.tailing = segment_stem(newest)
            if not newest.name.endswith(COMPRESSED_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    self.stream = open(newest, "rb")  # noqa: SIM115 - closed on rotation or exit
            if self.stream is None:
                # Compressed, or rotated and compressed since it was listed: closed, and none of
                # it read yet. Read whole (`_lines_of` finds the .gz twin of a plain name).
                self.done.add(self.tailing)
                yield from _lines_of(newest)
        if self.stream is not None:
            chunk = self.stream.read()
            if chunk:
                self.progressed = True
                *complete, self.pending = (self.pending + chunk).split(b"\n")
                for line in complete:
                    if line:
                        yield line

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None


def _by_writer(found: list[Path]) -> dict[str, list[Path]]:
    """Segments grouped by the writer that made them (the "-w<n>" at the end of the name)."""
    groups: dict[str, list[Path]] = {}
    for path in found:
        groups.setdefault(segment_stem(path).rsplit("-", 1)[-1], []).append(path)
    return groups


def segment_started(path: Path) -> float:
    """When a segment was started (Unix time), from its name; 0.0 if the name does not say."""
    try:
        day, clock, micros = segment_stem(path).split("-")[:3]
        return calendar.timegm(time.strptime(day + clock, "%Y%m%d%H%M%S")) + int(micros) / 1e6
    except ValueError:
        return 0.0


def find_seqs(
    directory: Path, writers: Iterable[int], wanted: set[int], *, since: float, at_least: int = 3
) -> dict[int, Path]:
    """Which of `wanted` (record "seq" values) the segments of `writers` hold, and where.

    Used at start-up to find which committed records are already in the log. A record
    written at or after `since` is in the segment its writer had open then or in a later
    one: those are read, and at least the last `at_least` of each writer.
    """
    by_writer = _by_writer(segments(directory))
    found: dict[int, Path] = {}
    for writer in writers:
        mine = by_writer.get(f"w{writer}", [])
        first = max(0, len(mine) - at_least)
        while first > 0 and segment_started(mine[first]) > since:
            first -= 1
        for path in mine[first:]:
            for line in _lines_of(path):
                seq = _seq_of(line)
                if seq is not None and seq in wanted:
                    found[seq] = path
    return found


def _seq_of(line: bytes) -> int | None:
    """A record line's "seq": 16 hex digits in a string, or (in a log written before seqs were
    strings, which a start after an upgrade reads) a JSON number. None if it has none."""
    at = line.rfind(b'"seq":')  # the last field of every record that has one (but `answered`)
    if at < 0:
        return None
    value = line[at + 6 :].split(b",", 1)[0].split(b"}", 1)[0]
    if len(value) == 18 and value[:1] == b'"' == value[-1:]:
        try:
            return int(value[1:-1], 16)
        except ValueError:
            return None
    return int(value) if value.isdigit() else None


def _lines_of(path: Path) -> Iterator[bytes]:
    opener = gzip.open if path.name.endswith(COMPRESSED_SUFFIX) else open
    try:
        with opener(path, "rb") as stream:
            for line in stream:
                if not line.endswith(b"\n"):
                    # A record still being written: the segment ends there for now. Read on,
                    # and the rest of it, written meanwhile, would come as a line of its own.
                    return
                if len(line) > 1:
                    yield line[:-1]
    except FileNotFoundError:
        # Compressed away while we looked: read the compressed twin instead.
        twin = path.with_name(path.name + ".gz")
        if not path.name.endswith(COMPRESSED_SUFFIX) and twin.exists():
            yield from _lines_of(twin)
    except (OSError, EOFError) as error:
        # A .gz cut short or damaged (the disk lost it): nothing more can be read from it, and
        # whoever reads must know that what follows in it is missing, not that there was none.
        _log.warning("log segment %s is damaged (%s): its records past that point cannot be read", path, error)


def segment_stem(path: Path) -> str:
    """A segment's name without its suffix (`20261206-093745-319504-w1`), compressed or not."""
    name = path.name
    for suffix in (COMPRESSED_SUFFIX, SEGMENT_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
