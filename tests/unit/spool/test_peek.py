"""`SqliteSpool.peek`: whose mail a stored message is, told from its row's queue name (and, for
a name without a tenant part, its envelope's `tenant` alone), without reading the row whole: what
a token bound to tenants is refused another tenant's message by (`Admin.inspect`), at the cost an
absent id costs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pigeon.message import Envelope, Recipient, envelope_tenant
from pigeon.spool.spool import NewMessage
from pigeon.spool.sqlite import SqliteSpool


async def test_a_peek_gives_the_queue_name_and_only_where_it_has_no_tenant_part_the_envelope(tmp_path: Path) -> None:
    spool = SqliteSpool(tmp_path, inline_limit=64)
    spool.open(asyncio.get_running_loop())
    try:
        ids = spool.new_ids(5)
        writer = spool.body_writer(ids[0])
        writer.write(b"Subject: x\r\n\r\n" + b"x" * 200 + b"\r\n")  # (a file: not looked at)
        now = time.time()
        many = [Recipient(f"u{n}@example.com") for n in range(2000)]
        messages = [
            NewMessage(ids[1], "globex@example.com", Envelope("a@example.org", many, tenant="globex"), now, now),
            NewMessage(ids[2], "example.com", Envelope("a@example.org", many), now, now),
            NewMessage(ids[3], "bulk", Envelope("a@example.org", many, tenant="globex", campaign="c"), now, now),
        ]
        await spool.store(writer.finish(), messages)
        queue, envelope = spool.peek(ids[1]) or ("", b"")
        assert (queue, envelope) == ("globex@example.com", None)
        queue, envelope = spool.peek(ids[2]) or ("", None)
        assert queue == "example.com" and envelope is not None and envelope_tenant(envelope) is None
        queue, envelope = spool.peek(ids[3]) or ("", None)
        assert queue == "bulk" and envelope is not None and envelope_tenant(envelope) == "globex"
        assert spool.peek(ids[4]) is None  # (no such message)
    finally:
        spool.close()
