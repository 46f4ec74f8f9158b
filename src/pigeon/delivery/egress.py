"""Egress sources and pools: which local address (and EHLO name) a message leaves from.

A *source* (`[[source]]`) is a local IP address that outbound connections bind to and the
name they give in EHLO. A *pool* (`[[pool]]`) is a set of sources with weights. A message's
pool is the one its policy hook named (`egress_pool`), else its `[[queue]]`'s, else
`[delivery] pool`; with none, it leaves from the *implicit* source: the address the OS picks
and `[delivery] helo_name`, as before sources existed (its ready queues keep the name
`[delivery] source`, and its limits the keys they always had).

Each time a message is made ready, its pool gives it the next source of a smooth weighted
round-robin (nginx's): every member gains its weight, the one with the most is chosen and
loses the total. Weights 3 and 1 give `a a b a`, over and over: the proportions hold over
any few messages, not only on average as a random draw would. The ready queue is then
`<source>-><site>`, so every source has its own connections and its own limits.

A pool name nobody configured (a policy hook's typo, or a pool removed from the file while
mail for it waited) is a transient failure of the message (`451 4.3.5`), logged once per
name: the mail stays in the spool, is retried on its queue's schedule and goes once the pool
exists, or expires with a DSN at `max_age`. Mail for an application's `[[target]]` does not
leave over SMTP and always takes the implicit source.

Counters are per worker process: each worker's share of a pool's mail is split in the
weights' proportions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pigeon.delivery.routes import Kind
from pigeon.queue.attempt import Unroutable
from pigeon.smtp.replies import Reply

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Source:
    """A `[[source]]`: bind outbound connections to `bind`, say `ehlo` in EHLO."""

    name: str
    bind: str
    ehlo: str


class WeightedRoundRobin:
    """Smooth weighted round-robin over named members (each weight at least 1)."""

    __slots__ = ("_current", "_names", "_total", "_weights")

    def __init__(self, members: Sequence[tuple[str, int]]) -> None:
        if not members or any(weight < 1 for _, weight in members):
            raise ValueError("a weighted round-robin needs members, each with a weight of at least 1")
        self._names = [name for name, _ in members]
        self._weights = [weight for _, weight in members]
        self._current = [0] * len(members)
        self._total = sum(self._weights)

    @property
    def size(self) -> int:
        """How many members it has."""
        return len(self._names)

    def next(self) -> str:
        """The next member: over every `total weight` picks, each member exactly `weight` times."""
        current, weights = self._current, self._weights
        best = 0
        for index in range(len(current)):
            current[index] += weights[index]
            if current[index] > current[best]:
                best = index
        current[best] -= self._total
        return self._names[best]


class Egress:
    """Chooses each message's source from its pool."""

    def __init__(self, pools: dict[str, Sequence[tuple[str, int]]], default_pool: str | None = None) -> None:
        self._pools = {name: WeightedRoundRobin(members) for name, members in pools.items()}
        self._default = default_pool
        self._warned: set[str] = set()

    @classmethod
    def from_config(cls, pools: Iterable[Any], default_pool: str | None) -> Egress:
        """From the `[[pool]]` tables (members are `{source, weight}` tables or bare names)."""
        members: dict[str, Sequence[tuple[str, int]]] = {}
        for pool in pools:
            members[pool.name] = [(m, 1) if isinstance(m, str) else (m.source, m.weight) for m in pool.sources]
        return cls(members, default_pool)

    def choose(self, pool: str | None, destination: Any, down: Callable[[str], bool] | None = None) -> str | None:
        """The source for one message of `pool` (None: the default pool) going to
        `destination`; None means the implicit source. Raises `Unroutable` (a 4xx) for a pool
        that is not configured. `down(source)`: whether that source finds the destination's
        site down; the pool's next member that does not is taken instead (its mail would
        wait for a probe of a path another source reaches now), none skipped if all do."""
        if destination.kind is not Kind.SMTP:
            return None  # an application's target: no SMTP connection to bind
        name = pool or self._default
        if name is None:
            return None
        chooser = self._pools.get(name)
        if chooser is None:
            if name not in self._warned:
                self._warned.add(name)
                _log.warning("mail names the egress pool %r, which is not configured: it waits in the spool", name)
            raise Unroutable(Reply(451, "4.3.5", (f"egress pool {name!r} is not configured ([[pool]])",)))
        chosen = chooser.next()
        if down is None or not down(chosen):
            return chosen
        for _ in range(chooser.size - 1):
            other = chooser.next()
            if not down(other):
                return other
        return chosen
