"""The message state machine: where every active message is, who may move it, and leases.

    scheduled --route found--> ready --taken--> in_flight --attempt reported--> settling
        |                        |  <--given back--  |                              |
        +------------------------+-------------------+--> settling --committed--> scheduled (back in
                                                                                 the spool, due later)
                                                          or delivered / bounced / expired / admin_bounced

    ready --moved to another ready queue (a reload changed which domains have their own)--> ready
    ready, or in_flight not begun --a reload changed its route: routed again--> scheduled

A message is in exactly one state and carries a generation, a number drawn afresh from one
counter at every transition (and when the message is loaded), so `(id, generation)` names
one state of one message for the whole life of the process, across reloads.

Only `pigeon.queue` moves messages, and always through `transition()`. Work that leaves the
queue and comes back later (a route lookup, a delivery attempt) takes a `Lease`: the id and
generation at the moment it started. The queue applies the result only while the lease is
current (`ActiveSet.current`); otherwise someone else moved the message meanwhile (an
operator's rebind, say), and the result is dropped and counted. A caller never reads the
generation when it *finishes*: that was the first build's race.

`settling` is the time between an outcome and its durable commit. Nothing acts on a settling
message; an admin operation waits for the commit (`ActiveSet.settled`) and acts on what it
left in the spool. Terminal states are reached only from `settling`, once the commit is done.

Only *active* messages are in memory: those loaded because they are due (or claimed by an
admin operation), until they settle. Deferred mail stays in the spool, indexed by due time.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple

import msgspec

from pigeon.message import AfterAttempt, Envelope, Message, RebindAfterAttempt, SpoolId, format_id
from pigeon.queue.names import queue_parts

if TYPE_CHECKING:
    from pigeon.queue.ready import ReadyQueue

_log = logging.getLogger(__name__)


class State(enum.Enum):
    SCHEDULED = "scheduled"  # loaded, its destination not known yet (a route lookup may be out)
    READY = "ready"  # in a ready queue, waiting for a connection
    IN_FLIGHT = "in_flight"  # leased to a delivery agent
    SETTLING = "settling"  # an outcome is being made durable: nobody else acts on it
    DELIVERED = "delivered"
    BOUNCED = "bounced"
    EXPIRED = "expired"
    ADMIN_BOUNCED = "admin_bounced"

    __hash__ = object.__hash__  # members are singletons: hash by identity, in C

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL: Final = frozenset({State.DELIVERED, State.BOUNCED, State.EXPIRED, State.ADMIN_BOUNCED})
IN_MEMORY: Final = tuple(state.value for state in State if state not in _TERMINAL)
"""The states a message in memory can be in (a terminal one leaves memory as it reaches it):
`pigeon_active_messages{state}` has a sample for each, 0 when none holds a message."""

# Which state may follow which. Looking the move up is the validation; a move nobody makes is
# not in the table.
_MOVES: Final[dict[State, frozenset[State]]] = {
    State.SCHEDULED: frozenset({State.READY, State.SETTLING}),
    # READY -> READY: moved to another ready queue (a reload gave its domain a queue of its
    # own, or took it away); the new generation makes any lease on where it was stale.
    # READY or IN_FLIGHT (not begun) -> SCHEDULED: a reload changed its [[route]], so the
    # ready queue it was in (site, TLS policy) is no longer its: it is routed again.
    State.READY: frozenset({State.SCHEDULED, State.READY, State.IN_FLIGHT, State.SETTLING}),
    # IN_FLIGHT -> READY: taken but given back untried (the connection died before it was sent).
    State.IN_FLIGHT: frozenset({State.SCHEDULED, State.READY, State.SETTLING}),
    # SETTLING -> SCHEDULED: recipients remain; the entry leaves memory, its row is due later.
    State.SETTLING: frozenset({State.SCHEDULED, *_TERMINAL}),
}


class StaleTransition(Exception):
    """The message was not in the state/generation the caller saw: someone else moved it."""


class Lease(NamedTuple):
    """The right to report back on one message: its id and the generation the work started at.
    (A named tuple: one is made for every attempt, and it is immutable.)"""

    id: SpoolId
    generation: int

    def __str__(self) -> str:
        return f"{format_id(self.id)}@{self.generation}"


@dataclass(frozen=True, slots=True)
class AdminMark:
    """An operator bounced (or held) a message while its attempt was on the wire: what that
    attempt does not deliver ends with `AdminBounce` instead of being retried (or is held, with
    `AdminHold`: `Entry.admin_hold`); its row carries it too (`Envelope.after_attempt`), so a
    stop or a crash before the attempt ends does not lose it. Also what an operator's hold of a
    message not being sent is made with (`Settlement.hold`). `bound_to`: the tenants of the
    token that asked, sorted (None: unbound, the operator), which a hold keeps
    (`Envelope.hold_bound_to`)."""

    reason: str
    operator: str
    bound_to: tuple[str, ...] | None = None

    @staticmethod
    def of(pending: AfterAttempt) -> AdminMark:
        """The mark a row's `after_attempt` was written from."""
        bound = tuple(pending.bound_to) if pending.bound_to is not None else None
        return AdminMark(pending.reason, pending.operator, bound)


