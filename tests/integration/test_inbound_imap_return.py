"""Dovecot stopped for long enough that the reconnect backoff has grown past ten seconds, then
started again: the mailbox knocks at its port every second, so /healthz is healthy again
within 5 s of Dovecot's return, and the mail is handed over once."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, mailbox_health, webhook_target
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot
from tests.support.sinks import wait_until

_ATTEMPT = re.compile(r"mailbox support \(.*; reconnecting")


def test_health_recovers_within_5s_of_dovecot_coming_back_and_mail_is_drained_once(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(5)])
    box = imap_mailbox(dovecot, "hook", down_after="2s")
    with WebhookApp() as app, PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
        assert app.wait_distinct(5, 20) == 5
        wait_until(lambda: not dovecot.unseen("app"), 10)
        dovecot.stop()
        wait_until(lambda: node.http_get("/healthz")[0] == 503, 15)
        # Five failed attempts (Dovecot's BYE, then refusals), each pause twice the last (1,
        # 2, 4, 8 s, less up to half): the next attempt is due 8 to 16 s after the fifth, so
        # without the knock the mailbox could not be back within 5 s of Dovecot's return.
        wait_until(lambda: len(_ATTEMPT.findall(node.stderr())) >= 5, 40)
        assert "Connection refused" in mailbox_health(node)["error"]
        back = time.monotonic()  # (its start-up counts in the 5 s)
        dovecot.start()
        dovecot.append("app", [customer_mail(i, tag="after") for i in range(5)])
        _, body = wait_until(lambda: (a := node.http_get("/healthz"))[0] == 200 and a, 10)
        assert time.monotonic() - back < 5, f"healthy {time.monotonic() - back:.1f}s after Dovecot's return"
        assert json.loads(body)["inbound"]["support"]["status"] == "ok"
        assert app.wait_distinct(10, 20) == 10
        wait_until(lambda: not dovecot.unseen("app"), 10)
        node.wait_records("InboundDelivery", 10)
        logged = node.stderr()
    assert sum(app.accepted.values()) == 10  # every message once: none lost, none repeated
    assert "accepts connections again; reconnecting" in logged
