"""Queue rates: `[[queue]] max_message_rate`, the pace a scheduled queue's mail leaves at.

A scheduled queue (`campaign:tenant@domain`) matched by a `[[queue]]` block with a
`max_message_rate` is made ready no faster than that rate, whatever its destination, as
KumoMTA's scheduled queues are: each matching queue has a rate of its own. Nothing pools the
queues a glob matches: `*:acme@*` paces each campaign of acme to each domain apart, so a tenant's
whole pace takes one queue of its own (a policy's `Changes(queue=...)`). The scheduler
hands such a queue's messages to the `Pacer` instead of routing them at once; the pacer books
their slots of the rate from the throttles (`pigeon.shaping.throttles`, keyed `queue:<name>`:
the node's workers share the schedule through their table, the cluster's nodes through Redis,
as for a site's rate) and gives each back to the scheduler when its slot comes. Meanwhile the
message waits in its scheduled queue, in memory and untried, as a message waiting for its
route lookup does: it holds a `Lease`, and one an operator moved meanwhile (bounced,
suspended, rebound) is dropped when its turn comes. Mail of other queues, to the same site
or not, never waits behind it: the pace is kept before the ready queues, not in a connection.

Only a few seconds of a queue's rate wait in memory (`_KEPT`), and no more than `budget`
messages of all paced queues together (half the worker's active set, `[delivery] max_active`,
but one per queue): a paced campaign of 100,000 messages, or a thousand paced campaigns, would
otherwise fill the active set, and every other tenant's mail would wait in the spool behind
them, at their pace. The rest goes back to
the spool, untried and unrecorded (`Settlement.defer`), due when its slot would come: each
queue's put-back messages are spread one slot apart after what already waits, so each is
written back once and comes back in its turn, not all together.

A queue with no rate costs nothing: the scheduler asks `QueueRates.of` only when some block
sets a rate (`QueueRates.any`), and then one cached dictionary look-up per message.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from pigeon.queue.state import Lease
from pigeon.shaping.gcra import Rate
from pigeon.shaping.throttles import Throttles

_log = logging.getLogger(__name__)

_GRAIN: Final = 0.1
"""Seconds of a rate booked at once: a queue at 5/s books one message a time, one at 1000/s a
hundred (each booking is a table or Redis round trip; the messages of a booking go together
when the last of them may)."""
_AFTER_A_FAILURE: Final = 1.0  # seconds before a queue whose booking failed unexpectedly books again
_KEPT: Final = 10.0
"""Seconds of a queue's rate that wait in memory for their slots (at least `_KEPT_MIN`
messages, at most `_KEPT_MAX`); more go back to the spool until their slot."""
_KEPT_MIN: Final = 100
_KEPT_MAX: Final = 1000


def queue_key(queue: str) -> str:
    """The throttle key of a scheduled queue's own rate."""
    return f"queue:{queue}"


class QueueRates:
    """The `[[queue]]` blocks' rates: (name glob, rate or None) in order; the first block whose
    glob matches a queue's name is the queue's, as for the blocks' other settings."""

    def __init__(self, rules: list[tuple[str, Rate | None]] | None = None) -> None:
        self._rules = rules or []
        self.any = any(rate is not None for _, rate in self._rules)
        """Whether some block sets a rate (none: no queue is paced, and nothing is asked)."""
        self._cache: dict[str, Rate | None] = {}

    def of(self, queue: str) -> Rate | None:
        """The rate of the scheduled queue `queue` (None: not paced)."""
        try:
            return self._cache[queue]
        except KeyError:
            pass
        rate = next((rate for pattern, rate in self._rules if fnmatch.fnmatchcase(queue, pattern)), None)
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[queue] = rate
        return rate


