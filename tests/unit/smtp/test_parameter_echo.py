"""A refused MAIL/RCPT parameter is named in the reply as printable ASCII, never as sent.

RFC 5321 replies are ASCII text on one line. A value echoed as the client sent it could carry
terminal escape sequences, 8-bit octets or a line break (the parser is also used on text that
never crossed the wire's framing), and would break the reply or the reader's screen.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pigeon.smtp.errors import SmtpProtocolError
from pigeon.smtp.extensions import Offer, parse_mail_parameters, parse_rcpt_parameters

from .harness import Peer


@pytest.mark.parametrize(
    ("command", "reply"),
    [
        ("MAIL FROM:<a@example.org> BODY=\x1b[2J", r"555 5.5.4 BODY=\x1b[2J is not supported"),
        ("MAIL FROM:<a@example.org> BODY=café", r"555 5.5.4 BODY=caf\xe9 is not supported"),
        ("MAIL FROM:<a@example.org> BÉ=1", r"501 5.5.4 Malformed parameter 'B\xc9=1'"),
    ],
)
def test_a_refused_mail_parameter_is_named_in_printable_ascii(command: str, reply: str) -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    answer = peer.send(command + "\r\n")
    assert answer.startswith(reply), answer
    line = answer.removesuffix("\r\n")
    assert line.isascii() and line.isprintable(), answer


def test_a_refused_notify_value_is_named_in_printable_ascii() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    answer = peer.send("RCPT TO:<b@example.net> NOTIFY=\x9b31m\r\n")
    assert answer.startswith(r"501 5.5.4 NOTIFY=\x9b31m has an unknown value"), answer


def test_a_very_long_refused_value_is_cut_in_the_reply() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    answer = peer.send("MAIL FROM:<a@example.org> BODY=" + "X" * 900 + "\r\n")
    assert answer.startswith("555 5.5.4 BODY=XXX") and "..." in answer and len(answer) < 200, answer


def _reply_lines(parse: Callable[[str, Offer], object], text: str) -> tuple[str, ...]:
    """The lines of the protocol error `parse` gives for `text` (none if it takes it)."""
    try:
        parse(text, Offer(max_message_size=1000))
    except SmtpProtocolError as error:
        return error.reply.lines
    return ()


@given(st.text(max_size=40))
def test_any_parameter_value_gives_a_protocol_error_or_parameters_never_a_crash(value: str) -> None:
    for text in (f"BODY={value}", f"RET={value}", f"ENVID={value}", f"AUTH={value}"):
        lines = _reply_lines(parse_mail_parameters, text)
        assert all(line.isascii() and line.isprintable() for line in lines), lines
    for text in (f"NOTIFY={value}", f"ORCPT={value}"):
        lines = _reply_lines(parse_rcpt_parameters, text)
        assert all(line.isascii() and line.isprintable() for line in lines), lines
