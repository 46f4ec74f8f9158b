"""CHUNKING (RFC 3030): BDAT sizes frame the content, so nothing inside a chunk is a command
or an end of data; the same content checks as DATA apply."""

from __future__ import annotations

import pytest

from pigeon.smtp.events import Closing, DataChunk, MessageEnd, Rejected, TransactionReset
from pigeon.smtp.framing import BareLinefeeds

from .harness import HOSTNAME, QUEUED, Peer, config, lines, open_transaction

OK = "250 2.0.0 Ok\r\n"
NO_RECIPIENTS = "554 5.5.1 No valid recipients\r\n"
NEED_MAIL = "503 5.5.1 Send MAIL FROM first\r\n"
BARE_LF = "554 5.6.0 Message contains a bare <LF>; lines must end with <CR><LF> (RFC 5321 2.3.8)\r\n"
BARE_CR = "554 5.6.0 Message contains a bare <CR>; lines must end with <CR><LF> (RFC 5321 2.3.8)\r\n"
BDAT_SYNTAX = "501 5.5.4 Syntax: BDAT size [LAST]\r\n"


def received(n: int) -> str:
    return f"250 2.0.0 {n} octets received\r\n"


def _bdat_peer(**overrides: object) -> Peer:
    peer = Peer.start(config(**overrides))
    open_transaction(peer)
    return peer


def bdat(data: bytes, *, last: bool = False) -> bytes:
    return b"BDAT %d%s\r\n" % (len(data), b" LAST" if last else b"") + data


def test_chunking_is_advertised() -> None:
    peer = Peer.start()
    assert "250-CHUNKING\r\n" in peer.send("EHLO client.test\r\n")


def test_single_last_chunk_is_a_whole_message() -> None:
    peer = _bdat_peer()
    assert peer.send(bdat(b"Subject: hi\r\n\r\nhello\r\n", last=True)) == QUEUED
    assert peer.content() == b"Subject: hi\r\n\r\nhello\r\n"
    assert peer.message_ends() == [MessageEnd(22, chunked=True)]


def test_each_intermediate_chunk_is_acknowledged_with_the_octets_so_far() -> None:
    peer = _bdat_peer()
    assert peer.send(bdat(b"hello")) == received(5)
    assert peer.send(bdat(b", world")) == received(12)
    assert peer.message_ends() == []
    assert peer.send(bdat(b"!\r\n", last=True)) == QUEUED
    assert peer.content() == b"hello, world!\r\n"
    assert peer.message_ends() == [MessageEnd(15, chunked=True)]


def test_bdat_zero_last_ends_the_message() -> None:
    peer = _bdat_peer()
    assert peer.send(bdat(b"abc\r\n")) == received(5)
    assert peer.send(b"BDAT 0 LAST\r\n") == QUEUED
    assert peer.message_ends() == [MessageEnd(5, chunked=True)]


def test_bdat_zero_last_alone_is_an_empty_message() -> None:
    peer = _bdat_peer()
    assert peer.send(b"bdat 0 last\r\n") == QUEUED
    assert peer.of_type(DataChunk) == []
    assert peer.message_ends() == [MessageEnd(0, chunked=True)]


def test_bdat_zero_without_last_is_acknowledged() -> None:
    peer = _bdat_peer()
    assert peer.send(b"BDAT 0\r\n") == received(0)
    assert peer.send(bdat(b"x\r\n", last=True)) == QUEUED


def test_chunk_content_is_never_a_command_or_an_end_of_data() -> None:
    payload = b"a\r\n.\r\nQUIT\r\nRSET\r\n.\r\n"
    peer = _bdat_peer()
    assert peer.send(bdat(payload, last=True) + b"NOOP\r\n") == QUEUED + OK
    assert peer.content() == payload  # no dot-unstuffing either
    assert peer.closing() is None


def test_chunk_split_at_every_point_gives_the_same_message() -> None:
    stream = bdat(b"ab\r\n.\r\n") + bdat(b"xyz\r\n", last=True) + b"NOOP\r\n"
    for cut in range(len(stream) + 1):
        peer = _bdat_peer()
        assert peer.send_pieces([stream[:cut], stream[cut:]]) == received(7) + QUEUED + OK, f"split at {cut}"
        assert peer.content() == b"ab\r\n.\r\nxyz\r\n", f"split at {cut}"
        assert peer.message_ends() == [MessageEnd(12, chunked=True)], f"split at {cut}"


def test_chunks_fed_one_byte_at_a_time() -> None:
    stream = bdat(b"line one\r\n") + bdat(b"line two\r\n", last=True) + b"QUIT\r\n"
    peer = _bdat_peer()
    out = peer.send_pieces(stream[i : i + 1] for i in range(len(stream)))
    assert out == received(10) + QUEUED + f"221 2.0.0 {HOSTNAME} closing connection\r\n"
    assert peer.content() == b"line one\r\nline two\r\n"


