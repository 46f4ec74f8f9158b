"""A reply line too long is cut, not a broken protocol; a reply too big still is.

Found from outside: one EHLO line of 5,000 characters (`250-X-LONG aaaa...`) made the host
unusable, `451 ... broke the protocol: reply line too long` at every attempt, for ever. As
Postfix does (`line_length_limit`), the client now reads such a line to its end and keeps its
first `_MAX_REPLY_LINE` bytes, without buffering the rest; what bounds a hostile server is the
size of a whole reply (`_MAX_REPLY_BYTES`), past which it stays a protocol error.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pigeon.smtp.client import _MAX_REPLY_BYTES, _MAX_REPLY_LINE, Capabilities, ClientProtocolError, ReplyReader
from pigeon.smtp.client_session import ClientSession, Ready, TlsPolicy
from pigeon.smtp.replies import Reply

LONG = 5000


def test_an_overlong_reply_line_is_cut_to_its_first_bytes() -> None:
    (reply,) = ReplyReader().feed(b"250 " + b"x" * LONG + b"\r\n")
    assert reply == Reply(250, None, ("x" * (_MAX_REPLY_LINE - 4),))


def test_an_overlong_line_fed_in_pieces_is_cut_the_same_and_the_next_reply_read() -> None:
    reader = ReplyReader()
    assert reader.feed(b"250-" + b"x" * 4000) == []
    assert reader.feed(b"x" * 4000) == []
    assert reader.buffered
    assert len(reader._buf) <= _MAX_REPLY_LINE + 1  # what is kept while the rest comes: never the line
    assert reader.feed(b"x" * 100_000) == []
    assert len(reader._buf) <= _MAX_REPLY_LINE + 1
    got = reader.feed(b"xx\r\n250 end\r\n354 go\r\n")
    assert got == [Reply(250, None, ("x" * (_MAX_REPLY_LINE - 4), "end")), Reply(354, None, ("go",))]
    assert not reader.buffered


def test_a_reply_bigger_than_the_bound_is_still_a_protocol_error() -> None:
    reader = ReplyReader()
    assert reader.feed(b"250 " + b"x" * 65532) == []
    for _ in range(_MAX_REPLY_BYTES // 65536 - 1):
        assert reader.feed(b"x" * 65536) == []  # dropped as it comes: the line has no end yet
    with pytest.raises(ClientProtocolError, match=f"more than {_MAX_REPLY_BYTES} bytes"):
        reader.feed(b"x" * 65536)


def test_a_reply_of_many_long_lines_is_bounded_in_all() -> None:
    line = b"250-" + b"x" * 60_000 + b"\r\n"
    reader = ReplyReader()
    for _ in range(_MAX_REPLY_BYTES // len(line)):
        assert reader.feed(line) == []
    with pytest.raises(ClientProtocolError, match=f"more than {_MAX_REPLY_BYTES} bytes"):
        reader.feed(line)


def test_the_bound_counts_one_reply_not_a_connection() -> None:
    reader = ReplyReader()
    line = b"250 " + b"x" * 60_000 + b"\r\n"
    for _ in range(2 * _MAX_REPLY_BYTES // len(line)):
        assert len(reader.feed(line)) == 1


def test_an_ehlo_keyword_line_too_long_is_ignored_and_the_others_used() -> None:
    session = ClientSession("client.test", tls=TlsPolicy.DISABLED)
    session.receive_data(b"220 mx.test\r\n")
    session.next_event()
    session.data_to_send()
    session.receive_data(
        b"250-mx.test\r\n250-X-LONG " + b"a" * LONG + b"\r\n250-PIPELINING\r\n250-SIZE 1000\r\n250 CHUNKING\r\n"
    )
    event = session.next_event()
    assert isinstance(event, Ready)
    assert event.capabilities.keywords == {"PIPELINING", "SIZE", "CHUNKING"}
    assert event.capabilities.size == 1000


def test_a_keyword_line_cut_short_gives_no_limit_or_mechanism_of_its_own() -> None:
    reply = Reply(250, None, ("mx.test", "SIZE " + "9" * 600, "AUTH PLAIN " + "L" * 600, "8BITMIME"))
    caps = Capabilities.from_ehlo(reply)
    assert caps.keywords == {"8BITMIME"} and caps.size is None and caps.auth == ()


# --- whatever the lines and the reads, the same replies ----------------------------------------
lines = st.lists(
    st.tuples(st.integers(0, 2 * _MAX_REPLY_LINE), st.sampled_from([b"\r\n", b"\n"])), min_size=1, max_size=6
)


def reference(spec: list[tuple[int, bytes]]) -> tuple[bytes, Reply]:
    """A multi-line 250 whose lines have the given lengths of text, and the reply it reads as."""
    texts = [(b"%d" % (i % 10)) * n for i, (n, _) in enumerate(spec)]
    last = len(spec) - 1
    wire = b"".join(
        b"250" + (b" " if i == last else b"-") + t + end
        for i, (t, (_, end)) in enumerate(zip(texts, spec, strict=True))
    )
    kept = tuple(t[: _MAX_REPLY_LINE - 4].decode() for t in texts)
    return wire, Reply(250, None, kept)


@given(spec=lines, cuts=st.lists(st.integers(0, 3 * _MAX_REPLY_LINE), max_size=8))
def test_long_lines_are_cut_the_same_wherever_the_reads_split_them(
    spec: list[tuple[int, bytes]], cuts: list[int]
) -> None:
    wire, expected = reference(spec)
    wire += b"354 next\r\n"
    points = sorted({min(cut, len(wire)) for cut in cuts})
    pieces = [wire[a:b] for a, b in zip([0, *points], [*points, len(wire)], strict=True) if b > a]
    reader = ReplyReader()
    got = [reply for piece in pieces for reply in reader.feed(piece)]
    assert got == [expected, Reply(354, None, ("next",))]
    assert not reader.buffered
