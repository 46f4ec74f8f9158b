"""A PostgreSQL restarted while the node was not running (SIGSTOP, a stalled loop): the pooled
connection it dropped fails one batch, which says so plainly, and the next batch connects
afresh and goes in."""

from __future__ import annotations

import time

import msgspec

from pigeon.config.schema import PostgresqlTarget as PostgresqlConfig
from pigeon.config.schema import decode_hook
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Verdict
from pigeon.inbound.targets.postgresql import PostgresqlTarget
from tests.support.apps import customer_mail
from tests.support.services import Postgres


def _message(n: int) -> InboundMessage:
    return InboundMessage.of(customer_mail(n), "imap:support", time.time())


async def test_a_connection_dropped_by_a_restart_is_said_plainly_and_replaced(postgres: Postgres) -> None:
    config = {"name": "db", "kind": "postgresql", "dsn": postgres.dsn, "table": "inbound_emails"}
    target = PostgresqlTarget(msgspec.convert(config, PostgresqlConfig, dec_hook=decode_hook))
    try:
        await target.start()
        assert (await target.deliver(_message(1))).accepted
        postgres.stop()  # blocking on purpose: the loop does not run, as under SIGSTOP
        postgres.start()
        lost = await target.deliver(_message(2))
        again = await target.deliver(_message(2))
    finally:
        await target.close()
    assert lost.verdict is Verdict.TRANSIENT
    assert lost.detail.endswith(": the connection was lost (PostgreSQL restarted?); reconnecting"), lost.detail
    assert again.accepted, again.detail
    assert postgres.query("SELECT count(*) FROM inbound_emails") == [("2",)]
