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
