"""Log hooks (`[[log_hook]]`): the event log's records POSTed to an application in batches.

A hook reads the records back from the log files, the node's durable record of what happened,
not from memory: what the log holds is sent, whatever became of the process that wrote it. Its
place in the log is a cursor, `<spool>/log-hooks/<name>.json`: for each writer (worker) of the
log, the segment and the bytes of it that are done with. Before a batch is POSTed, the cursor
file says which records it holds and its id (`batch`); once a 2xx took it, that the records are
done. Each write is fsynced (then its directory), so a restart, a `kill -9` or a power loss
sends again at most the batch that was on its way, with the same id and records, and loses
nothing: at least once, as KumoMTA's log hooks.

Reading follows each writer's segments as `pigeon logs --follow` does: in order, across
rotations (the rest of a segment is read before moving to the next one listed before it), a
plain segment compressed meanwhile read on from its open file or its `.gz` twin (a cursor's
offset counts uncompressed bytes, so it holds in either). A line without its newline is a record
still being written: left for the next look. Records of one writer go in the order it wrote
them; the writers' records, as they come, interleaved by `timestamp`.

A batch goes when it holds `batch` records or its first record has waited `linger`. The
answer: 2xx, done; anything else (4xx included: a hook never skips a batch, which would be
records lost without a trace), or none within `timeout`, and the same batch is sent again after
`retry_interval`, doubling up to `max_retry_interval` (a 429 or 503's `Retry-After` is
followed up to that). A refusal (a 4xx but 408 and 429) is logged as an ERROR, the others as a
WARNING, then every minute while it lasts; `pigeon_log_hook_failing` is 1 meanwhile, and
`pigeon_log_hook_lag_seconds` says how old the oldest record not yet taken is.

One process of a node runs the hooks (worker 0), beside its SMTP and delivery work: reading
and fsyncs run in a thread, a POST on the loop. The cursor's flock keeps a second process (a
worker 0 not yet gone) from sending too.

At a hook's first start (no cursor file), the segments started more than `_FIRST_START_MARGIN`
before are history: not sent. The records of the node's start are in.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, NamedTuple

import aiohttp
import msgspec

from pigeon.config.schema import LogHookConfig
from pigeon.flock import LockHeld, take_pid_lock
from pigeon.fsync import fsync_directory
from pigeon.inbound.targets.webhook import Unanswered, exchange, http_session, signature, tls_context
from pigeon.logs.reader import segment_started, segment_stem, segments
from pigeon.logs.writer import COMPRESSED_SUFFIX
from pigeon.redaction import redact, redact_url

_log = logging.getLogger(__name__)
_POLL: Final = 0.2  # seconds between looks at the log when nothing new came
_READ_BYTES: Final = 4 * 1024 * 1024  # read of one writer's segments per look, at most (a thread's turn)
_SAVE_SKIPPED_EVERY: Final = 5.0  # seconds between cursor saves that only step over records not sent
_REMIND_EVERY: Final = 60.0  # seconds between "still failing" lines
_LOCK_RETRY: Final = 1.0
_FIRST_START_MARGIN: Final = 60.0
_REFUSED_BUT: Final = frozenset({408, 429})  # 4xx answers that mean "later", as any 5xx

Position = tuple[str, int]
"""(segment stem, bytes of its uncompressed content read): a place in one writer's log."""


class _Line(NamedTuple):
    timestamp: float
    line: bytes  # without its newline
    stem: str
    end: int  # the offset after its newline


class _Head(msgspec.Struct):
    type: str = ""
    timestamp: float = 0.0


_HEAD: Final = msgspec.json.Decoder(_Head)


