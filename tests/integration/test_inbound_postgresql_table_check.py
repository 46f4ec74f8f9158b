"""A PostgreSQL target that may not create its table (create_table = false), and whose table is
missing or closed to its role: said at start, as an ERROR naming the table and the fix, and in
/healthz, not first when mail arrives; the node runs all the same, and once the table is there
(or the GRANT given) mail goes in and the mailbox is "ok" again.

The fix said is the GRANTs the insert needs, every one of them: INSERT, SELECT on dedupe_key
(which ON CONFLICT reads), USAGE on the sequence its id draws from; run as said, they make mail
flow. A privilege missing at insert time (revoked since) is said with the same GRANTs."""

from __future__ import annotations

from pathlib import Path

from pigeon.inbound.targets.postgresql import create_table_sql
from tests.support.apps import customer_mail, imap_mailbox, mailbox_health
from tests.support.process import PigeonProcess
from tests.support.readme import readme_sql
from tests.support.services import Dovecot, Postgres
from tests.support.sinks import wait_until

TABLE = "inbound_emails"


def _node(tmp_path: Path, dsn: str, dovecot: Dovecot, table: str = TABLE) -> PigeonProcess:
    target = {"name": "db", "kind": "postgresql", "dsn": dsn, "table": table, "create_table": False,
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
    assert " ERROR " in line and f"GRANT INSERT ON {TABLE} TO app;" in line, line


def _advised(logged: str) -> str:
    """The GRANTs the ERROR line says to run."""
    (line,) = [line for line in logged.splitlines() if "may not insert" in line]
    assert " ERROR " in line, line
    return line.split("run, as the owner: ", 1)[1].strip()


def test_a_role_that_may_insert_but_not_read_the_conflict_column_is_told_the_grant_that_works(
    tmp_path: Path, dovecot: Dovecot, postgres: Postgres
) -> None:
    # What the start-up advice used to be, given: a plain INSERT works, ON CONFLICT (dedupe_key) does not.
    _make_table(postgres)
    postgres.execute("CREATE ROLE app LOGIN; GRANT INSERT ON inbound_emails TO app; "
                     "GRANT USAGE ON SEQUENCE inbound_emails_id_seq TO app")  # fmt: skip
    with _node(tmp_path, postgres.dsn.replace("postgres@", "app@"), dovecot) as node:
        logged = node.wait_stderr(f"role app may not insert into table {TABLE}", timeout=10)
        assert mailbox_health(node)["status"] == "degraded"
        assert _advised(logged) == f"GRANT SELECT (dedupe_key) ON {TABLE} TO app"
        postgres.execute(_advised(logged))
        dovecot.append("app", [customer_mail(n) for n in range(2)])
        node.wait_records("InboundDelivery", 2, timeout=20)
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 10)
    assert postgres.query(f"SELECT count(*) FROM {TABLE}") == [("2",)]


def test_the_grants_said_at_start_make_mail_flow_into_a_table_made_like_pigeons(
    tmp_path: Path, dovecot: Dovecot, postgres: Postgres
) -> None:
    # Its id draws from inbound_emails' sequence (LIKE ... INCLUDING ALL copies the default).
    _make_table(postgres)
    postgres.execute("CREATE ROLE app LOGIN; CREATE TABLE perm_emails (LIKE inbound_emails INCLUDING ALL)")
    with _node(tmp_path, postgres.dsn.replace("postgres@", "app@"), dovecot, table="perm_emails") as node:
        logged = node.wait_stderr("role app may not insert into table perm_emails", timeout=10)
        assert _advised(logged) == (
            "GRANT INSERT, SELECT (dedupe_key) ON perm_emails TO app; "
            "GRANT USAGE ON SEQUENCE inbound_emails_id_seq TO app"
        )
        postgres.execute(_advised(logged))
        dovecot.append("app", [customer_mail(n) for n in range(2)])
        node.wait_records("InboundDelivery", 2, timeout=20)
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 10)
    assert postgres.query("SELECT count(*) FROM perm_emails") == [("2",)]


def test_a_privilege_revoked_after_start_is_said_with_its_grant_when_the_insert_fails(
    tmp_path: Path, dovecot: Dovecot, postgres: Postgres
) -> None:
    _make_table(postgres)
    grant = "GRANT SELECT (dedupe_key) ON inbound_emails TO app"
    postgres.execute("CREATE ROLE app LOGIN; GRANT INSERT ON inbound_emails TO app; "
                     f"GRANT USAGE ON SEQUENCE inbound_emails_id_seq TO app; {grant}")  # fmt: skip
    with _node(tmp_path, postgres.dsn.replace("postgres@", "app@"), dovecot) as node:
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 20)
        postgres.execute("REVOKE SELECT (dedupe_key) ON inbound_emails FROM app")
        dovecot.append("app", [customer_mail(1)])
        (failure, *_) = node.wait_records("InboundFailure", 1, timeout=20)
        assert "permission denied for table inbound_emails" in failure["detail"], failure
        assert "role app lacks SELECT on dedupe_key" in failure["detail"], failure
        assert failure["detail"].endswith(f"run, as the owner: {grant}"), failure
        health = mailbox_health(node)
        assert health["status"] == "degraded" and grant in health["error"], health
        postgres.execute(grant)
        node.wait_records("InboundDelivery", 1, timeout=20)
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 10)


def test_the_readmes_table_and_grants_take_mail_from_a_role_that_does_not_own_it(
    tmp_path: Path, dovecot: Dovecot, postgres: Postgres
) -> None:
    postgres.execute(readme_sql("CREATE TABLE"))
    postgres.execute("CREATE ROLE app LOGIN")
    postgres.execute(readme_sql("GRANT"))
    with _node(tmp_path, postgres.dsn.replace("postgres@", "app@"), dovecot) as node:
        dovecot.append("app", [customer_mail(n) for n in range(2)])
        node.wait_records("InboundDelivery", 2, timeout=20)
        assert mailbox_health(node)["status"] == "ok"
        assert " ERROR " not in node.stderr()
    assert postgres.query(f"SELECT count(*), count(subject) FROM {TABLE}") == [("2", "2")]