class Pacer:
    """The messages of paced queues waiting for their slot, and the tasks giving them back."""

    def __init__(
        self,
        rates: QueueRates,
        throttles: Throttles,
        release: Callable[[Lease], None],
        live: Callable[[Lease], bool] = lambda lease: True,
        put_back: Callable[[Lease, float], None] | None = None,
        clock: Callable[[], float] = time.time,
        budget: int = 5000,
        share: int = 1,
    ) -> None:
        self._rates = rates
        self._throttles = throttles
        self._release = release
        """The scheduler: route this message now (if its lease still holds)."""
        self._live = live
        """Whether a lease still holds: one an operator moved meanwhile takes no slot."""
        self._put_back = put_back
        """The scheduler: this message goes back to the spool, untried, due then (None: all
        wait in memory)."""
        self._clock = clock
        self._budget = budget
        self._share = max(1, share)
        """How many of the node's workers book slots of a queue's rate: each gets about this
        share of them, so what it puts back is spaced so many slots apart (else it came back
        early, to be put back again)."""
        """Messages of all paced queues that may wait in memory together (one per queue at least)."""
        self._held = 0  # messages waiting in memory, all queues together
        self._waiting: dict[str, deque[Lease]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._horizon: dict[str, float] = {}
        """Per queue: the slot promised to the last message put back (wall clock)."""

    @property
    def rates(self) -> QueueRates:
        """The queues' rates. Replaced by a reload: the next booking of each queue takes its
        new rate, and what was put back is spread again at it as it comes back (`forget`)."""
        return self._rates

    @rates.setter
    def rates(self, rates: QueueRates) -> None:
        self._rates = rates
        self.forget()

    def forget(self) -> None:
        """Forget the slots promised to messages put back in the spool: an operator made them
        due now (`pigeon retry`, a rebind), or a reload changed the rates. Each comes back as
        it is due and, if it must wait again, is spread after what waits then, at the rate in
        force; a promise kept would set it behind slots of the old rate, or its own old slot
        (found from outside: a retry after a rate was raised sent the rest two minutes later)."""
        self._horizon.clear()

    def hold(self, queue: str, lease: Lease) -> None:
        """`lease`'s message, of the paced queue `queue`, waits for its slot: in memory, or,
        past a few seconds' worth of the rate, in the spool until about its slot."""
        waiting = self._waiting.get(queue)
        if waiting is None:
            waiting = self._waiting[queue] = deque()
        rate = self.rates.of(queue)
        if self._put_back is not None and rate is not None:
            kept = min(_KEPT_MAX, max(_KEPT_MIN, int(rate.per_second * _KEPT)))
            if len(waiting) >= kept or (waiting and self._held >= self._budget):
                now = self._clock()
                # After what waits here and what was put back before it, one slot apart.
                per_second = rate.per_second / self._share  # (this worker's part of the rate)
                due = max(self._horizon.get(queue, 0.0), now + len(waiting) / per_second)
                due += 1 / per_second
                self._horizon[queue] = due
                if len(self._horizon) > 100_000:
                    self._horizon = {q: t for q, t in self._horizon.items() if t > now}
                self._put_back(lease, due)
                return
        waiting.append(lease)
        self._held += 1
        if queue not in self._tasks:
            self._tasks[queue] = asyncio.create_task(self._pace(queue, waiting), name=f"pace {queue}")

    def waiting(self, queue: str) -> int:
        """Messages of `queue` waiting for their slot (in this worker)."""
        return len(self._waiting.get(queue, ()))

    async def stop(self) -> None:
        """The node stops: what waits stays in the spool, due, for the next start."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._waiting.clear()
        self._horizon.clear()
        self._held = 0

    async def _pace(self, queue: str, waiting: deque[Lease]) -> None:
        try:
            while waiting:
                if not self._live(waiting[0]):
                    waiting.popleft()  # (bounced, suspended, rebound while it waited: it takes no slot)
                    self._held -= 1
                    continue
                rate = self.rates.of(queue)
                if rate is None:  # a reload took the rate away: what waits goes now
                    count = len(waiting)
                else:
                    count = min(len(waiting), max(1, int(rate.per_second * _GRAIN)))
                    try:
                        wait = await self._throttles.admit(queue_key(queue), rate, count)
                    except Exception:
                        _log.exception("booking a slot of queue %s's rate failed", queue)
                        await asyncio.sleep(_AFTER_A_FAILURE)
                        continue
                    if wait > 0:
                        await asyncio.sleep(wait)
                for _ in range(min(count, len(waiting))):
                    self._held -= 1
                    self._release(waiting.popleft())
        finally:
            if self._tasks.get(queue) is asyncio.current_task():
                del self._tasks[queue]
                if self._waiting.get(queue) is waiting:
                    del self._waiting[queue]
                    self._held -= len(waiting)  # (none, unless releasing one failed)
