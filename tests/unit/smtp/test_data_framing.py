"""DATA through the ServerSession: where a message ends, dot-unstuffing, and the content checks.

SMTP smuggling lives in the gap between what two MTAs take for the end of DATA: only
<CRLF>.<CRLF> may end it here, every other variant is content, and by default a message
with a bare CR or LF is refused.
"""

from __future__ import annotations

import pytest

from pigeon.smtp.events import Closing, DataChunk, MailFrom, MessageEnd, Rejected, TransactionReset
from pigeon.smtp.framing import BareLinefeeds

from .harness import QUEUED, Peer, config, open_data

NORMALISE = BareLinefeeds.NORMALISE
BARE_LF = "554 5.6.0 Message contains a bare <LF>; lines must end with <CR><LF> (RFC 5321 2.3.8)\r\n"
BARE_CR = "554 5.6.0 Message contains a bare <CR>; lines must end with <CR><LF> (RFC 5321 2.3.8)\r\n"
NUL = "554 5.6.0 Message contains a NUL octet (RFC 5322 2.3, RFC 6152 2)\r\n"
LINE_TOO_LONG = "554 5.6.0 Message has a line longer than 998 octets (RFC 5322 2.1.1)\r\n"
OK = "250 2.0.0 Ok\r\n"

HEAD = b"Subject: hello\r\n\r\nbody"
SMUGGLED = b"MAIL FROM:<evil@attacker.test>\r\nRCPT TO:<victim@example.net>\r\nDATA\r\nSubject: smuggled\r\n\r\nx\r\n"

# (fake end, reply by default, what NORMALISE stores in its place). A dot right after a real
# CRLF starts a line and is unstuffed; a dot after a bare CR or LF does not start one.
FAKE_ENDS = [
    pytest.param(b"\n.\n", BARE_LF, b"\r\n.\r\n", id="LF.LF"),
    pytest.param(b"\r.\r", BARE_CR, b"\r\n.\r\n", id="CR.CR"),
    pytest.param(b"\n.\r\n", BARE_LF, b"\r\n.\r\n", id="LF.CRLF"),
    pytest.param(b"\r\n.\n", BARE_LF, b"\r\n\r\n", id="CRLF.LF"),
    pytest.param(b"\r.\r\n", BARE_CR, b"\r\n.\r\n", id="CR.CRLF"),
    pytest.param(b"\r\n.\r", BARE_CR, b"\r\n\r\n", id="CRLF.CR"),
    pytest.param(b"\n.\r", BARE_LF, b"\r\n.\r\n", id="LF.CR"),
    pytest.param(b"\n..\n", BARE_LF, b"\r\n..\r\n", id="LF..LF"),
    pytest.param(b"\r\n.\r\r\n", BARE_CR, b"\r\n\r\n\r\n", id="CRLF.CRCRLF"),
    # A NUL is refused in both modes: normalising only repairs line endings.
    pytest.param(b"\r\n\x00.\r\n", NUL, None, id="CRLF-NUL.CRLF"),
]


def _data_peer(**overrides: object) -> Peer:
    peer = Peer.start(config(**overrides))
    open_data(peer)
    return peer


def _messages(peer: Peer) -> list[MessageEnd]:
    return peer.message_ends()


def _only_crlf_line_endings(data: bytes) -> bool:
    rest = data.replace(b"\r\n", b"")
    return b"\r" not in rest and b"\n" not in rest


# --- smuggling ------------------------------------------------------------------------------
@pytest.mark.parametrize(("fake_end", "refusal", "stored"), FAKE_ENDS)
@pytest.mark.parametrize("mode", list(BareLinefeeds), ids=lambda mode: mode.name)
def test_fake_end_of_data_does_not_end_the_message(
    fake_end: bytes, refusal: str, stored: bytes | None, mode: BareLinefeeds
) -> None:
    peer = _data_peer(bare_linefeeds=mode)
    assert peer.send(HEAD + fake_end + SMUGGLED) == ""
    assert _messages(peer) == []
    assert peer.of_type(Rejected) == []
    assert len(peer.of_type(MailFrom)) == 1  # the smuggled MAIL is content, not a command
    peer.send(b".\r\n")
    assert len(peer.of_type(MailFrom)) == 1


@pytest.mark.parametrize(("fake_end", "refusal", "stored"), FAKE_ENDS)
def test_fake_end_of_data_is_refused_by_default(fake_end: bytes, refusal: str, stored: bytes | None) -> None:
    peer = _data_peer()
    assert peer.send(HEAD + fake_end + SMUGGLED) == ""
    assert peer.send(b".\r\n") == refusal
    assert _messages(peer) == []
    rejected, reset = peer.events[-2:]
    assert isinstance(rejected, Rejected)
    assert (rejected.command, rejected.reply.code, rejected.reply.enhanced) == ("DATA", 554, "5.6.0")
    assert reset == TransactionReset()
    assert peer.send("RCPT TO:<b@example.net>\r\n") == "503 5.5.1 Send MAIL FROM first\r\n"


