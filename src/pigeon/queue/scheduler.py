"""The scheduler: brings messages that fall due from the spool into memory and makes them ready.

Owns the due-time index (the spool's `message_due`) and nothing else. Every tick it reads
the next messages due, in (due, id) order, after a watermark that only moves forward, so
each due message is read once; messages already active are skipped. New mail comes in
directly from the intake (no need to read back what was just written). Memory holds only
the active set, bounded by `max_active`: a million deferred messages cost index pages on
disk, not objects in RAM.

Making a message ready means resolving its destination (cached per domain: usually no
wait at all) and handing it to the dispatcher's ready queue for that site. The same tick
expires what has waited past `max_age` anywhere: at load time, and in the ready queues.

Every state change goes through `queue.state.transition()`. A message another actor moved
first (an admin operation, say) makes it raise `StaleTransition`; the scheduler then
leaves that message alone. That is normal, not an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final

from pigeon.delivery.dispatcher import Dispatcher
from pigeon.delivery.mx import DnsFailure
from pigeon.delivery.outcome import Attempt
from pigeon.delivery.routes import Destination, Router
from pigeon.message import Message
from pigeon.queue.policy import QueuePolicies
from pigeon.queue.settlement import Settlement
from pigeon.queue.state import ActiveSet, Entry, StaleTransition, State, transition
from pigeon.spool.sqlite import SqliteSpool

_log = logging.getLogger(__name__)
_SWEEP_EVERY: Final = 1.0


class Scheduler:
    def __init__(
        self,
        *,
        spools: list[SqliteSpool],
        active: ActiveSet,
        router: Router,
        dispatcher: Dispatcher,
        settlement: Settlement,
        policies: QueuePolicies,
        clock: Callable[[], float] = time.time,
        tick: float = 0.25,
        batch: int = 1000,
    ) -> None:
        self._spools = spools
        self._active = active
        self._router = router
        self._dispatcher = dispatcher
        self._settlement = settlement
        self._policies = policies
        self._clock = clock
        self._tick = tick
        self._batch = batch
        self._watermarks: dict[int, tuple[float, int]] = {spool.shard: (float("-inf"), 0) for spool in spools}
        self._resolving: dict[str, list[Entry]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_sweep = 0.0
        self._last_now = float("-inf")
        self._stopped = False
        self.observe_lag: Callable[[float], None] | None = None
        """Told, for each message made ready, how long after its due time that was."""
        self.intercept: Callable[[Entry], bool] | None = None
        """Standing admin rules (bounce, suspend), asked before a message is made ready."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="scheduler")

    async def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._task is not None:
            await self._task

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
        """Expire what waited too long in a ready queue."""
        now = self._clock()

        def expired(entry: Entry) -> bool:
            message = entry.message
            return now >= self._policies.for_queue(message.queue).retry.expires(message.created)

        for entry in self._dispatcher.expired(expired):
            self._settlement.expire(entry, State.READY)

    # --- making ready --------------------------------------------------------------------
    def _promote(self, entry: Entry) -> None:
        message = entry.message
        policy = self._policies.for_queue(message.queue)
        if self._clock() >= policy.retry.expires(message.created):
            self._settlement.expire(entry, State.SCHEDULED)
            return
        if self.intercept is not None and self.intercept(entry):
            return
        domain = message.envelope.routing_domain or message.envelope.recipients[0].domain
        destination = self._router.cached(domain)
        if destination is not None:
            self._ready(entry, destination, domain)
            return
        waiting = self._resolving.get(domain)
        if waiting is not None:
            waiting.append(entry)
            return
        self._resolving[domain] = [entry]
        task = asyncio.create_task(self._resolve(domain), name=f"resolve {domain}")
        self._tasks.add(task)  # a reference, so the task is not collected mid-flight
        task.add_done_callback(self._tasks.discard)

    async def _resolve(self, domain: str) -> None:
        try:
            destination = await self._router.destination(domain)
        except DnsFailure as error:
            for entry in self._resolving.pop(domain, []):
                self._failed(entry, error)
            return
        except Exception:
            _log.exception("resolving %s failed", domain)
            self._resolving.pop(domain, None)
            return
        for entry in self._resolving.pop(domain, []):
            self._ready(entry, destination, domain)

    def _ready(self, entry: Entry, destination: Destination, domain: str) -> None:
        try:
            transition(entry, State.SCHEDULED, entry.generation, State.READY)
        except StaleTransition:
            return
        if self.observe_lag is not None:
            self.observe_lag(max(0.0, self._clock() - entry.message.due))
        self._dispatcher.enqueue(entry, destination, domain)

    def _failed(self, entry: Entry, error: DnsFailure) -> None:
        """The destination cannot be resolved: an attempt that failed before connecting."""
        try:
            generation = transition(entry, State.SCHEDULED, entry.generation, State.IN_FLIGHT)
        except StaleTransition:
            return
        count = len(entry.message.envelope.recipients)
        self._settlement.settle(entry, generation, Attempt.same_for_all(error.reply, count, "dns"))
