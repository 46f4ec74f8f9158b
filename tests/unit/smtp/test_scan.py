"""The C scans (`pigeon.smtp._scan`) answer exactly as framing.py's Python ones: the server
and client run on whichever was built, so they must never disagree, on any bytes."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pigeon.smtp import framing
from pigeon.smtp.events import DataChunk

_scan = pytest.importorskip("pigeon.smtp._scan", reason="built without a C compiler: only the Python scans exist")

# Mostly the bytes the scans care about, so that lines, bare endings and dots are common.
_bytes = st.lists(st.sampled_from([b"\r", b"\n", b"\r\n", b".", b"\0", b"a", b"\r\n.", b"xyz" * 5]), max_size=80).map(
    b"".join
)


@given(_bytes, st.integers(0, 40), st.integers(0, 30))
@example(b"", 0, 0)
@example(b"\n", 0, 0)
@example(b"\r", 5, 3)
@example(b"abcd\r\n", 0, 3)  # a first line of 4 octets, limit 3
@example(b"ab\r\nabcde\n", 0, 3)  # a later line ended by a bare LF: within limit + 2 of its start
def test_inspect_in_c_answers_as_in_python(data: bytes, carried: int, limit: int) -> None:
    assert _scan.inspect(data, carried, limit) == framing._inspect(data, carried, limit)


@given(_bytes, st.integers(0, 90))
@example(b"\r\n.", 0)
@example(b"x\r\n.", 1)
@example(b"\r\n.", 1)
@example(b"\r\n", 0)
def test_find_line_dot_in_c_answers_as_bytes_find(data: bytes, start: int) -> None:
    assert _scan.find_line_dot(data, start) == framing._find_line_dot(data, start)


def test_framing_uses_the_c_scans_when_they_were_built() -> None:
    assert framing.inspect is _scan.inspect
    assert framing.find_line_dot is _scan.find_line_dot


def _session_outcome(stream: bytes, pieces: int, mode: framing.BareLinefeeds) -> tuple[str, list[bytes]]:
    from .harness import Peer, config

    peer = Peer.start(config(bare_linefeeds=mode, max_line_length=40))
    replies = peer.send("EHLO c.test\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<r@s.test>\r\nDATA\r\n")
    step = max(1, len(stream) // pieces)
    replies += peer.send_pieces(stream[i : i + step] for i in range(0, len(stream), step))
    return replies, [event.data for event in peer.events if isinstance(event, DataChunk)]


@given(_bytes, st.integers(1, 6), st.sampled_from(list(framing.BareLinefeeds)))
def test_a_server_on_the_python_scans_answers_and_stores_as_on_the_c_ones(
    content: bytes, pieces: int, mode: framing.BareLinefeeds
) -> None:
    # The whole DATA path, not only the scans: a session built without a compiler must
    # refuse, normalise and unstuff exactly as one built with it.
    stream = content + b"\r\n.\r\n"
    with_c = _session_outcome(stream, pieces, mode)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(framing, "inspect", framing._inspect)
        patch.setattr(framing, "find_line_dot", framing._find_line_dot)
        in_python = _session_outcome(stream, pieces, mode)
    assert in_python == with_c
