"""An IMAP session's answers parsed from scripted server bytes: no server, no socket.

The session runs on aioimaplib's protocol with Pigeon's parser (`imap._Protocol`); a fake
transport takes what it sends, and the test feeds the server's bytes in chunks as a socket
would cut them.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.inbound.imap import ImapSession, _Protocol

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


def _session() -> tuple[ImapSession, _Protocol, _Transport]:
    protocol = _Protocol(asyncio.get_running_loop(), None)
    transport = _Transport()
    protocol.connection_made(transport)
    protocol.state = "SELECTED"
    client = SimpleNamespace(protocol=protocol)
    return ImapSession(client, "INBOX", 1, 5.0, asyncio.Event()), protocol, transport


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
@given(st.integers(0, 12), st.integers(0, 5), st.lists(st.integers(1, 4000), max_size=40))
def test_fetched_bodies_and_flags_are_the_same_however_the_socket_cuts_the_answer(
    count: int, changes: int, cuts: list[int]
) -> None:
    bodies = _bodies(count)

    async def run() -> dict[int, tuple[tuple[str, ...], bytes]]:
        return await _answer(lambda session: session.fetch(list(bodies) or [1]), _fetch_reply(bodies, changes), cuts)

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
