"""The PostgreSQL target's table dropped, or replaced by one in an older layout, while SMTP mail
for an `[[inbound]]` route streams into it: the target learns the table again at the next try
(making it again with `create_table = true`), and the mail that waited in the spool goes in,
each message once, without a restart.

What the target had learnt at start (the table made, its columns) no longer held: every retry
failed the same way, `relation "inbound_emails" does not exist (SQLSTATE 42P01)` or `column
"subject" of relation "inbound_emails" does not exist (SQLSTATE 42703)`, until Pigeon restarted.
The rows committed before the change are kept (`CREATE TABLE kept AS ...` in the transaction
that drops the table), so that the two tables together show each message exactly once."""

from __future__ import annotations

import json
import logging
import smtplib
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pigeon.config.schema import PostgresqlTarget as PostgresqlConfig
from pigeon.config.schema import decode_hook
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Verdict
from pigeon.inbound.targets.postgresql import PostgresqlTarget, create_table_sql
from tests.support.apps import customer_mail
from tests.support.process import PigeonProcess
from tests.support.services import Postgres
from tests.support.sinks import wait_until

TABLE = "inbound_emails"
MESSAGES = 16
# Drop (or replace) the table once this many messages are in it: mail is still on its way.
CHANGE_AFTER = 5
# The layout of a table made by an older Pigeon, which the README says is supported: no
# decoded header columns.
OLDER = (
    create_table_sql(TABLE)
    .replace("subject     text,", "")
    .replace("from_header text,", "")
    .replace("to_header   text,", "")
)


def _node(tmp_path: Path, postgres: Postgres, *, create_table: bool = True) -> PigeonProcess:
    target = {"name": "pg", "kind": "postgresql", "dsn": postgres.dsn, "table": TABLE, "create_table": create_table,
              "retry_interval": "200ms", "max_retry_interval": "300ms"}  # fmt: skip
    return PigeonProcess(
        tmp_path / "p",
        delivery={"enabled": True, "retry_interval": "200ms", "max_retry_interval": "300ms"},
        target=[target],
        inbound=[{"recipient": "reply+*@app.example", "target": "pg"}],
    )


def _health(node: PigeonProcess) -> dict[str, Any]:
    _, body = node.http_get("/healthz")
    health: dict[str, Any] = json.loads(body)
    return health


def _stream(node: PigeonProcess, changed: threading.Event) -> threading.Thread:
    """Send MESSAGES messages, one transaction each, while the test goes on: the first
    CHANGE_AFTER at once, the next ones a little apart (racing the change), the last few only
    once the table has changed (so that some go into the new table, whatever the timing)."""

    def send() -> None:
        with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            for n in range(MESSAGES):
                if n >= MESSAGES - 4:
                    changed.wait(30)
                elif n >= CHANGE_AFTER:
                    time.sleep(0.05)
                client.sendmail("customer@example.com", [f"reply+{n}@app.example"], customer_mail(n))

    sender = threading.Thread(target=send)
    sender.start()
    return sender


def _ids(postgres: Postgres, table: str) -> list[str]:
    return [message_id for (message_id,) in postgres.query(f"SELECT message_id FROM {table}")]


def _change_mid_stream(node: PigeonProcess, postgres: Postgres, replacement: str) -> None:
    """Once CHANGE_AFTER messages are in, keep the rows in `kept` and drop the table, making
    `replacement` in its place (nothing: leave it missing), in one transaction."""
    changed = threading.Event()
    sender = _stream(node, changed)
    wait_until(lambda: int(postgres.query(f"SELECT count(*) FROM {TABLE}")[0][0]) >= CHANGE_AFTER, 20)
    try:
        # (Locked first: a row committed between the copy and the drop would be in neither.)
        postgres.execute(f"BEGIN; LOCK TABLE {TABLE}; CREATE TABLE kept AS SELECT * FROM {TABLE}; "
                         f"DROP TABLE {TABLE}; {replacement}; COMMIT")  # fmt: skip
    finally:
        changed.set()
    sender.join(30)
    assert not sender.is_alive()


