"""Exactly-once log records: committed with the change they report, forgotten once fsynced.

A record like `Reception` or `Delivery` reports a spool change. Written before the change
commits, a crash can leave the record without the change; written after, the change
without the record. So the record (encoded, with a unique `seq`) goes into the spool's
outbox table in the same transaction as the change. After the commit it is written to the
log, and every half second one `LogWriter.sync()` (one fsync) makes what was written durable;
the outbox then forgets exactly the records that sync covered. A record whose write failed,
that was dropped from memory, or whose fsync failed keeps its row. Records are written as their
commits end, which is not the order their seqs were given in (a commit, a settlement's after
its DSN's, may end after a later one; rows logged late come later still): a consumer dedupes
with a set of seqs, not the highest (the README says so).

While the log disk fails, the writer keeps records in memory up to its bound. Past it,
records are dropped from memory: terminal ones still have their rows, and the others
(Rejection, TransientFailure, ...) are saved into the spool's outbox with a `seq` of their
own. Once the log can be written again, those rows are read back and logged. At stop, what
still cannot be written stays in the outbox the same way, a `clean-stop` marker goes beside
each spool shard, and stderr says how many records wait there.

At start-up the outbox is compared with the log by `seq` (`recover_outbox_lines`, before
the log is opened) and only the missing records are written (`finish_outbox`). A shard's
records may be in the log of any worker that ever owned or adopted it, so all of those
are searched. The warning then says whether they were left by a crash or by the last stop.

A record that reports no spool change (an IMAP handoff's `InboundDelivery`, whose source is
acknowledged on the strength of it) is written with a `seq` of its own (`write_numbered`) and
flushed; the ones the file does not hold then (the log disk is full) get their outbox rows
before the caller goes on (`keep_unwritten`), so a `kill -9` with the log failing loses none of
them: the next start writes those the log lacks, as it does the spool's.

BUGS: a record written before an fsync that failed is not written again in this run (that
could log it twice): its row waits for the next start, which writes it if the log lacks it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pigeon.fsync import fsync_directory
from pigeon.logs.reader import find_seqs
from pigeon.logs.records import Record
from pigeon.logs.writer import LogWriter
from pigeon.message import format_id, id_time
from pigeon.spool.spool import Spool

_log = logging.getLogger(__name__)
_FORGET_AFTER: Final = 0.5  # seconds: one fsync and one outbox deletion per this much time
_REWRITE_BATCH: Final = 10_000  # rows read back per forget cycle once the log works again
# Seconds before a record's id time from which its segment is looked for: ids run ahead of the
# clock when it steps back, and reading more than the last minute of logs would slow every start.
_CLOCK_MARGIN: Final = 60.0
CLEAN_STOP: Final = "clean-stop"  # beside a spool shard: its outbox was left by a clean stop, not a crash


class Outbox:
    def __init__(self, log: LogWriter, spools: Mapping[int, Spool], *, forget_after: float = _FORGET_AFTER) -> None:
        self._log = log
        self._spools = spools
        self._forget_after = forget_after
        self._pending: deque[tuple[int, int, int]] = deque()  # (ticket, shard, seq) written, not yet fsynced
        self._unlogged: dict[int, set[int]] = {}  # shard -> seqs dropped from memory: their rows wait
        self._spilling: set[asyncio.Future[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._cycle_task: asyncio.Task[None] | None = None
        self._closed = False
        self.unconfirmed = 0  # records whose fsync failed: their rows wait for the next start
        self.lost = 0  # records dropped from memory that the spool could not keep either
        log.on_drop = self._dropped

    @property
    def unlogged(self) -> int:
        """Records dropped from memory whose rows wait to be logged (when the log works again)."""
        return sum(len(seqs) for seqs in self._unlogged.values())

    def seal(self, spool: Spool, records: Sequence[Record]) -> list[tuple[int, bytes]]:
        """Give each record its `seq` and encode it, ready to store with the change."""
        sealed: list[tuple[int, bytes]] = []
        for record, seq in zip(records, spool.new_ids(len(records)), strict=True):
            record.seq = format_id(seq)  # type: ignore[attr-defined]
            sealed.append((seq, self._log.encode(record)))
        return sealed

    def committed(self, spool: Spool, sealed: Sequence[tuple[int, bytes]]) -> None:
        """The change is durable: log its records, and forget them once they are fsynced."""
        if not sealed:
            return
        shard = spool.shard
        write = self._log.write_raw
        pending = self._pending
        for seq, line in sealed:
            pending.append((write(line), shard, seq))
        self._arm()

    def write_numbered(self, records: Sequence[Record]) -> list[tuple[int, int, bytes]]:
        """Write records that report no spool change, each with a `seq` of its own (so the log
        and an outbox row can be matched at the next start). Returns (ticket, seq, line)."""
        spool = next(iter(self._spools.values()), None)
        lines = [self._log.encode(record) for record in records]
        if spool is None:  # (no spool to keep them in: plain records)
            return [(self._log.write_raw(line), 0, line) for line in lines]
        written: list[tuple[int, int, bytes]] = []
        for seq, line in zip(spool.new_ids(len(lines)), lines, strict=True):
            line = _with_seq(line, seq)
            written.append((self._log.write_raw(line), seq, line))
        return written

    async def keep_unwritten(self, written: Sequence[tuple[int, int, bytes]]) -> int:
        """After a flush: give the records of `written` the file does not hold yet an outbox row,
        and return once it is committed (raises OSError if it cannot be); they are forgotten
        once logged, as committed ones are. Returns how many needed one."""
        spool = next(iter(self._spools.values()), None)
        missing = [(ticket, seq, line) for ticket, seq, line in written if seq and not self._log.written(ticket)]
        if not missing or spool is None:
            return 0
        # Tracked first: if the writer drops them from memory meanwhile, they are ours (their
        # rows are coming), not records to save again under other seqs. A row forgotten before
        # it is added stays, and the next start finds its seq in the log and forgets it then.
        shard = spool.shard
        self._pending.extend((ticket, shard, seq) for ticket, seq, _ in missing)
        await spool.outbox_add([(seq, line) for _, seq, line in missing])
        self._arm()
        return len(missing)

    async def close(self) -> None:
        """At stop: log and forget what can be. What cannot be stays in the outbox for the next
        start; say how many, and mark each shard as cleanly stopped."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._cycle_task is not None:
            await asyncio.gather(self._cycle_task, return_exceptions=True)
        # Commits still in flight log their records as they return: this waits for them.
        await asyncio.gather(*(spool.outbox_written(()) for spool in self._spools.values()), return_exceptions=True)
        await self._cycle()
        while self._unlogged and self._log.error is None:
            before = self.unlogged
            await self._cycle()  # logs rows dropped earlier, now that the log works
            if self.unlogged >= before:
                break
        self._log.abandon()  # what still cannot be written: into `_unlogged`, or saved to the spool
        if self._spilling:
            await asyncio.gather(*self._spilling, return_exceptions=True)
        self._report_stop()
        for spool in self._spools.values():
            mark_clean_stop(spool.directory, self._log.error)

    # --- the forget cycle ----------------------------------------------------------------------
    def _arm(self) -> None:
        if self._closed or self._timer is not None or self._cycle_task is not None:
            return
        self._timer = asyncio.get_running_loop().call_later(self._forget_after, self._start_cycle)

    def _start_cycle(self) -> None:
        self._timer = None
        self._cycle_task = asyncio.get_running_loop().create_task(self._cycle())
        self._cycle_task.add_done_callback(self._cycle_done)

    def _cycle_done(self, task: asyncio.Task[None]) -> None:
        self._cycle_task = None
        if not task.cancelled() and task.exception() is not None:
            _log.error("outbox: forget cycle failed", exc_info=task.exception())
        if self._pending or self._unlogged:
            self._arm()

    async def _cycle(self) -> None:
        """One fsync for everything written so far; then forget what it made durable."""
        try:
            await self._log.sync()
        except OSError:
            pass  # the writer says what failed; what did reach the disk is forgotten below
        self._forget()
        if self._unlogged and self._log.error is None and not self._log.pending:
            self._rewrite()

    def _forget(self) -> None:
        durable: dict[int, list[int]] = {}
        pending, settled = self._pending, self._log.settled
        while pending:
            ticket, shard, seq = pending[0]
            state = settled(ticket)
            if state is None:
                break  # not covered by a sync yet, nor anything after it
            pending.popleft()
            if state:
                durable.setdefault(shard, []).append(seq)
            else:
                self.unconfirmed += 1
        for shard, seqs in durable.items():
            self._spools[shard].outbox_written(seqs).add_done_callback(_forgotten)

    # --- when the log cannot take records -------------------------------------------------------
    def _dropped(self, dropped: list[tuple[int, bytes]]) -> None:
        """The writer dropped these records from memory. Ours keep their rows: note them to log
        later. The others are saved into the outbox now, so they are not lost."""
        tickets = {ticket for ticket, _ in dropped}
        kept: list[tuple[int, int, int]] = []
        ours = 0
        for entry in self._pending:
            ticket, shard, seq = entry
            if ticket in tickets:
                self._unlogged.setdefault(shard, set()).add(seq)
                tickets.discard(ticket)
                ours += 1
            else:
                kept.append(entry)
        self._pending.clear()
        self._pending.extend(kept)
        others = [line for ticket, line in dropped if ticket in tickets]
        if not self._closed:  # at stop, the stop report says it
            _log.error(
                "log: of the records dropped from memory, %d are in the spool's outbox and %d others are being "
                "saved there: all are logged once the log can be written again, or at the next start",
                ours,
                len(others),
            )
        if others:
            self._spill(others)

    def _spill(self, lines: list[bytes]) -> None:
        spool = next(iter(self._spools.values()), None)
        if spool is None:
            self.lost += len(lines)
            return
        seqs = spool.new_ids(len(lines))
        future = spool.outbox_add([(seq, _with_seq(line, seq)) for seq, line in zip(seqs, lines, strict=True)])
        self._spilling.add(future)
        future.add_done_callback(functools.partial(self._spilled, spool.shard, seqs))

    def _spilled(self, shard: int, seqs: Sequence[int], future: asyncio.Future[None]) -> None:
        self._spilling.discard(future)
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or error is not None:
            self.lost += len(seqs)
            _log.error(
                "log: %d records are lost: the log could not take them and the spool failed too (%s)", len(seqs), error
            )
            return
        self._unlogged.setdefault(shard, set()).update(seqs)
        if not self._closed:
            self._arm()

    def _rewrite(self) -> None:
        """The log works again: log the rows of records it dropped from memory (never written)."""
        budget, written = _REWRITE_BATCH, 0
        for shard in list(self._unlogged):
            seqs = self._unlogged[shard]
            take = sorted(seqs)[:budget]
            for seq, line in self._spools[shard].outbox(take):
                self._pending.append((self._log.write_raw(line), shard, seq))
                written += 1
            seqs.difference_update(take)
            if not seqs:
                del self._unlogged[shard]
            budget -= len(take)
            if budget <= 0:
                break
        _log.warning("log: wrote %d records kept in the spool's outbox while the log could not take them", written)

    def _report_stop(self) -> None:
        waiting, error = self.unlogged, self._log.error
        if waiting:
            _log.error(
                "log: %d records could not be written before stopping (%s); they stay in the spool's outbox "
                "and are written at the next start",
                waiting,
                error or "the log failed earlier",
            )
        if self.unconfirmed:
            _log.error(
                "log: %d records were written but their fsync failed; their rows stay in the spool's outbox "
                "and the next start writes those the log does not hold",
                self.unconfirmed,
            )
        if self.lost:
            _log.error("log: %d records are lost: neither the log nor the spool could keep them", self.lost)


