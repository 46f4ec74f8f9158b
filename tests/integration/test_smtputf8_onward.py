"""SMTPUTF8 on the way out: what needs it is UTF-8 in an address or a header field, not the
flag the mail came with (RFC 6531). Pure-ASCII mail sent with SMTPUTF8 goes to a next hop
that lacks it; mail that needs it is refused there, 5.6.7. Both doors: SMTP and HTTP."""

from __future__ import annotations

import smtplib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

TOKEN = "inject-token-0123456789"
ASCII_MESSAGE = b"From: <s@sender.test>\r\nTo: <user@d15.test>\r\nSubject: plain\r\n\r\nHello.\r\n"


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink(smtputf8=False) as running:  # offers 8BITMIME and SIZE, not SMTPUTF8
        yield running


@pytest.fixture
def pigeon(tmp_path: Path, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    with PigeonProcess(tmp_path / "node", http={"token": tokens}, **delivery_config(sink.endpoint)) as process:
        yield process


def _sendmail(pigeon: PigeonProcess, data: bytes, options: list[str]) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        assert client.sendmail("s@sender.test", ["user@d15.test"], data, mail_options=options) == {}


@pytest.mark.parametrize(
    ("data", "options"),
    [
        (ASCII_MESSAGE, ["SMTPUTF8"]),
        # UTF-8 in the body only: 8BITMIME carries it, SMTPUTF8 is not needed.
        (ASCII_MESSAGE.replace(b"Hello.", "Grüße, naïve.".encode()), ["SMTPUTF8", "BODY=8BITMIME"]),
    ],
    ids=["ascii", "utf8-body"],
)
def test_smtputf8_mail_with_ascii_addresses_and_header_goes_to_a_next_hop_without_smtputf8(
    pigeon: PigeonProcess, sink: ScriptedSink, data: bytes, options: list[str]
) -> None:
    _sendmail(pigeon, data, options)
    (received,) = sink.wait_for(1)
    assert received.recipients == ["user@d15.test"]
    assert received.data.endswith(data)
    assert "SMTPUTF8" not in received.mail_options
    assert ("BODY=8BITMIME" in received.mail_options) == (not data.isascii())
    assert pigeon.wait_records("Delivery")[0]["recipient"] == "user@d15.test"
    assert pigeon.records("Bounce") == []


def test_smtputf8_mail_with_a_utf8_header_field_is_refused_by_a_next_hop_without_smtputf8(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    data = ASCII_MESSAGE.replace(b"Subject: plain", "Subject: Grüße".encode())
    _sendmail(pigeon, data, ["SMTPUTF8", "BODY=8BITMIME"])
    (bounce,) = pigeon.wait_records("Bounce")
    assert bounce["recipient"] == "user@d15.test"
    assert (bounce["response"]["code"], bounce["response"]["enhanced"]) == (554, "5.6.7")
    assert bounce["said_by"] == "pigeon"  # the server never saw the message
    assert [r for r in sink.received if r.recipients == ["user@d15.test"]] == []


def test_the_dsn_of_a_refusal_for_want_of_smtputf8_says_pigeon_refused_not_the_server(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    # The server never saw the message: it only lacked SMTPUTF8, and Pigeon refused to send.
    # "smtp;" would tell the sender the server answered 554 5.6.7 (RFC 3464 2.3.6).
    data = ASCII_MESSAGE.replace(b"Subject: plain", "Subject: Grüße".encode())
    _sendmail(pigeon, data, ["SMTPUTF8", "BODY=8BITMIME"])
    (dsn,) = sink.wait_for(1)
    assert dsn.recipients == ["s@sender.test"]
    assert b"Diagnostic-Code: X-Pigeon; 554 5.6.7 Message needs SMTPUTF8" in dsn.data
    assert b"Diagnostic-Code: smtp;" not in dsn.data
    assert b"Remote-MTA: dns; [127.0.0.1]\r\n" in dsn.data  # the server that lacked it (no port: RFC 3464)


def test_an_injected_ascii_message_goes_to_a_next_hop_without_smtputf8(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    request = {
        "envelope_sender": "s@sender.test",
        "recipients": [{"email": "user@d15.test"}],
        "content": ASCII_MESSAGE.decode(),
    }
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["accepted"]) == (200, 1)
    (received,) = sink.wait_for(1)
    assert received.recipients == ["user@d15.test"]
    assert "SMTPUTF8" not in received.mail_options
    assert pigeon.records("Bounce") == []