@dataclass(frozen=True, slots=True)
class RebindMark:
    """An operator rebound a message: to the scheduled queue `queue` and/or to be routed as
    `routing_domain` ("" routes it by its recipients' domain again); None leaves either as it is.
    On a message whose attempt is on the wire, it applies to what that attempt leaves.
    Mail of an `[[inbound]]` route keeps its target, to which no route applies: a rebind
    leaves such mail alone and a policy's `Reroute` of it is not carried out, so this is only
    a guard behind them (what a mark does to it is said in `pigeon.queue.admin`)."""

    queue: str | None
    routing_domain: str | None
    operator: str = ""  # who asked (the API token's name), and in which operation: for its records
    operation: str | None = None

    @staticmethod
    def of(pending: RebindAfterAttempt) -> RebindMark:
        """The mark a row's `rebind_after_attempt` was written from."""
        return RebindMark(pending.queue, pending.routing_domain, pending.operator, pending.operation)

    def written(self) -> RebindAfterAttempt:
        """This mark as a row carries it (`Envelope.rebind_after_attempt`)."""
        return RebindAfterAttempt(self.queue, self.routing_domain, self.operator, self.operation)

    def then(self, later: RebindMark) -> RebindMark:
        """This rebind followed by `later`, as one: where `later` names a queue or a route, it
        wins; what it leaves as it is stays as this one moved it. Its operator and operation
        are `later`'s (the record written names the last asker)."""
        queue = later.queue if later.queue is not None else self.queue
        routing = later.routing_domain if later.routing_domain is not None else self.routing_domain
        return RebindMark(queue, routing, later.operator, later.operation)

    def envelope(self, envelope: Envelope) -> Envelope:
        """`envelope` as the rebind leaves it: routed as `routing_domain`, and, moved to a
        `campaign:tenant@domain` queue, of that tenant and campaign (a part the name leaves out
        is none), so that what `pigeon inspect` and the policy hooks say of it agree with its
        queue, which admin selectors match (`Selector.matches`). A queue named without a domain
        part (`parking`) says no tenant or campaign: they stay as they were. (Its DKIM
        signatures, made at reception, stay too.)"""
        if envelope.target is not None:
            return envelope
        changes: dict[str, str | None] = {}
        if self.routing_domain is not None:
            changes["routing_domain"] = self.routing_domain or None
        parts = None if self.queue is None else queue_parts(self.queue)
        if parts is not None:
            # One of the two is always named (`queue_parts`): the routing headers, which come
            # off on the way out while either is set (`delivery.content.edited`), still do.
            changes["tenant"], changes["campaign"] = parts[0] or None, parts[1] or None
        return msgspec.structs.replace(envelope, **changes) if changes else envelope


class Entry:
    """An active message: the spool row, plus where it is. Fields change only in `pigeon.queue`."""

    __slots__ = (
        "_waiters",
        "active",
        "admin_bounce",
        "admin_hold",
        "generation",
        "message",
        "ready",
        "rebind",
        "site",
        "source",
        "started",
        "state",
    )

    def __init__(self, message: Message, generation: int) -> None:
        self.message = message
        self.state = State.SCHEDULED
        self.generation = generation
        self.site: str | None = None  # the ready queue's site, once resolved
        self.source: str | None = None  # the [[source]] of its ready queue (None: the implicit one)
        self.ready: ReadyQueue | None = None  # the ready queue holding it while READY
        self.started = False  # IN_FLIGHT: the agent has begun sending it (no admin step can take it back)
        self.admin_bounce: AdminMark | None = None
        self.admin_hold: AdminMark | None = None  # held while on the wire: what the attempt leaves is held
        self.rebind: RebindMark | None = None
        self.active = True  # False once it left memory (settled)
        self._waiters: list[asyncio.Future[None]] | None = None

    @property
    def id(self) -> SpoolId:
        return self.message.id

    def __repr__(self) -> str:
        return f"<Entry {format_id(self.id)} {self.state.value}@{self.generation}>"


