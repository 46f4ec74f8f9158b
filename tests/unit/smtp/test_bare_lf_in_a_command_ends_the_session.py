"""A command line ended by a bare LF gets one 421 naming it and ends the session: nothing after
the bare LF is run as a command, however the bytes are split, since a proxy that frames commands
by CRLF would read it as the rest of the same line. Inside DATA and BDAT nothing changes (the
content checks refuse a bare LF there, or normalise it)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.smtp.events import Closing, MailFrom, RcptTo, Rejected

from .harness import QUEUED, Peer, lines, open_data, open_transaction

BARE_LF = (
    "421 4.5.2 mx.test Error: bare <LF> received; command lines must end with <CR><LF> (RFC 5321 2.3.8), "
    "closing connection"
)
OK = "250 2.0.0 Ok"


def _greeted() -> Peer:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    return peer


def test_noop_bare_lf_noop_gets_one_421_and_the_second_noop_is_not_run() -> None:
    peer = _greeted()
    assert peer.send("NOOP\nNOOP\r\n") == BARE_LF + "\r\n"
    assert peer.closing() == Closing(peer.of_type(Rejected)[0].reply)
    assert peer.send("NOOP\r\n") == ""  # closed: nothing more is read


def test_a_recipient_after_a_bare_lf_is_never_taken() -> None:
    peer = _greeted()
    out = peer.send("MAIL FROM:<s@x.test>\r\nRCPT TO:<a@r.test>\nRCPT TO:<b@r.test>\r\n")
    assert lines(out) == ["250 2.1.0 Sender ok", BARE_LF]
    assert peer.of_type(RcptTo) == []
    assert isinstance(peer.closing(), Closing)


def test_an_empty_line_of_a_bare_lf_ends_the_session_too() -> None:
    peer = _greeted()
    assert peer.send("\nNOOP\r\n") == BARE_LF + "\r\n"


def test_an_overlong_line_ended_by_a_bare_lf_ends_the_session() -> None:
    peer = _greeted()
    assert peer.send("NOOP " + "x" * 3000) == ""
    assert peer.send("\nNOOP\r\n") == BARE_LF + "\r\n"


def test_an_overlong_line_whose_crlf_is_split_is_refused_for_its_length_only() -> None:
    peer = _greeted()
    assert peer.send("NOOP " + "x" * 3000 + "\r") == ""
    assert lines(peer.send("\nNOOP\r\n")) == ["500 5.5.2 Line too long (RFC 5321 4.5.3.1.4)", OK]
    assert peer.closing() is None


def test_bare_lf_inside_data_is_refused_as_content_and_the_session_goes_on() -> None:
    peer = Peer.start()
    open_data(peer)
    out = peer.send("Subject: x\n\nbody\r\n.\r\nNOOP\r\n")
    assert lines(out)[0].startswith("554 5.6.0 Message contains a bare <LF>")
    assert lines(out)[1] == OK and peer.closing() is None


def test_bare_lf_inside_a_bdat_chunk_is_content_not_a_command_line() -> None:
    peer = Peer.start()
    open_transaction(peer)
    chunk = b"Subject: x\r\n\r\nNOOP\nbody\r\n"
    out = peer.send(b"BDAT %d LAST\r\n" % len(chunk) + chunk + b"NOOP\r\n")
    assert lines(out)[0].startswith("554 5.6.0 Message contains a bare <LF>")
    assert lines(out)[1] == OK and peer.closing() is None


def test_a_message_with_crlf_only_is_still_taken() -> None:
    peer = Peer.start()
    open_data(peer)
    assert peer.send("Subject: x\r\n\r\nbody\r\n.\r\n") == QUEUED


COMMANDS = ["NOOP", "RSET", "MAIL FROM:<s@x.test>", "RCPT TO:<a@r.test>", "HELP", "VRFY x"]


@settings(max_examples=200, deadline=None)
@given(
    before=st.lists(st.sampled_from(COMMANDS), max_size=4),
    bare=st.sampled_from([*COMMANDS, ""]),
    after=st.lists(st.sampled_from([*COMMANDS, "MAIL FROM:<evil@x.test>", "RCPT TO:<victim@r.test>"]), max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
def test_nothing_after_a_bare_lf_is_run_however_the_bytes_are_split(
    before: list[str], bare: str, after: list[str], cuts: list[int]
) -> None:
    data = "".join(f"{c}\r\n" for c in before) + bare + "\n" + "".join(f"{c}\r\n" for c in after)
    raw = data.encode()
    points = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    peer = _greeted()
    out = peer.send_pieces([raw[a:b] for a, b in itertools.pairwise(points)])
    replies = [line for line in lines(out) if line[3:4] == " "]  # final lines: one a reply
    # One reply for each command before the bare LF (a pipelined group: none closes the session
    # here), then the 421, and nothing after it.
    assert len(replies) == len(before) + 1
    assert replies[-1] == BARE_LF
    assert not any(r.startswith("421") for r in replies[:-1])
    assert isinstance(peer.closing(), Closing)
    assert all(m.sender != "evil@x.test" for m in peer.of_type(MailFrom))
    assert all(r.recipient != "victim@r.test" for r in peer.of_type(RcptTo))
    assert sum(1 for e in peer.of_type(Rejected) if e.reply.code == 421) == 1
