"""Nodes that start together on a new database each make the PostgreSQL target's table: one
makes it, the others find it made, and none says the database failed.

Two `CREATE TABLE IF NOT EXISTS` at once can both find no table and both go on to make it: the
second then fails on the catalog's unique index (`duplicate key value violates unique
constraint "pg_class_relname_nsp_index"`, or `pg_type_typname_nsp_index`), which a node took
for an outage. Many targets (one per node: each its own pool) start at once here, on a fresh
database each round, against a private PostgreSQL."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import msgspec
import pytest

from pigeon.config.schema import PostgresqlTarget as PostgresqlConfig
from pigeon.config.schema import decode_hook
from pigeon.inbound.targets.postgresql import PostgresqlTarget, create_table_sql
from tests.support.services import Postgres

CREATORS = 12
ROUNDS = 5


def _target(dsn: str) -> PostgresqlTarget:
    config = {"name": "app", "kind": "postgresql", "dsn": dsn}  # create_table: the default, true
    return PostgresqlTarget(msgspec.convert(config, PostgresqlConfig, dec_hook=decode_hook))


async def test_nodes_starting_together_on_a_new_database_make_the_table_once_without_an_outage(
    postgres: Postgres, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pigeon.inbound.targets.postgresql")
    for round_ in range(ROUNDS):
        database = f"fresh{round_}"
        postgres.execute(f"CREATE DATABASE {database}")
        targets = [_target(postgres.dsn_for(database)) for _ in range(CREATORS)]
        try:
            await asyncio.gather(*(target.start() for target in targets))
            said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert not said, f"round {round_}: {said}"
            assert [t.problem for t in targets] == [None] * CREATORS
            assert all(t._prepared and t._decoded for t in targets)  # each knows the table's columns
        finally:
            await asyncio.gather(*(target.close() for target in targets))


async def test_a_table_made_meanwhile_by_a_creator_that_takes_no_lock_is_taken_as_made(
    postgres: Postgres, caplog: pytest.LogCaptureFixture
) -> None:
    """Another creator (an earlier version of Pigeon, the application itself) takes no advisory
    lock: its CREATE may come between a node's look and the node's own CREATE. Played here by
    one that has made the table and not committed yet: the node finds no table, and its CREATE
    waits on the catalog's unique index until the other commits, then fails."""
    caplog.set_level(logging.INFO, logger="pigeon.inbound.targets.postgresql")
    postgres.execute("CREATE DATABASE shared")
    dsn = postgres.dsn_for("shared")
    other = await asyncpg.connect(dsn)
    target = _target(dsn)
    try:
        making = other.transaction()
        await making.start()
        await other.execute(create_table_sql("inbound_emails"))
        starting = asyncio.create_task(target.start())
        # Until the node's CREATE waits on the other's uncommitted rows in the catalog.
        for _ in range(100):
            if await other.fetchval("SELECT count(*) FROM pg_locks WHERE NOT granted"):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the node's CREATE never waited on the other's")
        await making.commit()
        await asyncio.wait_for(starting, 10)
    finally:
        await other.close()
        await target.close()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not said, said
    assert target.problem is None and target._prepared and target._decoded
