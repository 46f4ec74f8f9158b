"""The reply to EHLO or HELO names the client as Pigeon's Received field does: an 8-bit name
as its A-labels (or escaped, where a label has none), never as the raw octets it came in,
which a client that has not even had the chance to ask for SMTPUTF8 may not read as UTF-8."""

from __future__ import annotations

import time

import pytest

from pigeon.intake import Arrival, received_field
from pigeon.message import Envelope, Recipient, SpoolId
from pigeon.smtp.events import Ehlo, Helo
from tests.unit.smtp.harness import HOSTNAME, Peer


def _received_from(helo: str) -> bytes:
    arrival = Arrival("smtp", "s1", "192.0.2.1:25", "192.0.2.1", helo, "ESMTP")
    field = received_field(
        HOSTNAME, int(time.time()), Envelope("a@example.org", [Recipient("b@example.net")]), arrival, SpoolId(1)
    )
    return field.split(b"\r\n", 1)[0]


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("x\u00e9", "xn--x-bga"),
        ("b\u00fccher.example", "xn--bcher-kva.example"),
        ("\u00e9" * 70 + ".example", "\\xe9" * 70 + ".example"),  # a label too long for an A-label
        ("Client.Test", "Client.Test"),  # an ASCII name as it came
    ],
)
@pytest.mark.parametrize("verb", ["EHLO", "HELO"])
def test_the_greeting_reply_names_an_8_bit_client_as_the_received_field_does(verb: str, name: str, shown: str) -> None:
    peer = Peer.start()
    reply = peer.send_raw(f"{verb} {name}\r\n".encode())
    first = reply.split(b"\r\n", 1)[0]
    assert first == f"250{'-' if verb == 'EHLO' else ' '}{HOSTNAME} greets {shown}".encode()
    assert reply.isascii()
    if "\\" in shown:  # no domain: the address literal stands for it, the name in the comment, quoted
        quoted = shown.replace("\\", "\\\\")
        assert _received_from(name) == f"Received: from [192.0.2.1] (helo={quoted})".encode()
    else:
        assert _received_from(name) == f"Received: from {shown} ([192.0.2.1])".encode()
    # The session still knows the name as the client gave it (the policy hooks get that).
    assert [event.domain for event in peer.of_type(Ehlo if verb == "EHLO" else Helo)] == [name]
