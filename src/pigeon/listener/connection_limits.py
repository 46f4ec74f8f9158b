"""Concurrent connections per client: `[smtp] max_connections_per_client`, per node.

A client is what the AUTH lockouts count as one (`auth_throttle.client_key`): its IPv4
address, or the /64 of its IPv6 address (one host usually holds the whole /64, so counting
each address would let it open the limit times 2**64); an IPv4-mapped IPv6 address is its IPv4.

`LocalConnections` counts in the worker's memory: right when the node has one worker.
`SharedConnections` counts in the node's client table (`client_table`), so that a client
gets the limit from the node whichever workers the kernel hands its connections to. When the
table has no room for an address (every slot of its window holds open connections: some
thousands of clients at once), that address is counted in the worker alone against its share
of the limit (the limit divided by the workers, at least 1), and a warning says so once.
"""

from __future__ import annotations

import logging
from typing import Final, Protocol

from pigeon.listener.auth_throttle import client_key
from pigeon.listener.client_table import ClientTable

_log = logging.getLogger(__name__)

Held = int
"""Where an admitted connection is counted: its slot in the node's table (so that closing it
needs no look-up: a slot held is never given to another key), or `WORKER`."""
WORKER: Final = -1
"""Counted in this worker alone."""


class ClientConnections(Protocol):
    """Open connections per client address."""

    def open(self, ip: str, limit: int) -> Held | None:
        """Count one more connection from `ip` if fewer than `limit` are open; None if not."""
        ...

    def close(self, ip: str, held: Held) -> None:
        """A connection that `open` counted has ended."""
        ...


class LocalConnections:
    """Connections per client address in this worker's memory."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}  # only clients with open connections: bounded by them

    def open(self, ip: str, limit: int) -> Held | None:
        client = client_key(ip)
        count = self._open.get(client, 0)
        if count >= limit:
            return None
        self._open[client] = count + 1
        return WORKER

    def close(self, ip: str, held: Held) -> None:
        client = client_key(ip)
        left = self._open.get(client, 0) - 1
        if left > 0:
            self._open[client] = left
        else:
            self._open.pop(client, None)

    def count(self, ip: str) -> int:
        """Connections open from `ip`'s client (its /64 for IPv6)."""
        return self._open.get(client_key(ip), 0)


class SharedConnections:
    """Connections per client address for the whole node, in its client table."""

    def __init__(self, table: ClientTable, workers: int) -> None:
        self._table = table
        self._workers = max(1, workers)
        self._overflow = LocalConnections()
        self._warned = False

    def open(self, ip: str, limit: int) -> Held | None:
        table = self._table
        now = self._table.now()
        with table.locked():
            slot = table.find("c:" + client_key(ip), now)
            if slot is not None:
                if table.held(slot) >= limit:
                    return None
                table.hold(slot, now)
                return slot
        if not self._warned:
            self._warned = True
            _log.warning(
                "client table full: connections from %s are counted per worker (its share of the limit)", client_key(ip)
            )
        return self._overflow.open(ip, max(1, limit // self._workers))

    def close(self, ip: str, held: Held) -> None:
        if held == WORKER:
            self._overflow.close(ip, held)
            return
        table = self._table
        with table.locked():
            table.let_go(held)

    def count(self, ip: str) -> int:
        """Connections open from `ip`'s client (its /64 for IPv6) on the node (as far as the table knows)."""
        table = self._table
        with table.locked():
            slot = table.find("c:" + client_key(ip), 0.0, create=False)
            return 0 if slot is None else table.held(slot)
