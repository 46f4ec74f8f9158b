"""The PostgreSQL target with a pooled connection asyncpg left mid-operation: no database needed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import msgspec

from pigeon.config.schema import PostgresqlTarget as PostgresqlConfig
from pigeon.config.schema import decode_hook
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Verdict
from pigeon.inbound.targets.postgresql import PostgresqlTarget
from tests.support.apps import customer_mail

_STUCK = "cannot switch to state 15; another operation (2) is in progress"


class _Connection:
    def __init__(self, broken: bool) -> None:
        self.broken = broken
        self.terminated = False

    def is_closed(self) -> bool:
        return self.terminated

    def terminate(self) -> None:
        self.terminated = True

    async def fetchval(self, *args: Any) -> bool:
        return True  # the table is there

    async def fetchrow(self, *args: Any) -> tuple[list[str], list[str], list[str], str]:
        return [], [], [], "app"  # ... and ours to insert into: no privilege lacking

    async def fetch(self, query: str, *args: Any) -> list[dict[str, str]]:
        if "dedupe_key" in query:
            return []  # none of the batch's dedupe keys is in the table yet
        return [{"attname": name} for name in ("subject", "from_header", "to_header")]

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        if self.broken:
            raise asyncpg.exceptions.InternalClientError(_STUCK)
        yield

    async def executemany(self, *args: Any) -> None:
        pass


class _Pool:
    """Hands out the broken connection first, then fresh ones, as asyncpg's pool would once
    the broken one is terminated."""

    def __init__(self) -> None:
        self.handed: list[_Connection] = []

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[_Connection]:
        alive = [c for c in self.handed if not c.terminated]
        connection = alive[0] if alive else _Connection(broken=not self.handed)
        self.handed.append(connection)
        yield connection


async def test_a_connection_left_mid_operation_is_discarded_and_said_plainly() -> None:
    config = {"name": "db", "kind": "postgresql", "dsn": "postgresql://app:pw@127.0.0.1:1/app", "create_table": False}
    target = PostgresqlTarget(msgspec.convert(config, PostgresqlConfig, dec_hook=decode_hook))
    pool = _Pool()
    target._pool = pool  # type: ignore[assignment]
    message = InboundMessage.of(customer_mail(1), "imap:support", time.time())
    lost = await target.deliver(message)
    again = await target.deliver(message)
    assert lost.verdict is Verdict.TRANSIENT
    assert lost.detail == ("PostgreSQL at postgresql://app:***@127.0.0.1:1/app: the connection was lost "
                           "(PostgreSQL restarted?); reconnecting")  # fmt: skip
    assert _STUCK not in lost.detail
    assert pool.handed[0].terminated  # never handed out again
    assert again.accepted and pool.handed[1] is not pool.handed[0]
