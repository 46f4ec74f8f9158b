"""A mailbox that polls (`idle = false`, or a server without IDLE) sees, at each poll, the mail
another session appended since the one before: it is handed over within one `poll_interval`.
Dovecot shows a selected folder's new messages to a session only when a command ends (an
untagged EXISTS), so a poll that only searched missed them until the poll after."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.apps import customer_mail, imap_mailbox, mailbox_health
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot
from tests.support.sinks import wait_until

POLL = 3.0
SLACK = 1.5  # a poll's own round trips, a handoff to a Maildir, and this test's polling of /healthz


def _next_poll(node: PigeonProcess) -> None:
    """Return just after the mailbox's next poll: the wait before the one after is all ahead."""
    before = mailbox_health(node)["last_poll"]
    wait_until(lambda: mailbox_health(node)["last_poll"] != before, 2 * POLL + 5, interval=0.02)


def test_mail_appended_by_another_session_is_handed_over_within_one_poll_interval(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    maildir = tmp_path / "Maildir"
    target = {"name": "box", "kind": "maildir", "path": str(maildir)}
    box = imap_mailbox(dovecot, "box", idle=False, poll_interval=f"{POLL:g}s")
    with PigeonProcess(tmp_path / "p", target=[target], mailbox=[box]) as node:
        wait_until(lambda: mailbox_health(node)["last_poll"] is not None, 20)
        for n in range(2):
            _next_poll(node)
            appended = time.monotonic()
            dovecot.append("app", [customer_mail(n)])
            node.wait_records("InboundDelivery", n + 1, timeout=3 * POLL + 5)
            took = time.monotonic() - appended
            assert took < POLL + SLACK, f"message {n} handed over {took:.2f}s after it was appended"
