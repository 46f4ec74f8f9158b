"""`imap_responses` on its own: bytes in, responses and FETCH data out, however the socket
cuts them; and a server's broken FETCH is `MalformedResponse`, never another exception."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.inbound.imap_responses import FetchData, MalformedResponse, Response, ResponseReader, fetch_data

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
