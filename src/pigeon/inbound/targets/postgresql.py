"""PostgreSQL: a job row per message, `ON CONFLICT (dedupe_key) DO NOTHING`.

The unique dedupe key is the fence (Kleppmann's term): whatever arbitration let through twice,
the table holds one row per message. A batch is one `executemany` in one transaction. Every
database error is "later": a missing table or a failover must not send mail to the failed
folder.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import asyncpg

from pigeon.config.schema import PostgresqlTarget as PostgresqlConfig
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Handoff, Target, Verdict


def create_table_sql(table: str) -> str:
    return f"""
        CREATE TABLE IF NOT EXISTS {table} (
            id          bigserial PRIMARY KEY,
            dedupe_key  text NOT NULL UNIQUE,
            message_id  text,
            source      text NOT NULL,
            mailbox     text,
            uid         bigint,
            sender      text,
            recipients  text[],
            raw         bytea NOT NULL,
            received_at timestamptz NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now(),
            status      text NOT NULL DEFAULT 'pending'
        )"""


class PostgresqlTarget(Target):
    kind = "postgresql"
    batches = True

    def __init__(self, config: PostgresqlConfig, *, timeout: float = 10.0) -> None:
        super().__init__(config.name)
        self._config = config
        self._timeout = timeout
        self._pool: asyncpg.Pool | None = None
        self._insert = (
            f"INSERT INTO {config.table} (dedupe_key, message_id, source, mailbox, uid, sender, recipients,"
            " raw, received_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (dedupe_key) DO NOTHING"
        )

    async def _connect(self) -> asyncpg.Pool:
        if self._pool is None:
            config = self._config
            pool = await asyncpg.create_pool(
                config.dsn, min_size=1, max_size=config.pool_size, timeout=self._timeout, command_timeout=self._timeout
            )
            if config.create_table:
                async with pool.acquire() as connection:
                    await connection.execute(create_table_sql(config.table))
            self._pool = pool
        return self._pool

    async def start(self) -> None:
        try:
            await self._connect()
        except (OSError, asyncpg.PostgresError, TimeoutError):
            pass  # the first message tries again, and says why if it still fails

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    async def deliver(self, message: InboundMessage) -> Handoff:
        return (await self.deliver_many([message]))[0]

    async def deliver_many(self, messages: Sequence[InboundMessage]) -> list[Handoff]:
        rows = [
            (
                m.dedupe_key,
                m.message_id,
                m.source,
                m.mailbox,
                m.uid,
                m.sender,
                list(m.recipients) or None,
                m.raw,
                datetime.datetime.fromtimestamp(m.received_at, datetime.UTC),
            )
            for m in messages
        ]
        try:
            pool = await self._connect()
            async with pool.acquire() as connection, connection.transaction():
                await connection.executemany(self._insert, rows)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as error:
            failed = Handoff(Verdict.TRANSIENT, f"PostgreSQL: {error or type(error).__name__}")
            return [failed] * len(messages)
        done = Handoff(Verdict.ACCEPTED, f"inserted into {self._config.table}")
        return [done] * len(messages)