def test_pipelined_transaction_with_bdat() -> None:
    peer = Peer.start()
    out = peer.send(
        b"EHLO client.test\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\n"
        + bdat(b"one\r\n")
        + bdat(b"two\r\n", last=True)
        + b"MAIL FROM:<a@example.org>\r\n"
    )
    assert lines(out)[-5:] == [
        "250 2.1.0 Sender ok",
        "250 2.1.5 Recipient ok",
        "250 2.0.0 5 octets received",
        QUEUED.removesuffix("\r\n"),
        "250 2.1.0 Sender ok",
    ]


# --- out of sequence ------------------------------------------------------------------------
def test_bdat_before_rcpt_is_refused_and_its_chunk_consumed() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    assert peer.send(b"BDAT 6\r\nNOOP\r\nNOOP\r\n") == NO_RECIPIENTS + OK
    assert peer.of_type(DataChunk) == []
    assert peer.send("RCPT TO:<b@example.net>\r\n") == "250 2.1.5 Recipient ok\r\n"


def test_bdat_before_mail_is_refused_and_its_chunk_consumed() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    assert peer.send(b"BDAT 12 LAST\r\nQUIT\r\nQUIT\r\nNOOP\r\n") == NEED_MAIL + OK
    assert peer.closing() is None


def test_bdat_before_ehlo_is_refused_and_its_chunk_consumed() -> None:
    peer = Peer.start()
    assert peer.send(b"BDAT 6\r\nQUIT\r\nNOOP\r\n") == "503 5.5.1 Send EHLO or HELO first\r\n250 2.0.0 Ok\r\n"


def test_refused_bdat_chunk_split_across_receive_calls_is_consumed() -> None:
    peer = Peer.start()
    peer.send("EHLO client.test\r\n")
    assert peer.send_pieces([b"BDAT 12\r\nQUI", b"T\r\nQU", b"IT\r\n", b"NOOP\r\n"]) == NEED_MAIL + OK


def test_data_after_bdat_is_refused_and_the_bdat_transfer_goes_on() -> None:
    peer = _bdat_peer()
    assert peer.send(bdat(b"one\r\n")) == received(5)
    assert peer.send(b"DATA\r\n") == "503 5.5.1 DATA and BDAT cannot be mixed in one transaction\r\n"
    assert peer.send(b"MAIL FROM:<x@example.org>\r\n") == (
        "503 5.5.1 BDAT transfer in progress: send BDAT, RSET or QUIT\r\n"
    )
    assert peer.send(bdat(b"two\r\n", last=True)) == QUEUED
    assert peer.content() == b"one\r\ntwo\r\n"


def test_rset_abandons_a_bdat_transfer() -> None:
    peer = _bdat_peer()
    peer.send(bdat(b"one\r\n"))
    assert peer.send(b"RSET\r\n") == "250 2.0.0 Reset ok\r\n"
    assert peer.events[-1] == TransactionReset()
    assert peer.send(bdat(b"two\r\n", last=True)) == NEED_MAIL
    assert peer.message_ends() == []


def test_bdat_is_not_implemented_when_chunking_is_off() -> None:
    peer = Peer.start(config(chunking=False))
    assert "CHUNKING" not in peer.send("EHLO client.test\r\n")
    peer.send("MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\n")
    assert peer.send(b"BDAT 6 LAST\r\nNOOP\r\nNOOP\r\n") == "502 5.5.1 Command not implemented\r\n" + OK
    assert peer.message_ends() == []


# --- malformed BDAT: the framing is lost ----------------------------------------------------
FRAMING_LOST = f"421 4.5.0 {HOSTNAME} Error: cannot tell where the data of that BDAT ends, closing connection\r\n"


@pytest.mark.parametrize(
    "line",
    [b"BDAT abc", b"BDAT", b"BDAT -1", b"BDAT +5", b"BDAT 1 2", b"BDAT 5 NOTLAST", b"BDAT 5 LAST x", b"BDAT 0x10"],
)
def test_malformed_bdat_is_answered_then_the_session_closes_with_421_saying_why(line: bytes) -> None:
    peer = _bdat_peer()
    assert peer.send(line + b"\r\nNOOP\r\n") == BDAT_SYNTAX + FRAMING_LOST
    closing = peer.closing()
    assert closing is not None
    assert closing.reply is not None
    assert str(closing.reply) == FRAMING_LOST.removesuffix("\r\n")
    (rejected,) = peer.of_type(Rejected)
    assert str(rejected.reply) == BDAT_SYNTAX.removesuffix("\r\n")
    assert peer.events[-3:] == [Rejected("BDAT", rejected.reply, sender="a@example.org"), TransactionReset(), closing]


def test_closing_names_the_last_reply_sent_when_a_malformed_bdat_hits_the_error_limit() -> None:
    peer = Peer.start(config(max_errors=0))
    peer.send("EHLO client.test\r\n")
    out = peer.send(b"BDAT abc\r\n")
    assert lines(out)[-1] == f"421 4.7.0 {HOSTNAME} Error: too many errors, closing connection"
    closing = peer.closing()
    assert closing is not None
    assert closing.reply is not None
    assert closing.reply.code == 421


