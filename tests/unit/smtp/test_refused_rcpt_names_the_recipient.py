"""Every RCPT the session refuses by itself names the address it was given, so that the log
record of the refusal says whom it refused: past the recipient limit (452), out of sequence
(503), or malformed (501, 553, even bytes that are not UTF-8)."""

from __future__ import annotations

import pytest

from pigeon.smtp.events import Rejected

from .harness import Peer, config, open_transaction


def _refusals(peer: Peer) -> list[tuple[str, int, str | None]]:
    return [(e.command, e.reply.code, e.recipient) for e in peer.of_type(Rejected)]


def test_a_recipient_past_the_limit_is_named_in_its_452() -> None:
    peer = Peer.start(config(max_recipients=1))
    open_transaction(peer)
    assert peer.send("RCPT TO:<carol@example.net>\r\n").startswith("452 4.5.3 ")
    assert _refusals(peer) == [("RCPT", 452, "carol@example.net")]


def test_a_recipient_before_mail_is_named_in_its_503() -> None:
    peer = Peer.start()
    assert peer.send("RCPT TO:<early@example.net>\r\n").startswith("503 ")  # before EHLO
    peer.send("EHLO client.test\r\n")
    assert peer.send("RCPT TO:<bob@example.net> NOTIFY=NEVER\r\n") == "503 5.5.1 Send MAIL FROM first\r\n"
    assert _refusals(peer) == [("RCPT", 503, "early@example.net"), ("RCPT", 503, "bob@example.net")]


@pytest.mark.parametrize(
    ("line", "code", "named"),
    [
        (b"RCPT TO:<bob@example..net>", 501, "bob@example..net"),
        (b"RCPT TO:bob@example.net NOTIFY=NEVER", 501, "bob@example.net"),
        (b"rcpt to: <bob@example.net", 501, "<bob@example.net"),
        (b"RCPT FROM:<bob@example.net>", 501, "FROM:<bob@example.net>"),
        (b'RCPT TO:<"odd>name"@example.net> SIZE=1', 555, '"odd>name"@example.net'),
        (b"RCPT TO:<b\x1b[2Jb@example.net>", 553, "b\x1b[2Jb@example.net"),
        (b"RCPT TO:<caf\xe9@example.net>", 500, "caf\udce9@example.net"),
        (b"RCPT TO:<>", 501, ""),
        (b"RCPT", 501, ""),
        ("RCPT TO:<jürgen@example.net>".encode(), 553, "jürgen@example.net"),
    ],
)
def test_a_malformed_recipient_is_named_as_given(line: bytes, code: int, named: str) -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    assert peer.send_raw(line + b"\r\n")[:3] == str(code).encode()
    assert _refusals(peer) == [("RCPT", code, named)]


def test_other_refusals_name_no_recipient() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<bad\r\nFROB <x@example.net>\r\nDATA\r\n")
    assert [e.recipient for e in peer.of_type(Rejected)] == [None, None, None]
