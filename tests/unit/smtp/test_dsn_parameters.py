"""DSN parameters are xtext: decoded exactly, and never a way to inject header fields."""

from __future__ import annotations

import pytest

from .harness import Peer


@pytest.mark.parametrize(
    "command",
    [
        "MAIL FROM:<a@example.org> ENVID=q+0D+0AX-Injected:+201",
        "MAIL FROM:<a@example.org> ENVID=caf+E9",  # +E9 alone is not UTF-8
    ],
)
def test_envid_with_control_characters_or_bad_octets_is_refused(command: str) -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    assert peer.send(command + "\r\n").startswith("501 5.5.4 ENVID ")


def test_orcpt_with_an_encoded_line_break_is_refused() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    reply = peer.send("RCPT TO:<b@example.net> ORCPT=rfc822;b+0D+0AX-Evil:+20y@example.net\r\n")
    assert reply.startswith("501 5.5.4 ORCPT ")


@pytest.mark.parametrize(
    ("orcpt", "reply"),
    [
        ("utf-8;\\x{ZZZ}@y.test", "501 5.5.4 ORCPT utf-8 address is malformed: \\ must start \\x{HEX}"),
        ("utf-8;a\\b@y.test", "501 5.5.4 ORCPT utf-8 address is malformed: \\ must start \\x{HEX}"),
        ("utf-8;\\x{D800}@y.test", "501 5.5.4 ORCPT \\x{D800} is no Unicode character (RFC 6533)"),
        ("utf-8;\\x{110000}@y.test", "501 5.5.4 ORCPT \\x{110000} is no Unicode character (RFC 6533)"),
        ("utf-8;\\x{0}\\x{1B}[31m@y.test", "501 5.5.4 ORCPT must not contain control characters"),
        ("utf-8;a\\x{202E}b@y.test", "501 5.5.4 ORCPT must not contain control characters"),
    ],
)
def test_a_utf8_orcpt_with_a_bad_escape_is_refused_naming_it(orcpt: str, reply: str) -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    assert peer.send(f"RCPT TO:<b@example.net> ORCPT={orcpt}\r\n") == reply + "\r\n"


def test_a_utf8_orcpt_with_escapes_of_characters_is_taken() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    assert peer.send("RCPT TO:<b@example.net> ORCPT=utf-8;ren\\x{E9}\\x{1F600}\\x{2B}@y.test\r\n").startswith("250 ")
