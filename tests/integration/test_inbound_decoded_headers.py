"""What an application gets of a message with international headers, fetched from a real
Dovecot: Subject, From and To decoded to text (UTF-8 and RFC 2047 encoded-words, a display name
quoted where it needs to be) in the JSON webhook and in the PostgreSQL row, the raw bytes as they were."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.apps import WebhookApp, imap_mailbox, webhook_target
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, Postgres
from tests.support.sinks import wait_until

MAIL = (
    "From: =?utf-8?q?Zo=C3=AB?= Durand <zoe@example.fr>\r\n"
    "To: =?iso-8859-1?q?Andr=E9?= <andre@app.example>, =?utf-8?q?Doe=2C_J=C3=B6hn?= <j@app.example>\r\n"
    "Subject: =?utf-8?b?UsOpc2VydmF0aW9u?= pour thé\r\n"
    "Message-ID: <intl@example.fr>\r\n"
    "\r\nBonjour.\r\n"
).encode()


def test_a_json_webhook_gets_subject_from_and_to_as_text(tmp_path: Path, dovecot: Dovecot) -> None:
    dovecot.append("app", [MAIL])
    with (
        WebhookApp() as app,
        PigeonProcess(tmp_path / "p", target=[webhook_target(app, format="json")],
                      mailbox=[imap_mailbox(dovecot, "hook")]),
    ):  # fmt: skip
        assert app.wait_distinct(1, 20) == 1
        (body,) = [json.loads(b) for b in app.bodies.values()]
    assert body["subject"] == "Réservation pour thé"
    assert body["from"] == "Zoë Durand <zoe@example.fr>"
    # A display name with a "," quoted: one address, as sent (as plain text it read as two).
    assert body["to"] == 'André <andre@app.example>, "Doe, Jöhn" <j@app.example>'
    assert ["Subject", "=?utf-8?b?UsOpc2VydmF0aW9u?= pour thé"] in body["headers"]
    assert body["raw"].encode() == MAIL


def test_a_postgresql_row_has_the_decoded_fields_and_an_older_table_still_takes_rows(
    tmp_path: Path, dovecot: Dovecot, postgres: Postgres
) -> None:
    # A table made before the decoded columns existed: its rows go in as before.
    postgres.execute(
        "CREATE TABLE old_emails (id bigserial PRIMARY KEY, dedupe_key text NOT NULL UNIQUE, message_id text,"
        " source text NOT NULL, mailbox text, uid bigint, sender text, recipients text[], raw bytea NOT NULL,"
        " received_at timestamptz NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),"
        " status text NOT NULL DEFAULT 'pending')"
    )
    dovecot.append("app", [MAIL])
    targets = [
        {"name": "db", "kind": "postgresql", "dsn": postgres.dsn, "table": "inbound_emails"},
        {"name": "old", "kind": "postgresql", "dsn": postgres.dsn, "table": "old_emails"},
    ]
    box = imap_mailbox(dovecot, "db")
    other = imap_mailbox(dovecot, "old", name="other")
    other["folder"] = "Old"
    dovecot.create_folder("app", "Old")
    dovecot.append("app", [MAIL], folder="Old")
    with PigeonProcess(tmp_path / "p", target=targets, mailbox=[box, other]) as node:
        node.wait_records("InboundDelivery", 2, timeout=20)
        wait_until(lambda: not dovecot.unseen("app") and not dovecot.unseen("app", "Old"), 10)
    rows = postgres.query("SELECT subject, from_header, to_header, raw FROM inbound_emails")
    to = 'André <andre@app.example>, "Doe, Jöhn" <j@app.example>'
    decoded = ("Réservation pour thé", "Zoë Durand <zoe@example.fr>", to)
    assert [r[:3] for r in rows] == [decoded]
    assert postgres.query("SELECT message_id FROM old_emails") == [("<intl@example.fr>",)]
