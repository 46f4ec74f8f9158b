"""Canonicalization against RFC 6376's own example, and against dkimpy on random input."""

from __future__ import annotations

import hashlib

from dkim import rfc822_parse
from dkim.canonicalization import Relaxed, Simple
from hypothesis import example, given
from hypothesis import strategies as st

from pigeon.dkim.canonical import (
    BodyHash,
    body_hash,
    header_fields,
    relaxed_header,
    simple_header,
    split_message,
)

# RFC 6376 3.4.5.
EXAMPLE = b"A: X\r\nB : Y\t\r\n\tZ  \r\n\r\n C \r\nD \t E\r\n\r\n\r\n"


def test_the_rfc_example_header_canonicalizes_as_the_rfc_says() -> None:
    head, _ = split_message(EXAMPLE)
    fields = header_fields(head)
    assert [relaxed_header(f) for f in fields] == [b"a:X\r\n", b"b:Y Z\r\n"]
    assert b"".join(simple_header(f) for f in fields) == b"A: X\r\nB : Y\t\r\n\tZ  \r\n"


def test_the_rfc_example_body_canonicalizes_as_the_rfc_says() -> None:
    _, body = split_message(EXAMPLE)
    assert body_hash(body, relaxed=True) == hashlib.sha256(b" C\r\nD E\r\n").digest()
    assert body_hash(body, relaxed=False) == hashlib.sha256(b" C \r\nD \t E\r\n").digest()


def test_an_empty_body_is_nothing_relaxed_and_one_crlf_simple() -> None:
    for body in (b"", b"\r\n", b"\r\n\r\n", b"  \r\n\t\r\n"):
        assert body_hash(body, relaxed=True) == hashlib.sha256(b"").digest()
    for body in (b"", b"\r\n", b"\r\n\r\n"):
        assert body_hash(body, relaxed=False) == hashlib.sha256(b"\r\n").digest()


def test_a_message_without_an_empty_line_is_all_header() -> None:
    assert split_message(b"A: x\r\nB: y\r\n") == (b"A: x\r\nB: y\r\n", b"")
    assert split_message(b"A: x\r\n\r\nbody") == (b"A: x\r\n", b"body")


# Mostly the bytes canonicalization cares about: spaces, tabs, line ends, 8-bit text.
_body = st.lists(
    st.sampled_from([b" ", b"\t", b"\r\n", b"a", b"xyz", b"  ", b"\r\n\r\n", b" \r\n", "é".encode(), b"."]),
    max_size=60,
).map(b"".join)


def _dkimpy(body: bytes, relaxed: bool) -> bytes:
    # What leaves Pigeon ends with a CRLF (the SMTP client adds one), and that is what we hash.
    sent = body if not body or body.endswith(b"\r\n") else body + b"\r\n"
    return hashlib.sha256((Relaxed if relaxed else Simple).canonicalize_body(sent)).digest()


@given(_body, st.booleans())
@example(b"abc  ", True)
@example(b"\r\n \r\n", True)
@example(b"a\r\n\r\n \r\nb", False)
def test_the_body_hash_is_dkimpys(body: bytes, relaxed: bool) -> None:
    assert body_hash(body, relaxed=relaxed) == _dkimpy(body, relaxed)


@given(_body, st.booleans(), st.lists(st.integers(1, 9), min_size=1, max_size=20))
def test_the_body_hash_is_the_same_in_any_pieces(body: bytes, relaxed: bool, sizes: list[int]) -> None:
    hasher = BodyHash(relaxed=relaxed)
    at = 0
    for size in sizes * (len(body) // max(1, sum(sizes)) + 1):
        hasher.update(body[at : at + size])
        at += size
    hasher.update(body[at:])
    assert hasher.digest() == body_hash(body, relaxed=relaxed)


_name = st.sampled_from(["Subject", "FROM", "x-Thing", "To"])
_value = st.lists(st.sampled_from([" ", "\t", "a", "b c", "\r\n ", "\r\n\t", "ü", ":"]), max_size=12).map("".join)


@given(st.lists(st.tuples(_name, _value), min_size=1, max_size=6))
def test_relaxed_and_simple_headers_are_dkimpys(fields: list[tuple[str, str]]) -> None:
    # (dkimpy refuses a space before the colon, which the RFC example above covers.)
    head = "".join(f"{name}:{value}\r\n" for name, value in fields).encode()
    parsed = header_fields(head)
    theirs = [(bytes(n), bytes(v)) for n, v in rfc822_parse(head + b"\r\n")[0]]
    assert [(f.name, f.raw) for f in parsed] == [(n.lower(), n + b":" + v) for n, v in theirs]
    assert [relaxed_header(f) for f in parsed] == [b"%s:%s" % pair for pair in Relaxed.canonicalize_headers(theirs)]
    assert [simple_header(f) for f in parsed] == [b"%s:%s" % pair for pair in Simple.canonicalize_headers(theirs)]
