"""Ready queues: messages whose destination is known, waiting for a connection.

One ready queue per egress path `source->site`. A site is a destination's set of MX hosts
(or its static next hop), so domains hosted together share one queue and one set of
limits. Dispatchers take from the front; whoever moves a message out of READY (expiry, an
admin operation) removes it too, so a ready queue only ever holds READY messages.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from pigeon.queue.state import Entry, State


class ReadyQueue:
    __slots__ = ("_entries", "_waiters", "connections", "destination", "failures", "limiter", "path", "shaping")

    def __init__(self, path: str, destination: Any, shaping: Any, limiter: Any = None) -> None:
        self.path = path
        # The delivery room's objects, opaque here: pigeon.delivery.routes.Destination,
        # pigeon.delivery.dispatcher.Shaping and pigeon.shaping.gcra.Gcra (or None).
        self.destination = destination
        self.shaping = shaping
        self.limiter = limiter
        self.connections = 0  # connection tasks running for this queue
        self.failures = 0  # consecutive failed connection attempts
        self._entries: deque[Entry] = deque()
        self._waiters: deque[asyncio.Future[bool]] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries))

    def put(self, entry: Entry) -> None:
        self._entries.append(entry)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)
                break

    def put_front(self, entry: Entry) -> None:
        """Give back a message taken but not attempted: it keeps its place."""
        self._entries.appendleft(entry)

    def take_nowait(self) -> Entry | None:
        entries = self._entries
        while entries:
            entry = entries.popleft()
            if entry.state is State.READY:
                return entry
        return None

    async def take(self, idle: float) -> Entry | None:
        """The next message, or None after `idle` seconds with none (or on `wake_all()`)."""
        entry = self.take_nowait()
        if entry is not None or idle <= 0:
            return entry
        # A plain timer rather than asyncio.timeout(): connections wait here once per message
        # whenever mail trickles in, and a timeout context costs several times as much.
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(idle, _expire, waiter)
        try:
            timed_out = await waiter
        finally:
            timer.cancel()
            if not waiter.done():
                waiter.cancel()
        return None if timed_out else self.take_nowait()

    def remove_if(self, predicate: Callable[[Entry], bool]) -> list[Entry]:
        """Take out (and return) every message for which `predicate` is true."""
        kept: deque[Entry] = deque()
        removed: list[Entry] = []
        for entry in self._entries:
            (removed if predicate(entry) else kept).append(entry)
        self._entries = kept
        return removed

    def wake_all(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(True)  # timed out
