"""`after_delivery = "delete"` takes two commands: STORE \\Deleted, then (UID) EXPUNGE. A node
killed between them left the message handed over, recorded `acknowledged: "deleted"`, and
flagged \\Deleted in the folder for good, since every search leaves \\Deleted messages out. The
flag now goes with a keyword that says the message was handed over, and the next session
expunges what carries both, and nothing a person flagged \\Deleted. Against a private
Dovecot, the node killed by SIGKILL at that very moment (a relay keeps the EXPUNGE back)."""

from __future__ import annotations

from pathlib import Path

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, webhook_target
from tests.support.process import PigeonProcess
from tests.support.relay import Relay
from tests.support.services import Dovecot
from tests.support.sinks import wait_until


def test_a_message_left_flagged_deleted_by_a_killed_node_is_expunged_by_the_next_session(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    mine, theirs = dovecot.append("app", [customer_mail(0), customer_mail(1, tag="person")])
    with dovecot.connect("app") as imap:  # a person's: flagged \Deleted in a mail client, not expunged
        imap.select("INBOX")
        imap.uid("STORE", str(theirs), "+FLAGS.SILENT", "(\\Deleted)")
    with WebhookApp() as app, Relay(dovecot.port, hold_at=rb"^\S+ UID EXPUNGE ") as relay:
        box = imap_mailbox(dovecot, "hook", port=relay.port, tls="none", after_delivery="delete")
        first = PigeonProcess(tmp_path / "first", target=[webhook_target(app)], mailbox=[box])
        with first:
            assert relay.held.wait(20), first.stderr()  # flagged \Deleted; its EXPUNGE kept from the server
            first.kill()
            (record,) = first.records("InboundDelivery")
        assert record["acknowledged"] == "deleted" and record["uid"] == mine
        assert "\\Deleted" in dovecot.flags("app", mine)  # what the tester found, there for good
        assert app.wait_distinct(1, 5) == 1

    box = imap_mailbox(dovecot, "hook", tls="none", after_delivery="delete", poll_interval="1s")
    again = WebhookApp()
    second = PigeonProcess(tmp_path / "second", target=[webhook_target(again)], mailbox=[box])
    with again, second as node:
        wait_until(lambda: mine not in dovecot.uids("app"), 20)
        node.wait_stderr(
            "1 message handed over (or set aside) earlier and flagged so, their acknowledgement refused or "
            "cut short, is done at the source now"
        )
    assert dovecot.uids("app") == [theirs]  # the person's \Deleted message is left alone
    assert "\\Deleted" in dovecot.flags("app", theirs)
    assert not again.accepted  # nothing handed over again
    assert sum(app.accepted.values()) == 1