def _forgotten(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        # The rows stay: the next start finds their records in the log and forgets them then.
        _log.warning("outbox: cannot forget logged records yet: %s", future.exception())


def _with_seq(line: bytes, seq: int) -> bytes:
    """A record without a `seq` of its own gets its outbox row's, so a consumer can dedupe it
    (a string, as in every record: see `pigeon.logs.records`)."""
    return line[:-1] + b',"seq":"%016x"}' % seq if line.endswith(b"}") and b'"seq":' not in line else line


# --- start-up --------------------------------------------------------------------------------
@dataclass
class Unlogged:
    """What the outbox of one spool shard holds at start-up, compared with the log."""

    spool: Spool
    present: list[int]  # seqs found in the log (the segments holding them now fsynced)
    missing: list[tuple[int, bytes]]  # (seq, line) the log does not hold
    last_stop: str | None  # None: the last run did not stop cleanly; else why it left records


def writers_of(shard: int) -> list[int]:
    """Every worker whose log may hold records of spool shard `shard`: with K workers it is
    owned (shard < K) or adopted (shard >= K) by worker shard % K."""
    return sorted({shard % workers for workers in range(1, shard + 2)})


def recover_outbox_lines(spool: Spool, directory: Path) -> Unlogged:
    """Which outbox records of `spool` the log in `directory` holds, and which it lacks.

    Call before the log is opened (which compresses the last run's segments). The segments
    where records were found are fsynced, so their rows can be forgotten.
    """
    last_stop = take_clean_stop(spool.directory)
    pending = spool.outbox()
    if not pending:
        return Unlogged(spool, [], [], last_stop)
    wanted = {seq for seq, _ in pending}
    since = min(id_time(seq) for seq in wanted) - _CLOCK_MARGIN
    found = find_seqs(directory, writers_of(spool.shard), wanted, since=since)
    unsure: set[int] = set()
    for path in set(found.values()):
        try:
            _fsync_file(path)
        except FileNotFoundError:
            pass  # compressed meanwhile by its (running) writer: the .gz was fsynced before it went
        except OSError as error:  # they are in the log, maybe not on disk: neither forget nor repeat them
            _log.error("log: cannot fsync %s (%s); its records stay in the outbox", path, error)
            unsure |= {seq for seq, where in found.items() if where == path}
    present = sorted(set(found) - unsure)
    missing = [(seq, line) for seq, line in pending if seq not in found]
    return Unlogged(spool, present, missing, last_stop)


def finish_outbox(outbox: Outbox, unlogged: Unlogged) -> None:
    """Forget the records the log holds; log the missing ones (forgotten once fsynced)."""
    spool = unlogged.spool
    if unlogged.present:
        spool.outbox_written(unlogged.present).add_done_callback(_forgotten)
    if not unlogged.missing:
        return
    outbox.committed(spool, unlogged.missing)
    if unlogged.last_stop is None:
        when = "before a crash (or kill -9)"
    else:
        when = f"before the last stop ({unlogged.last_stop})" if unlogged.last_stop else "before the last stop"
    _log.warning(
        "spool %s: %d records kept in the outbox were not logged %s; logging them now",
        spool.directory,
        len(unlogged.missing),
        when,
    )


def mark_clean_stop(directory: Path, error: str | None) -> None:
    """Note beside a spool shard that this run stopped cleanly (and what kept records out of the log)."""
    note = json.dumps({"stopped": time.time(), "log_error": error or ""}).encode()
    partial = directory / (CLEAN_STOP + ".tmp")
    try:
        with open(partial, "wb") as stream:
            stream.write(note)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(partial, directory / CLEAN_STOP)
        fsync_directory(directory)
    except OSError as error:
        _log.warning("spool %s: cannot write the clean-stop marker: %s", directory, error)


def take_clean_stop(directory: Path) -> str | None:
    """Read and remove the clean-stop marker: None if the last run did not stop cleanly, else
    the log error it stopped with ("" if none)."""
    marker = directory / CLEAN_STOP
    try:
        raw = marker.read_bytes()
    except FileNotFoundError:
        return None
    marker.unlink()
    fsync_directory(directory)  # a crash of this run must not find it again
    try:
        error = json.loads(raw).get("log_error", "")
    except (ValueError, AttributeError):
        error = ""
    return str(error)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
