"""Messages another client expunged while they were handed over (or a node that took them over
moved them): the server refuses the move that would acknowledge them (`NO [EXPUNGEISSUED]`).
A message that is gone needs no acknowledgement: the others of the group are acknowledged, and
the mailbox stays `ok`, not `degraded` until a retry 30 s later."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, mailbox_health, webhook_target
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot
from tests.support.sinks import wait_until


def _expunge(dovecot: Dovecot, uids: list[int]) -> None:
    client = dovecot.connect("app")
    try:
        client.select("INBOX")
        client.uid("STORE", ",".join(map(str, uids)), "+FLAGS.SILENT", "(\\Deleted)")
        client.expunge()
    finally:
        with contextlib.suppress(Exception):
            client.logout()


@pytest.mark.parametrize("gone", [2, 4])
def test_messages_expunged_by_another_client_during_their_handoff_do_not_degrade_the_mailbox(
    tmp_path: Path, dovecot: Dovecot, gone: int
) -> None:
    box = imap_mailbox(dovecot, "hook", after_delivery="move", move_to="Processed", concurrency=4)
    uids = dovecot.append("app", [customer_mail(i) for i in range(4)])  # all found by the first search
    with WebhookApp() as app:
        app.hold("")
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            wait_until(lambda: app.started == 4, 20)  # the four under way, held
            _expunge(dovecot, uids[:gone])  # another client removes some (or all) meanwhile
            app.release("")
            node.wait_records("InboundDelivery", 4, timeout=15)
            wait_until(lambda: dovecot.count("app") == 0, 10)
            time.sleep(2)
            health = mailbox_health(node)
            processed = dovecot.count("app", "Processed")
            logged = node.stderr()
    assert processed == 4 - gone
    assert "are gone from INBOX already: nothing to acknowledge there" in logged, logged
    assert "cannot acknowledge" not in logged, logged
    assert health["status"] == "ok", health
    assert health["error"] is None, health
