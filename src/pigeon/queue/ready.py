"""Ready queues: messages whose destination is known, waiting for a connection.

One ready queue per egress path `source->site`. A site is a destination's set of MX hosts
(or its static next hop, or an application's target), so domains hosted together share one
queue and one set of limits, except a domain that a `[[shaping]]` block names (`owns`): it
gets a queue of its own, `source->domain@site`, and its block's limits (see
`pigeon.shaping.rules`). A reload that changes which domains those are moves what waits to
the queue it now belongs in (`rehome`), and an empty queue left idle for its `idle_timeout`
is forgotten (`forget_idle`), so per-domain queues do not pile up.

The source is the `[[source]]` the message was given as it was made ready
(`pigeon.delivery.egress`), or the implicit one (`source` None, named after `[delivery] source`):
each source has its own queue, connections and limits for a site.

A dispatcher takes from the front and gets a `Lease` (the message moves READY -> IN_FLIGHT);
it reports the attempt with that lease, or gives the message back untried. Whoever else moves
a message out of READY (expiry, an admin operation) does it through `transition()`, which tells
the queue; the entry stays in the deque and is skipped when it comes up, so removing one is
O(1) and `len()` counts only the messages really waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from pigeon.queue.names import ready_queue
from pigeon.queue.state import ActiveSet, Entry, Lease, State, transition


class ReadyQueue:
    __slots__ = (
        "_active",
        "_clock",
        "_entries",
        "_live",
        "_waiters",
        "destination",
        "domain",
        "egress",
        "own",
        "path",
        "source",
        "touched",
    )

    def __init__(
        self,
        path: str,
        destination: Any,
        active: ActiveSet,
        domain: str = "",
        source: str | None = None,
        *,
        own: bool = False,
        egress: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.source = source  # the [[source]] its connections leave from; None: the implicit one
        # Its source's path to the site, `source->site`, whatever the domain or TLS policy of the
        # queue: what a provider's answer about the sending address holds (a reaction's `source`).
        self.egress = egress or path
        # The delivery room's pigeon.delivery.routes.Destination: opaque here but for `site`.
        self.destination = destination
        # Its domain (own) or the domain whose mail opened it (shared: shaped by the catch-all).
        self.domain = domain
        self.own = own  # the queue of `domain` alone, not the site's shared one
        self._active = active
        self._entries: deque[Entry] = deque()
        self._live = 0
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._clock = clock
        self.touched = clock()  # when a message last came or went (see `forget_idle`)

    @property
    def site(self) -> str:
        site: str = self.destination.site
        return site

    def __len__(self) -> int:
        return self._live

    def __iter__(self) -> Iterator[Entry]:
        # A message moved away and back (two reloads) is in the deque twice: listed once.
        seen: set[int] = set()
        live = []
        for e in self._entries:
            if e.ready is self and e.state is State.READY and e.id not in seen:
                seen.add(e.id)
                live.append(e)
        return iter(live)

    # --- the queue's side ---------------------------------------------------------------
    def put(self, entry: Entry, *, front: bool = False) -> None:
        """A message that just became READY."""
        entry.ready = self
        self._live += 1
        self.touched = self._clock()
        if front:
            self._entries.appendleft(entry)
        else:
            self._entries.append(entry)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)
                break

    def left(self, entry: Entry) -> None:
        """`entry` left READY (taken, expired, or moved by an operator)."""
        if entry.ready is self:
            entry.ready = None
            self._live -= 1
            self.touched = self._clock()

    def expired(self, is_expired: Callable[[Entry], bool]) -> list[Entry]:
        """The READY messages for which `is_expired` is true (the caller settles them)."""
        return [entry for entry in self if is_expired(entry)]

    # --- the dispatcher's side -------------------------------------------------------------
    def take_nowait(self) -> Lease | None:
        """The next message, leased (now IN_FLIGHT), or None if none waits."""
        entries = self._entries
        while entries:
            entry = entries.popleft()
            if entry.ready is self and entry.state is State.READY:
                transition(entry, State.READY, entry.generation, State.IN_FLIGHT)
                return ActiveSet.lease(entry)
        return None

    async def take(self, idle: float) -> Lease | None:
        """The next message, or None after `idle` seconds with none (or on `wake_all()`)."""
        lease = self.take_nowait()
        if lease is not None or idle <= 0:
            return lease
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

    def give_back(self, lease: Lease) -> None:
        """A message taken but not sent (not begun): it goes back to the front, untried."""
        entry = self._active.current(lease, "give back")
        if entry is None or entry.state is not State.IN_FLIGHT or entry.started:
            return
        transition(entry, State.IN_FLIGHT, entry.generation, State.READY)
        self.put(entry, front=True)

    def wake_all(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(True)  # timed out


def _owns_none(domain: str) -> bool:
    return False


def _no_idle_timeout(queue: ReadyQueue) -> float | None:
    return None


def _forget_quietly(queue: ReadyQueue) -> None:
    return None


class ReadyQueues:
    """Every ready queue of this worker, by path. Tells the dispatcher when one has work.

    `owns(domain)`: whether a domain's mail gets a queue of its own (`ShapingRules.owns_queue`).
    `idle_timeout(queue)`: how long the dispatcher lets an empty queue be before it is
    forgotten; None keeps it (connections open on it, a shaping effect names it, its site is
    down or suspended).
    `on_forget(queue)`: the dispatcher lets go of a forgotten queue's lane.
    """

    def __init__(
        self,
        active: ActiveSet,
        source: str,
        on_work: Callable[[ReadyQueue], None],
        *,
        owns: Callable[[str], bool] = _owns_none,
        idle_timeout: Callable[[ReadyQueue], float | None] = _no_idle_timeout,
        on_forget: Callable[[ReadyQueue], None] = _forget_quietly,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._active = active
        self._source = source
        self._on_work = on_work
        self._owns = owns
        self._idle_timeout = idle_timeout
        self._on_forget = on_forget
        self._clock = clock
        self._queues: dict[str, ReadyQueue] = {}

    def __iter__(self) -> Iterator[ReadyQueue]:
        return iter(list(self._queues.values()))

    def __len__(self) -> int:
        return len(self._queues)

    def get(self, path: str) -> ReadyQueue | None:
        return self._queues.get(path)

    def enqueue(self, entry: Entry, destination: Any, source: str | None = None) -> None:
        """Make a SCHEDULED message READY in the queue of its destination's site (or of its
        domain, if that has one of its own), from `source` (None: the implicit source)."""
        queue = self._queue_for(entry, destination, source)
        if queue.destination is not destination and not len(queue):
            queue.destination = destination  # fresher routing (TTL): same site, maybe new hops
        transition(entry, State.SCHEDULED, entry.generation, State.READY)
        entry.site = queue.site
        entry.source = source
        queue.put(entry)
        self._on_work(queue)

    def _queue_for(self, entry: Entry, destination: Any, source: str | None) -> ReadyQueue:
        """The queue `entry` belongs in (made if there is none yet)."""
        envelope = entry.message.envelope
        domain = (envelope.routing_domain or envelope.recipients[0].domain).lower()
        own = self._owns(domain)
        # The TLS policy is part of the queue (`Destination.security`): its connections are
        # opened under it, and mail that requires more must not ride on them.
        source_name = source or self._source
        path = ready_queue(source_name, destination.site, domain if own else None, destination.security)
        queue = self._queues.get(path)
        if queue is None:
            egress = ready_queue(source_name, destination.site)
            queue = self._queues[path] = ReadyQueue(
                path, destination, self._active, domain, source, own=own, egress=egress, clock=self._clock
            )
        return queue

    def rehome(self, owns: Callable[[str], bool]) -> int:
        """From now on `owns` says which domains have a queue of their own (a reload); what
        waits in a queue it no longer belongs in moves, in order, to the one it does: how
        many moved. One synchronous step on the loop, each move a READY -> READY
        `transition()`: no timer tick, admin operation or connection runs in between, and a
        message taken already (in flight, settling) is not here to move; it finds its queue
        through `enqueue` when it is made ready again. Nothing durable changes (a ready
        queue is not stored), so nothing goes through the spool."""
        self._owns = owns
        moved = 0
        woken: dict[str, ReadyQueue] = {}
        for queue in list(self._queues.values()):
            for entry in list(queue):
                target = self._queue_for(entry, queue.destination, queue.source)
                if target is queue or entry.ready is not queue:
                    continue
                transition(entry, State.READY, entry.generation, State.READY)
                target.put(entry)
                moved += 1
                woken[target.path] = target
        for target in woken.values():
            self._on_work(target)
        return moved

    def forget_idle(self) -> list[str]:
        """Forget the empty queues that have been idle for their `idle_timeout`: their paths."""
        now = self._clock()
        forgotten: list[str] = []
        for path, queue in list(self._queues.items()):
            if len(queue):
                continue
            idle_timeout = self._idle_timeout(queue)
            if idle_timeout is None or now - queue.touched < idle_timeout:
                continue
            del self._queues[path]
            self._on_forget(queue)
            forgotten.append(path)
        return forgotten

    def expired(self, is_expired: Callable[[Entry], bool]) -> list[Entry]:
        found: list[Entry] = []
        for queue in self._queues.values():
            if len(queue):
                found += queue.expired(is_expired)
        return found

    def wake_all(self) -> None:
        for queue in self._queues.values():
            queue.wake_all()
