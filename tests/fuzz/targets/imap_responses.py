"""IMAP response handling: whatever a server answers to SEARCH, FETCH sizes or FETCH bodies,
cut anywhere, Pigeon's parser (`imap._Protocol`) never raises, and the session's command
returns its result, raises `ImapError`, or waits for more data (a real session times out)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any, Final

import atheris

from pigeon.inbound.imap import ImapError, ImapSession, _Protocol

_COMMANDS: Final = (
    lambda session: session.search("UNSEEN"),
    lambda session: session.sizes([1, 2, 3], unless=["$PigeonFailed"]),
    lambda session: session.fetch([1, 2, 3]),
)
# What servers answer, for the fuzzer to start from and splice.
_SEEDS: Final = (
    b"* SEARCH 1 2 3\r\n",
    b"* 1 FETCH (UID 1 RFC822.SIZE 120 FLAGS (\\Seen))\r\n",
    b"* 2 FETCH (UID 2 BODY[] {5}\r\nhello)\r\n",
    b"* 3 EXISTS\r\n",
)
_LOOP: Final = asyncio.new_event_loop()
logging.getLogger("pigeon.inbound.imap").setLevel(logging.ERROR)  # "broke the protocol", by the thousand


class _Transport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def _run(fdp: atheris.FuzzedDataProvider) -> None:
    protocol = _Protocol(asyncio.get_running_loop(), None)
    transport = _Transport()
    protocol.connection_made(transport)
    protocol.state = "SELECTED"
    session = ImapSession(SimpleNamespace(protocol=protocol), "INBOX", 1, 5.0, asyncio.Event())
    task: asyncio.Future[Any] = asyncio.ensure_future(fdp.PickValueInList(list(_COMMANDS))(session))
    for _ in range(5):
        await asyncio.sleep(0)
    assert transport.sent, "the command was not sent"
    tag = transport.sent[-1].split(b" ", 1)[0]
    data = b"".join(fdp.PickValueInList(list(_SEEDS)) for _ in range(fdp.ConsumeIntInRange(0, 3)))
    data += fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 512))
    if fdp.ConsumeBool():
        data += tag + b" OK done\r\n"
    while data and not transport.closed:
        cut = fdp.ConsumeIntInRange(1, len(data))
        protocol.data_received(data[:cut])  # must never raise
        data = data[cut:]
    for _ in range(5):
        await asyncio.sleep(0)
    if not task.done():
        task.cancel()
    try:
        await task
    except (ImapError, asyncio.CancelledError):
        pass


def check(data: bytes) -> None:
    _LOOP.run_until_complete(_run(atheris.FuzzedDataProvider(data)))