_generations = itertools.count(1)


def transition(entry: Entry, expected: State, generation: int, to: State) -> int:
    """Move `entry` from `expected` (at `generation`) to `to`; returns the new generation.

    Raises `StaleTransition` if the entry is not where the caller saw it, and `ValueError` for
    a move the state machine does not have.
    """
    if entry.state is not expected or entry.generation != generation or not entry.active:
        raise StaleTransition(f"message {entry!r} is not {expected.value}@{generation}")
    allowed = _MOVES.get(expected)
    if allowed is None or to not in allowed:
        raise ValueError(f"no move from {expected.value} to {to.value}")
    if expected is State.READY and entry.ready is not None:
        entry.ready.left(entry)
    entry.state = to
    entry.generation = next(_generations)
    if to is not State.IN_FLIGHT:
        entry.started = False
    return entry.generation


class ActiveSet:
    """The messages in memory, by spool id; the keeper of leases.

    The scheduler (and an admin operation claiming a message) adds; settlement removes, once
    the outcome is durable. Bodies may come along (fresh mail, from the intake) within
    `body_budget` bytes in all; past it, they are dropped and read from the spool when needed.
    """

    __slots__ = ("_entries", "body_budget", "body_bytes", "due_again", "limit", "stale_results")

    def __init__(self, limit: int, body_budget: int = 64 * 1024 * 1024) -> None:
        self._entries: dict[int, Entry] = {}
        self.limit = limit
        self.body_budget = body_budget
        self.body_bytes = 0
        self.stale_results: dict[str, int] = {}
        """Results dropped because their lease was stale, by step (for /metrics)."""
        self.due_again: float | None = None
        """The earliest due time of a message that left memory already due (the scheduler
        reads from there again: its watermark may be past that row)."""

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
            raise ValueError(f"message {format_id(message.id)} is already active")
        if message.data is not None:
            if self.body_bytes + len(message.data) > self.body_budget:
                message.data = None
            else:
                self.body_bytes += len(message.data)
        entry = Entry(message, next(_generations))
        self._entries[message.id] = entry
        return entry

    def get(self, spool_id: int) -> Entry | None:
        return self._entries.get(spool_id)

    # --- leases ----------------------------------------------------------------------------
    @staticmethod
    def lease(entry: Entry) -> Lease:
        return Lease(entry.id, entry.generation)

    def current(self, lease: Lease, step: str) -> Entry | None:
        """The entry while `lease` is current; otherwise None, and the result is counted stale."""
        entry = self._entries.get(lease.id)
        if entry is not None and entry.generation == lease.generation:
            return entry
        self.stale_results[step] = self.stale_results.get(step, 0) + 1
        _log.debug("stale %s result for %s dropped (now %r)", step, lease, entry)
        return None

    def begin(self, lease: Lease) -> Message | None:
        """An agent is about to send this IN_FLIGHT message: from now on no admin step takes it
        back. None if the lease is stale (an operator acted on it first): do not send it."""
        entry = self.current(lease, "attempt")
        if entry is None or entry.state is not State.IN_FLIGHT:
            return None
        entry.started = True
        return entry.message

    # --- leaving -----------------------------------------------------------------------------
    def finish(self, entry: Entry, to: State, due: float | None = None, now: float = 0.0) -> None:
        """A SETTLING entry's outcome is durable: it goes to `to` and leaves memory. `due` is
        its row's next due time when recipients remain."""
        transition(entry, State.SETTLING, entry.generation, to)
        if due is not None and due <= now:
            self.due_again = due if self.due_again is None else min(self.due_again, due)
        if self._entries.get(entry.id) is entry:
            del self._entries[entry.id]
            data = entry.message.data
            if data is not None:
                self.body_bytes -= len(data)
                entry.message.data = None
        entry.active = False
        waiters, entry._waiters = entry._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def settled(self, entry: Entry) -> asyncio.Future[None]:
        """Resolves once `entry` has left memory (its settlement is durable)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not entry.active:
            future.set_result(None)
        else:
            if entry._waiters is None:
                entry._waiters = []
            entry._waiters.append(future)
        return future
