"""With `[delivery] enabled = false` a node only accepts: SMTP mail for an `[[inbound]]` route
is spooled and waits, while mailboxes are still watched. A receive-only node set up that
way is an easy trap, so the node says at start which routes' mail will wait."""

from __future__ import annotations

import smtplib
import time
from pathlib import Path

from tests.support.apps import WebhookApp, customer_mail, webhook_target
from tests.support.process import PigeonProcess

_WAITS = "[delivery] enabled = false: SMTP mail for the [[inbound]] routes"


def test_a_node_that_does_not_deliver_warns_at_start_that_its_smtp_routes_mail_waits(tmp_path: Path) -> None:
    with WebhookApp() as app:
        node = PigeonProcess(
            tmp_path / "p",
            delivery={"enabled": False},
            target=[webhook_target(app), {"name": "box", "kind": "maildir", "path": str(tmp_path / "Maildir")}],
            inbound=[
                {"recipient": "reply+*@app.example", "target": "hook"},
                {"domain": "*.box.example", "target": "box"},
            ],
        )
        with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            warning = node.wait_stderr(_WAITS)
            client.sendmail("customer@example.com", ["reply+1@app.example"], customer_mail(1))
            time.sleep(1)
            assert not app.headers  # accepted, spooled, not handed over: as the warning says
            assert len(node.spool_messages()) == 1
    (line,) = [line for line in warning.splitlines() if _WAITS in line]
    assert "WARNING" in line
    assert "recipient reply+*@app.example -> hook, domain *.box.example -> box" in line
    assert "not handed to its target until delivery is enabled" in line


def test_a_delivering_node_or_one_without_smtp_routes_says_nothing_of_it(tmp_path: Path) -> None:
    with WebhookApp() as app:
        target = webhook_target(app)
        route = {"recipient": "reply+*@app.example", "target": "hook"}
        with PigeonProcess(tmp_path / "on", delivery={"enabled": True}, target=[target], inbound=[route]) as node:
            node.wait_stderr("smtp listening")
            assert _WAITS not in node.stderr()
        with PigeonProcess(tmp_path / "off", delivery={"enabled": False}, target=[target]) as node:
            node.wait_stderr("smtp listening")
            assert _WAITS not in node.stderr()
