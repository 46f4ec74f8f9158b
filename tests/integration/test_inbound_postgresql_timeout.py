"""An insert into the PostgreSQL target that a lock holds past the target's `timeout` is refused
for now with a detail that names that timeout (its key and value) and the lock that may hold it,
not a bare `TimeoutError`; once the lock goes, the message goes in."""

from __future__ import annotations

import time

import asyncpg
import msgspec

from pigeon.config.schema import PostgresqlTarget as PostgresqlConfig
from pigeon.config.schema import decode_hook
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Verdict
from pigeon.inbound.targets.postgresql import PostgresqlTarget
from tests.support.apps import customer_mail
from tests.support.services import Postgres


async def test_an_insert_held_by_a_table_lock_names_the_timeout_that_ran_out_and_the_lock(postgres: Postgres) -> None:
    config = {"name": "db", "kind": "postgresql", "dsn": postgres.dsn, "timeout": "1s"}
    target = PostgresqlTarget(msgspec.convert(config, PostgresqlConfig, dec_hook=decode_hook))
    message = InboundMessage.of(customer_mail(1), "imap:support", time.time())
    await target.start()
    holder = await asyncpg.connect(postgres.dsn)
    try:
        locking = holder.transaction()
        await locking.start()
        await holder.execute("LOCK TABLE inbound_emails")
        held = await target.deliver(message)
        await locking.rollback()
        went_in = await target.deliver(message)
    finally:
        await holder.close()
        await target.close()
    assert held.verdict is Verdict.TRANSIENT
    assert held.detail.endswith(
        ": a statement got no answer within timeout = 1s of target db: a lock on table inbound_emails may be "
        "holding it (a transaction that holds one, LOCK TABLE, ALTER TABLE: see pg_locks)"
    ), held.detail
    assert went_in.accepted, went_in.detail
    assert postgres.query("SELECT count(*) FROM inbound_emails") == [("1",)]
