"""Exactly-once log records: committed with the change they report, logged after the commit.

A record like `Reception` or `Delivery` reports a spool change. Written before the change
commits, a crash can leave the record without the change; written after, the change
without the record. So the record (encoded, with a unique `seq`) goes into the spool's
outbox table in the same transaction as the change; after the commit it is written to the
log file, and the outbox forgets it a moment later, in one batch. At start-up whatever the
outbox still holds is compared with the log and the missing records are written
(`recover_outbox_lines`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from pigeon.logs.reader import seqs_in_log
from pigeon.logs.records import Record
from pigeon.logs.writer import LogWriter
from pigeon.spool.sqlite import SqliteSpool

_log = logging.getLogger(__name__)
_FORGET_AFTER = 0.5  # seconds: batches the outbox deletions


class Outbox:
    def __init__(self, log: LogWriter, spools: Mapping[int, SqliteSpool]) -> None:
        self._log = log
        self._spools = spools
        self._done: dict[int, int] = {}
        self._timer: asyncio.TimerHandle | None = None

    def seal(self, spool: SqliteSpool, records: Sequence[Record]) -> list[tuple[int, bytes]]:
        """Give each record its `seq` and encode it, ready to store with the change."""
        sealed: list[tuple[int, bytes]] = []
        for record, seq in zip(records, spool.new_ids(len(records)), strict=True):
            record.seq = seq  # type: ignore[attr-defined]
            sealed.append((seq, self._log.encode(record)))
        return sealed

    def committed(self, spool: SqliteSpool, sealed: Sequence[tuple[int, bytes]]) -> None:
        """The change is durable: log its records, and let the outbox forget them soon."""
        if not sealed:
            return
        for _, line in sealed:
            self._log.write_raw(line)
        shard = spool.shard
        self._done[shard] = max(sealed[-1][0], self._done.get(shard, 0))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(_FORGET_AFTER, self.flush)

    def flush(self) -> None:
        """Forget what is in the log file (written to it first)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._log.flush()
        done, self._done = self._done, {}
        for shard, seq in done.items():
            self._spools[shard].outbox_written(seq)


def recover_outbox_lines(spool: SqliteSpool, log: LogWriter, shard: int) -> list[bytes]:
    """Terminal records committed before a crash and missing from the log (read before the
    log is opened, which compresses the last run's segments)."""
    pending = spool.outbox()
    if not pending:
        return []
    present = seqs_in_log(log.directory, shard, {seq for seq, _ in pending})
    return [line for seq, line in pending if seq not in present]


def finish_outbox(spool: SqliteSpool, log: LogWriter, missing: list[bytes]) -> None:
    """Log what `recover_outbox_lines` found, then empty the outbox."""
    pending = spool.outbox()
    for line in missing:
        log.write_raw(line)
    log.flush()
    if pending:
        spool.outbox_written(pending[-1][0])
    if missing:
        _log.warning(
            "spool %s: %d terminal records were committed but not logged before a crash; logged them now",
            spool.directory,
            len(missing),
        )
