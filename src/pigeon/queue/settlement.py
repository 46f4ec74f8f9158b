"""Settlement: the one place that decides what an attempt means for a message.

For each recipient: 2xx is a `Delivery`, 5xx a `Bounce` (classified), 4xx or a broken
connection a `TransientFailure`. Recipients still to do are retried with backoff, or
expire if the next try would come after `max_age`. The outcome is written to the spool
in one group-committed operation: the message row is updated (remaining recipients,
attempts, next due) or removed, and every terminal record goes into the spool's outbox
in the same transaction. Only once that is durable are the records written to the log and
the message let go. After `kill -9` a terminal record is therefore either committed (and
written to the log at the next start, if it had not been) or not committed at all (and
the attempt is made again): each recipient gets exactly one terminal record.

Failed recipients that asked for it get a delivery status notification, stored as a new
message before the failure is settled (a crash in between can duplicate a DSN, never lose
one).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pigeon.delivery.classify import Classifier
from pigeon.delivery.dsn import Failure, wants_failure_notice
from pigeon.delivery.outcome import Attempt
from pigeon.logs.outbox import Outbox
from pigeon.logs.records import AdminBounce, Bounce, Delivery, Expiration, Response, TransientFailure
from pigeon.logs.writer import LogWriter
from pigeon.message import Envelope, Message, Recipient, format_id
from pigeon.metrics import Metrics
from pigeon.queue.policy import QueuePolicies
from pigeon.queue.state import ActiveSet, Entry, StaleTransition, State, transition
from pigeon.smtp.replies import Reply
from pigeon.spool.sqlite import SqliteSpool

_log = logging.getLogger(__name__)
_SHARD_MASK = 63
_RETRY_WRITE = 1.0  # seconds before retrying a settlement the spool could not write

# Submits a DSN for these failures of this message; the future is done once it is stored.
Notifier = Callable[[Message, list[Failure]], "asyncio.Future[object]"]


def expired_reply(last: str | None) -> Reply:
    text = "Message expired: not delivered within max_age"
    return Reply(551, "5.4.7", (f"{text}; last attempt: {last}" if last else text,))


@dataclass(slots=True)
class _Outcome:
    """A settlement being written."""

    entry: Entry
    remaining: Envelope | None
    attempts: int
    due: float
    terminal: list[Delivery | Bounce | Expiration | AdminBounce] = field(default_factory=list)
    transient: list[TransientFailure] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    encoded: list[tuple[int, bytes]] = field(default_factory=list)
    queue: str | None = None  # a new scheduled queue (rebind)


class Settlement:
    def __init__(
        self,
        *,
        spools: Mapping[int, SqliteSpool],
        active: ActiveSet,
        log: LogWriter,
        outbox: Outbox,
        metrics: Metrics,
        classifier: Classifier,
        policies: QueuePolicies,
        notifier: Notifier | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self._spools = spools
        self._active = active
        self._log = log
        self._outbox = outbox
        self._metrics = metrics
        self._classifier = classifier
        self._policies = policies
        self._notifier = notifier
        self._clock = clock
        self._rng = rng or random.Random()

    # --- entry points ------------------------------------------------------------------------
    def settle(self, entry: Entry, generation: int, attempt: Attempt) -> None:
        """An attempt (IN_FLIGHT at `generation`) ended with these replies."""
        message = entry.message
        now = self._clock()
        policy = self._policies.for_queue(message.queue)
        attempts = message.attempts + 1
        outcome = _Outcome(entry, None, attempts, now)
        deferred: list[tuple[Recipient, Reply]] = []
        for recipient, reply in zip(message.envelope.recipients, attempt.replies, strict=True):
            fields = self._fields(message, recipient, reply, attempts, attempt)
            if reply.code < 400:
                outcome.terminal.append(Delivery(**fields))
            elif reply.code >= 500:
                outcome.terminal.append(Bounce(**fields, classification=self._classifier.classify(reply)))
                outcome.failures.append(Failure(recipient, reply, "failed", _host(attempt.peer)))
            else:
                deferred.append((recipient, reply))
        bounced_by = entry.notes.get("admin_bounce")
        if deferred and isinstance(bounced_by, tuple):
            # An operator bounced it while this attempt was under way: what did not get
            # through now ends here instead of being retried.
            reason, operator = bounced_by
            for recipient, _ in deferred:
                outcome.terminal.append(self._admin_bounce_record(message, recipient, attempts, reason, operator))
            deferred = []
        if deferred:
            last = str(deferred[-1][1])
            due = policy.retry.next_due(message.created, attempts, now, self._rng)
            if due is None:
                for recipient, _ in deferred:
                    reply = expired_reply(last)
                    outcome.terminal.append(Expiration(**self._fields(message, recipient, reply, attempts, attempt)))
                    outcome.failures.append(Failure(recipient, reply, "failed", _host(attempt.peer)))
            else:
                outcome.due = due
                outcome.remaining = _with(message.envelope, [r for r, _ in deferred], last)
                for recipient, reply in deferred:
                    fields = self._fields(message, recipient, reply, attempts, attempt)
                    outcome.transient.append(TransientFailure(**fields, next_attempt=due))
        to = State.SCHEDULED if outcome.remaining is not None else _terminal_state(outcome.terminal)
        if not self._move(entry, State.IN_FLIGHT, generation, to):
            return
        self._write(outcome, policy.dsn)

    def expire(self, entry: Entry, expected: State) -> None:
        """A message found past its max_age while SCHEDULED or READY: expire every recipient."""
        message = entry.message
        if not self._move(entry, expected, entry.generation, State.EXPIRED):
            return
        reply = expired_reply(message.envelope.last_response)
        outcome = _Outcome(entry, None, message.attempts, self._clock())
        for recipient in message.envelope.recipients:
            outcome.terminal.append(Expiration(**self._fields(message, recipient, reply, message.attempts, None)))
            outcome.failures.append(Failure(recipient, reply, "failed"))
        self._write(outcome, self._policies.for_queue(message.queue).dsn)

    def admin_bounce(self, entry: Entry, expected: State, reason: str, operator: str) -> bool:
        """An operator bounced a SCHEDULED or READY message: every recipient, no DSN."""
        message = entry.message
        if not self._move(entry, expected, entry.generation, State.ADMIN_BOUNCED):
            return False
        outcome = _Outcome(entry, None, message.attempts, self._clock())
        for recipient in message.envelope.recipients:
            outcome.terminal.append(self._admin_bounce_record(message, recipient, message.attempts, reason, operator))
        self._commit(outcome)
        return True

    def defer(
        self, entry: Entry, expected: State, until: float, *, queue: str | None = None, envelope: Envelope | None = None
    ) -> bool:
        """Put a SCHEDULED or READY message back in the spool until `until`, untried (its
        queue is suspended, or it is rebound to another `queue` or route in `envelope`): no
        attempt is counted and nothing is logged."""
        message = entry.message
        if not self._move(entry, expected, entry.generation, State.SCHEDULED):
            return False
        outcome = _Outcome(entry, envelope or message.envelope, message.attempts, until)
        outcome.due = until
        outcome.queue = queue
        self._commit(outcome)
        return True

    def _admin_bounce_record(
        self, message: Message, recipient: Recipient, attempts: int, reason: str, operator: str
    ) -> AdminBounce:
        reply = Reply(550, "5.7.1", (f"Administratively bounced: {reason}" if reason else "Administratively bounced",))
        return AdminBounce(**self._fields(message, recipient, reply, attempts, None), reason=reason, operator=operator)

    # --- writing -------------------------------------------------------------------------
    def _write(self, outcome: _Outcome, dsn: bool) -> None:
        message = outcome.entry.message
        failures = [f for f in outcome.failures if wants_failure_notice(f.recipient)]
        if dsn and failures and message.envelope.sender and self._notifier is not None:
            stored = self._notifier(message, failures)
            stored.add_done_callback(functools.partial(self._notified, outcome))
        else:
            self._commit(outcome)

    def _notified(self, outcome: _Outcome, stored: asyncio.Future[object]) -> None:
        error = stored.exception()
        if error is not None:
            _log.error("message %s: DSN not stored (%s); will try again", format_id(outcome.entry.id), error)
            asyncio.get_running_loop().call_later(_RETRY_WRITE, self._write, outcome, True)
            return
        self._commit(outcome)

    def _commit(self, outcome: _Outcome) -> None:
        message = outcome.entry.message
        spool = self._spools[message.id & _SHARD_MASK]
        if not outcome.encoded and outcome.terminal:
            outcome.encoded = self._outbox.seal(spool, outcome.terminal)
        future = spool.settle(
            message,
            outcome.remaining,
            attempts=outcome.attempts,
            due=outcome.due,
            records=outcome.encoded,
            queue=outcome.queue,
        )
        future.add_done_callback(functools.partial(self._committed, outcome, spool))

    def _committed(self, outcome: _Outcome, spool: SqliteSpool, future: asyncio.Future[None]) -> None:
        error = future.exception()
        if error is not None:
            _log.error("message %s: outcome not written (%s); will try again", format_id(outcome.entry.id), error)
            asyncio.get_running_loop().call_later(_RETRY_WRITE, self._commit, outcome)
            return
        log = self._log
        counts = self._metrics.counts
        self._outbox.committed(spool, outcome.encoded)
        for record in outcome.terminal:
            counts.outcome(type(record).__name__, record.queue, record.site)
        for transient in outcome.transient:
            log.write(transient)
            counts.outcome("TransientFailure", transient.queue, transient.site)
        if outcome.remaining is not None:
            message = outcome.entry.message
            message.envelope = outcome.remaining
            if outcome.queue is not None:
                message.queue = outcome.queue
            message.attempts = outcome.attempts
            message.due = outcome.due
        self._active.remove(outcome.entry)

    # --- helpers -----------------------------------------------------------------------
    def _move(self, entry: Entry, expected: State, generation: int, to: State) -> bool:
        try:
            transition(entry, expected, generation, to)
        except StaleTransition as stale:
            _log.info("settlement skipped: %s", stale)
            return False
        return True

    def _fields(
        self, message: Message, recipient: Recipient, reply: Reply, attempts: int, attempt: Attempt | None
    ) -> dict[str, Any]:
        return {
            "timestamp": self._clock(),
            "id": format_id(message.id),
            "queue": message.queue,
            "sender": message.envelope.sender,
            "recipient": recipient.address,
            "size": message.size,
            "attempt": attempts,
            "response": Response.of(reply),
            "site": attempt.site if attempt else "",
            "peer": attempt.peer if attempt else None,
            "tls": attempt.tls if attempt else None,
            "created": message.created,
            "duration": attempt.duration if attempt else None,
            "meta": message.envelope.metadata,
        }


def _terminal_state(records: list[Delivery | Bounce | Expiration | AdminBounce]) -> State:
    if all(isinstance(r, Delivery) for r in records):
        return State.DELIVERED
    if any(isinstance(r, Expiration) for r in records):
        return State.EXPIRED
    if any(isinstance(r, AdminBounce) for r in records):
        return State.ADMIN_BOUNCED
    return State.BOUNCED


def _with(envelope: Envelope, recipients: list[Recipient], last: str | None) -> Envelope:
    copy = Envelope(**{f: getattr(envelope, f) for f in envelope.__struct_fields__})
    copy.recipients = recipients
    copy.last_response = last
    return copy


def _host(peer: str | None) -> str | None:
    return peer.split(" ", 1)[0] if peer else None
