"""An EHLO or HELO name over 255 octets is refused (it would make our greeting's reply line
and the Received field over-long), and the Received field Pigeon writes keeps every line
under 998 octets whatever the client named."""

from __future__ import annotations

import time

import pytest

from pigeon.intake import Arrival, received_field
from pigeon.message import Envelope, Recipient, SpoolId
from pigeon.smtp.events import Ehlo, Helo
from tests.unit.smtp.harness import Peer


def _received(helo: str, tls: str | None = None, recipient: str = "user@example.net") -> bytes:
    arrival = Arrival("smtp", "s1", "192.0.2.1:25", "192.0.2.1", helo, "ESMTPS", tls=tls)
    envelope = Envelope("a@example.org", [Recipient(recipient)])
    return received_field("mx.test", int(time.time()), envelope, arrival, SpoolId(1))


@pytest.mark.parametrize(
    ("helo", "tls"),
    [
        ("a" * 993, None),  # as an older Pigeon or another door might have taken
        ("client.test", "TLSv1.3 with cipher " + "X" * 1500 + " (256/256 bits)"),
        ("client.test " * 200, "TLSv1.3 " * 300),
        ("\u00e9" * 400, None),  # not ASCII, and no name IDNA can encode
    ],
)
def test_our_received_field_keeps_every_line_under_998_octets_whatever_the_client_named(
    helo: str, tls: str | None
) -> None:
    field = _received(helo, tls)
    assert field.endswith(b"\r\n") and field.startswith(b"Received: from")
    lines = field[:-2].split(b"\r\n")
    assert max(len(line) for line in lines) <= 998, [len(line) for line in lines]
    assert all(line[:1] == b"\t" for line in lines[1:])  # continuation lines: one field
    assert field.isascii()


def test_a_received_field_of_usual_length_is_written_as_before() -> None:
    field = _received("client.test", "TLSv1.3 with cipher TLS_AES_256_GCM_SHA384 (256/256 bits)")
    assert field.startswith(b"Received: from client.test ([192.0.2.1])\r\n\t(using TLSv1.3 with cipher")
    assert b"\tfor <user@example.net>; " in field
    assert _received("b\u00fccher.example").startswith(b"Received: from xn--bcher-kva.example ([192.0.2.1])")


@pytest.mark.parametrize("verb", ["EHLO", "HELO"])
def test_a_greeting_name_over_255_octets_is_refused_with_501_5_5_2_and_255_is_taken(verb: str) -> None:
    peer = Peer.start()
    reply = peer.send(f"{verb} {'a' * 252}.tld\r\n")
    assert reply == f"501 5.5.2 {verb} name is longer than 255 octets; no domain or address literal is that long\r\n"
    # 255 octets in UTF-8, not characters: 128 two-octet ones are 256.
    assert peer.send(verb + " " + "\u00e9" * 128 + "\r\n").startswith("501 ")
    assert peer.send(f"{verb} {'a' * 251}.tld\r\n").startswith("250")
    assert [event.domain for event in peer.of_type(Ehlo if verb == "EHLO" else Helo)] == ["a" * 251 + ".tld"]
    # The same reply once a greeting was taken (it carried its enhanced code only then).
    assert peer.send(f"{verb} {'a' * 256}\r\n") == reply


def _received_from(helo: str) -> bytes:
    """The first line of our Received field for a client that named itself `helo`."""
    arrival = Arrival("smtp", "s1", "192.0.2.1:25", "192.0.2.1", helo, "ESMTP")
    field = received_field(
        "mx.test", int(time.time()), Envelope("a@example.org", [Recipient("b@example.net")]), arrival, SpoolId(1)
    )
    return field.split(b"\r\n", 1)[0]


@pytest.mark.parametrize("helo", ["[999.1.1.1]", "[1.2.3]", "[IPv6:1.2.3.4]", "[::1]", "[IPv6:zz::1]", "[a-b]"])
def test_an_ehlo_name_that_looks_like_a_literal_but_is_none_goes_into_the_comment(helo: str) -> None:
    assert _received_from(helo) == f"Received: from [192.0.2.1] (helo={helo})".encode()


@pytest.mark.parametrize("helo", ["[192.0.2.7]", "[192.000.2.7]", "[IPv6:2001:db8::7]", "[ipv6:::1]"])
def test_an_ehlo_address_literal_is_written_as_the_client_named_itself(helo: str) -> None:
    assert _received_from(helo) == f"Received: from {helo} ([192.0.2.1])".encode()
