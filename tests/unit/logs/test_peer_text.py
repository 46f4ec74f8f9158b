"""What a client sent, as a log record shows it: every character printable, nothing two inputs
share, and no longer than an address may be."""

from __future__ import annotations

import re

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.logs.peer_text import ADDRESS_LIMIT, shown

_ESCAPE = re.compile(r"\\(\\|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")


def _unescape(text: str) -> str:
    """The inverse of shown() for a value it did not cut: the test's proof it loses nothing."""

    def one(match: re.Match[str]) -> str:
        escape = match.group(1)
        if escape == "\\":
            return "\\"
        code = int(escape[1:], 16)
        if escape[0] == "x" and code >= 0x80:
            return chr(0xDC00 + code)  # a byte that was not UTF-8, as surrogateescape keeps it
        return chr(code)

    return _ESCAPE.sub(one, text)


def test_an_ordinary_address_is_shown_as_it_is() -> None:
    for address in ("bob@example.net", "jürgen@bücher.example", '"john doe"@[192.0.2.1]', "postmaster"):
        assert shown(address) == address


def test_terminal_controls_bidi_overrides_and_bytes_that_are_not_utf8_are_escaped() -> None:
    assert shown("a\x1b[2Jb@x") == "a\\x1b[2Jb@x"
    assert shown("a\x7f\x9b31mb@x") == "a\\x7f\\u009b31mb@x"  # DEL and the C1 CSI
    assert shown("evil\u202egro.elpmaxe@x") == "evil\\u202egro.elpmaxe@x"
    assert shown("a\r\nb@x") == "a\\x0d\\x0ab@x"
    assert shown(b"caf\xe9@x".decode("utf-8", "surrogateescape")) == "caf\\xe9@x"
    assert shown('"a\\ b"@x') == '"a\\\\ b"@x'  # the backslash itself, so that no escape is forged


def test_a_long_value_is_cut_at_the_limit_and_never_inside_an_escape() -> None:
    assert shown("a" * 1000) == "a" * ADDRESS_LIMIT + "..."
    assert shown("a" * ADDRESS_LIMIT) == "a" * ADDRESS_LIMIT
    assert shown("ab\x00c", limit=5) == "ab..."  # "\x00" (4 characters) does not fit after "ab"


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.binary().map(lambda data: data.decode("utf-8", "surrogateescape")),
    ),
    st.integers(min_value=4, max_value=300),
)
def test_any_text_is_shown_printable_bounded_and_unambiguous(text: str, limit: int) -> None:
    out = shown(text, limit)
    assert out.isprintable()
    assert len(out) <= limit + 3
    msgspec.json.encode(out)  # a log record can always hold it
    whole = shown(text, limit=10 * len(text))  # no text has an escape longer than 10
    assert _unescape(whole) == text
    if len(whole) <= limit:
        assert out == whole
    else:
        kept = out.removesuffix("...")
        assert out.endswith("...") and whole.startswith(kept) and limit - 10 < len(kept) <= limit
        assert text.startswith(_unescape(kept))  # cut between two characters, not in an escape


def test_without_a_limit_a_long_reply_is_escaped_and_never_cut() -> None:
    reply = "451 4.7.1 " + "x" * 600 + "\x1b[2J"
    assert shown(reply, limit=None) == "451 4.7.1 " + "x" * 600 + "\\x1b[2J"
    assert shown("y" * 600, limit=None) == "y" * 600
