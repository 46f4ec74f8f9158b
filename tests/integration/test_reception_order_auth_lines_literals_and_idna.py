"""SMTP reception over a real socket (and HTTP injection where an address is concerned):
a transaction command out of sequence is answered 503 whatever its argument; an AUTH line
of up to 12,288 octets logs in (500 5.5.6 beyond); an address literal written two ways is one
mailbox, and one with leading zeros is taken; an EHLO name that looks like a literal but is
none goes into the Received field's comment; a domain that is no IDNA2008 name is refused
at every door with the same text."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from pigeon.listener.passwords import set_password
from pigeon.smtp.address import U_LABEL_TEXT
from tests.support.process import PigeonProcess

TOKEN = "reception-token-0123456789"
PASSWORD = "p" * 9000  # its PLAIN response is a line of some 12,000 octets


@pytest.fixture(scope="module")
def pigeon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("reception")
    users = root / "users"
    set_password(users, "alice", PASSWORD)
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    with PigeonProcess(root / "node", http=http, smtp=smtp) as node:
        yield node


def _smtp(pigeon: PigeonProcess, *lines: str | bytes, ehlo: str | None = "client.test") -> list[str]:
    """Each line's reply (its last line), over a real socket; QUIT at the end."""
    replies: list[str] = []
    with socket.create_connection(("127.0.0.1", pigeon.smtp_port), timeout=10) as sock:
        stream = sock.makefile("rb")
        stream.readline()  # greeting
        for line in ((f"EHLO {ehlo}",) if ehlo else ()) + (*lines, "QUIT"):
            sock.sendall((line.encode() if isinstance(line, str) else line) + b"\r\n")
            reply = stream.readline()
            while reply[3:4] == b"-":
                reply = stream.readline()
            replies.append(reply.decode().rstrip("\r\n"))
    return replies[(1 if ehlo else 0) : -1]


def _inject(pigeon: PigeonProcess, *recipients: str) -> tuple[int, Any]:
    request: dict[str, Any] = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": r} for r in recipients],
        "content": "From: a@example.org\nSubject: x\n\nhi\n",
    }
    return pigeon.http_post("/api/v1/inject", request, TOKEN)


def _new_messages(pigeon: PigeonProcess, before: set[str]) -> list[dict[str, Any]]:
    return [m for m in pigeon.spool_messages() if m["id"] not in before]


def test_a_malformed_transaction_command_out_of_sequence_gets_503(pigeon: PigeonProcess) -> None:
    assert _smtp(pigeon, b"RCPT TO:<a\x01b@x>", "RCPT TO:<bad@@x>", ehlo=None) == [
        "503 5.5.1 Send EHLO or HELO first",
        "503 5.5.1 Send EHLO or HELO first",
    ]
    replies = _smtp(pigeon, "RCPT TO:<bad@@x>", "RCPT TO:<b@example.net> NOTIFY=BOGUS", "DATA now")
    assert replies == ["503 5.5.1 Send MAIL FROM first"] * 3


def test_an_auth_plain_line_of_12000_octets_logs_in_and_a_longer_one_gets_500_5_5_6(pigeon: PigeonProcess) -> None:
    response = base64.b64encode(f"\0alice\0{PASSWORD}".encode()).decode()
    assert 12_000 < len("AUTH PLAIN " + response) <= 12_288
    assert _smtp(pigeon, "AUTH PLAIN " + response) == ["235 2.7.0 Authentication successful"]
    assert _smtp(pigeon, "AUTH PLAIN", response) == ["334 ", "235 2.7.0 Authentication successful"]
    too_long = "AUTH PLAIN " + "A" * 12_300
    assert _smtp(pigeon, too_long, "NOOP") == [
        "500 5.5.6 Authentication Exchange line is too long (RFC 4954 4)",
        "250 2.0.0 Ok",
    ]


def test_an_address_literal_written_two_ways_is_one_recipient_and_leading_zeros_are_taken(
    pigeon: PigeonProcess,
) -> None:
    before = {m["id"] for m in pigeon.spool_messages()}
    replies = _smtp(
        pigeon,
        "MAIL FROM:<a@example.org>",
        "RCPT TO:<u@[IPv6:::1]>",
        "RCPT TO:<u@[IPv6:0::1]>",
        "RCPT TO:<u@[127.000.0.1]>",
        "RCPT TO:<u@[127.0.0.1]>",
        "DATA",
        "From: a@example.org\r\nSubject: literals\r\n\r\nhi\r\n.",
    )
    assert all(reply.startswith(("250 ", "354 ")) for reply in replies), replies
    new = _new_messages(pigeon, before)  # (one per queue: per domain)
    recipients = sorted(r for m in new for r in m["recipients"])
    assert recipients == ["u@[127.000.0.1]", "u@[IPv6:::1]"]  # each host once, as first given
    assert sorted(m["queue"] for m in new) == ["[127.0.0.1]", "[ipv6:::1]"]
    status, answer = _inject(pigeon, "v@[IPv6:::1]", "v@[IPv6:0:0::1]", "v@[010.0.0.1]")
    assert status == 200 and answer["accepted"] == 2, answer


def test_an_ehlo_name_that_is_no_address_literal_goes_into_the_received_comment(pigeon: PigeonProcess) -> None:
    before = {m["id"] for m in pigeon.spool_messages()}
    replies = _smtp(
        pigeon,
        "MAIL FROM:<a@example.org>",
        "RCPT TO:<helo@example.net>",
        "DATA",
        "From: a@example.org\r\nSubject: helo\r\n\r\nhi\r\n.",
        ehlo="[999.1.1.1]",
    )
    assert replies[-1].startswith("250 "), replies
    [message] = _new_messages(pigeon, before)
    assert message["data"].startswith(b"Received: from [127.0.0.1] (helo=[999.1.1.1])\r\n")


@pytest.mark.parametrize(
    ("domain", "text"),
    [("\u2163.example", U_LABEL_TEXT), ("\uff21.example", U_LABEL_TEXT)],
)
def test_a_domain_that_is_no_idna2008_name_is_refused_over_smtp_and_http_alike(
    pigeon: PigeonProcess, domain: str, text: str
) -> None:
    replies = _smtp(pigeon, "MAIL FROM:<a@example.org> SMTPUTF8", f"RCPT TO:<u@{domain}>")
    assert replies[1] == f"553 5.1.3 {text}"
    assert _inject(pigeon, f"u@{domain}") == (400, {"error": text, "field": "$.recipients[0].email"})
    good = _smtp(pigeon, "MAIL FROM:<a@example.org> SMTPUTF8", "RCPT TO:<u@b\u00fccher.example>")
    assert good[1] == "250 2.1.5 Recipient ok"