class _Writer:
    """One writer's segments, read in order from a position (`stem` None: not started)."""

    def __init__(self, name: str, at: Position | None) -> None:
        self.name = name
        self.stem: str | None = at[0] if at is not None else None
        self.offset = at[1] if at is not None else 0
        self.stream: IO[bytes] | None = None
        self.queue: deque[_Line] = deque()
        self.read_to: Position | None = None
        """The end of the segment read before this one, while nothing of this one is read."""
        self.placed = at is not None
        """Whether the cursor named a position of this writer's (else its segments since the
        hook's first start are read, `since`: what one never read is found again so)."""

    @property
    def position(self) -> Position | None:
        """Where reading goes on from. Not in a segment of which nothing is read yet: the
        writer removes a segment it closes empty (at a stop), and a cursor left in it would
        find it gone at the next start, and say the segment was lost (found from outside: an
        ERROR at a restart, though nothing was missing)."""
        if self.offset == 0 and self.read_to is not None:
            return self.read_to
        if self.offset == 0 and not self.placed:
            return None
        return (self.stem, self.offset) if self.stem is not None else None

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    def read(self, found: list[Path], wanted: frozenset[str] | None, room: int, since: float,
             stop_at: Position | None) -> bool:  # fmt: skip
        """Queue up to `room` more records of `wanted` types (None: all) from `found` (this
        writer's segments, oldest first, listed before reading), not past `stop_at`. True if
        it read anything."""
        progressed = False
        budget = _READ_BYTES
        while room > 0 and budget > 0:
            if stop_at is not None and self.stem is not None and (self.stem, self.offset) >= stop_at:
                return progressed
            if self.stream is None and not self._open(found, since):
                return progressed
            assert self.stream is not None and self.stem is not None
            line = self.stream.readline()
            if line.endswith(b"\n"):
                progressed = True
                self.offset += len(line)
                budget -= len(line)
                if len(line) > 1 and (kept := self._kept(line[:-1], wanted)) is not None:
                    self.queue.append(kept)
                    room -= 1
                continue
            if not any(segment_stem(path) > self.stem for path in found):
                # The newest segment: a line without its newline is still being written. Read
                # again from its start at the next look.
                if line:
                    self.stream.seek(self.offset)
                return progressed
            # The writer moved on before this look: the segment is whole (a head cut short at
            # its end was a record the writer writes again whole: `drop_cut_line`).
            self.close()
            if self.offset > 0:  # (an empty one is no place to go on from either)
                self.read_to = (self.stem, self.offset)
            self.stem = min(segment_stem(path) for path in found if segment_stem(path) > self.stem)
            self.offset = 0
            progressed = True
        return progressed

    def _kept(self, line: bytes, wanted: frozenset[str] | None) -> _Line | None:
        assert self.stem is not None
        try:
            head = _HEAD.decode(line)
        except msgspec.DecodeError:
            _log.warning("log hook: a line of log segment %s at byte %d is no JSON record: not sent",
                         self.stem, self.offset - len(line) - 1)  # fmt: skip
            return None
        if wanted is not None and head.type not in wanted:
            return None
        return _Line(head.timestamp, line, self.stem, self.offset)

    def _open(self, found: list[Path], since: float) -> bool:
        """Open the segment at the position (or the first one to read); False if none is there yet."""
        if self.stem is None:
            first = [path for path in found if segment_started(path) >= since]
            if not first:
                return False
            self.stem, self.offset = segment_stem(first[0]), 0
        by_stem = {segment_stem(path): path for path in found}
        path = by_stem.get(self.stem)
        if path is None:
            later = sorted(stem for stem in by_stem if stem > self.stem)
            if not later:
                return False  # (not listed yet, or being compressed: the next look finds it)
            _log.error("log hook: log segment %s is gone before all of it was sent (from byte %d on); "
                       "going on with %s", self.stem, self.offset, later[0])  # fmt: skip
            self.stem, self.offset = later[0], 0
            path = by_stem[self.stem]
        compressed = path.name.endswith(COMPRESSED_SUFFIX)
        for candidate in [path] if compressed else [path, path.with_name(path.name + ".gz")]:
            try:
                if candidate.name.endswith(COMPRESSED_SUFFIX):
                    stream: IO[bytes] = gzip.open(candidate, "rb")  # type: ignore[assignment]  # noqa: SIM115
                else:
                    stream = open(candidate, "rb")  # noqa: SIM115 - kept open between looks
            except FileNotFoundError:
                continue  # compressed meanwhile: its twin
            try:
                stream.seek(self.offset)
            except (OSError, EOFError) as error:
                stream.close()
                _log.error("log hook: cannot read log segment %s: %s", candidate, error)
                return False
            self.stream = stream
            return True
        return False


def _writer_of(stem: str) -> str:
    return stem.rsplit("-", 1)[-1]


