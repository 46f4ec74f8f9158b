"""A session that began with HELO was offered no service extension, so it may use none of
their parameters, nor BDAT (RFC 5321 4.1.1.1 and 4.1.1.11, RFC 1869 4.5, RFC 3030 3, RFC 6531
3.4). Found from outside: `HELO c` then `MAIL FROM:<a@b.c> SMTPUTF8` got 250, and the message
went on as though SMTPUTF8 had been offered and asked for."""

from __future__ import annotations

import pytest

from pigeon.smtp.events import MailFrom, RcptTo, Rejected

from .harness import Peer

HELO_OK = "250 mx.test greets client.test\r\n"
SENDER_OK = "250 2.1.0 Sender ok\r\n"
RECIPIENT_OK = "250 2.1.5 Recipient ok\r\n"


def refused(key: str) -> str:
    return f"555 5.5.4 {key} is not recognised: the session began with HELO, which offers no extensions\r\n"


@pytest.mark.parametrize(
    ("parameters", "key"),
    [
        ("SMTPUTF8", "SMTPUTF8"),
        ("SIZE=1000", "SIZE"),
        ("BODY=8BITMIME", "BODY"),
        ("BODY=7BIT", "BODY"),
        ("RET=HDRS", "RET"),
        ("ENVID=abc", "ENVID"),
        ("AUTH=<>", "AUTH"),
        ("size=10 BODY=8BITMIME", "SIZE"),  # (the first is named)
    ],
)
def test_mail_parameters_after_helo_are_refused_and_logged(parameters: str, key: str) -> None:
    peer = Peer.start()
    assert peer.send("HELO client.test\r\n") == HELO_OK
    assert peer.send(f"MAIL FROM:<a@example.org> {parameters}\r\n") == refused(key)
    (rejected,) = peer.of_type(Rejected)
    assert (rejected.command, rejected.reply.code, rejected.reply.enhanced) == ("MAIL", 555, "5.5.4")
    assert rejected.sender == "a@example.org"
    assert peer.of_type(MailFrom) == []  # no transaction
    # Without parameters it is taken, as HELO's MAIL is.
    assert peer.send("MAIL FROM:<a@example.org>\r\n") == SENDER_OK


@pytest.mark.parametrize(("parameters", "key"), [("NOTIFY=NEVER", "NOTIFY"), ("ORCPT=rfc822;b@example.net", "ORCPT")])
def test_rcpt_parameters_after_helo_are_refused_and_logged(parameters: str, key: str) -> None:
    peer = Peer.start()
    assert peer.send("HELO client.test\r\nMAIL FROM:<a@example.org>\r\n") == HELO_OK + SENDER_OK
    assert peer.send(f"RCPT TO:<b@example.net> {parameters}\r\n") == refused(key)
    (rejected,) = peer.of_type(Rejected)
    assert (rejected.command, rejected.recipient, rejected.reply.code) == ("RCPT", "b@example.net", 555)
    assert peer.send("RCPT TO:<b@example.net>\r\n") == RECIPIENT_OK
    assert [r.notify for r in peer.of_type(RcptTo)] == [None]


def test_after_ehlo_the_same_parameters_are_taken() -> None:
    peer = Peer.start()
    assert peer.send("EHLO client.test\r\n").startswith("250-mx.test greets client.test\r\n")
    assert peer.send("MAIL FROM:<a@example.org> SMTPUTF8 SIZE=1000 BODY=8BITMIME RET=HDRS ENVID=x\r\n") == SENDER_OK
    assert peer.send("RCPT TO:<b@example.net> NOTIFY=NEVER ORCPT=rfc822;b@example.net\r\n") == RECIPIENT_OK
    assert peer.of_type(Rejected) == []


def test_the_last_greeting_decides_helo_after_ehlo_and_ehlo_after_helo() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nHELO client.test\r\n")
    assert peer.send("MAIL FROM:<a@example.org> SMTPUTF8\r\n") == refused("SMTPUTF8")
    peer.send("EHLO client.test\r\n")
    assert peer.send("MAIL FROM:<a@example.org> SMTPUTF8\r\n") == SENDER_OK


def test_before_any_greeting_mail_with_parameters_is_told_to_greet_first() -> None:
    peer = Peer.start()
    assert peer.send("MAIL FROM:<a@example.org> SIZE=10\r\n") == "503 5.5.1 Send EHLO or HELO first\r\n"


def test_bdat_after_helo_is_refused_its_chunk_dropped_and_data_still_works() -> None:
    peer = Peer.start()
    peer.send("HELO client.test\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\n")
    chunk = b"Subject: x\r\n\r\nRSET\r\n"
    assert peer.send(b"BDAT %d LAST\r\n" % len(chunk) + chunk) == (
        "502 5.5.1 BDAT is not offered: the session began with HELO, which offers no extensions; use DATA\r\n"
    )
    assert peer.content() == b"" and peer.message_ends() == []
    (rejected,) = peer.of_type(Rejected)
    assert (rejected.command, rejected.reply.code) == ("BDAT", 502)
    assert peer.send("DATA\r\n") == "354 End data with <CR><LF>.<CR><LF>\r\n"
    assert peer.send("hi\r\n.\r\n") == "250 2.0.0 Ok: queued as 0000000000000001\r\n"
