"""Rows the operator's table refuses (create_table = false, a table with constraints of its own):
the refused row is a permanent failure for its message, said in one line of bounded length
without the row PostgreSQL dumps, and the rest of its batch goes in; a second copy is said as
already in the table; a missing table, once mail waits, says what to do in the failure and in
/healthz."""

from __future__ import annotations

from pathlib import Path

from pigeon.inbound.targets.postgresql import create_table_sql
from tests.support.apps import customer_mail, imap_mailbox, mailbox_health
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, Postgres
from tests.support.sinks import wait_until

TABLE = "mail_in"


def _node(tmp_path: Path, postgres: Postgres, dovecot: Dovecot) -> PigeonProcess:
    target = {"name": "db", "kind": "postgresql", "dsn": postgres.dsn, "table": TABLE, "create_table": False,
              "retry_interval": "200ms", "max_retry_interval": "300ms"}  # fmt: skip
    box = imap_mailbox(dovecot, "db", failed_folder="Failed")
    return PigeonProcess(tmp_path / "p", target=[target], mailbox=[box])


def _without_message_id(n: int) -> bytes:
    return f"From: customer{n}@example.com\r\nSubject: no id {n}\r\n\r\nHello {n}.\r\n".encode()


def _with_subject(subject: str) -> bytes:
    return f"From: c@example.com\r\nMessage-ID: <{subject}@example.com>\r\nSubject: {subject}\r\n\r\nHi.\r\n".encode()


def test_rows_the_tables_constraints_refuse_fail_for_good_and_the_rest_of_the_batch_goes_in(
    tmp_path: Path, dovecot: Dovecot, postgres: Postgres
) -> None:
    postgres.execute(create_table_sql(TABLE).replace("message_id  text,", "message_id  text NOT NULL,"))
    postgres.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT no_spam CHECK (subject <> 'spam')")
    good = [customer_mail(n) for n in range(4)]
    dovecot.append("app", [good[0], good[1], _without_message_id(1), good[2], _with_subject("spam"), good[3]])
    with _node(tmp_path, postgres, dovecot) as node:
        failures = node.wait_records("InboundFailure", 2, timeout=20)
        node.wait_records("InboundDelivery", 4, timeout=20)
        wait_until(lambda: dovecot.count("app", "Failed") == 2, 10)
        wait_until(lambda: not dovecot.unseen("app"), 10)
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 10)
        assert len(node.records("InboundFailure")) == 2  # refused once each, not retried
    assert all(f["permanent"] and f["action"] == "moved to Failed" for f in failures), failures
    details = sorted(f["detail"] for f in failures)
    assert details == [
        f'PostgreSQL refused the row: new row for relation "{TABLE}" violates check constraint "no_spam" '
        "(SQLSTATE 23514)",
        f'PostgreSQL refused the row: null value in column "message_id" of relation "{TABLE}" violates '
        "not-null constraint (SQLSTATE 23502)",
    ], details
    assert postgres.query(f"SELECT count(*) FROM {TABLE}") == [("4",)]


def test_a_different_message_that_breaks_another_unique_constraint_fails_for_good(
    tmp_path: Path, dovecot: Dovecot, postgres: Postgres
) -> None:
    # The operator made message_id unique: a message with the same Message-ID and other bytes is
    # not the one in the table (not a duplicate), and is refused, not dropped.
    postgres.execute(create_table_sql(TABLE).replace("message_id  text,", "message_id  text UNIQUE,"))
    dovecot.append("app", [customer_mail(1), customer_mail(2), customer_mail(1).replace(b"Hello", b"Hi again")])
    with _node(tmp_path, postgres, dovecot) as node:
        (failure,) = node.wait_records("InboundFailure", 1, timeout=20)
        node.wait_records("InboundDelivery", 2, timeout=20)
        wait_until(lambda: dovecot.count("app", "Failed") == 1, 10)
    assert failure["permanent"] and failure["action"] == "moved to Failed", failure
    assert failure["detail"] == (
        f'PostgreSQL refused the row: duplicate key value violates unique constraint "{TABLE}_message_id_key" '
        "(SQLSTATE 23505)"
    ), failure
    assert postgres.query(f"SELECT count(*) FROM {TABLE}") == [("2",)]


def test_a_refused_row_is_said_in_one_bounded_line_without_the_row_postgresql_dumps(
    tmp_path: Path, dovecot: Dovecot, postgres: Postgres
) -> None:
    postgres.execute(create_table_sql(TABLE).replace("message_id  text,", "message_id  text NOT NULL,"))
    dovecot.append("app", [_without_message_id(1) + b"x" * 5000 + b"\r\n"])
    with _node(tmp_path, postgres, dovecot) as node:
        (failure,) = node.wait_records("InboundFailure", 1, timeout=20)
    assert "Failing row" not in failure["detail"] and "\n" not in failure["detail"], failure
    assert len(failure["detail"]) <= 400, failure


def test_a_second_copy_is_logged_as_already_in_the_table_not_as_inserted(
    tmp_path: Path, dovecot: Dovecot, postgres: Postgres
) -> None:
    postgres.execute(create_table_sql(TABLE))
    dovecot.append("app", [customer_mail(0), customer_mail(1), customer_mail(0)])  # the same bytes twice in a batch
    with _node(tmp_path, postgres, dovecot) as node:
        node.wait_records("InboundDelivery", 3, timeout=20)
        dovecot.append("app", [customer_mail(1)])  # ... and again later, in a batch of its own
        deliveries = node.wait_records("InboundDelivery", 4, timeout=20)
    details = [d["detail"] for d in deliveries]
    already = f"duplicate: already in {TABLE} (same dedupe key)"
    assert sorted(details) == [already, already, f"inserted into {TABLE}", f"inserted into {TABLE}"], details
    assert details[3] == already
    assert postgres.query(f"SELECT count(*) FROM {TABLE}") == [("2",)]


def test_a_missing_table_says_what_to_do_in_the_failure_and_in_healthz_once_mail_waits(
    tmp_path: Path, dovecot: Dovecot, postgres: Postgres
) -> None:
    dovecot.append("app", [customer_mail(1)])
    with _node(tmp_path, postgres, dovecot) as node:
        (failure, *_) = node.wait_records("InboundFailure", 1, timeout=20)
        health = mailbox_health(node)
        postgres.execute(create_table_sql(TABLE))
        node.wait_records("InboundDelivery", 1, timeout=20)
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 10)
    fix = (
        f"table {TABLE} does not exist (create_table = false): create it (its columns: see the PostgreSQL "
        "target in the README), or set create_table = true"
    )
    assert not failure.get("permanent") and failure["detail"].endswith(fix), failure
    assert health["status"] == "degraded" and health["error"].endswith(fix), health
