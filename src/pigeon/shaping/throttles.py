"""Throttles: what the dispatcher asks before it opens a connection and before it sends.

Two questions, per limit key (an opaque string: `site:<site>`, or `provider:<name>` for all
of a provider's sites, `pigeon.shaping.rules`):

* `connect(key, limit)`: may one more connection be opened? A `Hold` if so, given back with
  `disconnect` when the connection ends;
* `admit(key, rate, count)`: book `count` messages at `rate`: the seconds until the last
  of them may go (GCRA, `pigeon.shaping.gcra`).

`LocalThrottles` answers for one node from its table (`pigeon.shaping.table`: in memory for
one worker, in a file shared by the workers for several). `ClusterThrottles`
(`pigeon.shaping.cluster`) answers for every node of a cluster through Redis, and falls back to
this node's share of each limit when Redis cannot be reached.
"""

from __future__ import annotations

import itertools
from typing import Any, Final

from pigeon.shaping.gcra import Rate
from pigeon.shaping.table import MemoryTable, Table

NODE: Final = "node"  # limits hold for this node (no Redis)
CLUSTER: Final = "cluster"  # limits hold for the cluster (Redis answers)
FALLBACK: Final = "fallback"  # Redis does not answer: this node keeps to its share


TURN: Final = 10.0
"""Seconds a connection keeps a full limit's slot while another lane, worker or node waits for
one, before it makes room (`Throttles.keep`): long enough that a connection's set-up (TLS
included) is paid for, short enough that mail in another worker's or node's queue is not held
back until this one's queue drains (a limit of 1 on two workers delayed one shard's mail for
as long as the other had any)."""
WANTED: Final = 1.5
"""Seconds a refused connection counts as waiting (its lane asks again every 0.1 s)."""


class Hold:
    """One connection counted against a key's limit (locally, and in Redis as `member`)."""

    __slots__ = ("key", "member", "released", "since", "yielding")

    def __init__(self, key: str, member: str, since: float = 0.0) -> None:
        self.key = key
        self.member = member
        self.since = since  # when it was opened (the table's clock)
        self.released = False  # told to end (`keep`): over the limit, or the node's share
        self.yielding = False  # told to end (`keep`): its turn is over and another waits


def _ending_key(key: str) -> str:
    """The table's count of `key`'s connections told to end (`Throttles.keep`)."""
    return "ending:" + key


def _yielding_key(key: str) -> str:
    """The table's count of `key`'s connections making room for one waiting (one at a time)."""
    return "yielding:" + key


def _wanted_key(key: str) -> str:
    """The table's mark of a connection for `key` refused for a full limit (`WANTED`)."""
    return "wanted:" + key


class Throttles:
    """Limits for one node, in memory or in its workers' shared table."""

    def __init__(self, table: Table | None = None) -> None:
        self.table: Table = table if table is not None else MemoryTable()
        self._numbers = itertools.count(1)

    @property
    def mode(self) -> str:
        """`NODE`, `CLUSTER` or `FALLBACK` (see above)."""
        return NODE

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        self.table.close()

    async def connect(self, key: str, limit: int) -> Hold | None:
        """A connection for `key` if fewer than `limit` are open, else None (try again later)."""
        if not self.table.acquire(key, limit):
            self._refused(key)
            return None
        return Hold(key, str(next(self._numbers)), self.table.now())

    def _refused(self, key: str) -> None:
        """Note for every worker that a connection for `key` waits for a slot."""
        self.table.mark(_wanted_key(key), self.table.now() + WANTED)

    def keep(self, hold: Hold, limit: int) -> bool:
        """Whether the connection of `hold` may go on to its next message, `limit` being the
        key's connection limit now: a limit lowered (a `limit` reaction, a reload) under what
        the node's workers have open ends as many of them as it must, each after its batch,
        whichever worker holds them. And one that has had its `TURN` while another waits for
        a slot makes room (`Hold.yielding`)."""
        return self._within(hold, limit) and not self._yields(hold)

    def _wanted_here(self, key: str) -> bool:
        """Whether a lane of this node was refused a connection for `key` of late."""
        return self.table.marked(_wanted_key(key))

    def _yields(self, hold: Hold, wanted_elsewhere: bool = False) -> bool:
        """Whether `hold`'s connection makes room now: it has had its turn, another waits (a
        lane of this node, or one elsewhere: `wanted_elsewhere`), and no other connection of
        the node is making room for one already (one at a time: the waiter needs one slot,
        not every connection of its turn closed at once). The turn is looked at first: it
        costs no look-up in the table, which each batch of a connection asks."""
        if self.table.now() - hold.since < TURN:
            return False
        if not (wanted_elsewhere or self._wanted_here(hold.key)):
            return False
        if not self.table.acquire(_yielding_key(hold.key), 1):
            return False
        hold.yielding = True
        return True

    def _within(self, hold: Hold, room: int) -> bool:
        """Whether `hold` may go on while the node keeps to `room` connections of its key. Those
        told to end are counted under the key's ending key in the same table, taken only while
        fewer than the excess: of the workers that see the excess at the same moment, just
        enough end (not every one of them, which would empty the site for a moment)."""
        if hold.released:
            return False
        held = self.table.held(hold.key)
        if held <= room:
            return True  # (the usual case: no need to count those ending)
        ending = _ending_key(hold.key)
        if held - self.table.held(ending) <= room:
            return True
        if not self.table.acquire(ending, held - room):
            return True  # others are ending already: enough of them
        hold.released = True
        return False

    def crowded(self, key: str, limit: int) -> bool:
        """Whether every connection `limit` allows for `key` is open, as far as this node can
        tell (all of its workers' connections): then an idle one should make room, for another
        lane, worker or node may be waiting for a slot."""
        return self.table.held(key) >= limit

    def disconnect(self, hold: Hold) -> None:
        """The connection `hold` was for has ended."""
        self.table.release(hold.key)
        if hold.released:
            self.table.release(_ending_key(hold.key))
        if hold.yielding:
            self.table.release(_yielding_key(hold.key))

    async def admit(self, key: str, rate: Rate, count: int) -> float:
        """Book `count` messages of `key` at `rate`; the seconds to wait before sending them."""
        return self.table.reserve(key, rate, count)

    def health(self) -> dict[str, Any]:
        """What /healthz says about the limits."""
        return {"status": "ok", "mode": self.mode}
