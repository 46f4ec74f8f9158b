"""8-bit mail to a next hop without 8BITMIME goes in a 7-bit form (its 8-bit MIME parts
quoted-printable, as Postfix converts by default) rather than bouncing 5.6.3: the hop gets
ASCII data, no BODY=8BITMIME, whose parts decode to what was sent, and the `Delivery` record
says `converted`. Pigeon's DKIM signature is made again over that form, and verifies.
`[delivery] eight_bit_conversion = false` bounces such mail 5.6.3, as mail with 8-bit header
fields (which has no 7-bit form) always does."""

from __future__ import annotations

import email
import email.policy
import re
import smtplib
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from pigeon.dkim.keys import generate_key, record_text, write_key
from tests.support.dkim import dkimpy_verify
from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess
from tests.support.sinks import Received, ScriptedSink, delivery_config, wait_until

TEXT = "Grüße aus Köln: naïve café = 100 % sûr \r\nsecond line\t\r\n"
PLAIN = (
    "From: ann@example.com\r\nTo: bob@example.net\r\nSubject: plain\r\nDate: Mon, 1 Jan 2024 00:00:00 +0000\r\n"
    "Message-ID: <plain@example.com>\r\n\r\n" + TEXT
).encode()
ATTACHMENT = bytes(range(256)) * 4
MULTIPART = (
    b"From: ann@example.com\r\nTo: bob@example.net\r\nSubject: with a file\r\n"
    b"Date: Mon, 1 Jan 2024 00:00:00 +0000\r\nMessage-ID: <multi@example.com>\r\n"
    b'MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="=_part"\r\n\r\n'
    b"--=_part\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"
    + TEXT.encode()
    + b"\r\n--=_part\r\nContent-Type: application/octet-stream\r\n"
    b'Content-Disposition: attachment; filename="bytes.bin"\r\nContent-Transfer-Encoding: base64\r\n\r\n'
    + email.base64mime.body_encode(ATTACHMENT, maxlinelen=76, eol="\r\n").encode()
    + b"--=_part--\r\n"
)
UTF8_SUBJECT = "From: ann@example.com\r\nTo: bob@example.net\r\nSubject: Grüße\r\n\r\nnaïve\r\n".encode()


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink(smtputf8=False, eight_bit_mime=False) as running:
        yield running


def _node(tmp_path: Path, sink: ScriptedSink, **sections: Any) -> PigeonProcess:
    delivery = sections.pop("delivery", {})
    return PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, **delivery), **sections)


def _send(pigeon: PigeonProcess, data: bytes, recipient: str = "bob@example.net", **options: str) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        mail = ["BODY=8BITMIME", *(f"{k}={v}" for k, v in options.items())]
        assert client.sendmail("ann@example.com", [recipient], data, mail_options=mail) == {}


def _delivered(sink: ScriptedSink, recipient: str = "bob@example.net") -> Received:
    found: list[Received] = wait_until(lambda: [r for r in sink.received if r.recipients == [recipient]])
    return found[0]


def _parsed(data: bytes) -> EmailMessage:
    parsed = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    return parsed


def _seven_bit_on_the_wire(received: Received) -> None:
    assert received.data.isascii()
    assert all(len(line) <= 998 for line in received.data.split(b"\r\n"))
    assert "BODY=8BITMIME" not in received.mail_options


