"""The address patterns in negated character classes (`pigeon.smtp.address.char_class`),
which `re` compiles in a millisecond, match exactly what the same patterns written as lists
of every allowed character matched: SMTP's UTF-8 mailbox pattern, and the HTTP API's
patterns that the OpenAPI document shows as JSON Schema spells them."""

from __future__ import annotations

import array
import re
import sys
import unicodedata

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pigeon import compose
from pigeon.smtp import address

# Every code point, surrogates included, as one string.
EVERY_CHARACTER = array.array("I", range(0x110000)).tobytes().decode(f"utf-32-{sys.byteorder[0]}e", "surrogatepass")

# SMTP's UTF-8 mailbox pattern as it was first written, each class listing every character
# beyond ASCII (compiling it took `re` some 60 ms): the reference the new one must match.
_UTF8 = "\u0080-\U0010ffff"
_ATOM = f"[A-Za-z0-9!#$%&'*+\\-/=?^_`{{|}}~{_UTF8}]+"
_LABEL = f"[A-Za-z0-9{_UTF8}](?:[A-Za-z0-9{_UTF8}-]*[A-Za-z0-9{_UTF8}])?"
_QUOTED = f'"(?:[\\x20\\x21\\x23-\\x5b\\x5d-\\x7e{_UTF8}]|\\\\[\\x20-\\x7e])*"'
LISTED_UTF8 = re.compile(
    f"(?P<local>{_ATOM}(?:\\.{_ATOM})*|{_QUOTED})@(?P<domain>{_LABEL}(?:\\.{_LABEL})*|\\[[^\\[\\]\\\\\\s]+\\])"
)

# What addresses are made of, and what trips a grammar up: the ASCII specials, non-ASCII
# letters, white space beyond ASCII (which `\s` in an address literal takes), format and
# control characters, a surrogate, a character beyond the BMP.
SPECIALS = [*'@."\\[]()<>,;: -_~!#', "\t", "\x7f"]
BEYOND = ["é", "ü", "ß", "中", "\u00a0", "\u2000", "\u3000", "\u00ad", "\u200b", "\u202e", "\x85", "\u2028"]
BEYOND += ["\ud800", "\U0001f600", "\ufeff", "\uffff"]
characters = st.one_of(st.sampled_from(["a", "Z", "0", *SPECIALS, *BEYOND]), st.characters())


def _put_in(text: str, char: str, where: int) -> str:
    where %= len(text) + 1
    return text[:where] + char + text[where:]


# Addresses that match, with one character put in anywhere: the tell-tale of a class that
# takes one character too many or too few.
words = st.text(st.sampled_from(["a", "Z", "0", "-", "!", "~", "é", "中", "ß"]), min_size=1, max_size=8)
names = st.lists(words, min_size=1, max_size=3).map(".".join)
mailboxes = st.one_of(
    st.builds(lambda local, domain: f"{local}@{domain}", names, names),
    st.builds(lambda local, domain: f'"{local}"@{domain}', words, names),
    st.builds(lambda local: f"{local}@[127.0.0.1]", names),
)
address_like = st.one_of(
    st.text(characters, max_size=40),
    st.builds(_put_in, mailboxes, characters, st.integers(min_value=0)),
)


def _spans(match: re.Match[str] | None) -> tuple[tuple[int, int], ...] | None:
    return None if match is None else (match.span("local"), match.span("domain"))


@pytest.mark.parametrize("extra", ["beyond ASCII", "JSON Schema"])
@pytest.mark.parametrize("ascii", [address._ATEXT, address._LET_DIG, address._LDH, address._QTEXT])
def test_a_negated_class_takes_every_character_its_listing_takes_and_no_other(ascii: str, extra: str) -> None:
    ranges = address.BEYOND_ASCII if extra == "beyond ASCII" else address.json_schema_extra()
    listed = re.compile(address.char_class(ascii, ranges))
    negated = re.compile(address.char_class(ascii, ranges, negated=True))
    assert negated.pattern.startswith("[^") and not listed.pattern.startswith("[^")
    # Every one of the 1,114,112 code points: what each class leaves out is the same text.
    assert negated.sub("", EVERY_CHARACTER) == listed.sub("", EVERY_CHARACTER)


def test_the_json_schema_characters_are_the_bmp_from_u00a0_less_the_refused_categories() -> None:
    allowed = [
        point
        for point in range(0xA0, 0x10000)
        if unicodedata.category(chr(point)) not in {"Cc", "Cf", "Cs", "Zl", "Zp"}
    ]
    ranges = address.json_schema_extra()
    assert [point for first, last in ranges for point in range(first, last + 1)] == allowed


@given(address_like)
@example('"a\\é"@example.net')  # a quoted pair is ASCII only
@example("a@[\u00a0]")  # white space beyond ASCII is no literal
@example("jürgen@bücher.example")
def test_the_utf8_mailbox_pattern_matches_what_the_listing_pattern_matched(text: str) -> None:
    assert _spans(address._MAILBOX_UTF8.fullmatch(text)) == _spans(LISTED_UTF8.fullmatch(text))


@given(address_like)
@example("jürgen@bücher.example")
@example("a\u00adb@example.net")
@example("a@\U0001f600.example")
@example("")
@example("PostMaster")
@example('"postmaster"')
def test_the_inject_address_patterns_take_what_the_openapi_document_says(text: str) -> None:
    assert len(compose.SCHEMA_PATTERNS) == 3  # an address, a sender ("" too), a recipient (postmaster too)
    for validated, documented in compose.SCHEMA_PATTERNS.items():
        assert bool(re.search(validated, text)) == bool(re.search(documented, text))
