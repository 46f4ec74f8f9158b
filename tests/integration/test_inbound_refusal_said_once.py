"""A `move_to` the server refuses (deleted after the node created it) refuses every group of
handoffs of a backlog: the refusal is said once as a WARNING, then at most once per retry period
(30 s) at INFO, not once per group, while each refusal still counts in the metrics."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, mailbox_health, webhook_target
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot
from tests.support.sinks import wait_until

_COUNT = 40


def _delete_folder(dovecot: Dovecot, name: str) -> None:
    client = dovecot.connect("app")
    try:
        client.delete(name)
    finally:
        with contextlib.suppress(Exception):
            client.logout()


def _errors(node: PigeonProcess) -> float:
    _, body = node.http_get("/metrics")
    found = re.search(rb'^pigeon_inbound_mailbox_errors_total\{mailbox="support"\} (\S+)$', body, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_refused_acknowledgement_is_said_once_per_retry_period_not_once_per_group(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    box = imap_mailbox(dovecot, "hook", after_delivery="move", move_to="Processed", concurrency=4, batch=10)
    with WebhookApp() as app, PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
        app.delay = 0.05
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 20)
        _delete_folder(dovecot, "Processed")
        dovecot.append("app", [customer_mail(i) for i in range(_COUNT)])
        node.wait_records("InboundDelivery", _COUNT, timeout=30)
        wait_until(lambda: _errors(node) >= 3, 10)
        logged = node.stderr()
        health = mailbox_health(node)
    lines = [line for line in logged.splitlines() if "cannot acknowledge UIDs" in line]
    assert health["status"] == "degraded" and "cannot acknowledge" in health["error"], health
    assert len(lines) == 1, lines
    assert "WARNING" in lines[0] and "flagged $PigeonDone instead" in lines[0], lines
    assert sum(app.accepted.values()) == _COUNT
