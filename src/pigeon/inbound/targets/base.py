"""What every target is: something that takes a message and says accepted, later, or never.

A target never decides what happens at the source; it only answers. "Later" (a 5xx, a
timeout, Redis or PostgreSQL down) keeps the message where it is, to be tried again with
backoff; "never" (a 4xx the application means) sends it to the failed folder or bounces it.
A target may say how long "later" is at the least (a webhook's `Retry-After`): the next try
waits for the longer of that and the backoff (`not_before`).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pigeon.inbound.message import InboundMessage
from pigeon.redaction import redact


class Verdict(enum.Enum):
    ACCEPTED = "accepted"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


@dataclass(frozen=True, slots=True)
class Handoff:
    """A target's answer for one message."""

    verdict: Verdict
    detail: str
    retry_after: float | None = None
    """TRANSIENT: seconds the target asked us to wait before trying again (a webhook's
    `Retry-After`); None: it did not say, and the usual backoff applies."""
    tried: bool = True
    """False: not handed over at all (the node stops: `Target.halt`), so nothing was tried and
    nothing counts against the message."""

    @property
    def accepted(self) -> bool:
        return self.verdict is Verdict.ACCEPTED


NOT_HANDED_OVER: Final = Handoff(Verdict.TRANSIENT, "not handed over: the node stopped first", tried=False)
"""A handoff that never started: the node stopped before its turn came (`Target.halt`)."""


def not_before(delay: float, answer: Handoff, cap: float) -> float:
    """The wait before the next try of what `answer` refused for now: `delay` (the backoff),
    or what the target asked for if that is longer, but never more than `cap` (a server
    cannot park mail for a year)."""
    if answer.retry_after is None:
        return delay
    return max(delay, min(answer.retry_after, cap))


class Prepared:
    """What a target did ahead for a batch (`Target.prepare`), that the application cannot
    see yet: handed over by `Target.deliver_prepared`, or undone by `discard`."""

    async def discard(self) -> None:
        """Undo what was done ahead (the batch is not handed over after all)."""


class Target:
    """Base of every target. Subclasses implement `deliver`, and `deliver_many` when they can
    hand over a batch in fewer round trips than one per message; `prepare` and
    `deliver_prepared` when part of a batch's work can be done ahead, unseen by the
    application (a Maildir's files written to tmp/ and made durable)."""

    kind = "target"
    batches = False  # whether deliver_many hands a batch over in one step (one transaction)

    def __init__(self, name: str, *, concurrency: int = 8) -> None:
        self.name = name
        self._concurrency = concurrency
        self._gate: asyncio.Semaphore | None = None  # shared by every caller: the target's own limit
        # What is known to keep every handoff from working before one is tried (found when the
        # target first connects: a table missing, say), for /healthz; None once one works.
        self.problem: str | None = None
        # Why the last handoff of SMTP-received mail (an `[[inbound]]` route) failed for now,
        # until one is accepted: set by the delivery side's target agent, for /healthz.
        self.failing: str | None = None
        self.halted = False  # the node stops: no handoff starts (`halt`)

    @property
    def concurrency(self) -> int:
        """How many handoffs it runs side by side (`deliver_many` of a target that does not
        batch)."""
        return self._concurrency

    async def start(self) -> None:
        """Connect, create tables: whatever must happen once before the first message."""

    def halt(self) -> None:
        """The node stops: the handoffs under way finish, and none starts from now on. One
        waiting for its turn (`concurrency`) is answered `NOT_HANDED_OVER` (untried) instead."""
        self.halted = True

    async def close(self) -> None:
        """Release connections."""

    async def deliver(self, message: InboundMessage) -> Handoff:
        raise NotImplementedError

    async def prepare(self, messages: Sequence[InboundMessage]) -> Prepared | None:
        """The work for `messages` that the application cannot see yet, done ahead: while the
        batch before is handed over, say. None: nothing to do ahead (or it failed: then
        `deliver_prepared` does it all, and says what fails). Never raises."""
        return None

    async def deliver_prepared(self, messages: Sequence[InboundMessage], prepared: Prepared | None) -> list[Handoff]:
        """`deliver_many`, with what `prepare` did for these same messages, in the same order
        (anything else is discarded, and the messages delivered from the start)."""
        if prepared is not None:
            await prepared.discard()
        return await self.deliver_many(messages)

    async def deliver_many(self, messages: Sequence[InboundMessage]) -> list[Handoff]:
        """One answer per message, in order. Never raises: a failure is a TRANSIENT answer."""
        if self._gate is None:
            self._gate = asyncio.Semaphore(self._concurrency)
        gate = self._gate

        async def one(message: InboundMessage) -> Handoff:
            async with gate:
                if self.halted:  # (its turn came after the stop: others were on the wire)
                    return NOT_HANDED_OVER
                try:
                    return await self.deliver(message)
                except Exception as error:  # a target bug must not lose the message
                    return Handoff(Verdict.TRANSIENT, f"{type(error).__name__}: {redact(str(error))}")

        return list(await asyncio.gather(*(one(m) for m in messages)))
