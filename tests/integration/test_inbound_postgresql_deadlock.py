"""Nodes sharing a PostgreSQL target hand over batches of the same messages in different orders
(a folder that holds each message twice, the second copies in reverse, watched by several nodes):
their transactions never deadlock, and a deadlock or serialization failure that happens all the
same (a constraint of the operator's) is tried again at once, not said as the database refusing
the batch (which failed every message of it, and set the mailbox back by a backoff).

Against a private PostgreSQL, with targets driven directly, one per node (each its own pool)."""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
import pytest

from pigeon.config.schema import PostgresqlTarget as PostgresqlConfig
from pigeon.config.schema import decode_hook
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Verdict
from pigeon.inbound.targets.postgresql import PostgresqlTarget, create_table_sql
from tests.support.apps import customer_mail
from tests.support.services import Postgres

TABLE = "inbound_emails"
MESSAGES = 8
# Each row's insert slowed down (a BEFORE INSERT trigger, as an operator's table may have), so that
# two batches that start together are each well inside their own when they meet the other's rows.
ROW_SECONDS = 0.1


def _target(postgres: Postgres) -> PostgresqlTarget:
    config = {"name": "db", "kind": "postgresql", "dsn": postgres.dsn, "table": TABLE}
    return PostgresqlTarget(msgspec.convert(config, PostgresqlConfig, dec_hook=decode_hook))


def _messages() -> list[InboundMessage]:
    return [InboundMessage.of(customer_mail(n), "imap:pgbox", time.time()) for n in range(MESSAGES)]


def _trigger(postgres: Postgres, body: str) -> None:
    postgres.execute(
        f"CREATE FUNCTION each_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {body} RETURN NEW; END $$; "
        f"CREATE TRIGGER each_row BEFORE INSERT ON {TABLE} FOR EACH ROW EXECUTE FUNCTION each_row()"
    )


async def test_two_nodes_inserting_the_same_messages_in_opposite_orders_do_not_deadlock(
    postgres: Postgres, caplog: pytest.LogCaptureFixture
) -> None:
    postgres.execute(create_table_sql(TABLE))
    _trigger(postgres, f"PERFORM pg_sleep({ROW_SECONDS});")
    caplog.set_level(logging.INFO, logger="pigeon.inbound.targets.postgresql")
    messages = _messages()
    one, other = _target(postgres), _target(postgres)
    try:
        await asyncio.gather(one.start(), other.start())
        answers = await asyncio.gather(one.deliver_many(messages), other.deliver_many(messages[::-1]))
    finally:
        await asyncio.gather(one.close(), other.close())
    details = [a.detail for batch in answers for a in batch if a.verdict is not Verdict.ACCEPTED]
    assert not details, details
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not said, said
    # Nor one deadlock that a retry then hid: PostgreSQL logs each it breaks.
    assert "deadlock detected" not in postgres.log_path.read_text(errors="replace")
    assert postgres.query(f"SELECT count(*), count(DISTINCT dedupe_key) FROM {TABLE}") == [(str(MESSAGES),) * 2]


@pytest.mark.parametrize(("sqlstate", "what"), [("40P01", "deadlock detected"), ("40001", "could not serialize")])
async def test_a_batch_that_meets_a_deadlock_or_serialization_failure_goes_in_when_tried_again_at_once(
    postgres: Postgres, caplog: pytest.LogCaptureFixture, sqlstate: str, what: str
) -> None:
    # The first two tries of the batch fail as a transaction that lost a deadlock or a
    # serialization conflict does (a sequence counts them: nextval is not rolled back).
    postgres.execute(create_table_sql(TABLE) + "; CREATE SEQUENCE tries")
    _trigger(postgres, f"IF nextval('tries') <= 2 THEN RAISE EXCEPTION '{what}' USING ERRCODE = '{sqlstate}'; END IF;")
    caplog.set_level(logging.INFO, logger="pigeon.inbound.targets.postgresql")
    messages = _messages()
    target = _target(postgres)
    try:
        await target.start()
        answers = await target.deliver_many(messages)
    finally:
        await target.close()
    assert [a.detail for a in answers] == [f"inserted into {TABLE}"] * MESSAGES
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not said, said
    assert postgres.query(f"SELECT count(*) FROM {TABLE}") == [(str(MESSAGES),)]


async def test_a_batch_that_keeps_meeting_deadlocks_is_refused_for_now_not_lost(postgres: Postgres) -> None:
    postgres.execute(create_table_sql(TABLE))
    _trigger(postgres, "RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01';")
    target = _target(postgres)
    try:
        await target.start()
        answers = await target.deliver_many(_messages())
    finally:
        await target.close()
    assert {a.verdict for a in answers} == {Verdict.TRANSIENT}
    assert answers[0].detail.endswith(": deadlock detected (SQLSTATE 40P01)"), answers[0].detail
