"""Commands that move no mail (NOOP, RSET, VRFY, HELP) are answered at once, so no timeout
ever stops a client that sends only them: `max_junk_commands` does, counted between messages
accepted (Postfix's smtpd_junk_command_limit), with a reply that says so."""

from __future__ import annotations

import pytest

from pigeon.smtp import replies
from pigeon.smtp.events import Closing, Rejected, TransactionReset

from .harness import QUEUED, Peer, config, open_transaction

OK = "250 2.0.0 Ok\r\n"
RESET_OK = "250 2.0.0 Reset ok\r\n"
TOO_MANY = "421 4.7.0 mx.test Error: too many NOOP, RSET, VRFY or HELP commands without mail, closing connection\r\n"


def _ready(**overrides: object) -> Peer:
    peer = Peer.start(config(**overrides))
    peer.send("EHLO client.test\r\n")
    return peer


def test_noop_past_the_junk_limit_ends_the_session_with_a_reply_that_says_why() -> None:
    peer = _ready(max_junk_commands=3)
    for _ in range(3):
        assert peer.send("NOOP\r\n") == OK
    assert peer.send("NOOP\r\n") == TOO_MANY
    assert [(e.command, e.reply.code, e.reply.enhanced) for e in peer.of_type(Rejected)] == [("NOOP", 421, "4.7.0")]
    closing = peer.closing()
    assert closing is not None and closing.reply is not None and closing.reply.code == 421
    assert peer.send("MAIL FROM:<a@example.org>\r\n") == ""  # nothing more is read


@pytest.mark.parametrize(
    ("command", "answer"),
    [
        ("RSET", RESET_OK),
        ("VRFY postmaster", "252 2.5.0 Cannot VRFY user, but will accept message and attempt delivery\r\n"),
        ("HELP", None),
    ],
)
def test_rset_vrfy_and_help_count_as_junk_too(command: str, answer: str | None) -> None:
    peer = _ready(max_junk_commands=2)
    for _ in range(2):
        out = peer.send(command + "\r\n")
        assert out.startswith("2") and (answer is None or out == answer)
    assert peer.send(command + "\r\n") == TOO_MANY


def test_the_junk_count_starts_over_with_each_message_accepted() -> None:
    """A connection pool's keepalive NOOPs between its messages never run out."""
    peer = _ready(max_junk_commands=2)
    for _ in range(5):
        assert peer.send("NOOP\r\nNOOP\r\n") == OK * 2
        open_transaction(peer)
        assert peer.send("DATA\r\n").startswith("354")
        assert peer.send("Subject: hi\r\n\r\nhello\r\n.\r\n") == QUEUED
    assert peer.send("RSET\r\nNOOP\r\nNOOP\r\n") == RESET_OK + OK + TOO_MANY


def test_junk_inside_a_transaction_counts_and_ending_the_session_ends_the_transaction() -> None:
    peer = _ready(max_junk_commands=1)
    open_transaction(peer)
    assert peer.send("NOOP\r\n") == OK
    assert peer.send("NOOP\r\n") == TOO_MANY
    assert peer.of_type(TransactionReset) != []
    assert isinstance(peer.events[-1], Closing)


def test_a_message_refused_does_not_start_the_junk_count_over() -> None:
    peer = _ready(max_junk_commands=1)
    peer.answer("MESSAGE", replies.r(554, "5.7.1", "no"))
    assert peer.send("NOOP\r\n") == OK
    open_transaction(peer)
    assert peer.send("DATA\r\n").startswith("354")
    assert peer.send("Subject: hi\r\n\r\nhello\r\n.\r\n") == "554 5.7.1 no\r\n"
    assert peer.send("NOOP\r\n") == TOO_MANY


def test_junk_limit_zero_means_no_limit() -> None:
    peer = _ready(max_junk_commands=0)
    assert peer.send("NOOP\r\n" * 1000) == OK * 1000
    assert peer.closing() is None


def test_the_default_allows_postfixs_hundred() -> None:
    peer = _ready()
    assert peer.send("NOOP\r\n" * 100) == OK * 100
    assert peer.send("NOOP\r\n") == TOO_MANY
