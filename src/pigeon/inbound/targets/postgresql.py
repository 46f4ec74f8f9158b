"""PostgreSQL: a job row per message, `ON CONFLICT (dedupe_key) DO NOTHING`.

The unique dedupe key is the fence (Kleppmann's term): whatever arbitration let through twice,
the table holds one row per message. A batch is one `executemany` in one transaction. Every
database error is "later": a missing table or a failover must not send mail to the failed
folder.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Sequence

import asyncpg

from pigeon.config.schema import PostgresqlTarget as PostgresqlConfig
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Handoff, Target, Verdict
from pigeon.redaction import redact


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
        self._connecting = asyncio.Lock()
        self._insert = (
            f"INSERT INTO {config.table} (dedupe_key, message_id, source, mailbox, uid, sender, recipients,"
            " raw, received_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (dedupe_key) DO NOTHING"
        )

    async def _connect(self) -> asyncpg.Pool:
        async with self._connecting:  # one pool, however many deliveries ask at once
            if self._pool is None:
                config = self._config
                pool = await asyncpg.create_pool(
                    config.dsn,
                    min_size=1,
                    max_size=config.pool_size,
                    timeout=self._timeout,
                    command_timeout=self._timeout,
                )
                try:
                    if config.create_table:
                        async with pool.acquire() as connection:
                            # Only when missing: CREATE ... IF NOT EXISTS needs the CREATE
                            # privilege even when the table exists, which a role that may only
                            # insert into the application's table lacks (PostgreSQL 15+ default).
                            if await connection.fetchval("SELECT to_regclass($1)", config.table) is None:
                                await connection.execute(create_table_sql(config.table))
                except BaseException:
                    await pool.close()
                    raise
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
        done = Handoff(Verdict.ACCEPTED, f"inserted into {self._config.table}")
        try:
            pool = await self._connect()
            async with pool.acquire() as connection:
                try:
                    async with connection.transaction():
                        await connection.executemany(self._insert, rows)
                except asyncpg.DataError:
                    # One row the database refuses (class 22) must not hold the others back:
                    # row by row, the refused one is a permanent failure, the rest go in.
                    return [await self._insert_one(connection, row) for row in rows]
        except Exception as error:  # down, failing over, misconfigured: later, never lost
            failed = Handoff(
                Verdict.TRANSIENT,
                f"PostgreSQL at {redact(self._config.dsn)}: {redact(str(error)) or type(error).__name__}",
            )
            return [failed] * len(messages)
        return [done] * len(messages)

    async def _insert_one(self, connection: asyncpg.Connection, row: tuple[object, ...]) -> Handoff:
        try:
            await connection.execute(self._insert, *row)
        except asyncpg.DataError as error:
            return Handoff(Verdict.PERMANENT, f"PostgreSQL refused the row: {redact(str(error))}")
        return Handoff(Verdict.ACCEPTED, f"inserted into {self._config.table}")
