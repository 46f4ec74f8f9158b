"""Queue rates: `[[queue]] max_message_rate`, the pace a tenant's or campaign's mail leaves at.

A scheduled queue (`campaign:tenant@domain`) matched by a `[[queue]]` block with a
`max_message_rate` is made ready no faster than that rate, whatever its destination, as
KumoMTA's scheduled queues are: each matching queue has a rate of its own. The scheduler
hands such a queue's messages to the `Pacer` instead of routing them at once; the pacer books
their slots of the rate from the throttles (`pigeon.shaping.throttles`, keyed `queue:<name>`:
the node's workers share the schedule through their table, the cluster's nodes through Redis,
as for a site's rate) and gives each back to the scheduler when its slot comes. Meanwhile the
message waits in its scheduled queue, in memory and untried, as a message waiting for its
route lookup does: it holds a `Lease`, and one an operator moved meanwhile (bounced,
suspended, rebound) is dropped when its turn comes. Mail of other queues, to the same site
or not, never waits behind it: the pace is kept before the ready queues, not in a connection.

A queue with no rate costs nothing: the scheduler asks `QueueRates.of` only when some block
sets a rate (`QueueRates.any`), and then one cached dictionary look-up per message.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
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
    ) -> None:
        self.rates = rates
        """Replaced by a reload: the next booking of each queue takes its new rate."""
        self._throttles = throttles
        self._release = release
        """The scheduler: route this message now (if its lease still holds)."""
        self._live = live
        """Whether a lease still holds: one an operator moved meanwhile takes no slot."""
        self._waiting: dict[str, deque[Lease]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def hold(self, queue: str, lease: Lease) -> None:
        """`lease`'s message, of the paced queue `queue`, waits for its slot."""
        waiting = self._waiting.get(queue)
        if waiting is None:
            waiting = self._waiting[queue] = deque()
        waiting.append(lease)
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

    async def _pace(self, queue: str, waiting: deque[Lease]) -> None:
        try:
            while waiting:
                if not self._live(waiting[0]):
                    waiting.popleft()  # (bounced, suspended, rebound while it waited: it takes no slot)
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
                    self._release(waiting.popleft())
        finally:
            if self._tasks.get(queue) is asyncio.current_task():
                del self._tasks[queue]
                if self._waiting.get(queue) is waiting:
                    del self._waiting[queue]
