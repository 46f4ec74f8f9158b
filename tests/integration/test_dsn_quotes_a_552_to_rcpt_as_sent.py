"""A 552 to RCPT is read as 452 (RFC 5321 4.5.3.1.10: a full mailbox may empty), and retried;
but what the sender's DSNs quote as the server's reply is what the server said, through a real
node and sinks: their `Diagnostic-Code` (RFC 3464 2.3.6, which a parser reads the remote
status from) is `smtp; 552 5.2.2 ...`, as Postfix quotes it, never a 452 the server did not
send. The human-readable text and the log records say what Pigeon read it as."""

from __future__ import annotations

import smtplib
from email.message import Message
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

MESSAGE = b"From: <sender@example.org>\r\nSubject: full\r\n\r\nHello.\r\n"
FULL = "552 5.2.2 Mailbox full"
NOTE = "(552 to RCPT read as 452, RFC 5321 4.5.3.1.10)"


def _status_block(dsn: Message) -> Message:
    """The one per-recipient block of a DSN's delivery-status part."""
    (block,) = dsn.get_payload()[1].get_payload()[1:]  # (the first is the per-message one)
    return block


def _text(dsn: Message) -> str:
    """A DSN's human-readable part, its wrapped lines joined."""
    return " ".join(dsn.get_payload()[0].get_payload(decode=True).decode().split())


def test_the_delay_and_expiry_dsns_of_a_552_to_rcpt_quote_the_552_as_the_server_sent_it(tmp_path: Path) -> None:
    with ScriptedSink() as sink, ScriptedSink() as dsn_sink:
        sink.rcpt_reply = lambda address: FULL
        config = delivery_config(sink.endpoint, delay_warning="2s", max_age="6s")
        dsn_route = {"domain": "example.org", "next_hop": dsn_sink.endpoint, "tls": "disabled"}
        config["route"] = [dsn_route, *config["route"]]
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                assert client.sendmail("sender@example.org", ["full@example.net"], MESSAGE) == {}
            pigeon.wait_records("Expiration", 1, timeout=30)
            delayed, failed = dsn_sink.wait_for(2, timeout=20)
            assert delayed.email["Subject"] == "Delayed Mail (still being retried)"
            assert failed.email["Subject"] == "Undelivered Mail Returned to Sender"

            # The server's words, as it gave them, under each report's own Status.
            for dsn, action, status in ((delayed, "delayed", "4.2.2"), (failed, "failed", "5.4.7")):
                block = _status_block(dsn.email)
                assert (block["Action"], block["Status"]) == (action, status)
                assert block["Diagnostic-Code"] == f"smtp; {FULL}"
                assert block["Remote-MTA"] == "dns; [127.0.0.1]"
            # The text says what Pigeon made of it: why a 552 was retried rather than bounced.
            assert f"<full@example.net>: Mailbox full {NOTE}" in _text(delayed.email)
            assert f"last attempt: 452 4.2.2 Mailbox full {NOTE}" in _text(failed.email)

            # The log records keep the reply as read, with the note (as documented).
            transient = pigeon.records("TransientFailure")
            assert transient and all(r["response"]["code"] == 452 for r in transient)
            assert all(r["response"]["text"] == f"Mailbox full {NOTE}" for r in transient)
