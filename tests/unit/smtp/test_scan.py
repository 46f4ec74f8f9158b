"""The C scans (`pigeon.smtp._scan`) answer exactly as framing.py's Python ones: the server
and client run on whichever was built, so they must never disagree, on any bytes."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pigeon.smtp import framing

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
