"""A webhook that answers 429 or 503 with `Retry-After` is not asked again before that time
(up to the retry schedule's longest wait), whether the message came from a mailbox or over
SMTP: the application, not our backoff, knows when it can take mail again."""

from __future__ import annotations

import email.utils
import smtplib
import time
from pathlib import Path

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, webhook_target
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot


def _gaps(app: WebhookApp) -> list[float]:
    return [later - earlier for earlier, later in zip(app.requests, app.requests[1:], strict=False)]


def test_a_mailbox_waits_out_a_webhook_s_retry_after_up_to_the_target_s_longest_wait(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    dovecot.append("app", [customer_mail(1)])
    with WebhookApp() as app:
        # Asked for 3 s (our backoff would try after 0.2 s), then for a year (capped at 5 s).
        app.answers = [(429, {"Retry-After": "3"}), (503, {"Retry-After": "31536000"})]
        target = webhook_target(app, max_retry_interval="5s")  # retry_interval 200ms
        with PigeonProcess(tmp_path / "p", target=[target], mailbox=[imap_mailbox(dovecot, "hook")]) as node:
            assert app.wait_distinct(1, 30) == 1
            failures = node.records("InboundFailure")
    first, second = _gaps(app)
    assert 2.9 <= first < 4.5, _gaps(app)
    assert 4.5 <= second < 7.5, _gaps(app)
    assert [round(r["next_attempt"] - r["timestamp"]) for r in failures] == [3, 5]
    assert "Retry-After: 3s" in failures[0]["detail"]


def test_smtp_mail_for_a_route_waits_out_a_webhook_s_retry_after_up_to_the_queue_s_longest_wait(
    tmp_path: Path,
) -> None:
    with WebhookApp() as app:
        node = PigeonProcess(
            tmp_path / "p",
            smtp={"relay_networks": ["192.0.2.0/24"]},
            delivery={"enabled": True, "retry_interval": "1s", "max_retry_interval": "5s"},
            target=[webhook_target(app)],
            inbound=[{"recipient": "support@app.example", "target": "hook"}],
        )
        with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            # An HTTP-date 4 s ahead (3 s and more: it has whole seconds), where the queue would
            # try after 1 s; then a day, capped at max_retry_interval (5 s).
            soon = email.utils.formatdate(time.time() + 4, usegmt=True)
            app.answers = [(503, {"Retry-After": soon}), (429, {"Retry-After": "86400"})]
            client.sendmail("customer@example.com", ["support@app.example"], customer_mail(1))
            assert app.wait_distinct(1, 40) == 1
            node.wait_records("Delivery", 1)
            failures = node.records("TransientFailure")
    first, second = _gaps(app)
    assert 2.9 <= first < 6, _gaps(app)
    assert 4.5 <= second < 8.5, _gaps(app)
    assert len(failures) == 2
    assert failures[1]["next_attempt"] - failures[1]["timestamp"] >= 4.9
