"""An AUTH command line and a SASL response may be 12,288 octets (RFC 4954 4), past the 998 of
every other command: a long password (or token) logs in. A longer one gets RFC 4954's
`500 5.5.6 Authentication Exchange line is too long`, other commands still `500 5.5.2` past
`max_line_length`."""

from __future__ import annotations

import base64

import pytest

from pigeon.smtp.events import AuthCredentials
from pigeon.smtp.server import MAX_AUTH_LINE_LENGTH

from .harness import Peer, config

AUTH_OK = "235 2.7.0 Authentication successful\r\n"
AUTH_TOO_LONG = "500 5.5.6 Authentication Exchange line is too long (RFC 4954 4)\r\n"
LINE_TOO_LONG = "500 5.5.2 Line too long (RFC 5321 4.5.3.1.4)\r\n"


def _ready() -> Peer:
    peer = Peer.start(config(auth_mechanisms=("PLAIN", "LOGIN"), auth_requires_tls=False))
    peer.send("EHLO client.test\r\n")
    return peer


def _plain(password: str) -> str:
    return base64.b64encode(f"\0alice\0{password}".encode()).decode("ascii")


def _password_for(line_octets: int, prefix: str = "") -> str:
    """A password whose PLAIN response, after `prefix`, makes a line of about `line_octets`."""
    return "p" * ((line_octets - len(prefix)) * 3 // 4 - len("\0alice\0"))


def _passwords(peer: Peer) -> list[str]:
    return [event.password for event in peer.of_type(AuthCredentials)]


@pytest.mark.parametrize("pieces", [1, 7], ids=["one write", "in pieces"])
def test_an_auth_plain_command_of_12288_octets_logs_in(pieces: int) -> None:
    password = _password_for(MAX_AUTH_LINE_LENGTH, "AUTH PLAIN ")
    line = f"AUTH PLAIN {_plain(password)}".encode()
    assert 12_000 < len(line) <= MAX_AUTH_LINE_LENGTH
    data = line + b"\r\n"
    size = -(-len(data) // pieces)
    peer = _ready()
    assert peer.send_pieces(data[i : i + size] for i in range(0, len(data), size)) == AUTH_OK
    assert _passwords(peer) == [password]


def test_a_sasl_response_of_12288_octets_logs_in() -> None:
    password = _password_for(MAX_AUTH_LINE_LENGTH)
    peer = _ready()
    assert peer.send("AUTH PLAIN\r\n") == "334 \r\n"
    assert peer.send(_plain(password) + "\r\n") == AUTH_OK
    assert _passwords(peer) == [password]


def test_a_long_auth_login_password_logs_in() -> None:
    password = "q" * 9000
    peer = _ready()
    peer.send("AUTH LOGIN " + base64.b64encode(b"alice").decode() + "\r\n")
    assert peer.send(base64.b64encode(password.encode()).decode() + "\r\n") == AUTH_OK
    assert _passwords(peer) == [password]


def test_an_auth_line_of_exactly_12288_octets_is_taken_and_one_more_is_refused_with_500_5_5_6() -> None:
    peer = _ready()
    assert peer.send("AUTH PLAIN\r\n") == "334 \r\n"
    assert peer.send("A" * MAX_AUTH_LINE_LENGTH + "\r\n").startswith("501 5.5.2 ")  # read, not base64 PLAIN
    assert peer.send("AUTH PLAIN\r\n") == "334 \r\n"
    assert peer.send("A" * (MAX_AUTH_LINE_LENGTH + 1) + "\r\n") == AUTH_TOO_LONG
    assert peer.send("AUTH PLAIN " + "A" * (MAX_AUTH_LINE_LENGTH - 10) + "\r\n") == AUTH_TOO_LONG
    assert peer.send("NOOP\r\n") == "250 2.0.0 Ok\r\n"  # the exchange ended; commands again


@pytest.mark.parametrize("phase", ["command", "response"])
def test_an_auth_line_far_past_the_limit_arriving_in_pieces_gets_one_500_5_5_6(phase: str) -> None:
    peer = _ready()
    if phase == "response":
        assert peer.send("AUTH LOGIN\r\n") == "334 VXNlcm5hbWU6\r\n"
        head = b""
    else:
        head = b"AUTH PLAIN "
    data = head + b"B" * 50_000 + b"\r\nNOOP\r\n"
    reply = peer.send_pieces(data[i : i + 1500] for i in range(0, len(data), 1500))
    assert reply == AUTH_TOO_LONG + "250 2.0.0 Ok\r\n"
    assert peer.session.buffered == 0


def test_other_commands_keep_the_998_octet_limit_and_its_500_5_5_2() -> None:
    peer = _ready()
    assert peer.send("NOOP " + "x" * 2000 + "\r\n") == LINE_TOO_LONG
    assert peer.send("MAIL FROM:<" + "a" * 1100 + "@example.org>\r\n") == LINE_TOO_LONG
    assert peer.send("XAUTH " + "x" * 2000 + "\r\n") == LINE_TOO_LONG