@pytest.mark.parametrize(("fake_end", "refusal", "stored"), FAKE_ENDS)
def test_fake_end_of_data_is_content_when_normalising(fake_end: bytes, refusal: str, stored: bytes | None) -> None:
    peer = _data_peer(bare_linefeeds=NORMALISE)
    peer.send(HEAD + fake_end + SMUGGLED)
    if stored is None:
        assert peer.send(b".\r\nNOOP\r\n") == refusal + OK
        return
    assert peer.send(b".\r\nNOOP\r\n") == QUEUED + OK
    content = peer.content()
    assert content == HEAD + stored + SMUGGLED
    assert _only_crlf_line_endings(content.replace(b"\x00", b""))
    assert _messages(peer) == [MessageEnd(len(content), chunked=False)]


@pytest.mark.parametrize(("fake_end", "refusal", "stored"), FAKE_ENDS)
@pytest.mark.parametrize("mode", list(BareLinefeeds), ids=lambda mode: mode.name)
def test_fake_end_of_data_gives_the_same_result_at_every_split(
    fake_end: bytes, refusal: str, stored: bytes | None, mode: BareLinefeeds
) -> None:
    stream = HEAD + fake_end + SMUGGLED + b".\r\nNOOP\r\n"
    whole = _data_peer(bare_linefeeds=mode)
    expected_reply = whole.send(stream)
    for cut in range(1, len(stream)):
        peer = _data_peer(bare_linefeeds=mode)
        assert peer.send_pieces([stream[:cut], stream[cut:]]) == expected_reply, f"split at {cut}"
        assert _messages(peer) == _messages(whole), f"split at {cut}"
        if mode is NORMALISE and stored is not None:  # a refused message may emit some lines, depending on the split
            assert peer.content() == whole.content(), f"split at {cut}"
    accepted = mode is NORMALISE and stored is not None
    assert expected_reply == (QUEUED if accepted else refusal) + OK


# --- the real end and dot-unstuffing --------------------------------------------------------
def test_only_crlf_dot_crlf_ends_data() -> None:
    peer = _data_peer()
    assert peer.send(b"line\r\n") == ""
    assert peer.send(b".\r\n") == QUEUED
    assert peer.content() == b"line\r\n"
    assert _messages(peer) == [MessageEnd(6, chunked=False)]


def test_dot_unstuffing_removes_exactly_one_leading_dot() -> None:
    peer = _data_peer()
    peer.send(b"a\r\n..b\r\n...c\r\n..\r\n...\r\nd.\r\ne..f\r\n .g\r\n.\r\n")
    assert peer.content() == b"a\r\n.b\r\n..c\r\n.\r\n..\r\nd.\r\ne..f\r\n .g\r\n"


def test_first_line_starting_with_a_dot_is_unstuffed() -> None:
    peer = _data_peer()
    assert peer.send(b"..first\r\nsecond\r\n.\r\n") == QUEUED
    assert peer.content() == b".first\r\nsecond\r\n"


def test_first_line_that_is_a_stuffed_dot_is_content() -> None:
    peer = _data_peer()
    assert peer.send(b"..\r\n.\r\n") == QUEUED
    assert peer.content() == b".\r\n"


def test_unstuffing_applies_across_receive_calls() -> None:
    peer = _data_peer()
    assert peer.send_pieces([b"a\r\n", b"..b\r\n", b"..", b"c\r\n", b".", b"\r\n"]) == QUEUED
    assert peer.content() == b"a\r\n.b\r\n.c\r\n"


def test_dot_after_a_bare_lf_is_not_unstuffed_when_normalising() -> None:
    peer = _data_peer(bare_linefeeds=NORMALISE)
    assert peer.send(b"a\n..b\r\n.\r\n") == QUEUED
    assert peer.content() == b"a\r\n..b\r\n"


def test_empty_message_is_a_message_of_zero_octets() -> None:
    peer = _data_peer()
    assert peer.send(b".\r\n") == QUEUED
    assert peer.of_type(DataChunk) == []
    assert _messages(peer) == [MessageEnd(0, chunked=False)]


def test_message_of_one_empty_line() -> None:
    peer = _data_peer()
    assert peer.send(b"\r\n.\r\n") == QUEUED
    assert peer.content() == b"\r\n"


