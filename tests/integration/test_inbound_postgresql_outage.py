"""A PostgreSQL target whose database is down at start and for a while: the node starts, the
outage and its end are each logged once, and every message waits unacknowledged in the
mailbox until its row is committed, then is inserted once."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.apps import customer_mail, imap_mailbox, mailbox_health
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, Postgres
from tests.support.sinks import wait_until


def test_a_database_down_at_start_delays_mail_loses_none_and_is_logged_once_with_its_recovery(
    tmp_path: Path, dovecot: Dovecot, postgres_template: Path
) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(5)])
    database = Postgres(tmp_path / "pg", template=postgres_template)  # not started: its port refuses
    target = {"name": "db", "kind": "postgresql", "dsn": database.dsn, "table": "inbound_emails",
              "retry_interval": "200ms", "max_retry_interval": "300ms"}  # fmt: skip
    try:
        with PigeonProcess(tmp_path / "p", target=[target], mailbox=[imap_mailbox(dovecot, "db")]) as node:
            failures = node.wait_records("InboundFailure", 15, timeout=30)  # three tries each at least
            assert "Connection refused" in failures[-1]["detail"]
            assert len(dovecot.unseen("app")) == 5  # nothing acknowledged without its row
            assert not node.records("InboundDelivery")
            assert "target db: PostgreSQL" in (mailbox_health(node)["error"] or "")
            database.start()
            node.wait_records("InboundDelivery", 5, timeout=20)
            wait_until(lambda: not dovecot.unseen("app"), 10)
            time.sleep(0.5)
            logged = node.stderr()
    finally:
        database.stop()
    outage = [line for line in logged.splitlines() if "target db: PostgreSQL at" in line and "again" not in line]
    assert len(outage) == 1, outage
    assert "Connection refused" in outage[0] and "wait unacknowledged" in outage[0]
    (recovery,) = [line for line in logged.splitlines() if "answers again; rows are committed" in line]
    # The outage's end is news, no trouble: INFO, as the target's "accepts messages again" is.
    assert " INFO pigeon.inbound.targets.postgresql: target db: PostgreSQL at " in recovery, recovery
    with database:
        rows = database.query("SELECT message_id FROM inbound_emails ORDER BY message_id")
    assert rows == [(f"<m{i}@example.com>",) for i in range(5)]
