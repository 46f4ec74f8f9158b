"""A mailbox whose IMAP session ends (Dovecot's `imap` processes told to stop: each says
`* BYE Server shutting down.` and closes) notices it at once, whatever it was doing: waiting
in IDLE, starting or ending one, or waiting for a handoff to answer. /healthz says
`connected: false` from that moment, the log says why, and the mailbox reconnects without
waiting out the command timeout. Against a private Dovecot."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, mailbox_health, webhook_target
from tests.support.process import PigeonProcess
from tests.support.relay import Relay
from tests.support.services import Dovecot
from tests.support.sinks import wait_until

SAID_BYE = "ImapError: the server said BYE: Server shutting down."


def test_a_bye_is_noticed_at_once_even_when_the_server_is_slow_to_close(tmp_path: Path, dovecot: Dovecot) -> None:
    # The tester's case: a handoff, then the session processes stopped. The BYE and the close
    # came apart now and then (5 of 12 tries), and the mailbox, which had sent DONE to end its
    # IDLE, waited the whole command timeout (60 s) for an answer on a dead socket. The relay
    # passes the close on 20 s late, every time: the BYE alone must end the session.
    with Relay(dovecot.port, close_after=20) as relay, WebhookApp() as app:
        box = imap_mailbox(dovecot, "hook", port=relay.port, tls="none", after_delivery="delete", batch=50,
                           timeout="60s", poll_interval="30s")  # fmt: skip
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            dovecot.append("app", [customer_mail(0)])
            assert app.wait_distinct(1, 20) == 1
            wait_until(lambda: dovecot.count("app") == 0, 10)  # handed over, acknowledged
            time.sleep(0.5)  # IDLE again
            assert dovecot.end_sessions() >= 1
            ended = time.monotonic()
            said = node.wait_stderr("the server said BYE", timeout=15)
            assert time.monotonic() - ended < 5, said
            assert f"{SAID_BYE}; reconnecting" in said
            assert "TimeoutError" not in said
            dovecot.append("app", [customer_mail(1)])  # handed over by the next session, within seconds
            assert app.wait_distinct(2, 15) == 2, f"{time.monotonic() - ended:.1f}s after the BYE"
            assert relay.connections >= 2
            wait_until(lambda: mailbox_health(node)["connected"] is True, 10)
    assert sum(app.accepted.values()) == 2


def test_healthz_says_disconnected_at_once_while_a_handoff_hangs(tmp_path: Path, dovecot: Dovecot) -> None:
    with WebhookApp() as app:
        app.hold("")  # the application takes its time answering (well within the webhook's 30 s)
        box = imap_mailbox(dovecot, "hook", after_delivery="delete")
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            wait_until(lambda: mailbox_health(node)["connected"] is True, 10)
            dovecot.append("app", [customer_mail(0)])
            wait_until(lambda: app.started == 1, 20)  # the handoff is under way
            assert dovecot.end_sessions() >= 1
            ended = time.monotonic()
            health = wait_until(lambda: (h := mailbox_health(node))["connected"] is False and h, 10)
            noticed = time.monotonic() - ended
            said = node.stderr()
            app.release("")
            assert noticed < 3, f"connected: true for {noticed:.1f}s after the session ended"
            assert health["status"] == "degraded" and SAID_BYE in health["error"], health
            assert f"{SAID_BYE}; reconnecting once the handoffs under way end" in said
            # The handoff answered after the session ended: the next session acknowledges it
            # (deletes it), and hands nothing over again.
            assert app.wait_distinct(1, 10) == 1
            wait_until(lambda: dovecot.count("app") == 0, 20)
            health = wait_until(lambda: (h := mailbox_health(node))["status"] == "ok" and h, 10)
            assert health["connected"] is True
    assert sum(app.accepted.values()) == 1