def test_commands_inside_data_are_content() -> None:
    peer = _data_peer()
    assert peer.send(b"QUIT\r\nRSET\r\nMAIL FROM:<x@example.org>\r\n") == ""
    assert peer.closing() is None
    assert peer.send(b".\r\n") == QUEUED
    assert peer.content() == b"QUIT\r\nRSET\r\nMAIL FROM:<x@example.org>\r\n"


TERMINATOR_STREAM = b"first\r\n..second\r\nlast\r\n.\r\nNOOP\r\n"
TERMINATOR_CONTENT = b"first\r\n.second\r\nlast\r\n"


def test_terminator_split_at_every_point_gives_the_same_message() -> None:
    stream = TERMINATOR_STREAM
    for cut in range(len(stream) + 1):
        peer = _data_peer()
        assert peer.send_pieces([stream[:cut], stream[cut:]]) == QUEUED + OK, f"split at {cut}"
        assert peer.content() == TERMINATOR_CONTENT, f"split at {cut}"


def test_terminator_split_at_every_pair_of_points_gives_the_same_message() -> None:
    stream = TERMINATOR_STREAM
    for first in range(1, len(stream)):
        for second in range(first, len(stream)):
            peer = _data_peer()
            pieces = [stream[:first], stream[first:second], stream[second:]]
            assert peer.send_pieces(pieces) == QUEUED + OK, f"split at {first}, {second}"
            assert peer.content() == TERMINATOR_CONTENT, f"split at {first}, {second}"


def test_terminator_fed_one_byte_at_a_time() -> None:
    peer = _data_peer()
    out = peer.send_pieces(TERMINATOR_STREAM[i : i + 1] for i in range(len(TERMINATOR_STREAM)))
    assert out == QUEUED + OK
    assert peer.content() == TERMINATOR_CONTENT
    assert len(_messages(peer)) == 1


def test_commands_pipelined_after_the_terminator_are_answered_in_order() -> None:
    peer = _data_peer()
    out = peer.send(b"hello\r\n.\r\nMAIL FROM:<c@example.org>\r\nRCPT TO:<d@example.net>\r\nQUIT\r\n")
    assert out == (QUEUED + "250 2.1.0 Sender ok\r\n250 2.1.5 Recipient ok\r\n221 2.0.0 mx.test closing connection\r\n")
    assert peer.content() == b"hello\r\n"
    kinds = [type(event).__name__ for event in peer.events[4:]]
    assert kinds == ["DataChunk", "MessageEnd", "MailFrom", "RcptTo", "TransactionReset", "Closing"]


def test_second_message_after_a_pipelined_terminator_is_separate() -> None:
    peer = _data_peer()
    out = peer.send(b"one\r\n.\r\nMAIL FROM:<c@example.org>\r\nRCPT TO:<d@example.net>\r\nDATA\r\ntwo\r\n.\r\n")
    assert out.count(QUEUED) == 2
    assert [event.data for event in peer.of_type(DataChunk)] == [b"one\r\n", b"two\r\n"]
    assert _messages(peer) == [MessageEnd(5, chunked=False), MessageEnd(5, chunked=False)]


def test_peer_closing_during_data_resets_the_transaction() -> None:
    peer = _data_peer()
    peer.send(b"half a message\r\n")
    assert peer.close() == ""
    assert _messages(peer) == []
    assert peer.events[-2:] == [TransactionReset(), Closing(None)]


# --- line length ----------------------------------------------------------------------------
def test_line_of_998_octets_is_accepted() -> None:
    line = b"x" * 998 + b"\r\n"
    peer = _data_peer()
    assert peer.send(line + line + b".\r\n") == QUEUED
    assert peer.content() == line + line


def test_line_of_999_octets_is_refused() -> None:
    peer = _data_peer()
    assert peer.send(b"short\r\n" + b"x" * 999 + b"\r\nshort\r\n") == ""
    assert peer.send(b".\r\n") == LINE_TOO_LONG
    assert _messages(peer) == []
    assert peer.events[-1] == TransactionReset()


def test_first_line_of_999_octets_is_refused() -> None:
    peer = _data_peer()
    assert peer.send(b"x" * 999 + b"\r\n.\r\n") == LINE_TOO_LONG


def test_line_of_999_octets_fed_one_byte_at_a_time_is_refused() -> None:
    stream = b"a\r\n" + b"x" * 999 + b"\r\n.\r\n"
    peer = _data_peer()
    assert peer.send_pieces(stream[i : i + 1] for i in range(len(stream))) == LINE_TOO_LONG


