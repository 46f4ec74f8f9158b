"""SMTPUTF8 on the way out, one rule at every door (SMTP with or without SMTPUTF8, HTTP injection,
`pigeon inject`): only an envelope address that is not ASCII needs it (RFC 6531), and is
refused, 5.6.7, by a next hop without it: that recipient alone, the message's ASCII recipients
going without SMTPUTF8 (a sender that is not ASCII refuses it whole: MAIL needs it). UTF-8 in a
header field asks for SMTPUTF8 where the next hop offers it and otherwise goes with
BODY=8BITMIME; to a hop with neither it is refused for want of 8BITMIME, 5.6.3. Pure-ASCII mail
sent with SMTPUTF8 goes to a next hop that lacks it. A header section in 8-bit octets that are
not UTF-8 (raw Latin-1) asks for no SMTPUTF8, even where offered (it left with SMTPUTF8 at
every door, telling a strict next hop to read Latin-1 as UTF-8): BODY=8BITMIME alone, unless
the client itself said SMTPUTF8."""

from __future__ import annotations

import base64
import smtplib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

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


def test_smtputf8_mail_to_an_address_that_is_not_ascii_is_refused_by_a_next_hop_without_smtputf8(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail("s@sender.test", ["renée@d15.test"], ASCII_MESSAGE, mail_options=["SMTPUTF8"])
    (bounce,) = pigeon.wait_records("Bounce")
    assert bounce["recipient"] == "renée@d15.test"
    assert (bounce["response"]["code"], bounce["response"]["enhanced"]) == (554, "5.6.7")
    assert "internationalised addresses" in bounce["response"]["text"]
    assert bounce["said_by"] == "pigeon"  # the server never saw the message
    assert [r for r in sink.received if r.recipients == ["renée@d15.test"]] == []


def test_the_dsn_of_a_refusal_for_want_of_smtputf8_says_pigeon_refused_not_the_server(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    # The server never saw the message: it only lacked SMTPUTF8, and Pigeon refused to send.
    # "smtp;" would tell the sender the server answered 554 5.6.7 (RFC 3464 2.3.6).
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail("s@sender.test", ["renée@d15.test"], ASCII_MESSAGE, mail_options=["SMTPUTF8"])
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


# --- UTF-8 in a header field: the same fate at every door ---------------------------------------
UTF8_SUBJECT = "From: a@example.org\r\nTo: b@hop.test\r\nSubject: café M\r\n\r\nb\r\n".encode()
DOORS = ["smtp", "smtp-smtputf8", "http", "cli"]
HOPS = {"no8": {"smtputf8": False}, "u8": {"smtputf8": True}, "none": {"smtputf8": False, "eight_bit_mime": False}}


@pytest.fixture(scope="module")
def hops() -> Iterator[dict[str, ScriptedSink]]:
    sinks = {name: ScriptedSink(**options) for name, options in HOPS.items()}  # type: ignore[arg-type]
    try:
        yield sinks
    finally:
        for running in sinks.values():
            running.stop()


@pytest.fixture(scope="module")
def doors_node(tmp_path_factory: pytest.TempPathFactory, hops: dict[str, ScriptedSink]) -> Iterator[PigeonProcess]:
    config = delivery_config(hops["u8"].endpoint)  # the DSNs (to example.org) go to u8
    config["route"] = [
        {"domain": f"{name}.test", "next_hop": sink.endpoint, "tls": "disabled"} for name, sink in hops.items()
    ] + config["route"]
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    root = tmp_path_factory.mktemp("utf8-doors")
    with PigeonProcess(root / "node", http={"token": tokens}, **config) as process:
        yield process


def _through(node: PigeonProcess, door: str, recipient: str, data: bytes) -> None:
    if door.startswith("smtp"):
        options = ["SMTPUTF8", "BODY=8BITMIME"] if door == "smtp-smtputf8" else ["BODY=8BITMIME"]
        with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            assert client.sendmail("a@example.org", [recipient], data, mail_options=options) == {}
    elif door == "http":
        request = {"envelope_sender": "a@example.org", "recipients": [{"email": recipient}], "content": data.decode()}
        status, answer = node.http_post("/api/v1/inject", request, TOKEN)
        assert (status, answer["accepted"]) == (200, 1), answer
    else:
        command = ["inject", "-c", str(node.config_path), "--token", TOKEN]
        command += ["--no-template", "--from", "a@example.org", "--to", recipient, "-"]
        done = zygote.run(command, input=data, timeout=60, check=False)
        assert done.returncode == 0, done


@pytest.mark.parametrize("door", DOORS)
def test_utf8_only_in_a_header_field_goes_with_8bitmime_to_a_next_hop_without_smtputf8_at_every_door(
    doors_node: PigeonProcess, hops: dict[str, ScriptedSink], door: str
) -> None:
    recipient = f"{door}@no8.test"
    _through(doors_node, door, recipient, UTF8_SUBJECT)
    received = wait_until(lambda: [r for r in hops["no8"].received if r.recipients == [recipient]])
    assert "BODY=8BITMIME" in received[0].mail_options
    assert "SMTPUTF8" not in received[0].mail_options
    assert "Subject: café M".encode() in received[0].data
    assert [b for b in doors_node.records("Bounce") if b["recipient"] == recipient] == []


@pytest.mark.parametrize("door", DOORS)
def test_utf8_in_a_header_field_asks_for_smtputf8_where_the_next_hop_offers_it_at_every_door(
    doors_node: PigeonProcess, hops: dict[str, ScriptedSink], door: str
) -> None:
    recipient = f"{door}@u8.test"
    _through(doors_node, door, recipient, UTF8_SUBJECT)
    received = wait_until(lambda: [r for r in hops["u8"].received if r.recipients == [recipient]])
    assert "SMTPUTF8" in received[0].mail_options
    assert "BODY=8BITMIME" in received[0].mail_options


@pytest.mark.parametrize("door", DOORS)
def test_utf8_in_a_header_field_to_a_next_hop_with_neither_extension_bounces_for_want_of_8bitmime_at_every_door(
    doors_node: PigeonProcess, hops: dict[str, ScriptedSink], door: str
) -> None:
    recipient = f"{door}@none.test"
    _through(doors_node, door, recipient, UTF8_SUBJECT)
    bounce = wait_until(lambda: [b for b in doors_node.records("Bounce") if b["recipient"] == recipient])[0]
    assert (bounce["response"]["code"], bounce["response"]["enhanced"]) == (554, "5.6.3")
    assert [r for r in hops["none"].received if r.recipients == [recipient]] == []


# --- 8-bit header bytes that are not UTF-8: legacy 8-bit mail, no SMTPUTF8 ----------------------
LATIN1_SUBJECT = b"From: a@example.org\r\nTo: b@hop.test\r\nSubject: caf\xe9 M\r\n\r\nb\r\n"
"""A raw Latin-1 Subject (RFC 6532 3 allows only UTF-8 there): SMTPUTF8 would tell the next hop
it is UTF-8, and a strict one would read it so."""


def _through_bytes(node: PigeonProcess, door: str, recipient: str, data: bytes, tmp_path: Path) -> None:
    """As `_through`, for bytes that are not UTF-8: base64 over HTTP, a message file for the CLI."""
    if door == "http":
        request = {
            "envelope_sender": "a@example.org",
            "recipients": [{"email": recipient}],
            "content": base64.b64encode(data).decode(),
            "content_encoding": "base64",
            "template": False,
        }
        status, answer = node.http_post("/api/v1/inject", request, TOKEN)
        assert (status, answer["accepted"]) == (200, 1), answer
    elif door == "cli":
        path = tmp_path / "latin.eml"
        path.write_bytes(data)
        command = ["inject", "-c", str(node.config_path), "--token", TOKEN]
        command += ["--from", "a@example.org", "--to", recipient, str(path)]
        done = zygote.run(command, timeout=60, check=False)
        assert done.returncode == 0, done
    else:
        _through(node, door, recipient, data)


@pytest.mark.parametrize("door", ["smtp", "http", "cli"])
def test_a_latin1_header_goes_with_8bitmime_and_no_smtputf8_to_a_next_hop_that_offers_it_at_every_door(
    doors_node: PigeonProcess, hops: dict[str, ScriptedSink], door: str, tmp_path: Path
) -> None:
    recipient = f"latin1-{door}@u8.test"
    _through_bytes(doors_node, door, recipient, LATIN1_SUBJECT, tmp_path)
    received = wait_until(lambda: [r for r in hops["u8"].received if r.recipients == [recipient]])
    assert "BODY=8BITMIME" in received[0].mail_options
    assert "SMTPUTF8" not in received[0].mail_options
    assert b"Subject: caf\xe9 M" in received[0].data


def test_a_latin1_header_from_a_client_that_asked_for_smtputf8_goes_on_with_it(
    doors_node: PigeonProcess, hops: dict[str, ScriptedSink]
) -> None:
    # The client's word, passed on as any SMTPUTF8 it sends (README): Pigeon does not second-guess it.
    recipient = "latin1-smtp-smtputf8@u8.test"
    _through(doors_node, "smtp-smtputf8", recipient, LATIN1_SUBJECT)
    received = wait_until(lambda: [r for r in hops["u8"].received if r.recipients == [recipient]])
    assert "SMTPUTF8" in received[0].mail_options


@pytest.mark.parametrize("door", ["smtp", "http", "cli"])
def test_a_latin1_header_to_a_next_hop_with_neither_extension_bounces_for_want_of_8bitmime(
    doors_node: PigeonProcess, hops: dict[str, ScriptedSink], door: str, tmp_path: Path
) -> None:
    recipient = f"latin1-{door}@none.test"
    _through_bytes(doors_node, door, recipient, LATIN1_SUBJECT, tmp_path)
    bounce = wait_until(lambda: [b for b in doors_node.records("Bounce") if b["recipient"] == recipient])[0]
    assert (bounce["response"]["code"], bounce["response"]["enhanced"]) == (554, "5.6.3")
    assert [r for r in hops["none"].received if r.recipients == [recipient]] == []


# A next hop without SMTPUTF8 refuses only the recipients whose address needs it: RCPT is per
# recipient, so the ASCII recipients of the same message go in a transaction without SMTPUTF8.

MESSAGE = b"From: <s@sender.test>\r\nTo: <bob@d15.test>\r\nSubject: plain\r\n\r\nHello.\r\n"
BOB, JOSE = "bob@d15.test", "josé@d15.test"


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
