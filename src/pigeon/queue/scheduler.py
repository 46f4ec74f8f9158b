"""The scheduler: brings messages that fall due from the spool into memory and makes them ready.

Owns the due-time index (the spool's `message_due`) and nothing else. Every tick it reads
the next messages due, in (due, id) order, after a watermark that only moves forward, so
each due message is read once; messages already active are skipped. New mail comes in
directly from the intake (no need to read back what was just written). Memory holds only
the active set, bounded by `max_active`: a million deferred messages cost index pages on
disk, not objects in RAM. Whatever leaves memory already due (a rebind, a retry with no
delay) moves the watermark back to it (`ActiveSet.due_again`).

Making a message ready means applying the operators' standing rules, then resolving its
destination: from the router's cache (no wait, the common case), or through a lookup shared
by every message waiting for that domain. A lookup is work that leaves the queue: each
waiting message holds a `Lease`, and when the answer comes only the messages whose lease is
still current are made ready. One an operator rebound or suspended meanwhile has moved on
(its result is dropped and counted as stale); that is normal, not an error.

The same tick expires what has waited past `max_age` anywhere: at load time, and in the
ready queues (one a reaction's suspension holds there names it: `holding`).

A reload that changes the routes (`reroute`) routes again what waits for a route that
changed, in a ready queue or taken and not begun: a ready queue is a site under a TLS policy,
and its connections must not carry mail whose route now says otherwise. (What of it waits in
the spool for the probe of a site found down is made due by the reload too, through the
admin's retry: `pigeon.node.outbound`, `Admin.retry_waiting_for_probes`.)

A message whose route is reserved for other tenants (`[[route]] tenants`) is not made ready:
it bounces, 550 5.7.1 and a DSN, as mail for a domain that cannot be routed does
(`pigeon.route_tenants`).

Each message made ready is given its egress source (`egress`, `pigeon.delivery.egress`):
from its policy hook's `egress_pool`, else its `[[queue]]`'s `pool` (`pigeon.queue.policy.egress_pool`,
what `pigeon inspect` shows too), else `[delivery] pool`. A pool that does not
exist is a transient failure of that message, like a destination that cannot be resolved.

A held message (mail of an `[[inbound]]` route kept for an operator, due at `HELD`) is loaded
only once an operator made it due: that releases it, and its `max_age` counts from then. Its
due time says when it expires unreleased (`HELD + t`, t from its route's `held_for`; `HELD`
alone: never); the sweep ends those past t, without a DSN. Mail an operator held (`pigeon
hold`: due at `HELD`, never expiring while held) is released the same way, but its `max_age`
still counts from its arrival: past it, it expires as it is loaded, with the usual DSN.

A row an operator held, bounced or rebound while an attempt of it was on the wire, that
attempt cut short by a stop or a crash (`Envelope.after_attempt`, `rebind_after_attempt`), is
held, bounced or moved as it is loaded, before anything else (`Settlement.cut_short`): it is
never attempted again where it was (moved, it is due at once in its new queue, and routed
there as it is loaded again).

Mail of a scheduled queue with a rate (`[[queue]] max_message_rate`) is made ready at that
rate: after the standing rules and before its route, it waits its turn in the `Pacer`
(`pigeon.queue.pacing`), then goes on as any other. What a reload routes again is not paced
twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import msgspec

from pigeon.message import HELD, Message, format_id
from pigeon.queue.attempt import Unroutable
from pigeon.queue.pacing import Pacer, QueueRates
from pigeon.queue.policy import QueuePolicies, egress_pool
from pigeon.queue.ready import ReadyQueues
from pigeon.queue.settlement import Settlement
from pigeon.queue.state import ActiveSet, Entry, Lease, State, transition
from pigeon.route_tenants import reserved_reply
from pigeon.shaping.throttles import Throttles
from pigeon.smtp.replies import Reply
from pigeon.spool.spool import Spool

_log = logging.getLogger(__name__)
_SWEEP_EVERY: Final = 1.0


class Routes(Protocol):
    """Where mail goes (`pigeon.delivery.routes.Router`): a destination has a `site`."""

    def cached(self, domain: str, target: str | None = None) -> Any | None:
        """The destination if known and fresh: no await needed."""

    async def destination(self, domain: str, target: str | None = None) -> Any:
        """Raises `Unroutable` when the domain cannot be resolved."""

    def reserved_for(self, domain: str) -> frozenset[str] | None:
        """The tenants whose mail the route of `domain` is for (`[[route]] tenants`); None: any."""


# Defaults of the scheduler's hooks: plain functions, not lambdas (mypyc compiles this module).
def _intercepts_nothing(entry: Entry) -> bool:
    return False


def _no_egress_pool(pool: str | None, destination: Any) -> str | None:
    return None


def _ignore_lag(seconds: float) -> None:
    return None


def _holds_nothing(entry: Entry) -> str | None:
    return None


class Scheduler:
    def __init__(
        self,
        *,
        spools: Sequence[Spool],
        active: ActiveSet,
        routes: Routes,
        ready: ReadyQueues,
        settlement: Settlement,
        policies: QueuePolicies,
        intercept: Callable[[Entry], bool] = _intercepts_nothing,
        egress: Callable[[str | None, Any], str | None] = _no_egress_pool,
        observe_lag: Callable[[float], None] = _ignore_lag,
        holding: Callable[[Entry], str | None] = _holds_nothing,
        rates: QueueRates | None = None,
        throttles: Throttles | None = None,
        rate_share: int = 1,
        clock: Callable[[], float] = time.time,
        tick: float = 0.25,
        batch: int = 1000,
    ) -> None:
        self._spools = spools
        self._active = active
        self._routes = routes
        self._ready = ready
        self._settlement = settlement
        self._policies = policies
        self._intercept = intercept
        """Standing admin rules (bounce, suspend), asked before a message is routed."""
        self._egress = egress
        """The source of a message of this pool (None: the default) to this destination;
        None is the implicit source. Raises `Unroutable` for a pool that does not exist."""
        self._observe_lag = observe_lag
        """Told, for each message made ready, how long after its due time that was."""
        self._holding = holding
        """What holds a READY message in its ready queue (a reaction's suspension), asked of
        one that expires there: its expiry names it (None: nothing does)."""
        self.pacer = Pacer(
            rates if rates is not None else QueueRates(),
            throttles if throttles is not None else Throttles(),
            self._paced,
            self._live,
            self._put_back,
            clock,
            budget=max(1, active.limit // 2),
            share=rate_share,
        )
        """Mail of the queues with a rate, waiting for its slot (`pigeon.queue.pacing`)."""
        self._clock = clock
        self._tick = tick
        self._batch = batch
        self._watermarks: dict[int, tuple[float, int]] = {spool.shard: (float("-inf"), 0) for spool in spools}
        self._resolving: dict[tuple[str, str | None], list[Lease]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_sweep = 0.0
        self._last_now = float("-inf")
        self._stopped = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="scheduler")

    async def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._task is not None:
            await self._task
        await self.pacer.stop()

    def wake(self) -> None:
        self._wake.set()

    def admit(self, messages: list[Message]) -> None:
        """Freshly stored messages, due now: make them active without reading them back."""
        for index, message in enumerate(messages):
            if self._active.room == 0:
                # The rest will be read from the spool when there is room; the watermark may
                # already be past them (their commit can land after a later-due message was read).
                self.rewind(min(m.due for m in messages[index:]))
                self._wake.set()
                return
            if message.id not in self._active:
                self._promote(self._active.add(message))

    def rewind(self, due: float) -> None:
        """Make the next ticks read again from `due`: a message now due at or after it is not
        missed even if the watermark had moved past (admin "retry now" uses this too)."""
        for shard, (mark, _) in self._watermarks.items():
            if mark >= due:
                self._watermarks[shard] = (due, -1)

    # --- the tick --------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopped:
            try:
                more = self.load()
                now = self._clock()
                if now - self._last_sweep >= _SWEEP_EVERY:
                    self._last_sweep = now
                    self.sweep()
                    self.expire_held()  # one index seek per spool when nothing is due
            except Exception:
                _log.exception("scheduler tick failed")
                more = False
            if more:
                await asyncio.sleep(0)  # more is due: go on, but let the loop breathe
                continue
            self._wake.clear()
            try:
                async with asyncio.timeout(self._tick):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def load(self) -> bool:
        """Read due messages into the active set. True if more may be waiting."""
        more = False
        now = self._clock()
        if now < self._last_now:
            self.rewind(now)  # the clock stepped back: what we read as due may be due again later
        self._last_now = now
        if self._active.due_again is not None:
            self.rewind(self._active.due_again)
            self._active.due_again = None
        for spool in self._spools:
            room = self._active.room
            if room == 0:
                return False
            limit = min(room, self._batch)
            watermark = self._watermarks[spool.shard]
            messages = spool.due(now, watermark, limit)
            if messages:
                last = messages[-1]
                self._watermarks[spool.shard] = (last.due, last.id)
            more = more or len(messages) == limit
            for message in messages:
                if message.id not in self._active:
                    self._promote(self._active.add(message))
        return more

    def sweep(self) -> None:
        """Expire what waited too long in a ready queue; forget ready queues idle and empty."""
        now = self._clock()

        def expired(entry: Entry) -> bool:
            message = entry.message
            return now >= self._policies.for_queue(message.queue).retry.expires(message.age_from)

        for entry in self._ready.expired(expired):
            # Held there by a suspension, it expires saying so, as one a site down kept does.
            self._settlement.expire(entry, held_by=self._holding(entry))
        # (also here, once a second: per-domain queues must not pile up once their mail is gone)
        self._ready.forget_idle()

    def expire_held(self) -> None:
        """End held messages whose route's `held_for` has passed (due between HELD and HELD + now)."""
        now = self._clock()
        for spool in self._spools:
            after = (HELD, (1 << 63) - 1)  # past every row due at HELD itself: those wait for ever
            while (room := min(self._active.room, self._batch)) > 0:
                messages = spool.due(HELD + now, after, room)
                for message in messages:
                    if message.id not in self._active:
                        self._settlement.expire_held(self._active.add(message))
                if len(messages) < room:
                    break
                after = (messages[-1].due, messages[-1].id)

    # --- making ready --------------------------------------------------------------------
    def reroute(self, changed: Callable[[str, str | None], bool]) -> int:
        """The routes changed (a reload): `changed(domain, target)` says, by the key a message
        is routed by, whose mail goes elsewhere now (another next hop, another TLS policy).
        What of it waits in a ready queue, or was taken by a connection and not begun, is
        routed again, as if just loaded: a ready queue's connections were opened under the
        old route (in plaintext, say) and must not carry it. Returns how many.

        One synchronous step: each message moves to SCHEDULED through `transition()`, whose
        new generation makes the taker's lease stale (its `begin` finds the message gone, and
        it gives nothing back), so no connection sends it at the old route and none loses
        it. A message being sent finishes where it is; what it leaves is routed afresh when
        it falls due. Nothing durable changes: a ready queue is not stored."""
        taken = [
            entry
            for entry in self._active
            if entry.state is State.IN_FLIGHT and not entry.started and changed(*_route_key(entry))
        ]
        waiting = [entry for queue in self._ready for entry in queue if changed(*_route_key(entry))]
        moved = taken + waiting  # (those taken were at the front of their queue)
        for entry in moved:
            transition(entry, entry.state, entry.generation, State.SCHEDULED)
            entry.site = entry.source = None
        for entry in moved:
            self._promote(entry, paced=True)  # (its slot of a queue rate was taken when it first came)
        return len(moved)

    def promote(self, entry: Entry) -> None:
        """Route a SCHEDULED message (an operator claimed it, then left it to the queue)."""
        self._promote(entry)

    def _promote(self, entry: Entry, *, paced: bool = False) -> None:
        """Route `entry`'s message and make it ready, unless a standing rule takes it, it has
        expired, or its queue's rate makes it wait first (`paced`: it has had its slot)."""
        message = entry.message
        if message.envelope.after_attempt is not None or message.envelope.rebind_after_attempt is not None:
            self._after_attempt(entry)
            return
        if message.envelope.held is not None:
            # Only an operator makes a held row due (retry, rebind): it is released. The new
            # envelope is written with the message's next settlement; a crash before that
            # leaves it held and due, and it is released again. Released from an operator's own
            # hold (`pigeon hold`), it is as old as it is: past max_age, it expires just below.
            released = message.envelope.released if message.envelope.hold_operator else self._clock()
            envelope = msgspec.structs.replace(
                message.envelope, held=None, hold_operator=None, hold_bound_to=None, released=released
            )
            message.envelope = envelope
        policy = self._policies.for_queue(message.queue)
        if self._clock() >= policy.retry.expires(message.age_from):
            self._settlement.expire(entry)
            return
        if self._intercept(entry):
            return
        rates = self.pacer.rates
        if not paced and rates.any and rates.of(message.queue) is not None:
            self.pacer.hold(message.queue, ActiveSet.lease(entry))
            return
        key = _route_key(entry)
        destination = self._routes.cached(*key)
        if destination is not None:
            self._make_ready(entry, destination)
            return
        waiting = self._resolving.get(key)
        if waiting is not None:
            waiting.append(ActiveSet.lease(entry))
            return
        self._resolving[key] = [ActiveSet.lease(entry)]
        task = asyncio.create_task(self._resolve(key), name=f"resolve {key[0]}")
        self._tasks.add(task)  # a reference, so the task is not collected mid-flight
        task.add_done_callback(self._tasks.discard)

    def _after_attempt(self, entry: Entry) -> None:
        """An operator held, bounced or rebound this message while an attempt of it was on the
        wire, and that attempt left no outcome (a stop cut it before its content went, or the
        process died): what the operator was told is done now, before any other attempt
        (`Settlement.cut_short`: a bounce wins; a hold and a rebind both apply). What an
        attempt delivered is out of the row already (its outcome committed with its records)."""
        envelope = entry.message.envelope
        pending, rebind = envelope.after_attempt, envelope.rebind_after_attempt
        recipients = len(envelope.recipients)
        if pending is not None:
            done = "bounced" if pending.kind == "bounce" else "held"
            _log.warning("admin %s by %s: message %s, whose attempt was cut short (a stop, or a crash), "
                         "%s now: %d recipients", pending.kind, pending.operator, format_id(entry.id), done,
                         recipients)  # fmt: skip
        if rebind is not None and (pending is None or pending.kind != "bounce"):
            _log.warning("admin rebind by %s: message %s, whose attempt was cut short (a stop, or a crash), "
                         "moved now to queue=%s route=%s: %d recipients", rebind.operator, format_id(entry.id),
                         rebind.queue, rebind.routing_domain, recipients)  # fmt: skip
        self._settlement.cut_short(entry)

    def _live(self, lease: Lease) -> bool:
        """Whether `lease` still holds (nobody moved its message meanwhile)."""
        entry = self._active.get(lease.id)
        return entry is not None and entry.generation == lease.generation and entry.state is State.SCHEDULED

    def _put_back(self, lease: Lease, until: float) -> None:
        """A paced message with many before it goes back to the spool, untried, until about
        its slot (`Pacer.hold`): it does not fill the active set meanwhile."""
        entry = self._active.current(lease, "pace")
        if entry is not None and entry.state is State.SCHEDULED:
            self._settlement.defer(entry, until)

    def _paced(self, lease: Lease) -> None:
        """A paced message's slot has come: it goes on to its route, if still where it was."""
        entry = self._active.current(lease, "pace")
        if entry is not None and entry.state is State.SCHEDULED:
            self._promote(entry, paced=True)

    async def _resolve(self, key: tuple[str, str | None]) -> None:
        try:
            destination = await self._routes.destination(*key)
        except Unroutable as failure:
            for lease in self._resolving.pop(key, []):
                self._settlement.unroutable(lease, failure)
            return
        except Exception as error:
            # Not an answer about the domain: a transient failure, so nothing waits in memory
            # for an answer that will not come.
            _log.exception("resolving %s failed", key[0])
            broken = Unroutable(Reply(451, "4.4.3", (f"cannot resolve {key[0]}: {type(error).__name__}",)))
            for lease in self._resolving.pop(key, []):
                self._settlement.unroutable(lease, broken)
            return
        for lease in self._resolving.pop(key, []):
            entry = self._active.current(lease, "route")
            if entry is not None and entry.state is State.SCHEDULED:
                self._make_ready(entry, destination)

    def _make_ready(self, entry: Entry, destination: Any) -> None:
        message = entry.message
        envelope = message.envelope
        if envelope.target is None:
            # A route reserved for other tenants (`[[route]] tenants`) never carries this mail,
            # however it came to it (a rebind, a policy's Reroute, a reload that reserved the
            # route): it bounces, with a DSN, as a domain that cannot be routed does.
            routed = envelope.routing_domain or envelope.recipients[0].domain
            allowed = self._routes.reserved_for(routed)
            if allowed is not None and envelope.tenant not in allowed:
                reply = reserved_reply(routed, (envelope.tenant,), routed=envelope.routing_domain is not None)
                self._settlement.unroutable(ActiveSet.lease(entry), Unroutable(reply))
                return
        # The pool `pigeon inspect` shows (`egress_pool`); `egress` applies [delivery] pool.
        pool, _ = egress_pool(message.envelope, self._policies.for_queue(message.queue), None)
        try:
            source = self._egress(pool, destination)
        except Unroutable as failure:
            self._settlement.unroutable(ActiveSet.lease(entry), failure)
            return
        self._observe_lag(max(0.0, self._clock() - message.due))
        self._ready.enqueue(entry, destination, source)


def route_key(message: Message) -> tuple[str, str | None]:
    """What a message is routed by: its routing domain (its recipients' unless rebound), and
    its [[inbound]] target, if it has one."""
    envelope = message.envelope
    return envelope.routing_domain or envelope.recipients[0].domain, envelope.target


def _route_key(entry: Entry) -> tuple[str, str | None]:
    return route_key(entry.message)