def test_an_8bit_plain_message_reaches_a_hop_without_8bitmime_quoted_printable_and_its_record_says_so(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    with _node(tmp_path, sink) as pigeon:
        _send(pigeon, PLAIN)
        received = _delivered(sink)
        _seven_bit_on_the_wire(received)
        parsed = _parsed(received.data)
        assert parsed["Content-Transfer-Encoding"] == "quoted-printable"
        assert parsed.get_content_type() == "text/plain" and parsed.get_content_charset() == "utf-8"
        assert parsed.get_payload(decode=True) == TEXT.encode()
        (delivery,) = pigeon.wait_records("Delivery")
        assert delivery["converted"] == "7bit"
        assert pigeon.records("Bounce") == []
        assert pigeon.metric("pigeon_converted_messages_total") == 1


def test_a_multipart_with_8bit_text_and_a_base64_attachment_decodes_to_what_was_sent(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    with _node(tmp_path, sink) as pigeon:
        _send(pigeon, MULTIPART)
        received = _delivered(sink)
        _seven_bit_on_the_wire(received)
        text, attachment = _parsed(received.data).iter_parts()
        assert text["Content-Transfer-Encoding"] == "quoted-printable"
        assert text.get_payload(decode=True) == TEXT.encode()
        assert attachment.get_payload(decode=True) == ATTACHMENT
        assert pigeon.wait_records("Delivery")[0]["converted"] == "7bit"


def test_ascii_mail_and_mail_to_a_hop_with_8bitmime_go_as_they_are(tmp_path: Path) -> None:
    with ScriptedSink(smtputf8=False) as eight_bit, _node(tmp_path, eight_bit) as pigeon:
        _send(pigeon, PLAIN)
        received = _delivered(eight_bit)
        assert received.data.endswith(PLAIN) and "BODY=8BITMIME" in received.mail_options
        assert "converted" not in pigeon.wait_records("Delivery")[0]
        assert pigeon.metric("pigeon_converted_messages_total") == 0


def _bounced(pigeon: PigeonProcess, sink: ScriptedSink) -> dict[str, Any]:
    bounce = wait_until(lambda: pigeon.records("Bounce"))[0]
    assert [r for r in sink.received if r.sender != "<>"] == []
    return bounce


def test_a_full_report_through_a_7bit_hop_returns_the_message_whole_in_its_7bit_form(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    # Found from outside: RET=FULL came back as the message's ASCII header fields only.
    with _node(tmp_path, sink) as pigeon:
        _send(pigeon, PLAIN, recipient="permfail@example.net", RET="FULL")
        (report,) = wait_until(lambda: [r for r in sink.received if r.sender == "<>"])
        _seven_bit_on_the_wire(report)
        text, _, returned = _parsed(report.data).get_payload()
        assert returned.get_content_type() == "message/rfc822"
        (message,) = returned.get_payload()
        assert message["Message-ID"] == "<plain@example.com>"
        assert message.get_payload(decode=True) == TEXT.encode()
        assert "It is attached below" in text.get_content()


def test_with_eight_bit_conversion_off_8bit_mail_bounces_for_want_of_8bitmime(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    with _node(tmp_path, sink, delivery={"eight_bit_conversion": False}) as pigeon:
        _send(pigeon, PLAIN)
        bounce = _bounced(pigeon, sink)
        assert (bounce["response"]["code"], bounce["response"]["enhanced"]) == (554, "5.6.3")
        assert bounce["said_by"] == "pigeon"


def test_mail_with_an_8bit_header_field_still_bounces_5_6_3_saying_why_it_was_not_converted(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    # Found from outside: the reply was the same as with eight_bit_conversion = false.
    with _node(tmp_path, sink) as pigeon:
        _send(pigeon, UTF8_SUBJECT)
        bounce = _bounced(pigeon, sink)
        assert (bounce["response"]["code"], bounce["response"]["enhanced"]) == (554, "5.6.3")
        why = "8-bit data in its header section, which has no 7-bit form"
        assert bounce["response"]["text"].endswith(f"does not offer 8BITMIME; not made 7-bit: {why}")
        (report,) = wait_until(lambda: [r for r in sink.received if r.sender == "<>"])
        assert why in re.sub(r"\r\n[ \t]+", " ", report.data.decode("ascii"))  # (its fields unfolded)


# --- DKIM ------------------------------------------------------------------------------------
def _signatures(data: bytes) -> list[str]:
    """The DKIM-Signature fields of the message's own header section (not of one it returns)."""
    head = data[: data.find(b"\r\n\r\n") + 2]
    return [m.decode() for m in re.findall(rb"(?im)^dkim-signature:[^\r\n]*(?:\r\n[ \t][^\r\n]*)*", head)]


@pytest.fixture
def signed_node(tmp_path: Path, sink: ScriptedSink) -> Iterator[tuple[PigeonProcess, DnsServer]]:
    key, dsn_key = generate_key("rsa-sha256"), generate_key("ed25519-sha256")
    zone = Zone()
    zone.records["conv._domainkey.example.com"] = [("TXT", record_text(key))]
    zone.records["dsn._domainkey.mx.pigeon.test"] = [("TXT", record_text(dsn_key))]  # (PigeonProcess's hostname)
    (tmp_path / "keys").mkdir()
    write_key(tmp_path / "keys" / "conv.pem", key)
    write_key(tmp_path / "keys" / "dsn.pem", dsn_key)
    dkim = [
        {"domain": "example.com", "selector": "conv", "private_key": tmp_path / "keys" / "conv.pem"},
        {
            "domain": "mx.pigeon.test",
            "selector": "dsn",
            "private_key": tmp_path / "keys" / "dsn.pem",
            "algorithm": "ed25519-sha256",
        },
    ]
    with DnsServer(zone) as dns, _node(tmp_path, sink, dkim=dkim) as pigeon:
        yield pigeon, dns


def test_pigeons_signature_is_made_again_over_the_7bit_form_and_verifies(
    signed_node: tuple[PigeonProcess, DnsServer], sink: ScriptedSink
) -> None:
    pigeon, dns = signed_node
    _send(pigeon, MULTIPART)
    received = _delivered(sink)
    _seven_bit_on_the_wire(received)
    (signature,) = _signatures(received.data)
    assert "d=example.com" in signature and "s=conv" in signature
    assert dkimpy_verify(received.data, dns) == [True]


def test_pigeons_own_report_through_a_7bit_hop_is_signed_again_and_verifies(
    signed_node: tuple[PigeonProcess, DnsServer], sink: ScriptedSink
) -> None:
    pigeon, dns = signed_node
    # An 8-bit header field: no 7-bit form, so it bounces; the report returns it whole (8-bit),
    # and goes to the sender through the same hop in its 7-bit form.
    _send(pigeon, UTF8_SUBJECT, RET="FULL")
    (report,) = wait_until(lambda: [r for r in sink.received if r.sender == "<>"])
    _seven_bit_on_the_wire(report)
    (signature,) = _signatures(report.data)
    assert "d=mx.pigeon.test" in signature
    # (dkimpy counts the returned message's signature too, among its header fields: the report's is the first)
    assert dkimpy_verify(report.data, dns)[0] is True
