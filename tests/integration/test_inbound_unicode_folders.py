"""A mailbox whose folders have non-ASCII names: Pigeon names them to Dovecot in modified
UTF-7 (RFC 3501 5.1.3), so it watches, moves to and sets aside in the folders configured."""

from __future__ import annotations

from pathlib import Path

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, webhook_target
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot
from tests.support.sinks import wait_until

# The folders as Dovecot's LIST names them (set up without Pigeon's codec).
_WATCHED = "Entr&AOk-e/Re&AOc-us"
_DONE = "Trait&AOk-s"


def test_a_folder_configured_as_entree_recus_is_the_one_selected_and_moved_from(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    dovecot.create_folder("app", _WATCHED)
    dovecot.append("app", [customer_mail(i) for i in range(3)], folder=_WATCHED)
    dovecot.append("app", [customer_mail(9, tag="inbox")])  # in INBOX: not ours to take
    box = imap_mailbox(dovecot, "hook", folder="Entrée/Reçus", after_delivery="move", move_to="Traités")
    with WebhookApp() as app, PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
        assert app.wait_distinct(3, 20) == 3
        wait_until(lambda: dovecot.count("app", _WATCHED) == 0, 10)
        records = node.wait_records("InboundDelivery", 3)
    assert dovecot.count("app", _DONE) == 3
    assert dovecot.count("app") == 1  # INBOX untouched
    assert _DONE in dovecot.folders("app")  # created under its encoded name, not as UTF-8 bytes
    assert {r["acknowledged"] for r in records} == {"moved to Traités"}
    assert all(r["mailbox"].endswith("/Entrée/Reçus") for r in records)
