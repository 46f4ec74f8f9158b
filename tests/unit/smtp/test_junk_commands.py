"""Commands that move no mail (NOOP, RSET, VRFY, HELP, a repeated EHLO or HELO, RCPTs far past
the recipient limit) are answered at once and are no error, so neither a timeout nor
`max_errors` ever stops a client that sends only them: `max_junk_commands` does, counted
between messages accepted (Postfix's smtpd_junk_command_limit), with a reply that says so.
A client that sends mail never runs into it, however many messages it sends."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.smtp import replies
from pigeon.smtp.events import Closing, Rejected, TransactionReset

from .harness import QUEUED, Peer, config, open_transaction

OK = "250 2.0.0 Ok\r\n"
RESET_OK = "250 2.0.0 Reset ok\r\n"
TOO_MANY_RECIPIENTS = "452 4.5.3 Too many recipients for this message; send the rest in a new transaction\r\n"
TOO_MANY = "421 4.7.0 mx.test Error: too many commands that move no mail, closing connection\r\n"


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
        open_transaction(peer, ehlo=False)
        assert peer.send("DATA\r\n").startswith("354")
        assert peer.send("Subject: hi\r\n\r\nhello\r\n.\r\n") == QUEUED
    assert peer.send("RSET\r\nNOOP\r\nNOOP\r\n") == RESET_OK + OK + TOO_MANY


def test_junk_inside_a_transaction_counts_and_ending_the_session_ends_the_transaction() -> None:
    peer = _ready(max_junk_commands=1)
    open_transaction(peer, ehlo=False)
    assert peer.send("NOOP\r\n") == OK
    assert peer.send("NOOP\r\n") == TOO_MANY
    assert peer.of_type(TransactionReset) != []
    assert isinstance(peer.events[-1], Closing)


def test_a_message_refused_does_not_start_the_junk_count_over() -> None:
    peer = _ready(max_junk_commands=1)
    peer.answer("MESSAGE", replies.r(554, "5.7.1", "no"))
    assert peer.send("NOOP\r\n") == OK
    open_transaction(peer, ehlo=False)
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


# --- loops that never send a message -------------------------------------------------------
def test_a_greeting_loop_without_mail_ends_at_the_junk_limit() -> None:
    """EHLO resets the transaction as RSET does: EHLO, MAIL, EHLO, MAIL, ... is no way round."""
    peer = _ready(max_junk_commands=3)
    for _ in range(3):
        assert peer.send("MAIL FROM:<a@example.org>\r\n").startswith("250 ")
        assert peer.send("EHLO client.test\r\n").startswith("250-")
    assert peer.send("MAIL FROM:<a@example.org>\r\nHELO client.test\r\n") == "250 2.1.0 Sender ok\r\n" + TOO_MANY
    assert [(e.command, e.reply.code) for e in peer.of_type(Rejected)] == [("HELO", 421)]
    assert isinstance(peer.events[-1], Closing)


def test_the_first_greeting_and_the_one_after_starttls_are_not_junk() -> None:
    peer = Peer.start(config(max_junk_commands=1, tls_available=True))
    peer.established_tls_after_starttls = True
    assert peer.send("EHLO client.test\r\n").startswith("250-")
    assert peer.send("STARTTLS\r\n").startswith("220 ")
    assert peer.send("EHLO client.test\r\n").startswith("250-")  # RFC 3207 4.2: the session starts over
    assert peer.send("NOOP\r\n") == OK
    assert peer.send("EHLO client.test\r\n") == TOO_MANY


def test_a_mail_rset_loop_without_data_ends_at_the_junk_limit() -> None:
    peer = _ready(max_junk_commands=2)
    loop = "MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nRSET\r\n"
    transaction = "250 2.1.0 Sender ok\r\n250 2.1.5 Recipient ok\r\n"
    assert peer.send(loop * 3) == (transaction + RESET_OK) * 2 + transaction + TOO_MANY
    assert peer.of_type(TransactionReset) != []


def test_recipients_past_the_limit_are_junk_once_as_many_again_were_refused() -> None:
    """A pipelining client learns of the limit only after it sent its batch: up to
    max_recipients more cost nothing. Past that, each is junk, and the last is named."""
    peer = _ready(max_recipients=2, max_junk_commands=3)
    peer.send("MAIL FROM:<a@example.org>\r\n")
    rcpts = "".join(f"RCPT TO:<r{i}@example.net>\r\n" for i in range(8))
    assert peer.send(rcpts) == "250 2.1.5 Recipient ok\r\n" * 2 + TOO_MANY_RECIPIENTS * 5 + TOO_MANY
    assert [(e.reply.code, e.recipient) for e in peer.of_type(Rejected)] == [
        *((452, f"r{i}@example.net") for i in range(2, 7)),
        (421, "r7@example.net"),
    ]
    assert isinstance(peer.events[-1], Closing)


def test_a_mailbox_named_again_is_taken_past_max_recipients_and_counts_as_junk() -> None:
    """A repeat adds no recipient (the mailbox gets one copy), so max_recipients does not
    refuse it; it moves no mail either, so it is junk: without that a client could name one
    mailbox for ever."""
    peer = _ready(max_recipients=2, max_junk_commands=3)
    ok = "250 2.1.5 Recipient ok\r\n"
    peer.send("MAIL FROM:<a@example.org>\r\n")
    # The domain in any case and a quoted local part name one mailbox, as the intake's filter has it.
    rcpts = ["a@example.net", "b@example.net", "a@EXAMPLE.net", '"b"@example.net', "c@example.net"]
    assert peer.send("".join(f"RCPT TO:<{r}>\r\n" for r in rcpts)) == ok * 4 + TOO_MANY_RECIPIENTS
    assert peer.send("RCPT TO:<a@example.net>\r\n") == ok  # the third repeat: the third junk command
    assert peer.send("RCPT TO:<a@example.net>\r\n") == TOO_MANY
    assert [(e.reply.code, e.recipient) for e in peer.of_type(Rejected)] == [
        (452, "c@example.net"),
        (421, "a@example.net"),
    ]


def test_every_name_of_our_postmaster_is_one_mailbox_against_max_recipients() -> None:
    peer = _ready(max_recipients=1)
    peer.send("MAIL FROM:<a@example.org>\r\n")
    rcpts = "RCPT TO:<postmaster>\r\nRCPT TO:<PostMaster@MX.test>\r\nRCPT TO:<b@example.net>\r\n"
    assert peer.send(rcpts) == "250 2.1.5 Recipient ok\r\n" * 2 + TOO_MANY_RECIPIENTS


def test_a_repeat_of_a_refused_recipient_is_no_repeat() -> None:
    """Only a mailbox taken is held: one the application refused may be asked about again."""
    peer = Peer.start(config(max_recipients=1))
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    peer.answer("RCPT", replies.r(550, "5.1.1", "No such user"))
    assert peer.send("RCPT TO:<x@example.net>\r\n").startswith("550 5.1.1")
    assert peer.send("RCPT TO:<y@example.net>\r\n") == "250 2.1.5 Recipient ok\r\n"
    assert peer.send("RCPT TO:<x@example.net>\r\n") == TOO_MANY_RECIPIENTS


def test_a_client_that_overshoots_by_up_to_the_limit_loses_nothing_message_after_message() -> None:
    peer = _ready(max_recipients=3, max_junk_commands=1)
    rcpts = "".join(f"RCPT TO:<r{i}@example.net>\r\n" for i in range(6))
    for _ in range(20):
        out = peer.send("MAIL FROM:<a@example.org>\r\n" + rcpts + "DATA\r\n")
        assert out.count("452 4.5.3") == 3 and out.endswith("354 End data with <CR><LF>.<CR><LF>\r\n")
        assert peer.send("Subject: hi\r\n\r\nhello\r\n.\r\n") == QUEUED
    assert peer.closing() is None


# Commands that never carry a message: whatever their order, repeated for ever, they end.
_NO_MAIL = [
    "EHLO client.test",
    "HELO client.test",
    "MAIL FROM:<a@example.org>",
    "RCPT TO:<b@example.net>",
    "RCPT TO:<c@example.net> NOTIFY=NEVER",
    "RCPT TO:<bad",
    "RSET",
    "NOOP",
    "VRFY b",
    "HELP",
    "STARTTLS",
    "AUTH PLAIN",
    "FROB",
]


@settings(max_examples=300, deadline=None)
@given(
    loop=st.lists(st.sampled_from(_NO_MAIL), min_size=1, max_size=8),
    max_recipients=st.integers(1, 4),
    max_junk=st.integers(1, 6),
    max_errors=st.integers(1, 6),
    pipelined=st.booleans(),
)
def test_a_client_that_never_sends_a_message_is_closed_with_421_in_bounded_commands(
    loop: list[str], max_recipients: int, max_junk: int, max_errors: int, pipelined: bool
) -> None:
    """Each transaction ends with junk (RSET, EHLO) or an error, and holds at most twice
    max_recipients RCPTs that are neither: so much and no more before the 421."""
    peer = Peer.start(config(max_recipients=max_recipients, max_junk_commands=max_junk, max_errors=max_errors))
    bound = 2 + (max_junk + 1) * (1 + 2 * max_recipients) + max_junk + max_errors
    commands = itertools.islice(itertools.cycle(loop), bound)
    if pipelined:
        peer.send("".join(f"{command}\r\n" for command in commands))
    else:
        for command in commands:
            peer.send(f"{command}\r\n")
            if peer.closing() is not None:
                break
    closing = peer.closing()
    assert closing is not None and closing.reply is not None and closing.reply.code == 421


@settings(max_examples=200, deadline=None)
@given(
    messages=st.lists(
        st.tuples(
            st.lists(st.sampled_from(["RSET", "NOOP", "VRFY b", "HELP", "EHLO client.test"]), max_size=4),
            st.integers(1, 6),  # recipients sent: up to max_recipients (3) past the limit
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_a_client_that_sends_mail_never_runs_into_the_junk_limit(messages: list[tuple[list[str], int]]) -> None:
    peer = _ready(max_recipients=3, max_junk_commands=4, max_errors=1)
    for junk, recipients in messages:
        rcpts = "".join(f"RCPT TO:<r{i}@example.net>\r\n" for i in range(recipients))
        peer.send("".join(f"{command}\r\n" for command in junk) + "MAIL FROM:<a@example.org>\r\n" + rcpts + "DATA\r\n")
        assert peer.send("Subject: hi\r\n\r\nhello\r\n.\r\n") == QUEUED
    assert peer.closing() is None and len(peer.message_ends()) == len(messages)
