"""Message content is read while its transaction is open, never after.

Some refusals can only be made when the message is complete: a CR as its last octet is bare
only once no LF can follow it, a last line without CRLF is too long only once it is known to
be the last. The session must decide before it emits the content that this last step brought:
emitted first, the `DataChunk` would be read after the refusal had already ended the
transaction, and the I/O layer, which builds the message from `session.mail`, would have none
(an outside tester's `BDAT 41 LAST` ending in CR closed the connection with an AssertionError).

The harness (`Peer.pump`) checks the same for every test: no `DataChunk` or `MessageEnd` is
read with no transaction open.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pigeon.smtp import replies
from pigeon.smtp.events import (
    Closing,
    Data,
    DataChunk,
    Decision,
    MailFrom,
    MessageEnd,
    Rejected,
    TransactionReset,
    _NeedData,
)
from pigeon.smtp.framing import BareLinefeeds
from pigeon.smtp.server import Phase, ServerSession

from .harness import QUEUED, Peer, config, open_transaction

BARE_CR = replies.CONTENT_BARE_CR
LINE_TOO_LONG = replies.content_line_too_long(998)
TESTER_MESSAGE = b"From: a@example.com\r\nSubject: cr\r\n\r\nbody\r"  # 41 octets, the last a bare CR
GOOD = b"Subject: next\r\n\r\nfine\r\n"
SENDER = "a@example.org"
OPENING = b"MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\n"


def bdat(data: bytes, *, last: bool = False) -> bytes:
    return b"BDAT %d%s\r\n" % (len(data), b" LAST" if last else b"") + data


# The content of one transaction (after RCPT) that is refused only once it is complete, and
# the reply that refuses it.
REFUSED_AT_THE_END = {
    "BDAT LAST ending in a bare CR": (bdat(TESTER_MESSAGE, last=True), BARE_CR),
    "a CR alone as the whole message": (bdat(b"\r", last=True), BARE_CR),
    "a chunk ending in CR, then BDAT n LAST": (bdat(b"Subject: x\r\n\r\none\r") + bdat(b"two\r\n", last=True), BARE_CR),
    "a chunk ending in CR, then BDAT n LAST ending in CR": (bdat(b"one\r\n") + bdat(b"two\r", last=True), BARE_CR),
    "a chunk ending in CR, then BDAT 0 LAST": (bdat(b"one\r\ntwo\r") + b"BDAT 0 LAST\r\n", BARE_CR),
    "the CR split into a chunk of its own": (bdat(b"one\r\ntwo") + bdat(b"\r", last=True), BARE_CR),
    "a last line of 999 octets without CRLF": (bdat(b"Subject: x\r\n\r\n" + b"x" * 999, last=True), LINE_TOO_LONG),
    "DATA with a CR ending its last line before the dot": (b"DATA\r\nSubject: x\r\n\r\nbody\r\r\n.\r\n", BARE_CR),
}


def _after(peer: Peer, start: int) -> list[object]:
    return list(peer.events[start:])


@pytest.mark.parametrize("what", list(REFUSED_AT_THE_END))
def test_a_message_refused_at_its_end_gives_no_content_after_the_refusal(what: str) -> None:
    content, refusal = REFUSED_AT_THE_END[what]
    verb = "DATA" if content.startswith(b"DATA") else "BDAT"
    peer = Peer.start()
    open_transaction(peer)
    start = len(peer.events)
    out = peer.send(content)
    assert out.endswith(refusal.encode(enhanced=True).decode())
    events = _after(peer, start)
    # Content of earlier chunks may have come (and was read in time); none after the refusal.
    assert [e for e in events if not isinstance(e, (DataChunk, Data))] == [
        Rejected(verb, refusal, sender=SENDER),
        TransactionReset(),
    ]
    assert not any(isinstance(e, DataChunk) for e in events[events.index(Rejected(verb, refusal, sender=SENDER)) :])
    # The session is usable: the next transaction goes through whole.
    open_transaction(peer, ehlo=False)
    assert peer.send(bdat(GOOD, last=True)) == QUEUED
    assert peer.message_ends() == [MessageEnd(len(GOOD), chunked=True)]


def test_the_testers_message_gives_no_content_at_all() -> None:
    peer = Peer.start()
    open_transaction(peer)
    start = len(peer.events)
    assert peer.send(bdat(TESTER_MESSAGE, last=True)) == BARE_CR.encode(enhanced=True).decode()
    assert _after(peer, start) == [Rejected("BDAT", BARE_CR, sender=SENDER), TransactionReset()]


@pytest.mark.parametrize("pieces", ["one", "byte by byte"])
def test_pipelined_refusal_at_the_end_then_the_next_transaction(pieces: str) -> None:
    stream = b"EHLO client.test\r\n" + OPENING + bdat(TESTER_MESSAGE, last=True) + OPENING + bdat(GOOD, last=True)
    peer = Peer.start()
    out = peer.send_pieces([stream] if pieces == "one" else [stream[i : i + 1] for i in range(len(stream))])
    assert out.endswith(
        "250 2.1.0 Sender ok\r\n250 2.1.5 Recipient ok\r\n"
        + BARE_CR.encode(enhanced=True).decode()
        + "250 2.1.0 Sender ok\r\n250 2.1.5 Recipient ok\r\n"
        + QUEUED
    )
    # (Fed byte by byte, the refused message's first octets came while it was open: the reset
    # after its refusal drops them.)
    reset = max(i for i, e in enumerate(peer.events) if isinstance(e, TransactionReset))
    assert b"".join(e.data for e in peer.events[reset:] if isinstance(e, DataChunk)) == GOOD
    assert peer.message_ends() == [MessageEnd(len(GOOD), chunked=True)]


def test_refusal_at_the_end_after_rset() -> None:
    peer = Peer.start()
    open_transaction(peer)
    assert peer.send(bdat(b"abandoned\r\n")) == "250 2.0.0 11 octets received\r\n"
    assert peer.send("RSET\r\n") == "250 2.0.0 Reset ok\r\n"
    assert peer.send(OPENING) == "250 2.1.0 Sender ok\r\n250 2.1.5 Recipient ok\r\n"
    start = len(peer.events)
    assert peer.send(bdat(TESTER_MESSAGE, last=True)) == BARE_CR.encode(enhanced=True).decode()
    assert _after(peer, start) == [Rejected("BDAT", BARE_CR, sender=SENDER), TransactionReset()]
    assert peer.send(OPENING + bdat(GOOD, last=True)) == "250 2.1.0 Sender ok\r\n250 2.1.5 Recipient ok\r\n" + QUEUED


def test_normalised_cr_that_takes_the_message_over_the_size_limit_gives_no_content() -> None:
    # In normalise mode the last CR becomes CRLF when the message ends: 9 + 2 octets > 10.
    peer = Peer.start(config(bare_linefeeds=BareLinefeeds.NORMALISE, max_message_size=10))
    open_transaction(peer)
    start = len(peer.events)
    out = peer.send(bdat(b"012345678\r", last=True))
    assert out.startswith("552 5.3.4 ")
    assert [type(e) for e in _after(peer, start)] == [Rejected, TransactionReset]


def test_normalised_cr_at_the_end_is_content_of_the_message() -> None:
    peer = Peer.start(config(bare_linefeeds=BareLinefeeds.NORMALISE))
    open_transaction(peer)
    assert peer.send(bdat(b"one\r\ntwo\r", last=True)) == QUEUED
    assert peer.content() == b"one\r\ntwo\r\n"
    assert peer.message_ends() == [MessageEnd(10, chunked=True)]


# --- the property ---------------------------------------------------------------------------
FRAGMENTS = st.sampled_from([b"\r", b"\n", b"\r\n", b"x", b"abc", b".", b"\0", b"x" * 500, b"x" * 999])
CONTENT = st.lists(FRAGMENTS, max_size=6).map(b"".join)
STEPS = st.lists(
    st.one_of(
        st.builds(lambda data, last: bdat(data, last=last), CONTENT, st.booleans()),
        st.builds(lambda data: bdat(data, last=True), CONTENT),
        st.sampled_from([b"BDAT 0 LAST\r\n", b"BDAT 0\r\n", b"RSET\r\n", b"NOOP\r\n", OPENING, b"DATA\r\n"]),
        st.builds(lambda data: data + b"\r\n.\r\n", CONTENT),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=STEPS,
    bare_linefeeds=st.sampled_from(list(BareLinefeeds)),
    max_size=st.sampled_from([12, 2000, 25 * 1024 * 1024]),
    cuts=st.lists(st.integers(min_value=0), max_size=6),
)
def test_no_sequence_of_chunks_gives_content_after_its_transaction_ended(
    steps: list[bytes], bare_linefeeds: BareLinefeeds, max_size: int, cuts: list[int]
) -> None:
    stream = b"EHLO client.test\r\n" + OPENING + b"".join(steps)
    points = sorted({cut % (len(stream) + 1) for cut in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    session = ServerSession(config(bare_linefeeds=bare_linefeeds, max_message_size=max_size, max_errors=1000))
    session.greet()
    in_transaction = False  # as the events tell it, read in order
    for piece in pieces:
        session.receive_data(piece)
        while not isinstance(event := session.next_event(), (_NeedData, Closing)):
            if isinstance(event, MailFrom):
                in_transaction = True
            elif isinstance(event, (DataChunk, MessageEnd)):
                # Read while its transaction is open, in the events and in the session alike
                # (the I/O layer builds the message from `session.mail`).
                assert in_transaction, f"{event!r} after a TransactionReset"
                assert session.mail is not None, f"{event!r} read after its transaction ended"
                assert session.phase in (Phase.DATA, Phase.BDAT), f"{event!r} read in {session.phase}"
            elif isinstance(event, TransactionReset):
                in_transaction = False
            if isinstance(event, MessageEnd):
                session.respond(replies.queued(["1"]))
                in_transaction = False
            elif isinstance(event, Decision):
                session.accept()