@dataclass
class HookState:
    """What a hook tells /metrics."""

    name: str
    sent: int = 0  # records a 2xx took
    batches: int = 0  # batches a 2xx took
    failures: dict[str, int] = field(default_factory=lambda: {"refused": 0, "unavailable": 0})
    failing: bool = False  # the last POST failed
    waited: Callable[[], float] = lambda: 0.0  # seconds the oldest record not yet taken has waited

    def lag(self) -> float:
        return self.waited()


@dataclass
class _Batch:
    id: str
    lines: list[bytes]
    to: dict[str, Position]
    oldest: float


class LogHook:
    """One `[[log_hook]]`: `await run()` sends until cancelled."""

    def __init__(self, config: LogHookConfig, *, log_directory: Path, state_directory: Path, node: str) -> None:
        self.config = config
        self._log_directory = log_directory
        self._directory = state_directory
        self._cursor = state_directory / f"{config.name}.json"
        self._node = node
        self._wanted = None if "*" in config.types else frozenset(config.types)
        self._writers: dict[str, _Writer] = {}
        self._done: dict[str, Position] = {}
        self._since = 0.0
        self._resend: _Batch | None = None  # the batch on its way when the last run ended
        self._first_seen = 0.0  # when the oldest record queued was read (monotonic)
        self._saved_skips = 0.0
        self._sending: _Batch | None = None
        self._lock_fd: int | None = None
        self.state = HookState(config.name, waited=self._lag)

    # --- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        session: aiohttp.ClientSession | None = None
        try:
            await self._lock()
            await asyncio.to_thread(self._load)
            session = http_session(tls_context(self.config.url, verify=self.config.tls_verify,
                                               ca_file=self.config.ca_file))  # fmt: skip
            _log.info("log hook %s: sending %s to %s", self.config.name,
                      "every record" if self._wanted is None else ", ".join(self.config.types),
                      redact_url(self.config.url))  # fmt: skip
            while True:
                progressed = await asyncio.to_thread(self._fill)
                batch = self._next_batch(progressed)
                if batch is None:
                    if not progressed:
                        await asyncio.sleep(_POLL)
                    continue
                await self._send(session, batch)
        finally:
            for writer in self._writers.values():
                writer.close()
            if session is not None:
                await session.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    async def _lock(self) -> None:
        said = False
        while True:
            try:
                await asyncio.to_thread(self._directory.mkdir, parents=True, exist_ok=True)
                self._lock_fd = take_pid_lock(self._directory / f"{self.config.name}.lock", 0o600)
                return
            except LockHeld as held:
                if not said:
                    said = True
                    _log.warning("log hook %s: process %s still sends its records; waiting for it to end",
                                 self.config.name, held.holder)  # fmt: skip
            await asyncio.sleep(_LOCK_RETRY)

    # --- the cursor -------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            saved = json.loads(self._cursor.read_text())
        except FileNotFoundError:
            self._since = time.time() - _FIRST_START_MARGIN
            self._save(None)
            return
        except (OSError, ValueError) as error:
            # Read again from the start of the log rather than guess: duplicates, not losses.
            _log.error("log hook %s: cannot read its cursor %s (%s); sending the whole log again",
                       self.config.name, self._cursor, error)  # fmt: skip
            self._since = 0.0
            return
        self._since = float(saved.get("since", 0.0))
        self._done = {w: (str(p[0]), int(p[1])) for w, p in saved.get("done", {}).items()}
        for name, at in self._done.items():
            self._writers[name] = _Writer(name, at)
        if (batch := saved.get("batch")) is not None:
            to = {w: (str(p[0]), int(p[1])) for w, p in batch["to"].items()}
            self._resend = _Batch(str(batch["id"]), [], to, 0.0)

    def _save(self, batch: _Batch | None) -> None:
        """Write the cursor (and the batch on its way, if any) durably: fsynced, renamed, and
        the rename fsynced."""
        state: dict[str, Any] = {
            "version": 1,
            "since": self._since,
            "done": {w: list(p) for w, p in sorted(self._done.items())},
            "batch": None if batch is None else {
                "id": batch.id, "records": len(batch.lines), "to": {w: list(p) for w, p in sorted(batch.to.items())}
            },
        }  # fmt: skip
        partial = self._cursor.with_name(self._cursor.name + ".tmp")
        with open(partial, "wb") as stream:
            stream.write(json.dumps(state).encode() + b"\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(partial, self._cursor)
        fsync_directory(self._directory)

    # --- reading ----------------------------------------------------------------------------
    def _fill(self) -> bool:
        """Read what the log holds past each writer's position (in a thread)."""
        by_writer: dict[str, list[Path]] = {}
        for path in segments(self._log_directory):
            by_writer.setdefault(_writer_of(segment_stem(path)), []).append(path)
        progressed = False
        for name in sorted(by_writer):
            writer = self._writers.get(name)
            if writer is None:
                writer = self._writers[name] = _Writer(name, None)
            if self._resend is not None:
                stop_at = self._resend.to.get(name)
                if stop_at is None:
                    continue  # nothing of this writer's in the batch on its way
                room = 1 << 30
            else:
                stop_at, room = None, self.config.batch - len(writer.queue)
            was_empty = not any(w.queue for w in self._writers.values())
            try:
                progressed |= writer.read(by_writer[name], self._wanted, room, self._since, stop_at)
            except (OSError, EOFError) as error:
                writer.close()
                _log.error("log hook %s: cannot read log segment %s: %s", self.config.name, writer.stem, error)
            if was_empty and writer.queue:
                self._first_seen = time.monotonic()
        return progressed

    def _next_batch(self, progressed: bool) -> _Batch | None:
        if self._resend is not None:
            if progressed:
                return None  # read on to its end first
            batch, self._resend = self._resend, None
            lines = self._take(1 << 30)
            batch.lines = [line.line for line in lines]
            batch.oldest = min((line.timestamp for line in lines), default=time.time())
            if not batch.lines:
                # Nothing of it is there to send any more (its types no longer wanted): done.
                self._done = batch.to
                self._save(None)
                return None
            _log.warning("log hook %s: sending again batch %s (%d records) that was on its way when the node stopped",
                         self.config.name, batch.id, len(batch.lines))  # fmt: skip
            return batch
        queued = sum(len(w.queue) for w in self._writers.values())
        if queued == 0:
            self._skip_ahead()
            return None
        if queued < self.config.batch and time.monotonic() - self._first_seen < self.config.linger:
            return None
        lines = self._take(self.config.batch)
        to = dict(self._done)
        for name, writer in self._writers.items():
            if not writer.queue and writer.position is not None:
                to[name] = writer.position  # every line before it sent or not wanted
        for line in lines:
            to[_writer_of(line.stem)] = max(to.get(_writer_of(line.stem), ("", 0)), (line.stem, line.end))
        ident = hashlib.sha256(json.dumps([self._node, self.config.name, sorted(to.items())]).encode())
        oldest = min(line.timestamp for line in lines)
        return _Batch(ident.hexdigest()[:32], [line.line for line in lines], to, oldest)

    def _take(self, most: int) -> list[_Line]:
        """Up to `most` queued records, each writer's in order, the writers' interleaved by time."""
        writers = [w for _, w in sorted(self._writers.items())]
        taken: list[_Line] = []
        while len(taken) < most:
            heads = [w for w in writers if w.queue]
            if not heads:
                break
            first = min(heads, key=lambda w: w.queue[0].timestamp)
            taken.append(first.queue.popleft())
        return taken

    def _skip_ahead(self) -> None:
        """Nothing queued: keep the cursor past the records not sent, now and then (else a
        restart would read them all again to skip them)."""
        now = time.monotonic()
        if now - self._saved_skips < _SAVE_SKIPPED_EVERY:
            return
        moved = {n: w.position for n, w in self._writers.items() if w.position is not None}
        if any(self._done.get(n) != p for n, p in moved.items()):
            self._saved_skips = now
            self._done.update({n: p for n, p in moved.items() if p is not None})
            try:
                self._save(None)
            except OSError as error:
                _log.error("log hook %s: cannot save its cursor %s: %s", self.config.name, self._cursor, error)

    def _lag(self) -> float:
        oldest = [w.queue[0].timestamp for w in self._writers.values() if w.queue]
        if self._sending is not None:
            oldest.append(self._sending.oldest)
        return max(0.0, time.time() - min(oldest)) if oldest else 0.0

    # --- sending ----------------------------------------------------------------------------
    async def _send(self, session: aiohttp.ClientSession, batch: _Batch) -> None:
        """POST the batch until a 2xx takes it, then move the cursor past it."""
        config = self.config
        self._sending = batch
        try:
            await self._durably(batch)  # (the batch again after a restart: the same id and records)
            body = b"[" + b",".join(batch.lines) + b"]"
            wait: float = config.retry_interval
            failing_since: float | None = None
            said_at, said_kind = 0.0, ""
            while True:
                headers = {
                    "Content-Type": "application/json",
                    "User-Agent": "Pigeon",
                    "X-Pigeon-Node": self._node,
                    "X-Pigeon-Log-Hook": config.name,
                    "X-Pigeon-Batch-Id": batch.id,
                    "X-Pigeon-Batch-Size": str(len(batch.lines)),
                    **config.headers,
                }
                if config.secret:
                    headers["X-Pigeon-Signature"] = signature(config.secret, int(time.time()), body)
                asked: float | None = None
                try:
                    status, reason, asked = await exchange(session, config.url, body, headers, config.timeout)
                except Unanswered as failure:
                    problem, kind = failure.detail, "unavailable"
                except ValueError as error:  # a header aiohttp will not send
                    problem, kind = f"cannot make the request: {redact(str(error))}", "refused"
                else:
                    if 200 <= status < 300:
                        break
                    problem = f"{redact_url(config.url)} answered {status} {reason}".rstrip()
                    refused = 400 <= status < 500 and status not in _REFUSED_BUT
                    kind = "refused" if refused else "unavailable"
                self.state.failures[kind] += 1
                self.state.failing = True
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                # Said at once when the kind of failure changes (found from outside: a 400
                # after a minute of 500s was never said, as a reminder was not due yet).
                if kind != said_kind or now - said_at >= _REMIND_EVERY:
                    said_at, said_kind = now, kind
                    self._say(kind, problem, batch, now - failing_since)
                delay = wait if asked is None else min(asked, config.max_retry_interval)
                await asyncio.sleep(delay)
                wait = min(wait * 2, config.max_retry_interval)
            if failing_since is not None:
                _log.info("log hook %s: batch %s taken after %.0fs of failures", config.name, batch.id,
                          time.monotonic() - failing_since)  # fmt: skip
            self.state.failing = False
            self._done = batch.to
            await self._durably(None)
            self.state.sent += len(batch.lines)
            self.state.batches += 1
        finally:
            self._sending = None

    async def _durably(self, batch: _Batch | None) -> None:
        """Save the cursor; while that fails (a full disk), try again every second: a batch
        sent without it saved first could be lost to a restart."""
        said = False
        while True:
            try:
                await asyncio.to_thread(self._save, batch)
                return
            except OSError as error:
                if not said:
                    said = True
                    _log.error("log hook %s: cannot save its cursor %s: %s; trying again every second",
                               self.config.name, self._cursor, error)  # fmt: skip
            await asyncio.sleep(1.0)

    def _say(self, kind: str, problem: str, batch: _Batch, failing_for: float) -> None:
        waited = time.time() - batch.oldest
        if kind == "refused":
            _log.error(
                "log hook %s: batch %s (%d records) refused: %s; it is sent again until a 2xx takes it "
                "(fix the receiver or the hook's config); the oldest record waiting is %.0fs old",
                self.config.name, batch.id, len(batch.lines), problem, waited,
            )  # fmt: skip
        elif failing_for == 0.0:
            _log.warning("log hook %s: batch %s (%d records) not taken: %s; sending it again",
                         self.config.name, batch.id, len(batch.lines), problem)  # fmt: skip
        else:
            _log.error("log hook %s: still failing after %.0fs: %s; the oldest record waiting is %.0fs old",
                       self.config.name, failing_for, problem, waited)  # fmt: skip


class LogHooks:
    """The node's `[[log_hook]]`s, each in a task of its own."""

    def __init__(self, hooks: list[LogHookConfig], *, log_directory: Path, spool: Path, node: str) -> None:
        self.hooks = [
            LogHook(hook, log_directory=log_directory, state_directory=spool / "log-hooks", node=node) for hook in hooks
        ]
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for hook in self.hooks:
            task = asyncio.create_task(hook.run(), name=f"log hook {hook.config.name}")
            task.add_done_callback(_ended)
            self._tasks.append(task)

    async def stop(self) -> None:
        """Stop sending: a batch on its way is sent again, with its id, at the next start."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


def _ended(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        error = task.exception()
        if error is not None:
            _log.error("%s stopped: %s", task.get_name(), error, exc_info=error)
