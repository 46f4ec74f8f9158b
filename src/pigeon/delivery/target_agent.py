"""The target agent: mail of an `[[inbound]]` route, handed to the application's `[[target]]`.

Messages go to the target in batches (`Target.deliver_many`: one Redis script, one SQL
transaction), or, to a target told of each message by a call of its own (a webhook), one
per call, side by side, each outcome settled as soon as its call answers. Its answers become
replies the queue understands, so retries, `max_age`, bounces and admin operations work on
this mail as on outbound mail: accepted is `250 2.0.0`, a permanent refusal `550 5.0.0`,
anything else `451 4.3.0`. A target that asked for time (a webhook's `Retry-After`) is not
tried again before it (`Attempt.not_before`). A handoff that never started because the node
stops (`Target.halt`: its turn came after the SIGTERM) is `451 4.3.2`, untried
(`Attempt.tried`): no attempt counted, due at the next start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from pigeon.delivery.agent import Work
from pigeon.delivery.classify import Classifier
from pigeon.delivery.routes import Destination
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import NOT_HANDED_OVER, Handoff, Target, Verdict
from pigeon.message import format_id
from pigeon.queue.attempt import Attempt
from pigeon.redaction import redact
from pigeon.smtp.replies import Reply

_log = logging.getLogger(__name__)

Counted = Callable[[str, Verdict], None]
"""Told each target's answer (for pigeon_inbound_messages_total{source="smtp"})."""


class TargetAgent:
    batch = 64
    separately = False

    def __init__(self, name: str, target: Target | None, site: str, classifier: Classifier, counted: Counted) -> None:
        if target is not None and not target.batches:
            # A call per message (a webhook): each is handed over on its own, side by side, and
            # its outcome recorded as soon as it answers (`Agent.separately`), not once the
            # slowest call of its batch does: a kill -9 then makes again what was on the wire
            # (the target's concurrency, shared by every connection), and what was answered
            # within the spool's last group commit. A batch is what the target runs side by
            # side: more would only wait for its turn, taken from the queue meanwhile.
            self.batch = max(1, min(self.batch, target.concurrency))
            self.separately = True
        self._name = name
        self._target = target
        self._site = site
        self._classifier = classifier
        self._counted = counted

    def usable(self) -> bool:
        return True

    def final(self) -> list[Attempt]:
        return []  # a handoff cancelled part way is tried again whole (the target is told idempotently)

    async def deliver(self, work: Sequence[Work]) -> list[Attempt]:
        name, target = self._name, self._target
        if target is None:
            missing = Reply(451, "4.3.5", (f"no [[target]] called {name!r} in this node's configuration",))
            return [self._same(item, missing) for item in work]
        if target.halted:  # the node stops: nothing new starts (the batch waited for a free connection)
            return [self._untried(item, NOT_HANDED_OVER.detail) for item in work]
        messages = [
            InboundMessage.of(
                item.body,
                "smtp",
                item.message.created,
                spool_id=format_id(item.message.id),
                sender=item.message.envelope.sender,
                recipients=tuple(r.address for r in item.message.envelope.recipients),
            )
            for item in work
        ]
        started = time.monotonic()
        try:
            answers = await target.deliver_many(messages)
        except Exception as error:  # targets answer rather than raise; a bug must not lose the batch
            _log.exception("handing over to target %s failed unexpectedly", name)
            target.failing = f"{type(error).__name__}: {redact(str(error))}"
            broken = Reply(451, "4.3.0", (f"{name}: {target.failing}",))
            return [self._same(item, broken) for item in work]
        duration = (time.monotonic() - started) / len(messages)
        self._note(target, answers)
        attempts = []
        for item, answer in zip(work, answers, strict=True):
            if not answer.tried:
                attempts.append(self._untried(item, answer.detail))
                continue
            self._counted(name, answer.verdict)
            if answer.verdict is Verdict.ACCEPTED:
                reply = Reply(250, "2.0.0", (f"{name}: {answer.detail}",))
            elif answer.verdict is Verdict.PERMANENT:
                reply = Reply(550, "5.0.0", (f"{name}: {answer.detail}",))
            else:
                reply = Reply(451, "4.3.0", (f"{name}: {answer.detail}",))
            count = len(item.message.envelope.recipients)
            classification = self._classifier.classify(reply) if reply.code >= 500 else ""
            attempt = Attempt([reply] * count, [classification] * count, self._site, name, None, duration)
            if answer.verdict is Verdict.TRANSIENT and answer.retry_after is not None:
                attempt = attempt._replace(not_before=answer.retry_after)  # the queue caps it
            attempts.append(attempt)
        return attempts

    @staticmethod
    def _note(target: Target, answers: Sequence[Handoff]) -> None:
        """What /healthz says of the target: failing from a batch of which no message went in
        for now, until one does. A permanent refusal is about its message, not the target."""
        verdicts = {answer.verdict for answer in answers if answer.tried}
        if Verdict.ACCEPTED in verdicts:
            target.failing = None
        elif Verdict.TRANSIENT in verdicts:
            target.failing = next(a.detail for a in answers if a.tried and a.verdict is Verdict.TRANSIENT)

    def _same(self, item: Work, reply: Reply) -> Attempt:
        return Attempt.same_for_all(reply, len(item.message.envelope.recipients), "", self._site)

    def _untried(self, item: Work, detail: str) -> Attempt:
        """Not handed over (the node stops): due again at once, no attempt counted; the next
        start hands it over."""
        reply = Reply(451, "4.3.2", (f"{self._name}: {detail}",))
        return self._same(item, reply)._replace(tried=False, retry_after=0.0)

    async def close(self) -> None:
        pass


class TargetAgents:
    """Opens a `TargetAgent` for a destination of kind TARGET (a target needs no connection)."""

    def __init__(self, targets: Mapping[str, Target], classifier: Classifier, counted: Counted) -> None:
        self._targets = targets
        self._classifier = classifier
        self._counted = counted

    async def open(self, destination: Destination, source: str | None = None) -> TargetAgent:
        """(`source` is for SMTP agents: a target is not reached from an address of ours.)"""
        name = destination.target or ""
        return TargetAgent(name, self._targets.get(name), destination.site, self._classifier, self._counted)
