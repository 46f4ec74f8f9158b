"""`imap_responses` on its own: bytes in, responses and FETCH data out, however the socket
cuts them; and a server's broken FETCH is `MalformedResponse`, never another exception."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.inbound.imap_responses import (
    MAX_SEARCH_UIDS,
    FetchData,
    MalformedResponse,
    Response,
    ResponseReader,
    canonical,
    esearch_uids,
    fetch_data,
)

# A server's answers as Dovecot, Gmail and others shape them: the usual ones, items in another
# order, extra items (MODSEQ, labels with quoted strings and literals), sections and partials.
_ANSWER = (
    b"* 1 FETCH (UID 11 FLAGS (\\Seen $Label) BODY[] {5}\r\nhello)\r\n"
    b"* 2 EXISTS\r\n"
    b"* 2 FETCH (FLAGS () UID 12 RFC822.SIZE 33 MODSEQ (7))\r\n"
    b'* 3 FETCH (X-GM-LABELS ("\\\\Inbox" "a \\"b\\"" {2}\r\nxy) UID 13 BODY[]<0> {3}\r\nabc FLAGS (\\Recent))\r\n'
    b"* 4 FETCH (UID 14 BODY[HEADER.FIELDS (FROM)] NIL BODY[] NIL)\r\n"
    b"* 5 FETCH (UID 15 BINARY[] ~{4}\r\n\x00\x01\r\n)\r\n"
    b"* 6 FETCH (FLAGS (\\Deleted))\r\n"
    b"+ idling\r\n"
    b"* 7 FETCH (UID 17 RFC822 {0}\r\n)\r\n"
    b"A12 OK Fetch completed.\r\n"
)
_EXPECTED = [
    FetchData(1, 11, ("\\Seen", "$Label"), None, b"hello"),
    Response((b"* 2 EXISTS",), ()),
    FetchData(2, 12, (), 33, None),
    FetchData(3, 13, ("\\Recent",), None, b"abc"),
    FetchData(4, 14, None, None, b""),
    FetchData(5, 15, None, None, b"\x00\x01\r\n"),
    FetchData(6, None, ("\\Deleted",), None, None),
    Response((b"+ idling",), ()),
    FetchData(7, 17, None, None, b""),
    Response((b"A12 OK Fetch completed.",), ()),
]


def _read(data: bytes, cuts: list[int], *, fetch: bool = True) -> list[Response | FetchData]:
    reader = ResponseReader()
    events: list[Response | FetchData] = []
    edges = [0, *sorted(c for c in cuts if 0 < c < len(data)), len(data)]
    for start, stop in itertools.pairwise(edges):
        reader.receive_data(data[start:stop])
        while (event := reader.next_event(fetch=fetch)) is not None:
            events.append(event)
    return events


def test_fetch_responses_are_read_whatever_their_items_and_others_come_whole() -> None:
    assert _read(_ANSWER, []) == _EXPECTED


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, len(_ANSWER) - 1), max_size=30))
def test_the_same_events_however_the_socket_cuts_the_bytes(cuts: list[int]) -> None:
    assert _read(_ANSWER, cuts) == _EXPECTED


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, len(_ANSWER) - 1), max_size=30))
def test_without_fetch_every_response_comes_back_as_the_server_sent_it(cuts: list[int]) -> None:
    # What aioimaplib is handed when no FETCH of Pigeon's own is under way: the same bytes.
    events = _read(_ANSWER, cuts, fetch=False)
    assert all(isinstance(event, Response) for event in events)
    assert b"".join(event.raw() for event in events if isinstance(event, Response)) == _ANSWER


_FLAG = st.sampled_from([b"\\Seen", b"\\Recent", b"$Label", b"$PigeonNode_a-1", b"\\Deleted", b"~k"])
_ITEMS = st.permutations(["uid", "flags", "size", "body", "modseq"])


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 10**9),
    st.lists(_FLAG, max_size=4),
    st.integers(0, 10**7),
    st.binary(max_size=300),
    _ITEMS,
    st.lists(st.integers(1, 400), max_size=6),
)
def test_any_order_of_the_items_reads_the_same(
    uid: int, flags: list[bytes], size: int, body: bytes, order: list[str], cuts: list[int]
) -> None:
    # The fast path (the usual shapes) and the general reader must agree on every shape.
    parts = {
        "uid": b"UID %d" % uid,
        "flags": b"FLAGS (" + b" ".join(flags) + b")",
        "size": b"RFC822.SIZE %d" % size,
        "body": b"BODY[] {%d}\r\n" % len(body) + body,
        "modseq": b"MODSEQ (12)",
    }
    data = b"* 9 FETCH (" + b" ".join(parts[name] for name in order) + b")\r\n"
    decoded = tuple(flag.decode() for flag in flags)
    assert _read(data, cuts) == [FetchData(9, uid, decoded, size, body)]


_CASES = st.sampled_from([bytes.lower, bytes.upper, bytes.title, bytes.swapcase])


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 10**9),
    st.lists(_FLAG, max_size=4),
    st.integers(0, 10**7),
    st.binary(max_size=300),
    _ITEMS,
    st.lists(st.integers(1, 400), max_size=6),
    st.lists(_CASES, min_size=6, max_size=6),
)
def test_a_fetch_response_reads_the_same_whatever_the_case_of_its_names(
    uid: int, flags: list[bytes], size: int, body: bytes, order: list[str], cuts: list[int], cases: list[Any]
) -> None:
    # Found from outside: "* 1 fetch (UID 1 RFC822.SIZE 123 FLAGS ())" was dropped unread, and
    # the mailbox went round for ever (search, sizes, nothing to fetch). Names are
    # case-insensitive (RFC 3501 9); flags and the body keep theirs.
    fetch, uid_name, flags_name, size_name, body_name, modseq = (
        case(name)
        for case, name in zip(cases, (b"FETCH", b"UID", b"FLAGS", b"RFC822.SIZE", b"BODY[]", b"MODSEQ"), strict=True)
    )
    parts = {
        "uid": uid_name + b" %d" % uid,
        "flags": flags_name + b" (" + b" ".join(flags) + b")",
        "size": size_name + b" %d" % size,
        "body": body_name + b" {%d}\r\n" % len(body) + body,
        "modseq": modseq + b" (12)",
    }
    data = b"* 9 " + fetch + b" (" + b" ".join(parts[name] for name in order) + b")\r\n"
    decoded = tuple(flag.decode() for flag in flags)
    assert _read(data, cuts) == [FetchData(9, uid, decoded, size, body)]
    assert _read(b"* 9 " + fetch + b" (" + uid_name + b" %d)\r\n" % uid, cuts) == [FetchData(9, uid)]


@pytest.mark.parametrize(
    ("sent", "read"),
    [
        (b"a1 ok [read-write] Select completed", b"a1 OK [READ-WRITE] Select completed"),
        (b"a2 no [authenticationfailed] Bad", b"a2 NO [AUTHENTICATIONFAILED] Bad"),
        (b"a3 Bad unknown", b"a3 BAD unknown"),
        (b"* ok [uidvalidity 7] UIDs valid", b"* OK [UIDVALIDITY 7] UIDs valid"),
        (b"* 3 exists", b"* 3 EXISTS"),
        (b"* 2 Expunge", b"* 2 EXPUNGE"),
        (b"* 1 fetch (flags (\\Seen $Label))", b"* 1 FETCH (flags (\\Seen $Label))"),
        (b"* search 1 2", b"* SEARCH 1 2"),
        (b'* esearch (tag "a1") uid all 1:2', b'* ESEARCH (tag "a1") uid all 1:2'),
        (b"* capability imap4rev1 idle auth=xoauth2", b"* CAPABILITY IMAP4REV1 IDLE AUTH=XOAUTH2"),
        (b"a4 ok [capability imap4rev1 move] Logged in", b"a4 OK [CAPABILITY IMAP4REV1 MOVE] Logged in"),
        (b"* preauth ready", b"* PREAUTH ready"),
        (b"* bye closing", b"* BYE closing"),
        (b"+ idling", b"+ idling"),
        (b"* flags (\\Answered $Label)", b"* FLAGS (\\Answered $Label)"),
    ],
)
def test_a_response_gets_its_names_in_capitals_and_keeps_its_text(sent: bytes, read: bytes) -> None:
    # aioimaplib compares them in capitals: a server's "a1 ok" answered nothing it could tell,
    # its "* capability idle" listed no IDLE.
    assert canonical(sent + b"\r\n") == read + b"\r\n"
    assert canonical(sent + b" {3}\r\nabc)\r\n").endswith(b" {3}\r\nabc)\r\n")  # a literal after: untouched


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=120))
def test_canonical_changes_nothing_but_case_and_says_it_once(response: bytes) -> None:
    for data in (response, b"* " + response, b"* 1 " + response, b"A1 " + response):
        read = canonical(data)
        assert read.lower() == data.lower() and len(read) == len(data)
        assert canonical(read) == read


_RUN = st.tuples(st.integers(1, 2**32 - 1), st.integers(0, 4), st.booleans())  # first UID, more UIDs, "b:a"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_RUN, min_size=1, max_size=30),
    st.randoms(use_true_random=False),
    st.sampled_from([b'ESEARCH (TAG "A1") UID', b'esearch (tag "A1") uid', b"ESEARCH UID", b"ESEARCH"]),
    st.sampled_from([b" ALL ", b" all ", b" MIN 1 ALL ", b" COUNT 9 ALL "]),
)
def test_an_esearch_answer_lists_its_uids_however_its_set_is_written(
    runs: list[tuple[int, int, bool]], shuffle: Any, opening: bytes, result: bytes
) -> None:
    # IMAP4rev2 answers UID SEARCH so (RFC 9051 7.3.4): "* ESEARCH (TAG "A1") UID ALL 2,10:11",
    # its runs in any order, each either way round, overlapping or not.
    parts, expected = [], set()
    for first, more, backwards in runs:
        last = min(first + more, 2**32 - 1)
        expected |= set(range(first, last + 1))
        ends = (last, first) if backwards else (first, last)
        parts.append(b"%d" % first if first == last else b"%d:%d" % ends)
    shuffle.shuffle(parts)
    assert esearch_uids(opening + result + b",".join(parts), "A1") == sorted(expected)


def test_an_esearch_answer_that_found_nothing_or_is_another_commands() -> None:
    assert esearch_uids(b'ESEARCH (TAG "A1") UID', "A1") == []
    assert esearch_uids(b"ESEARCH", "A1") == []
    assert esearch_uids(b'ESEARCH (TAG "A1") UID COUNT 0', "A1") == []
    assert esearch_uids(b'ESEARCH (TAG "B7") UID ALL 1:3', "A1") is None


@pytest.mark.parametrize(
    "response",
    [
        b'ESEARCH (TAG "A1") UID ALL',  # ALL without its set
        b'ESEARCH (TAG "A1") UID ALL 0',  # no UID is 0
        b'ESEARCH (TAG "A1") UID ALL 1:*',
        b'ESEARCH (TAG "A1") UID ALL 1,,2',
        b'ESEARCH (TAG "A1") UID ALL (1)',
        b'ESEARCH (TAG "A1" UID ALL 1',
        b"ESEARCH UID ALL 1:%d" % (MAX_SEARCH_UIDS + 1),  # four billion numbers, made of a few bytes
        b"SEARCH 1 2",
    ],
)
def test_a_broken_esearch_answer_is_malformed(response: bytes) -> None:
    with pytest.raises(MalformedResponse):
        esearch_uids(response, "A1")


@pytest.mark.parametrize(
    "line",
    [
        b"* 1 FETCH (UID x)",  # not a number
        b"* 1 FETCH (UID 1 FLAGS \\Seen)",  # not a list
        b"* 1 FETCH (UID 1",  # no end
        b"* 1 FETCH (UID 1) trailing",  # more after the list
        b"* 1 FETCH (UID)",  # a name without its value
        b"* 1 FETCH UID 1",  # no list
        b'* 1 FETCH (UID 1 X "unterminated)',
        b"* 1 FETCH (BODY[] (1))",  # a body that is a list
        b"* 1 FETCH (UID 1 {99999999999999999999}",  # a literal of 20 digits
    ],
)
def test_a_broken_fetch_response_is_malformed(line: bytes) -> None:
    with pytest.raises(MalformedResponse):
        _read(line + b"\r\n", [])


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(1, 200), max_size=8))
def test_any_bytes_give_responses_or_malformed_never_another_error(noise: bytes, cuts: list[int]) -> None:
    for data in (noise, b"* 1 FETCH (" + noise, b"* 1 FETCH (UID 1 BODY[] {3}\r\n" + noise):
        try:
            _read(data + b"\r\n", cuts)
        except MalformedResponse:
            pass


def test_a_body_cut_mid_literal_is_not_read_before_it_is_whole() -> None:
    reader = ResponseReader()
    reader.receive_data(b"* 1 FETCH (UID 5 BODY[] {10}\r\n01234")
    assert reader.next_event(fetch=True) is None
    reader.receive_data(b"56789)\r\n* 2 EXISTS\r")
    assert reader.next_event(fetch=True) == FetchData(1, 5, None, None, b"0123456789")
    assert reader.next_event(fetch=True) is None  # "* 2 EXISTS\r": its LF is still to come
    reader.receive_data(b"\n")
    assert reader.next_event(fetch=True) == Response((b"* 2 EXISTS",), ())


def test_a_big_body_in_many_chunks_is_not_copied_again_with_each_chunk() -> None:
    # The buffer holds what came since the last response was read, not the whole body so
    # far: 20 MB in 64 KB chunks would otherwise be copied 300 times over.
    body = bytes(range(256)) * (20 * 4096)
    data = b"* 1 FETCH (UID 5 BODY[] {%d}\r\n" % len(body) + body + b")\r\n"
    reader = ResponseReader()
    events: list[Response | FetchData] = []
    for start in range(0, len(data), 65536):
        reader.receive_data(data[start : start + 65536])
        assert len(reader._buffer) <= 65536 + 64
        while (event := reader.next_event(fetch=True)) is not None:
            events.append(event)
    assert events == [FetchData(1, 5, None, None, body)]


def test_fetch_data_of_a_response_that_is_no_fetch_is_none() -> None:
    assert fetch_data(Response((b"* 3 EXISTS",), ())) is None
    assert fetch_data(Response((b"A1 OK FETCH done",), ())) is None