def _each_message_once(postgres: Postgres) -> None:
    ids = _ids(postgres, "kept") + _ids(postgres, TABLE)
    assert sorted(ids) == sorted(f"<m{n}@example.com>" for n in range(MESSAGES)), ids
    assert _ids(postgres, TABLE), "every message went in before the change: the test tested nothing"


def test_a_table_dropped_while_mail_streams_in_is_made_again_and_each_message_goes_in_once(
    tmp_path: Path, postgres: Postgres
) -> None:
    with _node(tmp_path, postgres) as node:
        _change_mid_stream(node, postgres, replacement="")
        node.wait_records("Delivery", MESSAGES, timeout=30)
        wait_until(lambda: _health(node)["targets"]["pg"]["status"] == "ok", 10)
        assert len(node.records("Delivery")) == MESSAGES
    _each_message_once(postgres)
    # Made again as Pigeon makes it: with the decoded header columns, filled.
    assert postgres.query(f"SELECT count(*) = count(subject) FROM {TABLE}") == [("t",)]


@pytest.mark.parametrize("create_table", [True, False])
def test_a_table_replaced_by_one_of_the_older_layout_takes_the_rows_in_its_columns(
    tmp_path: Path, postgres: Postgres, create_table: bool
) -> None:
    postgres.execute(create_table_sql(TABLE))
    with _node(tmp_path, postgres, create_table=create_table) as node:
        _change_mid_stream(node, postgres, replacement=OLDER)
        node.wait_records("Delivery", MESSAGES, timeout=30)
        wait_until(lambda: _health(node)["targets"]["pg"]["status"] == "ok", 10)
        assert len(node.records("Delivery")) == MESSAGES
        logged = node.stderr()
    _each_message_once(postgres)
    assert "ALTER TABLE inbound_emails ADD COLUMN subject text" in logged  # said again, for the new table


def test_a_table_dropped_with_create_table_false_says_how_to_make_it_and_mail_goes_in_once_it_is_made(
    tmp_path: Path, postgres: Postgres
) -> None:
    postgres.execute(create_table_sql(TABLE))
    with _node(tmp_path, postgres, create_table=False) as node:
        _change_mid_stream(node, postgres, replacement="")
        failure = node.wait_records("TransientFailure", 1, timeout=20)[-1]
        assert "create it (its columns: see the PostgreSQL target in the README)" in str(failure), failure
        wait_until(lambda: _health(node)["targets"]["pg"]["status"] == "degraded", 10)
        postgres.execute(OLDER)
        node.wait_records("Delivery", MESSAGES, timeout=30)
        wait_until(lambda: _health(node)["targets"]["pg"]["status"] == "ok", 10)
    _each_message_once(postgres)


async def test_a_table_that_lacks_a_column_the_insert_needs_is_said_changed_once_not_at_every_try(
    postgres: Postgres, caplog: pytest.LogCaptureFixture
) -> None:
    # Learning the table again does not mend this one: every try fails the same way.
    postgres.execute(create_table_sql(TABLE).replace("sender      text,", ""))
    config = {"name": "pg", "kind": "postgresql", "dsn": postgres.dsn, "create_table": False}
    target = PostgresqlTarget(msgspec.convert(config, PostgresqlConfig, dec_hook=decode_hook))
    caplog.set_level(logging.INFO, logger="pigeon.inbound.targets.postgresql")
    try:
        await target.start()
        message = InboundMessage.of(customer_mail(1), "smtp", time.time())
        tries = [await target.deliver(message) for _ in range(4)]
    finally:
        await target.close()
    assert {t.verdict for t in tries} == {Verdict.TRANSIENT}
    assert 'column "sender" of relation "inbound_emails" does not exist (SQLSTATE 42703)' in tries[-1].detail
    said = [r.getMessage() for r in caplog.records if "changed under the insert" in r.getMessage()]
    assert len(said) == 1, said
