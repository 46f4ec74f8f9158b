"""A delivery report reaches its sender through a hop without 8BITMIME: a report that would be
8-bit (on internationalised mail) goes in a 7-bit form there, rather than being refused and
lost (no one hears of a null sender's failure); and its message/delivery-status part never
holds raw UTF-8, an ORCPT given so included (RFC 6533 3)."""

from __future__ import annotations

import email
import email.policy
import smtplib
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import Received, ScriptedSink, delivery_config

UTF8_MESSAGE = (
    "From: a@example.org\r\nTo: b@example.net\r\nSubject: Grüße\r\nMessage-ID: <m1@example.org>\r\n\r\nnaïve\r\n"
)


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink(smtputf8=False, eight_bit_mime=False) as running:
        yield running


@pytest.fixture
def pigeon(tmp_path: Path, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    with PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as process:
        yield process


def _report(sink: ScriptedSink) -> tuple[Received, EmailMessage]:
    (report,) = [r for r in sink.wait_for(1) if r.sender == "<>"]
    parsed = email.message_from_bytes(report.data, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    return report, parsed


@pytest.mark.parametrize("ret", ["FULL", "HDRS"])
def test_the_report_on_an_smtputf8_message_reaches_its_sender_through_a_hop_without_8bitmime(
    pigeon: PigeonProcess, sink: ScriptedSink, ret: str
) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        options = ["SMTPUTF8", "BODY=8BITMIME", f"RET={ret}"]
        assert client.sendmail("a@example.org", ["b@example.net"], UTF8_MESSAGE.encode(), mail_options=options) == {}
    # The message cannot go (that hop lacks 8BITMIME, which its UTF-8 Subject needs at least):
    # its report to a@example.org goes the same way.
    report, parsed = _report(sink)
    assert report.recipients == ["a@example.org"]
    assert report.data.isascii() and "BODY=8BITMIME" not in report.mail_options
    assert parsed.get_content_type() == "multipart/report"
    assert parsed.get_param("report-type") == "delivery-status"
    text, status, returned = parsed.get_payload()
    assert "Message has 8-bit data and the receiving server does not" in text.get_content()
    assert "Its headers (those in ASCII) are attached below;" in text.get_content()  # (what came back)
    assert status.get_content_type() == "message/delivery-status"
    assert "Final-Recipient: rfc822; b@example.net" in status.as_string()
    # Of the message, its header fields that are ASCII: the Subject in UTF-8 is left out.
    assert returned.get_content_type() == "text/rfc822-headers"
    kept = returned.get_content()
    assert "Message-ID: <m1@example.org>" in kept and "Subject" not in kept


def test_a_utf8_orcpt_is_written_as_utf8_addr_xtext_in_message_delivery_status(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    with RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO client.test")
        client.expect(250, "MAIL FROM:<a@example.org>")
        client.expect(250, "RCPT TO:<permfail@example.net> ORCPT=utf-8;\u00fc@example.net".encode())
        client.expect(354, "DATA")
        client.send(b"Subject: s\r\n\r\nbody\r\n.\r\n")
        client.expect(250)
        client.expect(221, "QUIT")
    report, parsed = _report(sink)
    assert report.data.isascii()
    status = parsed.get_payload()[1]
    assert status.get_content_type() == "message/delivery-status"
    assert "Original-Recipient: utf-8; \\x{FC}@example.net" in status.as_string()
