"""A PostgreSQL target that may not create its table (create_table = false), and whose table is
missing or closed to its role: said at start, as an ERROR naming the table and the fix, and in
/healthz, not first when mail arrives; the node runs all the same, and once the table is there
(or the GRANT given) mail goes in and the mailbox is "ok" again."""

from __future__ import annotations

from pathlib import Path

from pigeon.inbound.targets.postgresql import create_table_sql
from tests.support.apps import customer_mail, imap_mailbox, mailbox_health
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, Postgres
from tests.support.sinks import wait_until

TABLE = "inbound_emails"


def _node(tmp_path: Path, dsn: str, dovecot: Dovecot) -> PigeonProcess:
    target = {"name": "db", "kind": "postgresql", "dsn": dsn, "table": TABLE, "create_table": False,
              "retry_interval": "200ms", "max_retry_interval": "300ms"}  # fmt: skip
    return PigeonProcess(tmp_path / "p", target=[target], mailbox=[imap_mailbox(dovecot, "db")])


def _make_table(postgres: Postgres) -> None:
    postgres.execute(create_table_sql(TABLE))


def test_a_missing_table_is_said_at_start_and_in_healthz(tmp_path: Path, dovecot: Dovecot, postgres: Postgres) -> None:
    with _node(tmp_path, postgres.dsn, dovecot) as node:
        logged = node.wait_stderr(f"table {TABLE} does not exist", timeout=10)
        health = mailbox_health(node)
        assert health["status"] == "degraded", health
        assert f"target db: table {TABLE} does not exist" in health["error"], health
        _make_table(postgres)
        dovecot.append("app", [customer_mail(1)])
        node.wait_records("InboundDelivery", 1, timeout=20)
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 10)
    (line,) = [line for line in logged.splitlines() if "does not exist" in line]
    assert " ERROR " in line and "create_table = false" in line and "set create_table = true" in line, line


def test_a_table_the_role_may_not_insert_into_is_said_at_start(
    tmp_path: Path, dovecot: Dovecot, postgres: Postgres
) -> None:
    _make_table(postgres)
    postgres.execute("CREATE ROLE app LOGIN; GRANT SELECT ON inbound_emails TO app")
    with _node(tmp_path, postgres.dsn.replace("postgres@", "app@"), dovecot) as node:
        logged = node.wait_stderr(f"role app may not insert into table {TABLE}", timeout=10)
        assert mailbox_health(node)["status"] == "degraded"
        postgres.execute("GRANT INSERT ON inbound_emails TO app; GRANT USAGE ON SEQUENCE inbound_emails_id_seq TO app")
        dovecot.append("app", [customer_mail(1)])
        node.wait_records("InboundDelivery", 1, timeout=20)
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 10)
    (line,) = [line for line in logged.splitlines() if "may not insert" in line]
    assert " ERROR " in line and f"GRANT INSERT ON {TABLE} TO app" in line, line