# --- content checks -------------------------------------------------------------------------
def test_last_chunk_over_the_size_limit_is_refused_and_resets() -> None:
    peer = _bdat_peer(max_message_size=10)
    assert peer.send(bdat(b"0123456789", last=True)) == QUEUED
    open_transaction_again(peer)
    out = peer.send(bdat(b"0123456789A", last=True))
    assert out == "552 5.3.4 Message size exceeds fixed maximum message size of 10 octets\r\n"
    assert peer.events[-1] == TransactionReset()
    assert len(peer.message_ends()) == 1


def test_intermediate_chunk_over_the_size_limit_is_refused_at_once() -> None:
    peer = _bdat_peer(max_message_size=10)
    assert peer.send(bdat(b"012345")) == received(6)
    out = peer.send(bdat(b"6789AB") + bdat(b"C", last=True))
    assert out == "552 5.3.4 Message size exceeds fixed maximum message size of 10 octets\r\n" + NEED_MAIL
    assert peer.message_ends() == []
    assert TransactionReset() in peer.events


def test_chunk_content_beyond_the_size_limit_is_not_emitted() -> None:
    peer = _bdat_peer(max_message_size=10)
    stream = bdat(b"0123456789ABCDEFGHIJ", last=True)
    peer.send_pieces(stream[i : i + 3] for i in range(0, len(stream), 3))
    emitted = peer.content()
    assert len(emitted) <= 10
    assert b"0123456789ABCDEFGHIJ".startswith(emitted)
    assert peer.message_ends() == []


def test_bare_lf_inside_a_chunk_is_refused_by_default() -> None:
    peer = _bdat_peer()
    assert peer.send(bdat(b"one\ntwo\r\n", last=True)) == BARE_LF
    assert peer.message_ends() == []
    assert peer.events[-1] == TransactionReset()


def test_bare_lf_in_an_intermediate_chunk_is_refused_at_once() -> None:
    peer = _bdat_peer()
    assert peer.send(bdat(b"one\n")) == BARE_LF
    assert peer.send(bdat(b"two\r\n", last=True)) == NEED_MAIL


def test_smuggled_end_of_data_inside_a_chunk_is_refused_by_default() -> None:
    peer = _bdat_peer()
    out = peer.send(bdat(b"body\n.\nMAIL FROM:<evil@attacker.test>\r\n", last=True))
    assert out == BARE_LF


def test_bare_cr_at_the_end_of_the_last_chunk_is_refused() -> None:
    peer = _bdat_peer()
    assert peer.send(bdat(b"one\r\ntwo\r", last=True)) == BARE_CR


def test_bare_cr_ending_a_chunk_followed_by_bdat_zero_last_is_refused() -> None:
    peer = _bdat_peer()
    assert peer.send(bdat(b"one\r")).endswith(" octets received\r\n")
    assert peer.send(b"BDAT 0 LAST\r\n") == BARE_CR


def test_crlf_split_across_two_chunks_is_not_a_bare_cr_or_lf() -> None:
    peer = _bdat_peer()
    peer.send(bdat(b"ab\r"))
    assert peer.send(bdat(b"\ncd\r\n", last=True)) == QUEUED
    assert peer.content() == b"ab\r\ncd\r\n"
    assert peer.message_ends() == [MessageEnd(8, chunked=True)]


def test_chunk_ending_in_cr_is_acknowledged_with_all_its_octets() -> None:
    peer = _bdat_peer()
    assert peer.send(bdat(b"ab\r")) == received(3)


def test_bare_lf_in_a_chunk_is_normalised_when_configured() -> None:
    peer = _bdat_peer(bare_linefeeds=BareLinefeeds.NORMALISE)
    assert peer.send(bdat(b"one\ntwo\rthree\r\n", last=True)) == QUEUED
    assert peer.content() == b"one\r\ntwo\r\nthree\r\n"


def test_line_of_999_octets_split_across_chunks_is_refused() -> None:
    peer = _bdat_peer()
    assert peer.send(bdat(b"x" * 500)) == received(500)
    assert peer.send(bdat(b"x" * 499 + b"\r\n", last=True)) == (
        "554 5.6.0 Message has a line longer than 998 octets (RFC 5322 2.1.1)\r\n"
    )


def test_line_of_998_octets_split_across_chunks_is_accepted() -> None:
    peer = _bdat_peer()
    peer.send(bdat(b"x" * 500))
    assert peer.send(bdat(b"x" * 498 + b"\r")).endswith(" octets received\r\n")
    assert peer.send(bdat(b"\n", last=True)) == QUEUED
    assert peer.content() == b"x" * 998 + b"\r\n"


def test_peer_closing_during_bdat_resets_the_transaction() -> None:
    peer = _bdat_peer()
    peer.send(b"BDAT 100\r\nonly part")
    assert peer.close() == ""
    assert peer.events[-2:] == [TransactionReset(), Closing(None)]
    assert peer.message_ends() == []


def open_transaction_again(peer: Peer) -> None:
    assert peer.send("MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\n") == (
        "250 2.1.0 Sender ok\r\n250 2.1.5 Recipient ok\r\n"
    )
