"""Every refusal the session reports (`Rejected`) names the command it answered, as the client
sent it: the 421 that follows the error past `max_errors` names the command of that error,
whichever way it was refused; a verb that is not ASCII keeps its bytes (those that are not
UTF-8 as surrogate escapes, as a refused RCPT's address); and a command line refused for a bare
CR or a NUL is told which of the two it held."""

from __future__ import annotations

import pytest

from pigeon.smtp import replies
from pigeon.smtp.events import Rejected

from .harness import Peer, config, open_transaction


def _refusals(peer: Peer) -> list[tuple[str, int]]:
    return [(e.command, e.reply.code) for e in peer.of_type(Rejected)]


@pytest.mark.parametrize(
    ("lines", "last"),
    [
        (b"FOO\r\n", "FOO"),  # unknown
        (b"MAIL FROM:<bad\r\n", "MAIL"),  # malformed
        (b"DATA\r\n", "DATA"),  # out of sequence
        (b"NOOP\0\r\n", "NOOP\0"),  # a NUL in the line
        (b"STARTTLS\r\n", "STARTTLS"),  # not offered
    ],
)
def test_the_421_past_max_errors_names_the_command_that_went_over(lines: bytes, last: str) -> None:
    peer = Peer.start(config(max_errors=2))
    peer.send("EHLO client.test\r\nBOGUS\r\n")
    out = peer.send_raw(lines)
    assert b"421 4.7.0 mx.test Error: too many errors" in out
    assert _refusals(peer) == [("BOGUS", 500), (last, int(out[:3])), (last, 421)]


@pytest.mark.parametrize(
    ("verb", "refusal"),
    [
        ("MAIL", b"MAIL FROM:<a@example.org>\r\n"),
        ("RCPT", b"RCPT TO:<b@example.net>\r\n"),
        ("DATA", b"DATA\r\n"),
    ],
)
def test_the_421_past_max_errors_names_a_command_the_application_refused(verb: str, refusal: bytes) -> None:
    peer = Peer.start(config(max_errors=1))
    if verb == "DATA":
        open_transaction(peer)
    else:
        peer.send("EHLO client.test\r\n" + ("MAIL FROM:<a@example.org>\r\n" if verb == "RCPT" else ""))
    peer.answer(verb, replies.r(550, "5.7.1", "No"))
    assert peer.send_raw(refusal).startswith(b"550 5.7.1 No\r\n421 4.7.0 ")
    # (The application logs its own 550; the session reports the 421 it added.)
    assert _refusals(peer) == [(verb, 421)]


def test_the_421_past_max_errors_names_bdat_for_a_chunked_message_refused() -> None:
    peer = Peer.start(config(max_errors=1))
    peer.answer("MESSAGE", replies.r(554, "5.7.1", "No"))
    peer.send("EHLO client.test\r\n")
    open_transaction(peer)
    assert peer.send_raw(b"BDAT 4 LAST\r\nhi\r\n").startswith(b"554 5.7.1 No\r\n421 4.7.0 ")
    assert _refusals(peer) == [("BDAT", 421)]


@pytest.mark.parametrize(
    ("line", "verb"),
    [
        (b"\xc3\xa9hlo x", "\xe9HLO"),  # UTF-8: its letters kept as they are (ASCII ones in capitals)
        (b"\xe9hlo x", "\udce9HLO"),  # Latin-1: a byte that is not UTF-8
        ("\u202ehlo x".encode(), "\u202eHLO"),
        (b"x" * 15 + "\u00e9".encode(), "X" * 15 + "\udcc3"),  # cut at 16 octets, mid-character
    ],
)
def test_a_verb_that_is_not_ascii_is_named_as_given(line: bytes, verb: str) -> None:
    peer = Peer.start()
    assert peer.send_raw(line + b"\r\n").startswith(b"500 ")
    assert _refusals(peer) == [(verb, 500)]


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b"NOOP\0", "Command contains a NUL"),
        (b"NO\0OP", "Command contains a NUL"),
        (b"NOOP\rRSET", "Command contains a bare <CR>"),
        (b"\rNOOP", "Command contains a bare <CR>"),
        (b"NOOP\r\0", "Command contains a bare <CR> and a NUL"),
        (b"NOOP\0\r", "Command contains a bare <CR> and a NUL"),
    ],
)
def test_a_command_with_a_bare_cr_or_a_nul_is_told_which(line: bytes, text: str) -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    assert peer.send_raw(line + b"\r\n") == f"501 5.5.2 {text}\r\n".encode()
    assert peer.send("NOOP\r\n") == "250 2.0.0 Ok\r\n"  # the session goes on
