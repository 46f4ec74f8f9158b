"""The message state machine: where every active message is, and the one way to move it.

    scheduled --promote--> ready --take--> in_flight --settle--> scheduled (retry later)
        |                    |                  |                  delivered / bounced / expired
        +--------------------+------------------+--> expired, admin_bounced (any live state)

A message is in exactly one state and carries a generation number, bumped by every
transition. Everything that moves a message (the scheduler's tick, a dispatcher taking
one from a ready queue, the settlement of an attempt, admin operations) does it through
`transition()`, naming the state and generation it saw. If someone else got there first
the state or generation differ, `transition()` raises `StaleTransition`, and the caller
leaves the message alone. This is the race KumoMTA's timer wheel kept hitting (a tick
against a bulk bounce or a flush, two owners of one message), removed by construction:
there is one owner at a time, and changing owner is a compare-and-set.

Only *active* messages are in memory (`ActiveSet`): those the scheduler has loaded because
they are due, until they are settled. Deferred mail stays in the spool, indexed by due
time, so memory grows with what is being worked on, not with the queue.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from pigeon.message import Message, SpoolId


class State(enum.Enum):
    SCHEDULED = "scheduled"  # loaded, waiting for its destination to be resolved
    READY = "ready"  # in a ready queue, waiting for a connection
    IN_FLIGHT = "in_flight"  # a dispatcher is delivering it
    DELIVERED = "delivered"
    BOUNCED = "bounced"
    EXPIRED = "expired"
    ADMIN_BOUNCED = "admin_bounced"

    __hash__ = object.__hash__  # members are singletons: hash by identity, in C

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL: Final = frozenset({State.DELIVERED, State.BOUNCED, State.EXPIRED, State.ADMIN_BOUNCED})

# Which state may follow which. Looking the move up is the validation.
_MOVES: Final[dict[State, frozenset[State]]] = {
    # SCHEDULED -> IN_FLIGHT: an attempt that fails before any connection (no DNS answer).
    State.SCHEDULED: frozenset(
        {State.READY, State.IN_FLIGHT, State.EXPIRED, State.BOUNCED, State.ADMIN_BOUNCED, State.SCHEDULED}
    ),
    State.READY: frozenset({State.IN_FLIGHT, State.SCHEDULED, State.EXPIRED, State.ADMIN_BOUNCED}),
    State.IN_FLIGHT: frozenset(
        {State.SCHEDULED, State.DELIVERED, State.BOUNCED, State.EXPIRED, State.ADMIN_BOUNCED, State.READY}
    ),
}


class StaleTransition(Exception):
    """The message was not in the state/generation the caller saw: someone else moved it."""


@dataclass(slots=True, eq=False)
class Entry:
    """An active message: the spool row, plus where it is and who may move it."""

    message: Message
    state: State = State.SCHEDULED
    generation: int = 0
    site: str | None = None  # the ready queue's site, once resolved
    settled: bool = False  # left the active set (its final spool write is durable)
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def id(self) -> SpoolId:
        return self.message.id


def transition(entry: Entry, expected: State, generation: int, to: State) -> int:
    """Move `entry` from `expected` (at `generation`) to `to`; returns the new generation."""
    if entry.state is not expected or entry.generation != generation:
        raise StaleTransition(
            f"message {entry.id:016x} is {entry.state.value}@{entry.generation}, not {expected.value}@{generation}"
        )
    allowed = _MOVES.get(expected)
    if allowed is None or to not in allowed:
        raise ValueError(f"no move from {expected.value} to {to.value}")
    entry.state = to
    entry.generation = generation + 1
    return entry.generation


class ActiveSet:
    """The messages in memory, by spool id. The scheduler adds; settlement removes.

    Bodies may come along (fresh mail, from the intake) within `body_budget` bytes in all;
    past it, they are dropped and read from the spool when needed.
    """

    __slots__ = ("_entries", "body_budget", "body_bytes", "limit")

    def __init__(self, limit: int, body_budget: int = 64 * 1024 * 1024) -> None:
        self._entries: dict[int, Entry] = {}
        self.limit = limit
        self.body_budget = body_budget
        self.body_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, spool_id: int) -> bool:
        return spool_id in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    @property
    def room(self) -> int:
        return max(0, self.limit - len(self._entries))

    def add(self, message: Message) -> Entry:
        if message.id in self._entries:
            raise ValueError(f"message {message.id:016x} is already active")
        if message.data is not None:
            if self.body_bytes + len(message.data) > self.body_budget:
                message.data = None
            else:
                self.body_bytes += len(message.data)
        entry = Entry(message)
        self._entries[message.id] = entry
        return entry

    def get(self, spool_id: int) -> Entry | None:
        return self._entries.get(spool_id)

    def remove(self, entry: Entry) -> None:
        if self._entries.get(entry.id) is entry:
            del self._entries[entry.id]
            data = entry.message.data
            if data is not None:
                self.body_bytes -= len(data)
                entry.message.data = None
        entry.settled = True
