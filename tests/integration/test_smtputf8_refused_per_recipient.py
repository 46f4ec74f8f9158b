"""A next hop without SMTPUTF8 refuses only the recipients whose address needs it.

An address that is not ASCII has no other form in RCPT (RFC 6531), but RCPT is per recipient:
the message's ASCII recipients of the same domain go in a transaction without SMTPUTF8 (their
MAIL and RCPT are ASCII) and are delivered, while each non-ASCII one bounces 554 5.6.7 on its
own, with one record each and a DSN naming it alone. At every door alike (SMTP with SMTPUTF8,
HTTP injection). A sender that is not ASCII still refuses the whole message: MAIL needs it."""

from __future__ import annotations

import smtplib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

TOKEN = "inject-token-0123456789"
MESSAGE = b"From: <s@sender.test>\r\nTo: <bob@d15.test>\r\nSubject: plain\r\n\r\nHello.\r\n"
BOB, JOSE = "bob@d15.test", "josé@d15.test"


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink(smtputf8=False) as running:  # offers 8BITMIME and SIZE, not SMTPUTF8
        yield running


@pytest.fixture
def pigeon(tmp_path: Path, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    with PigeonProcess(tmp_path / "node", http={"token": tokens}, **delivery_config(sink.endpoint)) as process:
        yield process


def _send(pigeon: PigeonProcess, door: str, sender: str, recipients: list[str], data: bytes = MESSAGE) -> None:
    if door == "smtp":
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            assert client.sendmail(sender, recipients, data, mail_options=["SMTPUTF8", "BODY=8BITMIME"]) == {}
    else:
        request = {
            "envelope_sender": sender,
            "recipients": [{"email": recipient} for recipient in recipients],
            "content": data.decode(),
        }
        status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
        assert (status, answer["accepted"]) == (200, len(recipients)), answer


def _records(pigeon: PigeonProcess, kind: str, *recipients: str) -> list[dict[str, Any]]:
    """The `kind` records of these recipients (not of a DSN's), once each has one."""

    def found() -> list[dict[str, Any]]:
        return [record for record in pigeon.records(kind) if record["recipient"] in recipients]

    wait_until(lambda: len(found()) >= len(recipients))
    return found()


def _terminal(pigeon: PigeonProcess) -> list[tuple[str, str]]:
    """(record type, recipient) of every Delivery and Bounce of bob and josé so far, sorted."""
    records = [(kind, r["recipient"]) for kind in ("Delivery", "Bounce") for r in pigeon.records(kind)]
    return sorted(record for record in records if record[1] in (BOB, JOSE))


@pytest.mark.parametrize("door", ["smtp", "http"])
def test_the_ascii_recipient_is_delivered_and_only_the_non_ascii_one_bounces_at_a_next_hop_without_smtputf8(
    pigeon: PigeonProcess, sink: ScriptedSink, door: str
) -> None:
    _send(pigeon, door, "s@sender.test", [BOB, JOSE])
    (delivery,) = _records(pigeon, "Delivery", BOB)
    (bounce,) = _records(pigeon, "Bounce", JOSE)
    assert (bounce["response"]["code"], bounce["response"]["enhanced"]) == (554, "5.6.7")
    assert bounce["said_by"] == "pigeon"  # the server never saw josé
    assert delivery["peer"] == bounce["peer"]  # the same host: it lacked SMTPUTF8 for josé alone
    # bob's message and the DSN (to the sender, through the same sink): two transactions.
    delivered, dsn = sorted(sink.wait_for(2), key=lambda received: received.recipients != [BOB])
    assert (delivered.sender, delivered.recipients) == ("s@sender.test", [BOB])
    assert "SMTPUTF8" not in delivered.mail_options
    assert delivered.data.endswith(MESSAGE)
    assert [address for address in sink.rcpt_log if address != "s@sender.test"] == [BOB]  # josé never went
    # The DSN names josé alone (in the form its door gives: UTF-8, or \x{E9} without SMTPUTF8).
    assert dsn.recipients == ["s@sender.test"]
    report = dsn.data.decode()
    finals = [line for line in report.split("\r\n") if line.startswith("Final-Recipient:")]
    assert finals in (["Final-Recipient: utf-8; josé@d15.test"], ["Final-Recipient: utf-8; jos\\x{E9}@d15.test"])
    assert "<josé@d15.test>: Message needs SMTPUTF8" in report
    assert "<bob@d15.test>:" not in report
    assert "Diagnostic-Code: X-Pigeon; 554 5.6.7" in report
    # One terminal record each, and nothing more after a while.
    time.sleep(1.5)
    assert _terminal(pigeon) == [("Bounce", JOSE), ("Delivery", BOB)]
    assert pigeon.records("TransientFailure") == []


def test_a_sender_that_is_not_ascii_still_refuses_the_whole_message(pigeon: PigeonProcess, sink: ScriptedSink) -> None:
    _send(pigeon, "smtp", "rené@sender.test", [BOB, JOSE])
    bounces = _records(pigeon, "Bounce", BOB, JOSE)  # (the DSN to rené bounces alike: not theirs)
    assert sorted(b["recipient"] for b in bounces) == [BOB, JOSE]
    assert {(b["response"]["code"], b["response"]["enhanced"]) for b in bounces} == {(554, "5.6.7")}
    assert pigeon.records("Delivery") == []
    assert [r for r in sink.received if BOB in r.recipients] == []


def test_the_ascii_recipient_of_8bit_mail_goes_in_its_7bit_form_to_a_hop_with_neither_extension(
    tmp_path: Path,
) -> None:
    # Neither SMTPUTF8 nor 8BITMIME: josé cannot go at all; bob's message has a 7-bit form.
    data = MESSAGE.replace(b"Hello.", "Grüße.".encode())
    with (
        ScriptedSink(smtputf8=False, eight_bit_mime=False) as hop,
        PigeonProcess(tmp_path / "node", **delivery_config(hop.endpoint)) as pigeon,
    ):
        _send(pigeon, "smtp", "s@sender.test", [BOB, JOSE], data)
        (delivery,) = _records(pigeon, "Delivery", BOB)
        (bounce,) = _records(pigeon, "Bounce", JOSE)
        assert (delivery["recipient"], bounce["recipient"], delivery["converted"]) == (BOB, JOSE, "7bit")
        assert (bounce["response"]["code"], bounce["response"]["enhanced"]) == (554, "5.6.7")
        received = wait_until(lambda: [r for r in hop.received if r.recipients == [BOB]])[0]
        assert received.data.isascii()  # quoted-printable
        assert "SMTPUTF8" not in received.mail_options
