"""A report's 7-bit form (`seven_bit`), for a way back without 8BITMIME, read back with the
stdlib parser; and a message/delivery-status part that never holds raw UTF-8 (RFC 6533 3)."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage

import pytest

from pigeon.delivery import seven_bit as converter
from pigeon.delivery.dsn import Failure, build_report, for_seven_bit_hop, seven_bit
from pigeon.message import Envelope, Message, Recipient, SpoolId
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


@pytest.mark.parametrize("ret", ["FULL", "HDRS"])
def test_a_report_on_internationalised_mail_has_a_7_bit_form_that_says_as_much(ret: str) -> None:
    envelope = Envelope("alice@example.org", [Recipient("rené@example.net", orcpt="utf-8;rené@example.net")])
    envelope.smtputf8, envelope.ret = True, ret
    report = _report(envelope)
    assert not report.isascii()
    seven = seven_bit(report)
    assert seven is not None and seven.isascii()
    parsed = _parsed(seven)
    assert parsed.get_param("report-type") == "delivery-status"
    text, _, returned = parsed.get_payload()
    # The text, quoted-printable, reads as it did.
    assert text.get_all("Content-Transfer-Encoding") == ["quoted-printable"]  # ("8bit" no longer)
    assert all(part.get_all("Content-Transfer-Encoding") in (None, ["quoted-printable"]) for part in parsed.walk())
    assert "<rené@example.net>: Utilisateur inconnu: rené" in text.get_content()
    assert "Its headers (those in ASCII) are attached below;" in text.get_content()  # (not all, nor all of them)
    # The addresses in RFC 6533's utf-8-addr-xtext; the server's words escaped alike.
    status = _status(parsed)
    assert "Final-Recipient: utf-8; ren\\x{E9}@example.net" in status
    assert "Original-Recipient: utf-8; ren\\x{E9}@example.net" in status
    assert "Utilisateur inconnu: ren\\x{E9}" in status
    # Of the message, its ASCII header fields only (a field's continuation lines go with it).
    assert returned.get_content_type() == "text/rfc822-headers"
    assert returned.get_content() == "To: bob@example.net\r\nMessage-ID: <m1@example.org>\r\n"


@pytest.mark.parametrize("reply", [REFUSED, Reply(550, "5.1.1", ("unknown",))], ids=["utf8-reply", "ascii-reply"])
def test_an_8_bit_message_returned_whole_comes_back_as_its_header_fields_and_the_text_says_so(reply: Reply) -> None:
    # Not internationalised (no SMTPUTF8): 8-bit in its body only, which message/rfc822 cannot encode.
    original = b"From: a@example.org\r\nSubject: s\r\n\r\nna\xc3\xafve\r\n"
    report = _report(Envelope("alice@example.org", [Recipient("bob@example.net")], ret="FULL"), original, reply)
    seven = seven_bit(report)
    assert seven is not None and seven.isascii()
    text, _, returned = _parsed(seven).get_payload()
    assert returned.get_content_type() == "text/rfc822-headers"
    assert returned.get_content() == "From: a@example.org\r\nSubject: s\r\n"
    # The text says what came back: not the message, written before it was cut to its headers.
    said = text.get_content()
    assert "Its headers (those in ASCII) are attached below; the reasons are:" in said
    assert "It is attached" not in said
    assert f"<bob@example.net>: {reply.text}" in said


@pytest.mark.parametrize("smtputf8", [False, True], ids=["message/rfc822", "message/global"])
def test_an_8_bit_message_returned_whole_comes_back_whole_in_its_7_bit_form_when_it_has_one(smtputf8: bool) -> None:
    # Found from outside: RET=FULL through a hop without 8BITMIME returned only the header
    # fields, though the message (8-bit in its body only) has a 7-bit form.
    original = b"From: a@example.org\r\nSubject: s\r\nMIME-Version: 1.0\r\n\r\nna\xc3\xafve\r\n"
    envelope = Envelope("alice@example.org", [Recipient("bob@example.net")], smtputf8=smtputf8, ret="FULL")
    report = _report(envelope, original, Reply(550, "5.1.1", ("unknown",)))
    seven = seven_bit(report, converter.seven_bit)
    assert seven is not None and seven.isascii()
    text, _, returned = _parsed(seven).get_payload()
    assert returned.get_content_type() == "message/rfc822"
    assert returned.get_all("Content-Transfer-Encoding") is None  # (7bit)
    (inner,) = returned.get_payload()
    assert inner["Subject"] == "s" and inner.get_all("Content-Transfer-Encoding") == ["quoted-printable"]
    assert inner.get_payload(decode=True) == "naïve\r\n".encode()
    assert "It is attached below; the reasons are:" in text.get_content()


def test_a_message_returned_whole_with_8_bit_header_fields_still_comes_back_as_its_ascii_fields() -> None:
    envelope = Envelope("alice@example.org", [Recipient("bob@example.net")], smtputf8=True, ret="FULL")
    seven = seven_bit(_report(envelope), converter.seven_bit)
    assert seven is not None and seven.isascii()
    text, _, returned = _parsed(seven).get_payload()
    assert returned.get_content_type() == "text/rfc822-headers"
    assert returned.get_content() == "To: bob@example.net\r\nMessage-ID: <m1@example.org>\r\n"
    assert "Its headers (those in ASCII) are attached below;" in text.get_content()


@pytest.mark.parametrize("smtputf8", [True, False], ids=["global-delivery-status", "delivery-status"])
def test_a_long_utf8_reply_keeps_to_78_octets_a_line_in_every_form_of_the_report(smtputf8: bool) -> None:
    # Three lines of 400 octets (RFC 5321 allows 512), each "é" 6 octets once escaped (\\x{E9}):
    # folded where the escaped form is too long, so that neither form has a line over 78.
    lines = tuple(" ".join(f"r\u00e9ponse{i}{j:02d}" for j in range(36)) for i in range(3))
    envelope = Envelope("alice@example.org", [Recipient("rené@example.net")], smtputf8=smtputf8, ret="FULL")
    report = _report(envelope, reply=Reply(550, "5.7.1", lines))
    seven = seven_bit(report)
    assert seven is not None and seven.isascii()
    for form in (report, seven):
        assert max(len(line) for line in form.removesuffix(b"\r\n").split(b"\r\n")[1:]) <= 78  # (after Received)
    parsed = _parsed(seven)
    status = _status(parsed)
    diagnostic = status[status.index("Diagnostic-Code: ") :].split("\nLast-Attempt-Date:")[0]
    escaped = " ".join(lines).replace("\u00e9", "\\x{E9}")
    assert diagnostic.replace("\n", "") == f"Diagnostic-Code: smtp; 550 5.7.1 {escaped}"  # (unfolded)
    text = parsed.get_payload()[0].get_content()
    assert text[text.index("<ren") :].split()[1:] == " ".join(lines).split()


def test_a_message_in_ascii_still_comes_back_whole_in_the_7_bit_form_and_the_text_says_so() -> None:
    # Internationalised only in its recipient and the reply: the message, all ASCII, goes as it was.
    envelope = Envelope("alice@example.org", [Recipient("rené@example.net")], smtputf8=True, ret="FULL")
    seven = seven_bit(_report(envelope, b"From: a@example.org\r\nSubject: s\r\n\r\nplain\r\n"))
    assert seven is not None and seven.isascii()
    text, _, returned = _parsed(seven).get_payload()
    assert returned.get_content_type() == "message/global"
    assert "It is attached below; the reasons are:" in text.get_content()


def test_a_report_that_is_ascii_already_is_left_as_it_is() -> None:
    envelope = Envelope("alice@example.org", [Recipient("bob@example.net")])
    report = _report(envelope, b"Subject: s\r\n\r\nx\r\n", Reply(550, "5.1.1", ("unknown",)))
    assert report.isascii()
    assert seven_bit(report) == report


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


def _message(envelope: Envelope) -> Message:
    return Message(SpoolId(1), "example.org", envelope, 0.0, 0, SpoolId(1))


def test_only_a_report_of_ours_is_made_7_bit_and_its_signature_comes_off() -> None:
    envelope = Envelope("alice@example.org", [Recipient("bob@example.net")], smtputf8=True)
    report = _report(envelope)
    signature = b"DKIM-Signature: v=1; a=rsa-sha256; d=pigeon.test; s=s; b=abc\r\n"
    ours = Envelope("", [Recipient("alice@example.org")], protocol="LOCAL", dkim_signatures=signature)
    assert for_seven_bit_hop(_message(ours), signature + report) == seven_bit(report)
    # A client's message with a null sender is no report of ours: it is refused there, as any.
    assert for_seven_bit_hop(_message(Envelope("", [Recipient("alice@example.org")])), report) is None
    assert for_seven_bit_hop(_message(envelope), report) is None
