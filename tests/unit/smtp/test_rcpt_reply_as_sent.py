"""A 552 to RCPT is read as 452 with a note (`rcpt_reply_read`); `rcpt_reply_as_sent` gives
back, from the one-line form a recipient's last reply is kept in, the reply the server sent,
which a DSN's Diagnostic-Code quotes. Any other reply is quoted as it is."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pigeon.smtp.client import ReplyReader, rcpt_reply_as_sent, rcpt_reply_read
from pigeon.smtp.replies import Reply


def _reply(wire: bytes) -> Reply:
    (reply,) = ReplyReader().feed(wire)
    return reply


@pytest.mark.parametrize(
    "wire",
    [
        b"552 5.2.2 Mailbox full\r\n",
        b"552 Mailbox full\r\n",  # no enhanced code
        b"552 5.5.3 Too many recipients\r\n",
        b"552-5.2.2 The mailbox is full.\r\n552 5.2.2 Try later.\r\n",  # several lines, joined
        b"552 5.2.2\r\n",  # no text
    ],
)
def test_a_552_to_rcpt_read_as_452_is_quoted_as_the_server_sent_it(wire: bytes) -> None:
    reply = _reply(wire)
    read = rcpt_reply_read(reply)
    assert read.code == 452 and str(read).endswith("(552 to RCPT read as 452, RFC 5321 4.5.3.1.10)")
    assert rcpt_reply_as_sent(str(read)) == str(reply)


@pytest.mark.parametrize(
    "said",
    [
        "452 4.2.2 mailbox full",
        "452 4.5.3 Too many recipients",
        "451 4.7.1 greylisted (552 to RCPT read as 452, RFC 5321 4.5.3.1.10)",  # not a 452
        "550 5.1.1 user unknown",
        "554 5.4.7 Message expired: last attempt: 452 4.2.2 full (552 to RCPT read as 452, RFC 5321 4.5.3.1.10)",
    ],
)
def test_any_other_reply_is_quoted_as_it_is(said: str) -> None:
    assert rcpt_reply_as_sent(said) == said


@given(
    code=st.integers(200, 599),
    enhanced=st.none() | st.tuples(st.integers(0, 999), st.integers(0, 999)),
    text=st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
)
def test_every_rcpt_reply_is_quoted_as_the_server_sent_it(
    code: int, enhanced: tuple[int, int] | None, text: str
) -> None:
    code_text = "" if enhanced is None else f"{code // 100}.{enhanced[0]}.{enhanced[1]} "
    wire = f"{code} {code_text}{text}\r\n".encode()
    reply = _reply(wire)
    assert rcpt_reply_as_sent(str(rcpt_reply_read(reply))) == str(reply)