def test_line_of_998_octets_fed_one_byte_at_a_time_is_accepted() -> None:
    stream = b"a\r\n" + b"x" * 998 + b"\r\n.\r\n"
    peer = _data_peer()
    assert peer.send_pieces(stream[i : i + 1] for i in range(len(stream))) == QUEUED
    assert peer.content() == stream[:-3]


def test_endless_line_is_refused_and_the_terminator_is_still_found() -> None:
    peer = _data_peer()
    out = peer.send_pieces([b"start\r\n", *[b"y" * 100] * 50, b"\r\n.\r\nNOOP\r\n"])
    assert out == LINE_TOO_LONG + OK
    assert _messages(peer) == []
    assert b"y" * 999 not in peer.content()
    assert peer.send("MAIL FROM:<a@example.org>\r\n") == "250 2.1.0 Sender ok\r\n"


def test_999_octet_line_ended_by_bare_lf_is_refused_when_normalising() -> None:
    peer = _data_peer(bare_linefeeds=NORMALISE)
    assert peer.send(b"x\r\n" + b"y" * 999 + b"\nz\r\n.\r\n") == LINE_TOO_LONG


def test_999_octet_first_line_ended_by_bare_lf_is_refused_when_normalising() -> None:
    peer = _data_peer(bare_linefeeds=NORMALISE)
    assert peer.send(b"y" * 999 + b"\nz\r\n.\r\n") == LINE_TOO_LONG


def test_lines_split_by_bare_cr_are_measured_after_normalising() -> None:
    peer = _data_peer(bare_linefeeds=NORMALISE)
    assert peer.send(b"y" * 600 + b"\r" + b"z" * 600 + b"\r\n.\r\n") == QUEUED
    assert peer.content() == b"y" * 600 + b"\r\n" + b"z" * 600 + b"\r\n"


def test_line_too_long_reply_names_the_configured_limit() -> None:
    peer = _data_peer(max_line_length=78)
    reply = peer.send(b"y" * 100 + b"\r\n.\r\n")
    assert reply.startswith("554 5.6.0 ")
    assert "78" in reply


# --- bare CR / LF ---------------------------------------------------------------------------
def test_bare_cr_before_the_terminator_is_refused() -> None:
    peer = _data_peer()
    assert peer.send(b"abc\r\r\n.\r\n") == BARE_CR


def test_bare_lf_is_normalised_to_crlf() -> None:
    peer = _data_peer(bare_linefeeds=NORMALISE)
    assert peer.send(b"one\ntwo\rthree\r\n.\r\n") == QUEUED
    assert peer.content() == b"one\r\ntwo\r\nthree\r\n"
    assert _messages(peer) == [MessageEnd(len(b"one\r\ntwo\r\nthree\r\n"), chunked=False)]


# --- size -----------------------------------------------------------------------------------
LINE10 = b"xxxxxxxx\r\n"


def test_message_of_exactly_the_maximum_size_is_accepted() -> None:
    peer = _data_peer(max_message_size=100)
    assert peer.send(LINE10 * 10 + b".\r\n") == QUEUED
    assert _messages(peer) == [MessageEnd(100, chunked=False)]


def test_message_over_the_maximum_size_is_refused_after_the_end_of_data() -> None:
    peer = _data_peer(max_message_size=100)
    assert peer.send(LINE10 * 10 + b"y\r\n") == ""  # no early reply: the client is still sending
    assert peer.send(b".\r\n") == "552 5.3.4 Message size exceeds fixed maximum message size of 100 octets\r\n"
    assert _messages(peer) == []
    rejected, reset = peer.events[-2:]
    assert isinstance(rejected, Rejected)
    assert (rejected.command, rejected.reply.code, rejected.reply.enhanced) == ("DATA", 552, "5.3.4")
    assert reset == TransactionReset()
    assert peer.send("MAIL FROM:<a@example.org>\r\n") == "250 2.1.0 Sender ok\r\n"


def test_content_beyond_the_size_limit_is_not_emitted() -> None:
    peer = _data_peer(max_message_size=100)
    body = LINE10 * 30
    peer.send_pieces([body[i : i + 10] for i in range(0, len(body), 10)])
    emitted = peer.content()
    assert len(emitted) <= 100
    assert body.startswith(emitted)
    chunks_at_limit = len(peer.of_type(DataChunk))
    peer.send(LINE10 * 5)
    assert len(peer.of_type(DataChunk)) == chunks_at_limit
    assert peer.send(b".\r\n").startswith("552 5.3.4 ")


def test_size_is_counted_after_unstuffing() -> None:
    peer = _data_peer(max_message_size=10)
    assert peer.send(b"..abcdefg\r\n.\r\n") == QUEUED  # 11 octets on the wire, 10 in the message
    assert _messages(peer) == [MessageEnd(10, chunked=False)]
