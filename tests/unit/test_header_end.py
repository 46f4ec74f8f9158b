"""Where a message's header section ends, read as the content arrives (`HeaderEnd`) or whole, as
HTTP injection reads raw content (`end_header_section`): the same however the writes split it,
so a line that is no field (white space first, plain text) starts the body instead of
continuing the field before it."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from pigeon.header_section import HeaderEnd, end_header_section

# The rule written out another way, as the oracle: the header fields a message starts with
# (a name of printable ASCII but the colon, blanks, the colon; continuation lines), whole.
_FIELD_LINES = re.compile(rb"(?:[!-9;-~]+[ \t]*:[^\r\n]*\r\n(?:[ \t][^\r\n]*\r\n)*)*")

LINES = [
    b"Subject: hi\r\n",
    b"A:\r\n",
    b"From : obsolete@example.org\r\n",
    b"X-Tenant:acme\r\n",
    b"\tfolded on\r\n",
    b" by forged.example with ESMTP\r\n",
    b"plain text\r\n",
    b"From someone@example.org Mon Jan  1 00:00:00 2024\r\n",
    b"Subject\r\n",
    b"\r\n",
    b"X-Long: " + b"x" * 5000 + b"\r\n",  # past what is held before a line is read by its start
    b"\xc3\xa9t\xc3\xa9: 8-bit name\r\n",
]


def _as_the_rule_reads_it(content: bytes) -> tuple[bytes, int]:
    """The empty line put in before the first line that neither starts a field nor continues
    one (none after a header section that is all of it), and where the fields end."""
    end = _FIELD_LINES.match(content).end()  # type: ignore[union-attr]
    if end == len(content) or content.startswith(b"\r\n", end):
        return content, end
    return content[:end] + b"\r\n" + content[end:], end


def _fed(content: bytes, cuts: list[int]) -> bytes:
    end = HeaderEnd()
    out, at = [], 0
    for cut in [*sorted(cuts), len(content)]:
        out.append(end.feed(content[at:cut]))
        at = cut
    out.append(end.finish())
    assert end.finish() == b""
    return b"".join(out)


@given(
    st.lists(st.sampled_from(LINES), max_size=12),
    st.lists(st.integers(min_value=0, max_value=60_000), max_size=8),
)
def test_the_header_section_ends_where_http_injection_ends_it_however_the_writes_split_it(
    lines: list[bytes], cuts: list[int]
) -> None:
    content = b"".join(lines) + b"body\r\n"
    cuts = [cut % (len(content) + 1) for cut in cuts]
    expected, fields_end = _as_the_rule_reads_it(content)
    assert _fed(content, cuts) == expected
    assert end_header_section(content) == (expected, fields_end)


@given(st.lists(st.sampled_from(LINES), max_size=12))
def test_content_that_is_all_header_ends_where_it_ends(lines: list[bytes]) -> None:
    content = b"".join(lines)
    expected, fields_end = _as_the_rule_reads_it(content)
    assert end_header_section(content) == (expected, fields_end)


def test_content_that_starts_with_white_space_is_all_body() -> None:
    content = b"\tby forged.example with ESMTP\r\nSubject: s\r\n\r\nbody\r\n"
    assert _fed(content, []) == b"\r\n" + content
    assert _fed(content, [1]) == b"\r\n" + content  # decided on the first octet


def test_a_last_line_without_its_crlf_is_read_whole_at_the_end() -> None:
    assert _fed(b"Subject: s\r\nno field", [3, 15]) == b"Subject: s\r\n\r\nno field"
    assert _fed(b"Subject: s", [3]) == b"Subject: s"
    assert _fed(b"no field", []) == b"\r\nno field"
    assert _fed(b"", []) == b""


def test_once_the_header_section_ends_the_rest_passes_as_it_comes() -> None:
    end = HeaderEnd()
    assert end.feed(b"Subject: s\r\n\r\nbo") == b"Subject: s\r\n\r\nbo"
    assert end.ended
    assert end.feed(b"\tdy\r\n") == b"\tdy\r\n"


def test_a_field_split_mid_crlf_is_read_as_one() -> None:
    assert _fed(b"Subject: s\r\n\tmore\r\n\r\nbody\r\n", [11, 12]) == b"Subject: s\r\n\tmore\r\n\r\nbody\r\n"
