"""`SqliteSpool.make_due`: a walk's write, made due only where the row is still as the walk
read it. A row written since (held by id at `HELD`, deferred again by an attempt's outcome) is
left as that write left it, and the count says how many rows were made due."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pigeon.message import HELD, Envelope, Recipient
from pigeon.spool.spool import NewMessage
from pigeon.spool.sqlite import SqliteSpool


async def test_make_due_leaves_a_row_whose_due_changed_since_it_was_read(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path)
    spool.open(asyncio.get_running_loop())
    try:
        now = time.time()
        ids = spool.new_ids(4)
        writer = spool.body_writer(ids[0])
        writer.write(b"Subject: x\r\n\r\nbody\r\n")
        envelope = Envelope("a@example.org", [Recipient("u@example.com")])
        await spool.store(writer.finish(), [NewMessage(i, "example.com", envelope, now, now + 600) for i in ids])
        read = {i: spool.get(i) for i in ids}  # what a walk reads, then rests on
        first, held, deferred, gone = (read[i] for i in ids)
        assert first is not None and held is not None and deferred is not None and gone is not None
        # Meanwhile: a hold by id, an attempt's outcome deferring it again, a delivery.
        await spool.settle(held, held.envelope, attempts=0, due=HELD)
        await spool.settle(deferred, deferred.envelope, attempts=1, due=now + 1200)
        await spool.settle(gone, None, attempts=1, due=now)

        made_due = await spool.make_due([(m.id, m.due) for m in (first, held, deferred, gone)], now)

        assert made_due == 1
        dues = {i: getattr(spool.get(i), "due", None) for i in ids}
        assert dues == {first.id: now, held.id: HELD, deferred.id: now + 1200, gone.id: None}
        assert await spool.make_due([], now) == 0
    finally:
        spool.close()
