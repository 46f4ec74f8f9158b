"""A transaction command out of sequence (MAIL, RCPT, DATA, BDAT) gets its 503 whatever its
argument, as from Postfix (RFC 5321 4.3.2): a malformed one is not answered 501 or 553 first,
which would have the client fix its syntax only to be refused for the order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.smtp.events import Rejected

from .harness import Peer, open_transaction

_NEED_HELO = "503 5.5.1 Send EHLO or HELO first\r\n"
_NEED_MAIL = "503 5.5.1 Send MAIL FROM first\r\n"
_NESTED_MAIL = "503 5.5.1 Sender already given: send RSET to start a new transaction\r\n"

_MALFORMED = [
    b"RCPT TO:<bad@@x>",
    b"RCPT TO:<a\x01b@example.net>",
    b"RCPT TO:<b@example.net> NOTIFY=BOGUS",
    b"RCPT TO:b@example.net",
    b"RCPT TO:<\xff@example.net>",
    b"MAIL FROM:<a\x01b@example.org>",
    b"MAIL FROM:<bad@@x>",
    b"MAIL FROM:<a@example.org> BODY=9BIT",
    b"MAIL TO:<a@example.org>",
    b"DATA now",
]


@pytest.mark.parametrize("line", _MALFORMED)
def test_a_malformed_transaction_command_before_the_greeting_gets_503_send_ehlo_first(line: bytes) -> None:
    peer = Peer.start()
    assert peer.send(line + b"\r\n") == _NEED_HELO
    [refusal] = peer.of_type(Rejected)
    assert (refusal.command, refusal.reply.code) == (line[:4].decode(), 503)


@pytest.mark.parametrize("line", [line for line in _MALFORMED if not line.startswith(b"MAIL")])
def test_a_malformed_rcpt_or_data_without_mail_gets_503_send_mail_first(line: bytes) -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    assert peer.send(line + b"\r\n") == _NEED_MAIL


@pytest.mark.parametrize("line", [line for line in _MALFORMED if line.startswith(b"MAIL")])
def test_a_malformed_mail_inside_a_transaction_gets_503_sender_already_given(line: bytes) -> None:
    peer = Peer.start()
    open_transaction(peer)
    assert peer.send(line + b"\r\n") == _NESTED_MAIL


def test_a_malformed_rcpt_refused_for_its_order_still_names_the_recipient_given() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    peer.send("RCPT TO:<bad@@x>\r\n")
    assert [(e.command, e.reply.code, e.recipient) for e in peer.of_type(Rejected)] == [("RCPT", 503, "bad@@x")]


def test_a_malformed_bdat_without_a_transaction_gets_503_and_still_ends_the_session() -> None:
    # Without a size the chunk's end cannot be found: the framing is lost whatever the reply.
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    reply = peer.send("BDAT many LAST\r\n")
    assert reply.startswith(_NEED_MAIL + "421 4.")
    assert peer.closing() is not None


def test_in_sequence_the_malformed_command_still_gets_its_syntax_reply() -> None:
    peer = Peer.start()
    open_transaction(peer)
    assert peer.send("RCPT TO:<bad@@x>\r\n") == "501 5.1.3 Bad recipient address syntax\r\n"
    assert peer.send("RCPT TO:<a\x01b@example.net>\r\n").startswith("553 5.1.3 Address contains U+0001")


@settings(max_examples=200, deadline=None)
@given(
    verb=st.sampled_from(["MAIL", "RCPT", "DATA", "mail", "Rcpt"]),
    argument=st.binary(max_size=60).filter(lambda b: b"\n" not in b and b"\r" not in b and b"\0" not in b),
)
def test_before_the_greeting_a_transaction_command_gets_503_whatever_its_argument(verb: str, argument: bytes) -> None:
    peer = Peer.start()
    line = verb.encode() + (b" " + argument if argument else b"")
    assert peer.send(line + b"\r\n") == _NEED_HELO
