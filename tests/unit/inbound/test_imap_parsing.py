"""An IMAP session's answers parsed from scripted server bytes: no server, no socket.

The session runs on aioimaplib's protocol with Pigeon's parser (`imap._Protocol`); a fake
transport takes what it sends, and the test feeds the server's bytes in chunks as a socket
would cut them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.inbound.imap import FetchUnusable, ImapSession, _Protocol

T = TypeVar("T")


class _Transport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.wrote = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.sent.append(data)
        self.wrote.set()

    def is_closing(self) -> bool:
        return False


def _session(timeout: float = 5.0) -> tuple[ImapSession, _Protocol, _Transport]:
    protocol = _Protocol(asyncio.get_running_loop(), None)
    transport = _Transport()
    protocol.connection_made(transport)
    protocol.state = "SELECTED"
    client = SimpleNamespace(protocol=protocol)
    return ImapSession(client, "INBOX", 1, timeout, asyncio.Event()), protocol, transport


async def _sent(transport: _Transport, count: int) -> list[bytes]:
    """The command lines sent, once there are `count` of them."""
    while len(transport.sent) < count:
        transport.wrote.clear()
        await transport.wrote.wait()
    return transport.sent


async def _converse(command: Callable[[ImapSession], Awaitable[T]], replies: Sequence[Callable[[str], bytes]]) -> T:
    """Run `command` on a fresh session; the server answers each command it sends in turn with
    `replies[i](tag)`."""
    session, protocol, transport = _session()
    task = asyncio.ensure_future(command(session))
    for count, reply in enumerate(replies, start=1):
        sent = await asyncio.wait_for(_sent(transport, count), 5)
        protocol.data_received(reply(sent[count - 1].split(b" ", 1)[0].decode()))
    return await asyncio.wait_for(task, 5)


def _ok(tag: str) -> bytes:
    return f"{tag} OK done\r\n".encode()


async def _answer(
    command: Callable[[ImapSession], Awaitable[T]], reply: Callable[[str], bytes], cuts: Sequence[int] = ()
) -> T:
    """Run `command` on a fresh session; the server answers `reply(tag)`, cut at `cuts`."""
    session, protocol, transport = _session()
    task = asyncio.ensure_future(command(session))
    await transport.wrote.wait()
    tag = transport.sent[-1].split(b" ", 1)[0].decode()
    data = reply(tag)
    edges = [0, *sorted(c for c in cuts if 0 < c < len(data)), len(data)]
    for start, stop in itertools.pairwise(edges):
        protocol.data_received(data[start:stop])
    return await asyncio.wait_for(task, 5)


def _flag_changes(count: int) -> bytes:
    """What the server tells a session about flags other sessions changed meanwhile."""
    return b"".join(b"* %d FETCH (FLAGS (\\Seen))\r\n" % n for n in range(1, count + 1))


async def test_thousands_of_other_sessions_flag_changes_in_one_chunk_do_not_break_the_session() -> None:
    # aioimaplib parses a chunk recursively, a level per line: past ~950 lines it raised
    # RecursionError and the connection was dropped.
    def reply(tag: str) -> bytes:
        sizes = b"".join(b"* %d FETCH (UID %d RFC822.SIZE 5120 FLAGS ())\r\n" % (n, 100 + n) for n in range(1, 101))
        return _flag_changes(3000) + sizes + f"{tag} OK Fetch completed.\r\n".encode()

    sizes = await _answer(lambda session: session.sizes(range(101, 201)), reply)
    assert sizes == {100 + n: 5120 for n in range(1, 101)}


def _bodies(count: int) -> dict[int, bytes]:
    return {
        200 + n: (f"Subject: {n}\r\n\r\n" + "line (with parentheses) {3}\r\n" * (n % 7)).encode() for n in range(count)
    }


def _fetch_reply(bodies: dict[int, bytes], changes: int) -> Callable[[str], bytes]:
    def reply(tag: str) -> bytes:
        out = [_flag_changes(changes)]
        for n, (uid, body) in enumerate(bodies.items(), start=1):
            flags = b"\\Seen $Label" if n % 2 else b""
            out.append(b"* %d FETCH (UID %d FLAGS (%s) BODY[] {%d}\r\n" % (n, uid, flags, len(body)) + body + b")\r\n")
        out.append(f"{tag} OK Fetch completed.\r\n".encode())
        return b"".join(out)

    return reply


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(0, 5), st.lists(st.integers(1, 4000), max_size=40))
def test_fetched_bodies_and_flags_are_the_same_however_the_socket_cuts_the_answer(
    count: int, changes: int, cuts: list[int]
) -> None:
    # (A fetch that finds nothing looks whether the messages are there: a conversation of its
    # own, below.)
    bodies = _bodies(count)

    async def run() -> dict[int, tuple[tuple[str, ...], bytes]]:
        return await _answer(lambda session: session.fetch(list(bodies)), _fetch_reply(bodies, changes), cuts)

    flags = [("\\Seen", "$Label") if n % 2 else () for n in range(1, len(bodies) + 1)]
    assert asyncio.run(run()) == {uid: (flag, body) for (uid, body), flag in zip(bodies.items(), flags, strict=True)}


async def test_a_search_answer_cut_mid_line_is_read_whole() -> None:
    def reply(tag: str) -> bytes:
        uids = b" ".join(b"%d" % n for n in range(1, 2001))
        return b"* SEARCH " + uids + f"\r\n{tag} OK Search completed.\r\n".encode()

    for cut in (5, 100, 7000):
        uids = await _answer(lambda session: session.search("UNSEEN"), reply, [cut, cut + 3])
        assert uids == list(range(1, 2001))


async def test_a_tagged_answer_to_a_command_never_sent_closes_the_connection_instead_of_raising() -> None:
    # Found by fuzzing (tests/fuzz/targets/imap_responses.py): aioimaplib raised Abort out of
    # data_received, which asyncio reports as a fatal "data_received() call failed" traceback.
    session, protocol, transport = _session()
    closed: list[bool] = []
    transport.close = lambda: closed.append(True)  # type: ignore[attr-defined]
    task = asyncio.ensure_future(session.search("UNSEEN"))
    await transport.wrote.wait()
    protocol.data_received(b"2NPEE0 OK done\r\n")  # a tag Pigeon never sent
    assert closed == [True]
    task.cancel()


async def test_an_untagged_response_whose_name_is_not_text_closes_the_connection_instead_of_raising() -> None:
    # Found by fuzzing: aioimaplib decoded the name as UTF-8, and the UnicodeDecodeError
    # escaped from data_received.
    session, protocol, transport = _session()
    closed: list[bool] = []
    transport.close = lambda: closed.append(True)  # type: ignore[attr-defined]
    task = asyncio.ensure_future(session.search("UNSEEN"))
    await transport.wrote.wait()
    protocol.data_received(b"* \x83\xff 1\r\n")
    assert closed == [True]
    task.cancel()


async def test_a_server_that_answers_in_lower_case_is_understood() -> None:
    # Found from outside: "* 1 fetch (UID 1 RFC822.SIZE 123 FLAGS ())" was dropped unread, so
    # nothing was ever fetched, and the mailbox searched, asked for sizes and idled for ever,
    # saying nothing. Names are case-insensitive (RFC 3501 9).
    found = await _answer(
        lambda session: session.search("UNSEEN"), lambda tag: f"* search 3 4\r\n{tag} ok done\r\n".encode()
    )
    assert found == [3, 4]

    def sizes(tag: str) -> bytes:
        first = b"* 1 fetch (uid 3 rfc822.size 10 flags ())\r\n"
        return first + f"* 2 Fetch (Uid 4 Rfc822.Size 20 Flags ($Label))\r\n{tag} ok done\r\n".encode()

    assert await _answer(lambda session: session.describe([3, 4]), sizes) == {3: (10, ()), 4: (20, ("$Label",))}

    def bodies(tag: str) -> bytes:
        return f"* 1 fetch (uid 3 flags (\\Seen) body[] {{5}}\r\nhello)\r\n{tag} ok done\r\n".encode()

    assert await _answer(lambda session: session.fetch([3]), bodies) == {3: (("\\Seen",), b"hello")}


async def test_an_imap4rev2_search_answer_comes_as_esearch() -> None:
    def reply(tag: str) -> bytes:
        other = b'* ESEARCH (TAG "X9") UID ALL 100\r\n'  # another command's, were there one
        return other + f'* ESEARCH (TAG "{tag}") UID ALL 3:5,9\r\n{tag} OK done\r\n'.encode()

    assert await _answer(lambda session: session.search("UNSEEN"), reply) == [3, 4, 5, 9]
    nothing = await _answer(
        lambda session: session.search("UNSEEN"),
        lambda tag: f'* esearch (tag "{tag}") uid\r\n{tag} OK done\r\n'.encode(),
    )
    assert nothing == []


async def test_a_fetch_answer_without_uids_for_messages_still_there_says_so() -> None:
    # A body FETCH response without its UID cannot be told apart from another session's flag
    # change: dropped, it left the mailbox claiming and fetching the same messages for ever.
    def bodies(tag: str) -> bytes:
        return f"* 1 FETCH (FLAGS () BODY[] {{5}}\r\nhello)\r\n{tag} OK done\r\n".encode()

    def still_there(tag: str) -> bytes:
        return f"* SEARCH 3\r\n{tag} OK done\r\n".encode()

    with pytest.raises(FetchUnusable) as raised:
        await _converse(lambda session: session.fetch([3]), [bodies, _ok, still_there])
    assert str(raised.value) == (
        "fetch: the server answered, but with nothing of use for UIDs 3, which are in INBOX: 1 of its FETCH "
        "responses carried BODY[] but no UID, which a UID FETCH must; this server's answers cannot be read"
    )
    with pytest.raises(FetchUnusable, match="UIDs 3:4, which are in INBOX: it sent no FETCH response for them"):
        await _converse(
            lambda session: session.describe([3, 4]),
            [_ok, _ok, lambda tag: f"* SEARCH 3 4\r\n{tag} OK done\r\n".encode()],
        )


async def test_a_fetch_of_messages_gone_meanwhile_finds_nothing_and_says_nothing() -> None:
    # Expunged by another client since the search: looked for (NOOP, then UID SEARCH), not there.
    def one_of_two(tag: str) -> bytes:
        return f"* 1 FETCH (UID 3 FLAGS () BODY[] {{2}}\r\nhi)\r\n{tag} OK done\r\n".encode()

    assert await _converse(lambda session: session.fetch([3, 4]), [one_of_two, _ok, _ok]) == {3: ((), b"hi")}
    assert await _converse(lambda session: session.fetch([4]), [_ok, _ok, _ok]) == {}


async def _trickled(
    command: Callable[[ImapSession], Awaitable[T]], pieces: Sequence[bytes | Callable[[str], bytes]], pause: float
) -> T:
    """Run `command` on a session with a 0.3 s timeout; the server sends `pieces` (a callable is
    given the command's tag), `pause` seconds apart."""
    session, protocol, transport = _session(timeout=0.3)
    task = asyncio.ensure_future(command(session))
    sent = await asyncio.wait_for(_sent(transport, 1), 5)
    tag = sent[0].split(b" ", 1)[0].decode()
    for piece in pieces:
        await asyncio.sleep(pause)
        protocol.data_received(piece(tag) if callable(piece) else piece)
    return await asyncio.wait_for(task, 10)


async def test_an_answer_still_coming_is_waited_for_however_long_it_takes() -> None:
    # Found from outside: the timeout bounded the whole FETCH, so a 20 MB message over a slow
    # link (longer than `timeout` to come) was cut off at every try: never fetched, and the
    # mailbox stalled. Bytes that keep coming are an answer under way.
    body = bytes(range(256)) * 40
    head = b"* 1 FETCH (UID 3 FLAGS () BODY[] {%d}\r\n" % len(body)
    pieces: list[bytes | Callable[[str], bytes]] = [head] + [body[i : i + 512] for i in range(0, len(body), 512)]
    started = time.monotonic()
    fetched = await _trickled(lambda session: session.fetch([3]), [*pieces, b")\r\n", _ok], 0.1)
    assert fetched == {3: ((), body)}
    assert time.monotonic() - started > 2  # ... well past the 0.3 s timeout


async def test_an_answer_that_stops_coming_times_out_after_the_timeout_of_silence() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^fetch: nothing more for 0\.3s \(\d+ bytes came since it was sent\)$"):
        await _trickled(lambda session: session.fetch([3]), [b"* 1 FETCH (UID 3 BODY[] {99}\r\nhal"] * 4, 0.1)
    assert 0.6 < time.monotonic() - started < 2
    with pytest.raises(TimeoutError, match=r"^fetch: no answer within 0\.3s$"):
        await _trickled(lambda session: session.fetch([3]), [], 0)


async def test_a_store_answered_after_a_long_fetch_is_not_timed_out() -> None:
    # An acknowledgement (STORE) sent while the next batch's FETCH streams is answered after it,
    # in order: its wait is the FETCH's, however long.
    session, protocol, transport = _session(timeout=0.3)
    fetching = asyncio.ensure_future(session.fetch([3]))
    flagging = asyncio.ensure_future(session.flag([2], "\\Seen"))
    fetch_line, store_line = await asyncio.wait_for(_sent(transport, 2), 5)
    assert b"UID STORE" in store_line
    fetch_tag, store_tag = (line.split(b" ", 1)[0] for line in (fetch_line, store_line))
    body = b"x" * 2000
    protocol.data_received(b"* 1 FETCH (UID 3 FLAGS () BODY[] {%d}\r\n" % len(body))
    for start in range(0, len(body), 200):
        await asyncio.sleep(0.1)
        protocol.data_received(body[start : start + 200])
    protocol.data_received(b")\r\n" + fetch_tag + b" OK done\r\n" + store_tag + b" OK done\r\n")
    assert await asyncio.wait_for(fetching, 5) == {3: ((), body)}
    await asyncio.wait_for(flagging, 5)
