"""A report's 7-bit form (`seven_bit`), for a way back without 8BITMIME, read back with the
stdlib parser; and a message/delivery-status part that never holds raw UTF-8 (RFC 6533 3)."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage

from pigeon.delivery.dsn import Failure, build_report
from pigeon.message import Envelope, Recipient
from pigeon.smtp.replies import Reply

HOSTNAME = "mx.pigeon.test"
RECEIVED = b"Received: by mx.pigeon.test (Pigeon) id 00000000000000ac; Tue, 14 Nov 2023 22:15:00 +0000\r\n"
ORIGINAL = (
    "From: Renée <renee@example.org>\r\nTo: bob@example.net\r\nSubject: café\r\n\t au lait\r\n"
    "Message-ID: <m1@example.org>\r\n\r\nnaïve\r\n"
).encode()
REFUSED = Reply(550, "5.1.1", ("Utilisateur inconnu: rené",))


def _report(envelope: Envelope, original: bytes = ORIGINAL, reply: Reply = REFUSED) -> bytes:
    failures = [Failure(r, reply, "failed", "mx.example.net") for r in envelope.recipients]
    return RECEIVED + build_report(
        hostname=HOSTNAME,
        queue_id="00000000000000ab",
        envelope=envelope,
        failures=failures,
        original=original,
        arrival=1_700_000_000.0,
        now=1_700_000_100.0,
    )


def _parsed(data: bytes) -> EmailMessage:
    parsed = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    assert parsed.defects == [] and all(part.defects == [] for part in parsed.walk())
    return parsed


def _status(parsed: EmailMessage) -> str:
    status = parsed.get_payload()[1]
    assert status.get_content_type() == "message/delivery-status"
    return status.as_string()


def test_a_utf8_orcpt_is_written_as_utf8_addr_xtext_in_message_delivery_status() -> None:
    # As a client sent it without SMTPUTF8: "RCPT TO:<x@example.net> ORCPT=utf-8;ü@example.net".
    recipients = [
        Recipient("x@example.net", orcpt="utf-8;ü@example.net"),
        Recipient("y@example.net", orcpt="rfc822;ü+@example.net"),
    ]
    report = _report(Envelope("sender@example.org", recipients), b"Subject: s\r\n\r\nx\r\n")
    status = _status(_parsed(report))
    assert status.isascii()
    assert "Original-Recipient: utf-8; \\x{FC}@example.net" in status
    assert "Original-Recipient: utf-8; \\x{FC}\\x{2B}@example.net" in status  # (RFC 3461's, decoded, made xtext)
    # The server's reply in UTF-8 is escaped there too.
    assert "Diagnostic-Code: smtp; 550 5.1.1 Utilisateur inconnu: ren\\x{E9}" in status
    # In message/global-delivery-status UTF-8 goes as it is.
    envelope = Envelope("sender@example.org", recipients[:1], smtputf8=True)
    assert "Original-Recipient: utf-8; ü@example.net".encode() in _report(envelope)
