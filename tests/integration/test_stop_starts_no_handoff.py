"""SIGTERM: a stopping node finishes the handoffs in flight and starts no new one, from a
mailbox's backlog or from the spool (mail an `[[inbound]]` route took over SMTP): what it has
not started is left where it was, for the next start (or another node), handed over once."""

from __future__ import annotations

import signal
import smtplib
import time
from pathlib import Path

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, mailbox_health, webhook_target
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.services import Dovecot
from tests.support.sinks import wait_until

_MAILBOX_CONCURRENCY = 8  # [[mailbox]] concurrency's default
_WEBHOOK_CONCURRENCY = 16  # the calls a webhook target makes side by side


def _settled(app: WebhookApp, count: int) -> None:
    """Wait until `count` requests reached the held application, and no more come."""
    wait_until(lambda: app.started >= count, 30)
    time.sleep(0.5)
    assert app.started == count


def _stopping(node: PigeonProcess) -> None:
    """Wait until the node has begun its stop (it says so as it halts its handoffs): a fixed
    0.5 s after the SIGTERM may not be enough for a loaded machine to get there."""
    node.wait_stderr("stopping: finishing open transactions", timeout=20)


def test_a_stopping_node_starts_no_handoff_from_a_mailbox_backlog(tmp_path: Path, dovecot: Dovecot) -> None:
    backlog = 40
    with WebhookApp() as app:
        node = PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[imap_mailbox(dovecot, "hook")])
        app.hold("")  # every request waits, unanswered, until released
        dovecot.append("app", [customer_mail(n) for n in range(backlog)])
        with node:
            assert node.process is not None
            _settled(app, _MAILBOX_CONCURRENCY)
            node.process.send_signal(signal.SIGTERM)
            _stopping(node)
            app.release("")  # the handoffs in flight end: the node must not start others
            assert node.process.wait(20) == 0
            started_while_stopping = app.started - _MAILBOX_CONCURRENCY
            assert started_while_stopping == 0, f"{started_while_stopping} handoffs started after SIGTERM"
            assert len(dovecot.unseen("app")) == backlog - _MAILBOX_CONCURRENCY
            # The next start hands over the rest, and nothing twice.
            node.start()
            assert app.wait_distinct(backlog, 60) == backlog
            wait_until(lambda: mailbox_health(node)["claims"] == 0 and not dovecot.unseen("app"), 20)
    assert set(app.accepted.values()) == {1}, app.accepted


def test_a_stopping_node_starts_no_handoff_of_spooled_mail_while_smtp_sessions_finish(tmp_path: Path) -> None:
    # Mail an [[inbound]] route took over SMTP goes through the delivery queue, several batches
    # of a webhook's concurrency at once. The stop waits up to shutdown_timeout for an open
    # SMTP transaction: meanwhile, no new delivery may start.
    messages = 80
    with WebhookApp() as app:
        node = PigeonProcess(
            tmp_path / "p",
            node={"shutdown_timeout": "3s"},
            smtp={"relay_networks": ["192.0.2.0/24"]},
            delivery={"enabled": True, "retry_interval": "200ms"},
            target=[webhook_target(app)],
            inbound=[{"recipient": "support@app.example", "target": "hook"}],
        )
        app.hold("")
        with node:
            assert node.process is not None
            with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
                for n in range(messages):
                    client.sendmail("customer@example.com", ["support@app.example"], customer_mail(n))
            _settled(app, _WEBHOOK_CONCURRENCY)
            with RawSmtp(node.smtp_port) as open_transaction:
                open_transaction.expect(220)
                open_transaction.expect(250, "EHLO slow.test")
                open_transaction.expect(250, "MAIL FROM:<customer@example.com>")
                node.process.send_signal(signal.SIGTERM)
                _stopping(node)
                app.release("")  # the handoffs in flight end while the SMTP session holds the stop up
                assert open_transaction.reply()[0] == 421  # at the end of shutdown_timeout
            assert node.process.wait(20) == 0
            started_while_stopping = app.started - _WEBHOOK_CONCURRENCY
            assert started_while_stopping == 0, f"{started_while_stopping} handoffs started after SIGTERM"
            assert len(node.spool_messages()) == messages - _WEBHOOK_CONCURRENCY
            # Begun, but not handed over (their turn at the webhook came after the SIGTERM): said
            # so, and no attempt counted.
            untried = node.records("TransientFailure")
            assert untried
            for record in untried:
                assert record["attempt"] == 0, record
                assert record["response"]["text"] == "hook: not handed over: the node stopped first", record
            node.start()
            assert app.wait_distinct(messages, 60) == messages
            wait_until(lambda: node.spool_messages() == [], 20)
    assert set(app.accepted.values()) == {1}, app.accepted
