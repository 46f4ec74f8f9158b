"""A quoted local part whose content is a dot-string names the same mailbox as that dot-string
(RFC 5321 4.1.2: `"dd"@example.net` is `dd@example.net`): one delivery for the mailbox named
both ways, at every door, and the bare form on the wire, as 4.1.2 says a sender SHOULD use.
A quoted string that needs its quotes (`"first last"`) keeps them."""

from __future__ import annotations

import smtplib
import time
from collections.abc import Iterator

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import WireSink, delivery_config

TOKEN = "quoted-token-0123456789"


@pytest.fixture
def sink() -> Iterator[WireSink]:
    with WireSink() as running:
        yield running


@pytest.fixture
def pigeon(tmp_path_factory: pytest.TempPathFactory, sink: WireSink) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("quoted") / "node"
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    with PigeonProcess(root, http=http, **delivery_config(sink.endpoint)) as node:
        yield node


def test_a_mailbox_named_bare_and_quoted_in_one_smtp_transaction_gets_one_copy(
    pigeon: PigeonProcess, sink: WireSink
) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo()
        client.mail("s@sender.test")
        assert client.rcpt("dd@example.net")[0] == 250
        assert client.rcpt('"dd"@example.net')[0] == 250  # README: a repeated RCPT gets its 250
        assert client.rcpt('"d\\d"@example.net')[0] == 250  # a quoted pair is its character
        assert client.data(b"From: a@example.org\r\nSubject: twice\r\n\r\nhello\r\n")[0] == 250
    (received,) = sink.wait_for(1)
    assert received.recipients == ["dd@example.net"]
    time.sleep(1)  # a second copy would have come by now
    assert len(sink.wait_for(1)) == 1
    assert pigeon.records("Bounce") == []


def test_a_mailbox_named_bare_and_quoted_in_one_injection_is_refused_as_a_duplicate(
    pigeon: PigeonProcess, sink: WireSink
) -> None:
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "dd@example.net"}, {"email": '"dd"@example.net'}],
        "content": "From: a@example.org\nSubject: x\n\nhi\n",
    }
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer
    assert (answer["accepted"], answer["failed"]) == (1, 1), answer
    assert answer["recipients"][1] == {
        "email": '"dd"@example.net',
        "error": "550 5.1.0 duplicate of recipient 0 of the request",
        "duplicate_of": 0,
    }
    (received,) = sink.wait_for(1)
    assert received.recipients == ["dd@example.net"]


def test_a_quoted_local_part_goes_on_the_wire_bare_when_it_can_and_quoted_when_it_must(
    pigeon: PigeonProcess, sink: WireSink
) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        refused = client.sendmail('"s.s"@sender.test', ['"dd"@example.net', '"first last"@example.net'], b"\r\nhi\r\n")
        assert refused == {}
    (received,) = sink.wait_for(1)
    assert received.sender == "s.s@sender.test"
    assert sorted(received.recipients) == ['"first last"@example.net', "dd@example.net"]
    # The log keeps each address as the client wrote it, as it keeps a U-label domain.
    delivered = sorted(record["recipient"] for record in pigeon.wait_records("Delivery", 2))
    assert delivered == ['"dd"@example.net', '"first last"@example.net']
