"""Settlement: the one place that decides what an outcome means for a message, and makes it durable.

For each recipient of an attempt: 2xx is a `Delivery`, 5xx a `Bounce` (with the class the
agent gave it), 4xx or a broken connection a `TransientFailure`. Recipients still to do are
retried with backoff, or expire if the next try would come after `max_age`. An attempt that
was not tried (`Attempt.tried`: its site is down) defers the message by its `retry_after`
and counts no attempt. Operators'
outcomes (admin bounce, defer for a suspension or a rebind) and expiry come through here too.

The message is `settling` from the moment its outcome is known until the outcome is durable:
the row is updated (remaining recipients, attempts, next due, maybe a new queue) or removed,
and every terminal record goes into the spool's outbox in the same transaction. Only then are
the records logged and the message let go of (`ActiveSet.finish`). Nobody else acts on a
settling message, and nothing writes a settling message's in-memory envelope back to the
spool: an operator waits for the commit and acts on the row it left. After `kill -9` a
terminal record is either committed (and logged at the next start, if it had not been) or not
committed at all (and the attempt is made again): each recipient gets exactly one.

An operator's hold, bounce or rebind of a message whose attempt is on the wire is applied by
that attempt's outcome, to what it leaves; it is written to the message's row first
(`after_attempt`, `rebind_after_attempt`), ahead of that outcome in the shard's commit order,
so that an attempt that never ends (a stop, a crash) leaves the row to be held, bounced or
moved when it is loaded again (`cut_short`). A bounce asked too wins over a rebind (nothing is
left to move); a hold and a rebind both apply: moved, and held there.

Results come back with the `Lease` their work started with (`report`, `unroutable`); a stale
lease (someone moved the message meanwhile) means the result is dropped and counted.

Failed recipients that asked for it get a delivery status notification, stored as a new
message in the same transaction as the outcome it reports, in the failed message's shard (its
worker's own, or one adopted): after `kill -9` there is one DSN and the outcome, or neither
and the attempt is made again. A DSN that cannot be stored leaves the outcome unwritten too,
and both are tried again.

A deferral past `[delivery] delay_warning` tells the sender once that the message is still
being retried (a "delayed" DSN, for the deferred recipients whose NOTIFY allows it): the mark
that it was told (`Envelope.delay_warned`) is in the row the deferral leaves, committed with
that DSN as a failure's is with its outcome, so a crash leaves both or neither (and the next
deferral tells), and nothing that keeps the row (a restart, a retry, a rebind, an adoption)
tells again.

Mail of an `[[inbound]]` route is taken from anyone, so its DSN would go to any sender an
attacker wrote. Its route says who gets one (`InboundFailures`); for anyone else the failure
is not terminal: the message is *held*, its row kept in the spool due at `HELD` (never by
itself) with a `Held` record saying why and that no DSN went out, until an operator releases
it (`pigeon retry`; the scheduler then counts `max_age` afresh) or bounces it. A route that
drops such mail instead ends it with the usual `Bounce`/`Expiration`, whose `dsn` says why
none was sent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from pigeon.delivery.dsn import Failure, wants_delay_notice, wants_failure_notice, wants_success_notice
from pigeon.logs.records import (
    AdminBounce,
    AdminHold,
    Bounce,
    Delivery,
    Expiration,
    Held,
    Rebind,
    Record,
    Response,
    TransientFailure,
)
from pigeon.message import HELD, AfterAttempt, Envelope, Message, Recipient, format_id
from pigeon.metrics import Counts
from pigeon.queue.attempt import Attempt, Unroutable
from pigeon.queue.policy import InboundFailures, QueuePolicies, QueuePolicy
from pigeon.queue.state import ActiveSet, AdminMark, Entry, Lease, RebindMark, State, transition
from pigeon.smtp.replies import Reply
from pigeon.spool.shards import Spools
from pigeon.spool.spool import Settling, Spool

_log = logging.getLogger(__name__)
_RETRY_WRITE = 1.0  # seconds before retrying a settlement the spool could not write

Notifier = Callable[[Message, list[Failure], Settling], "asyncio.Future[object]"]
"""Stores a DSN for these failures of this message, with the outcome it reports (`Settling`)
in the same transaction; the future is done once both are durable (fails if neither is)."""

Terminal = Delivery | Bounce | Expiration | AdminBounce

RouteFailures = Callable[[str], InboundFailures | None]
"""The `[[inbound]]` route's failure policy for a recipient address (None: no route names it)."""
_ROUTE_DEFAULT = InboundFailures()


class RecordLog(Protocol):
    """Where records that report no spool change go (`TransientFailure`)."""

    def write(self, record: Record) -> object: ...


class RecordOutbox(Protocol):
    """Terminal records, committed with the change they report (`pigeon.logs.outbox.Outbox`)."""

    def seal(self, spool: Spool, records: Sequence[Record]) -> list[tuple[int, bytes]]: ...

    def committed(self, spool: Spool, sealed: Sequence[tuple[int, bytes]]) -> None: ...


def expired_reply(last: str | None, max_age: float, held_by: str | None = None) -> Reply:
    """The reply of an expiry, which a DSN gives its sender to read: how long the message was
    tried (not the name of the setting), what last held it back if a shaping reaction's
    suspension did (`Envelope.held_by`: its rule and the provider's reply behind it), and what
    its last attempt met."""
    text = f"Message expired: not delivered within {_span(max_age)}"
    if held_by:
        text = f"{text}; last held by {held_by}"
    # 554: the transaction failed for good (551 would say "user not local", RFC 5321 3.4).
    return Reply(554, "5.4.7", (f"{text}; last attempt: {last}" if last else text,))


def _span(seconds: float) -> str:
    """A duration for a person to read: "5 days", "1 day 12 hours", "30 minutes", "45 seconds"."""
    left = max(round(seconds), 1)
    parts: list[str] = []
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count} {unit}{'' if count == 1 else 's'}")
    return " ".join(parts[:2])


@dataclass(slots=True)
class _Outcome:
    """A settlement being written."""

    entry: Entry
    generation: int  # the SETTLING state it was taken at
    remaining: Envelope | None
    attempts: int
    due: float
    terminal: list[Terminal] = field(default_factory=list)
    transient: list[TransientFailure] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    encoded: list[tuple[int, bytes]] = field(default_factory=list)
    queue: str | None = None  # a new scheduled queue (rebind)
    notes: list[Record] = field(default_factory=list)  # logged once committed, as transient ones (Rebind)
    held: list[tuple[Recipient, Held]] = field(default_factory=list)  # kept for an operator, no DSN
    written: asyncio.Future[None] | None = None  # set once the outcome is durable, if someone waits


def held_envelope(envelope: Envelope, mark: AdminMark) -> Envelope:
    """`envelope` as an operator's hold leaves it: held (`Envelope.held`: who held it and why,
    as `pigeon inspect` and `pigeon queue list` show it), by that operator (`hold_operator`).
    A hold asked while an attempt was on the wire is done with (`after_attempt`); a bounce so
    asked stays, and ends the message once it is released."""
    why = f"held by operator {mark.operator!r}" + (f": {mark.reason}" if mark.reason else "")
    pending = envelope.after_attempt
    after = pending if pending is not None and pending.kind == "bounce" else None
    bound = list(mark.bound_to) if mark.bound_to is not None else None
    return msgspec.structs.replace(
        envelope, held=why, hold_operator=mark.operator, hold_bound_to=bound, after_attempt=after
    )


def pending_rebind(entry: Entry) -> RebindMark | None:
    """The rebind an operator asked of `entry` while an attempt of it was on the wire: this
    process's (`Entry.rebind`), else the one its row carries (`Envelope.rebind_after_attempt`,
    asked before a stop or a crash)."""
    if entry.rebind is not None:
        return entry.rebind
    pending = entry.message.envelope.rebind_after_attempt
    return RebindMark.of(pending) if pending is not None else None


def marks_after_attempt(entry: Entry) -> tuple[AdminMark | None, AdminMark | None]:
    """The bounce and the hold an operator asked of `entry` while an attempt of it was on the
    wire: this process's (`Entry.admin_bounce`, `admin_hold`), else the one its row carries
    (`Envelope.after_attempt`, asked before a stop or a crash)."""
    bounce, hold = entry.admin_bounce, entry.admin_hold
    pending = entry.message.envelope.after_attempt
    if pending is not None:
        mark = AdminMark.of(pending)
        if pending.kind == "bounce":
            bounce = bounce or mark
        else:
            hold = hold or mark
    return bounce, hold


def _no_route(address: str) -> InboundFailures | None:
    """No `[[inbound]]` route names any address (the default)."""
    return None


def _unclassified(reply: Reply) -> str:
    """No rule table (the default): a deferral's record names no class."""
    return ""


class Settlement:
    def __init__(
        self,
        *,
        spools: Spools,
        active: ActiveSet,
        log: RecordLog,
        outbox: RecordOutbox,
        counts: Counts,
        policies: QueuePolicies,
        notifier: Notifier | None = None,
        route_failures: RouteFailures = _no_route,
        classify: Callable[[Reply], str] = _unclassified,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self._spools = spools
        self._active = active
        self._log = log
        self._outbox = outbox
        self._counts = counts
        self._policies = policies
        self._notifier = notifier
        self._route_failures = route_failures
        self._classify = classify
        """The bounce class of a 4xx, for its `TransientFailure` record (the rule table's
        `Classifier.classify`: cached by reply, so a deferral costs a dict lookup)."""
        self._clock = clock
        self._rng = rng or random.Random()

    # --- results of work that left the queue -------------------------------------------------
    def report(self, lease: Lease, attempt: Attempt) -> asyncio.Future[None] | None:
        """A delivery attempt (leased when it was taken) ended with these replies.

        Returns a future done once the outcome is durable (None for a stale lease: nothing to
        write). A dispatcher waits on it before it sends much more: what a crash can deliver
        twice is then what one connection had on the wire and in the last commit.
        """
        entry = self._active.current(lease, "attempt")
        if entry is None or entry.state is not State.IN_FLIGHT:
            return None
        outcome = self._settle_attempt(entry, attempt)
        outcome.written = asyncio.get_running_loop().create_future()
        return outcome.written

    def unroutable(self, lease: Lease, failure: Unroutable) -> None:
        """The route lookup (leased when it started) found no way to the destination."""
        entry = self._active.current(lease, "route")
        if entry is None or entry.state is not State.SCHEDULED:
            return
        count = len(entry.message.envelope.recipients)
        self._settle_attempt(entry, Attempt.same_for_all(failure.reply, count, failure.classification))

    def reroute(self, lease: Lease, routing_domain: str) -> asyncio.Future[None] | None:
        """A policy hook sent a message it was about to attempt elsewhere: back to the spool,
        due now, to be routed as `routing_domain` ("" for its recipients' own domain), untried
        (no attempt counted, nothing logged), as an operator's rebind would. The future
        resolves once that is durable; None if the lease is stale (someone else moved it)."""
        entry = self._active.current(lease, "attempt")
        if entry is None or entry.state is not State.IN_FLIGHT:
            return None
        envelope = RebindMark(None, routing_domain).envelope(entry.message.envelope)
        return self.defer(entry, self._clock(), envelope=envelope)

    # --- the queue's own decisions (synchronous: the caller holds the entry now) --------------
    def expire(self, entry: Entry, *, held_by: str | None = None) -> None:
        """A message found past its max_age before an attempt: expire every recipient.
        `held_by`: what holds it in its ready queue now (a reaction's suspension), else what
        held it when it was last deferred, if anything did, is what its expiry names."""
        message = entry.message
        max_age = self._policies.for_queue(message.queue).retry.max_age
        outcome = self._begin(entry, message.attempts, self._clock())
        held = held_by or message.envelope.held_by
        for recipient in message.envelope.recipients:
            # (A row stored before recipients kept their own has the message's alone.)
            last = recipient.last_response or message.envelope.last_response
            said = (recipient.last_peer, last) if recipient.last_peer and last else None
            reply = expired_reply(last, max_age, held)
            self._expired(outcome, recipient, reply, None, said=said, at=recipient.last_host)
        self._keep_held(outcome)
        self._write(outcome, self._policies.for_queue(message.queue).dsn)

    def expire_held(self, entry: Entry) -> None:
        """A held message nobody released within its route's `held_for`: every recipient ends
        with an `Expiration` record, and still no DSN (it was held because none may go)."""
        message = entry.message
        outcome = self._begin(entry, message.attempts, self._clock())
        held = message.envelope.held or "held"
        for recipient in message.envelope.recipients:
            why = recipient.last_response or held  # (the message's alone in rows stored before)
            reply = Reply(550, "5.4.7", (f"Held for the operator past [[inbound]] held_for; {why}",))
            fields = self._fields(message, recipient, reply, message.attempts, None)
            outcome.terminal.append(Expiration(**fields, dsn="not sent: held past [[inbound]] held_for"))
        self._commit(outcome)

    def admin_bounce(self, entry: Entry, mark: AdminMark) -> asyncio.Future[None]:
        """An operator bounced a message nobody is sending: every recipient, no DSN.
        The future resolves once that is durable."""
        message = entry.message
        outcome = self._begin(entry, message.attempts, self._clock())
        for recipient in message.envelope.recipients:
            outcome.terminal.append(self._admin_bounce_record(message, recipient, message.attempts, mark))
        self._commit(outcome)
        return self._active.settled(entry)

    def hold(self, entry: Entry, mark: AdminMark) -> asyncio.Future[None]:
        """An operator held a message nobody is sending (`pigeon hold`): back in the spool, due
        at `HELD` (never by itself, and it does not expire meanwhile), untried, with an
        `AdminHold` record once that is durable. The future resolves then."""
        message = entry.message
        outcome = self._begin(entry, message.attempts, HELD)
        # A rebind asked while an attempt was on the wire, cut short: moved, and held there.
        outcome.remaining = held_envelope(self._rebound_now(outcome, message.envelope), mark)
        outcome.notes.append(self._hold_record(message, outcome.remaining, mark, outcome.queue))
        self._commit(outcome)
        return self._active.settled(entry)

    def cut_short(self, entry: Entry) -> asyncio.Future[None]:
        """What an operator asked of a message while an attempt of it was on the wire, that
        attempt cut short (a stop cut it before its content went, or the process died), done as
        its row is loaded again, before any other attempt (`Envelope.after_attempt`,
        `rebind_after_attempt`): a bounce ends it (a rebind asked too has nothing left to
        move), a hold holds it (moved first, where a rebind asked too), a rebind alone moves it,
        due at once, with its `Rebind` record. The future resolves once that is durable."""
        pending = entry.message.envelope.after_attempt
        if pending is not None and pending.kind == "bounce":
            return self.admin_bounce(entry, AdminMark.of(pending))
        if pending is not None:
            return self.hold(entry, AdminMark.of(pending))
        message = entry.message
        outcome = self._begin(entry, message.attempts, self._clock())
        outcome.remaining = self._rebound_now(outcome, message.envelope)
        self._commit(outcome)
        return self._active.settled(entry)

    def _rebound_now(self, outcome: _Outcome, envelope: Envelope) -> Envelope:
        """`envelope` moved as the rebind its row carries asks (one asked while an attempt was on
        the wire, which never ended), into `outcome` (its queue, its `Rebind` record); as it
        is, without one."""
        pending = envelope.rebind_after_attempt
        if pending is None:
            return envelope
        mark = RebindMark.of(pending)
        moved = msgspec.structs.replace(mark.envelope(envelope), rebind_after_attempt=None)
        outcome.queue = mark.queue
        outcome.notes.append(self._rebind_record(outcome.entry.message, moved, mark))
        return moved

    def after_attempt(self, entry: Entry, kind: str, mark: AdminMark) -> asyncio.Future[None]:
        """An operator held (`kind` "hold") or bounced ("bounce") a message whose attempt is on
        the wire: what that attempt does not deliver is held (`AdminHold`) or bounced
        (`AdminBounce`) when it ends. The mark goes into the message's row now
        (`Envelope.after_attempt`), so that an attempt a stop cuts short, or a crash, leaves
        the row to be held or bounced as it is loaded again, never attempted (a bounce asked
        already stays: it ends the message, a hold adds nothing to it). The future resolves
        once the mark is durable, or the attempt's outcome, which applies it, is: the operator
        is answered then. A write that fails is tried again while the attempt is on the wire."""
        if kind == "bounce":
            entry.admin_bounce = mark
        else:
            entry.admin_hold = mark
        message = entry.message
        pending = message.envelope.after_attempt
        if pending is None or pending.kind != "bounce":
            bound = list(mark.bound_to) if mark.bound_to is not None else None
            written = AfterAttempt(kind, mark.reason, mark.operator, bound)
            message.envelope = msgspec.structs.replace(message.envelope, after_attempt=written)
        return self._mark_durable(entry)

    def cancel_hold(self, entry: Entry) -> asyncio.Future[None]:
        """An operator released (`pigeon retry --id`) a message held while its attempt is on the
        wire, that hold not applied yet: it is cancelled, in memory (`Entry.admin_hold`) and in
        the row (`Envelope.after_attempt`), so that the attempt's outcome leaves the message
        deferred or due as any outcome does, and a stop or a crash before that outcome leaves a
        row that is not held as it is loaded again. A bounce asked too stays (a bounce is final:
        the caller says so), and so does a rebind (`rebind_after_attempt`: the row keeps it). The
        future resolves as `after_attempt`'s does, once the row no longer holds the hold (or the
        attempt's outcome, which no longer applies it, is durable): the operator is answered
        then. Written in the shard's commit order after the hold's own mark."""
        entry.admin_hold = None
        message = entry.message
        pending = message.envelope.after_attempt
        if pending is not None and pending.kind == "hold":
            message.envelope = msgspec.structs.replace(message.envelope, after_attempt=None)
        return self._mark_durable(entry)

    def rebind_after_attempt(self, entry: Entry, mark: RebindMark) -> asyncio.Future[None]:
        """An operator rebound a message whose attempt is on the wire: what that attempt does not
        deliver moves when it ends, due at once, with a `Rebind` record. The mark goes into the
        message's row now (`Envelope.rebind_after_attempt`), as a hold's does (`after_attempt`),
        so that an attempt a stop cuts short, or a crash, leaves the row to be moved as it is
        loaded again, before any attempt where it was. Asked again during the same attempt,
        the later rebind goes on from the earlier (`RebindMark.then`). A hold asked too is
        kept apart, with its own operator and binding; a bounce wins. The future resolves
        as `after_attempt`'s does: the operator is answered then."""
        pending = pending_rebind(entry)
        mark = pending.then(mark) if pending is not None else mark
        entry.rebind = mark
        message = entry.message
        message.envelope = msgspec.structs.replace(message.envelope, rebind_after_attempt=mark.written())
        return self._mark_durable(entry)

    def _mark_durable(self, entry: Entry) -> asyncio.Future[None]:
        """A future done once `entry`'s row holds its in-memory envelope (the marks just put on
        it), or once the outcome of its attempt, which applies them, is durable."""
        durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # (An outcome of the attempt made durable first applied the mark: answered then too.)
        self._active.settled(entry).add_done_callback(functools.partial(_resolve, durable))
        self._write_mark(entry, durable)
        return durable

    def _write_mark(self, entry: Entry, durable: asyncio.Future[None]) -> None:
        if durable.done() or not entry.active or entry.state is not State.IN_FLIGHT:
            return  # settling (or settled): its outcome writes what the mark asks
        message = entry.message
        spool = self._spools.of(message.id)
        written = spool.rewrite_envelope(message.id, message.envelope, attempts=message.attempts)
        written.add_done_callback(functools.partial(self._mark_written, entry, durable))

    def _mark_written(self, entry: Entry, durable: asyncio.Future[None], written: asyncio.Future[None]) -> None:
        if written.cancelled():
            return  # shutting down: committed or not, the next start finds the row consistent
        error = written.exception()
        if error is None:
            _resolve(durable, written)
            return
        _log.error("message %s: operator's mark not written (%s); will try again", format_id(entry.id), error)
        asyncio.get_running_loop().call_later(_RETRY_WRITE, self._write_mark, entry, durable)

    def defer(
        self,
        entry: Entry,
        until: float,
        *,
        queue: str | None = None,
        envelope: Envelope | None = None,
        rebind: RebindMark | None = None,
    ) -> asyncio.Future[None]:
        """Put a message nobody is sending back in the spool until `until`, untried (its queue
        is suspended, or it is rebound to another `queue` or route in `envelope`): no attempt
        is counted, and nothing is logged but the operator's `rebind`, once it is durable. The
        future resolves once that is durable."""
        message = entry.message
        outcome = self._begin(entry, message.attempts, until)
        outcome.remaining = envelope or message.envelope
        outcome.queue = queue
        if rebind is not None:
            outcome.notes.append(self._rebind_record(message, outcome.remaining, rebind))
        self._commit(outcome)
        return self._active.settled(entry)

    # --- outcomes ------------------------------------------------------------------------------
    def _begin(self, entry: Entry, attempts: int, due: float) -> _Outcome:
        """Take `entry` (SCHEDULED, READY, or IN_FLIGHT) into SETTLING."""
        return _Outcome(entry, transition(entry, entry.state, entry.generation, State.SETTLING), None, attempts, due)

    def _settle_attempt(self, entry: Entry, attempt: Attempt) -> _Outcome:
        message = entry.message
        now = self._clock()
        policy = self._policies.for_queue(message.queue)
        attempts = message.attempts + 1 if attempt.tried else message.attempts
        recipients = message.envelope.recipients
        replies = attempt.replies
        if len(replies) != len(recipients) or len(attempt.classifications) != len(recipients):
            # An agent's bug: refused before the message settles, so its caller can report it again.
            raise ValueError(f"an attempt needs one reply and one class per recipient: {attempt}")
        outcome = self._begin(entry, attempts, now)
        deferred: list[tuple[Recipient, Reply, int]] = []
        for index, recipient in enumerate(recipients):
            reply = replies[index]
            if reply.code < 400:
                fields = self._fields(message, recipient, reply, attempts, attempt, index)
                outcome.terminal.append(Delivery(**fields, converted=attempt.converted))
                if wants_success_notice(recipient) and not (via := attempt.peer_of(index))[2]:
                    # NOTIFY=SUCCESS and nobody further on will report it: an application's
                    # target is the end ("delivered"), held back as its route holds back a
                    # failure's DSN (no backscatter to a sender anyone can write); a peer
                    # without DSN, a relay onward ("relayed").
                    if message.envelope.target is None:
                        outcome.failures.append(Failure(recipient, reply, "relayed", _host(via[0])))
                    elif self._withheld(message, recipient)[0] is None:
                        outcome.failures.append(Failure(recipient, reply, "delivered"))
            elif reply.code >= 500:
                fields = self._fields(message, recipient, reply, attempts, attempt, index)
                classification = attempt.classifications[index]
                withheld, hold = self._withheld(message, recipient)
                if hold:
                    held = Held(**fields, classification=classification, cause="refused", dsn=withheld or "")
                    outcome.held.append((recipient, held))
                    continue
                # Pigeon's own refusal (DNS says no mail goes there, the server lacks
                # 8BITMIME) is no server's reply, though a server that was there is still named.
                peer = attempt.peer_of(index)[0]
                said_by = "server" if peer and index not in attempt.own else "pigeon"
                bounce = Bounce(**fields, classification=classification, dsn=withheld, said_by=said_by)
                outcome.terminal.append(bounce)
                if withheld is None:
                    # "smtp;" in the DSN only for what a server answered; a peer that was there
                    # is named (Remote-MTA), as an expiry names its last one.
                    # An application's target is no mail server: its answer comes in a reply
                    # Pigeon wrote, and its name is no host (and the operator's, not the sender's).
                    if said_by == "server" and message.envelope.target is None:
                        outcome.failures.append(Failure(recipient, reply, "failed", _host(peer)))
                    else:
                        attempted = now if peer else None  # (none without a peer: nothing was tried)
                        remote = _remote_mta(message, peer)
                        failure = Failure(recipient, reply, "failed", remote, "X-Pigeon", attempted)
                        outcome.failures.append(failure)
            else:
                deferred.append((recipient, reply, index))
        mark, on_hold = marks_after_attempt(entry)
        if mark is not None and (deferred or outcome.held):
            # An operator bounced it while this attempt was on the wire: what did not get
            # through now ends here instead of being retried or held. Each record keeps what
            # the attempt met, which no other record would tell.
            for recipient, reply, index in deferred:
                said = Response.of(reply)
                record = self._admin_bounce_record(message, recipient, attempts, mark, attempt, index, said)
                outcome.terminal.append(record)
            for recipient, held in outcome.held:
                record = self._admin_bounce_record(message, recipient, attempts, mark, attempt, -1, held.response)
                outcome.terminal.append(record)
            deferred, outcome.held = [], []
        elif mark is not None:
            _log.info("admin bounce by %s: message %s was settled by the attempt under way (its records say "
                      "how), not bounced", mark.operator, format_id(message.id))  # fmt: skip
        on_hold = on_hold if mark is None else None  # (a bounce asked too ends it: nothing to hold)
        if on_hold is not None and not deferred:
            _log.info("admin hold by %s: message %s was settled by the attempt under way (its records say "
                      "how), not held", on_hold.operator, format_id(message.id))  # fmt: skip
        if deferred:
            # Each recipient keeps the reply it got, which its expiry names (now, or from the
            # spool later). Not tried (its site is down): what each last met is the site's
            # failure, not "not tried", or an expiry would tell the sender only that.
            cause = attempt.cause if attempt.cause is not None and not attempt.tried else None
            lasts = [str(reply if cause is None else cause) for _, reply, _ in deferred]
            # Whose words each last reply is: a server's (its host, for an expiry's DSN to
            # name as `Remote-MTA` with its reply as `smtp;`), or Pigeon's own (None).
            peers = [None if cause is not None else _said_by_server(message, attempt, i) for _, _, i in deferred]
            # Pigeon's own words about a server it reached (the connection broke there): its host,
            # which the expiry's DSN names as the delay warning does (`Remote-MTA`, `X-Pigeon;`).
            hosts = [
                None if cause is not None or peer is not None else _reached(message, attempt, i)
                for (_, _, i), peer in zip(deferred, peers, strict=True)
            ]
            due = policy.retry.next_due(message.age_from, attempts, now, self._rng)
            if due is not None and attempt.retry_after is not None:
                due = min(now + attempt.retry_after, policy.retry.expires(message.age_from))
            if due is not None and attempt.not_before is not None:
                wait = min(attempt.not_before, policy.retry.max_retry_interval)
                due = min(max(due, now + wait), policy.retry.expires(message.age_from))
            rebind = pending_rebind(entry)
            if rebind is not None and due is not None:
                # Rebound while this attempt was on the wire: what is left moves now, due at once.
                due, outcome.queue = now, rebind.queue
            if on_hold is not None:
                # Held while this attempt was on the wire: what is left waits for the operator,
                # and does not expire meanwhile (past max_age, it does once released).
                due = HELD
            if due is None:
                max_age = policy.retry.max_age
                for (recipient, _, index), last, peer in zip(deferred, lasts, peers, strict=True):
                    reply = expired_reply(last, max_age, attempt.held_by)
                    self._expired(outcome, recipient, reply, attempt, index, said=(peer, last) if peer else None)
            else:
                outcome.due = due
                kept = [
                    msgspec.structs.replace(recipient, last_response=last, last_peer=peer, last_host=host)
                    for (recipient, _, _), last, peer, host in zip(deferred, lasts, peers, hosts, strict=True)
                ]
                outcome.remaining = msgspec.structs.replace(
                    message.envelope,
                    recipients=kept,
                    last_response=lasts[-1],
                    last_attempt=now,
                    held_by=attempt.held_by,
                )
                # (Held: no "still being retried until ..." to its sender; it is not, for now.)
                warned: set[int] = set()
                if on_hold is None:
                    warned = self._warn_delayed(outcome, policy, deferred, peers, attempt, now)
                if warned:
                    # The mark goes into the row the delay DSN commits with: both, or neither.
                    outcome.remaining = msgspec.structs.replace(outcome.remaining, delay_warned=now)
                if rebind is not None:
                    outcome.remaining = rebind.envelope(outcome.remaining)
                    outcome.notes.append(self._rebind_record(message, outcome.remaining, rebind))
                if on_hold is not None:
                    outcome.remaining = held_envelope(outcome.remaining, on_hold)
                    outcome.notes.append(self._hold_record(message, outcome.remaining, on_hold, outcome.queue))
                for recipient, reply, index in deferred:
                    fields = self._fields(message, recipient, reply, attempts, attempt, index)
                    # Classified as a bounce is (KumoMTA classifies every record): a deferral
                    # for a full mailbox is told from one for a provider's rate limit.
                    classification = attempt.classifications[index] or self._classify(reply)
                    transient = TransientFailure(
                        **fields,
                        next_attempt=0.0 if on_hold is not None else due,  # (held: none, said 0)
                        classification=classification,
                        delay_notified=index in warned,
                    )
                    outcome.transient.append(transient)
        self._keep_held(outcome)
        left = outcome.remaining
        if left is not None and (left.after_attempt is not None or left.rebind_after_attempt is not None):
            # This outcome applied what an operator asked while the attempt was on the wire.
            outcome.remaining = msgspec.structs.replace(left, after_attempt=None, rebind_after_attempt=None)
        self._write(outcome, policy.dsn)
        return outcome

    def _warn_delayed(
        self,
        outcome: _Outcome,
        policy: QueuePolicy,
        deferred: list[tuple[Recipient, Reply, int]],
        peers: list[str | None],
        attempt: Attempt,
        now: float,
    ) -> set[int]:
        """The deferred recipients (the attempt's indexes) whose sender is told now, once, that
        the message is still being retried (`[delivery] delay_warning`, Postfix's
        `delay_warning_time`): their "delayed" reports go into `outcome.failures`, to be
        committed with the outcome. None when it is off, was done before (`delay_warned`), the
        message is younger than that, its sender is <> or gets no DSN from this queue; nor for
        a recipient whose NOTIFY leaves out DELAY, or whose route withholds its DSNs."""
        message = outcome.entry.message
        envelope = message.envelope
        warning = policy.delay_warning
        if warning <= 0 or envelope.delay_warned is not None or now - message.created < warning:
            return set()
        if not policy.dsn or not envelope.sender or self._notifier is None:
            return set()
        warned: set[int] = set()
        until = policy.retry.expires(message.age_from)
        for (recipient, reply, index), peer in zip(deferred, peers, strict=True):
            if not wants_delay_notice(recipient) or self._withheld(message, recipient)[0] is not None:
                continue
            if peer is not None:
                # A server's 4xx: its words and its host, as a failure's DSN reports them.
                report = Failure(recipient, reply, "delayed", peer, "smtp", now, retry_until=until)
            else:
                # Pigeon's own (a refused connection, a DNS failure, "not tried": its site is down).
                said = attempt.cause if attempt.cause is not None and not attempt.tried else reply
                attempted = now if attempt.tried else envelope.last_attempt
                peer_name = _remote_mta(message, attempt.peer_of(index)[0] if attempt.tried else None)
                report = Failure(recipient, said, "delayed", peer_name, "X-Pigeon", attempted, retry_until=until)
            outcome.failures.append(report)
            warned.add(index)
        return warned

    def _expired(
        self,
        outcome: _Outcome,
        recipient: Recipient,
        reply: Reply,
        attempt: Attempt | None,
        index: int = -1,
        *,
        said: tuple[str, str] | None = None,
        at: str | None = None,
    ) -> None:
        """`recipient` (the attempt's recipient `index`) expired: an `Expiration` (with a DSN
        if it may have one), or held. `said`: the host and the reply of a server that gave
        the recipient's last failure, which its DSN reports (None: Pigeon's own words were).
        `at`, expired before an attempt (`attempt` None): the host Pigeon's own words of that
        last failure were about (`Recipient.last_host`), which its DSN names."""
        message = outcome.entry.message
        fields = self._fields(message, recipient, reply, outcome.attempts, attempt, index)
        withheld, hold = self._withheld(message, recipient)
        if hold:
            outcome.held.append((recipient, Held(**fields, cause="expired", dsn=withheld or "")))
            return
        outcome.terminal.append(Expiration(**fields, dsn=withheld))
        if withheld is None:
            # Expired before an attempt: the last one was at its deferral (none: never tried).
            attempted = message.envelope.last_attempt if attempt is None else self._clock()
            if said is not None:
                # A server's reply was the last failure: reported as its (`Remote-MTA`, `smtp;`),
                # as Postfix reports mail that expires after deferrals, so that a parser gets the
                # remote status; the Status stays the expiry's 5.4.7, and the text says it expired.
                host, last = said
                outcome.failures.append(Failure(recipient, reply, "failed", host, "smtp", attempted, last))
            else:
                # A server reached all the same (the connection broke there) is named, as the
                # delay warning for that failure named it.
                peer = _remote_mta(message, fields["peer"] if attempt is not None else at)
                outcome.failures.append(Failure(recipient, reply, "failed", peer, "X-Pigeon", attempted))

    def _withheld(self, message: Message, recipient: Recipient) -> tuple[str | None, bool]:
        """For a failed recipient: why its sender gets no DSN (None: it may get one), and
        whether the message is then held rather than ended (mail of [[inbound]] routes only)."""
        if message.envelope.target is None:
            return None, False
        policy = self._route_failures(recipient.address) or _ROUTE_DEFAULT
        withheld = policy.withheld(message.envelope)
        return withheld, withheld is not None and policy.hold

    def _keep_held(self, outcome: _Outcome) -> None:
        """Held recipients stay in the row. Alone, they make it due at `HELD` (only an operator
        brings it back); with recipients to retry (not seen: a target answers alike for all of
        a message's recipients), they are tried again with those."""
        if not outcome.held:
            return
        # Each recipient keeps why it is held as its last reply, as one retried keeps its own.
        kept = [
            msgspec.structs.replace(recipient, last_response=_why(held), last_peer=None, last_host=None)
            for recipient, held in outcome.held
        ]
        if outcome.remaining is not None:
            outcome.remaining = msgspec.structs.replace(
                outcome.remaining, recipients=[*outcome.remaining.recipients, *kept]
            )
            return
        why = _why(outcome.held[-1][1])
        outcome.remaining = msgspec.structs.replace(
            outcome.entry.message.envelope, recipients=kept, held=why, last_response=why
        )
        # The shortest `held_for` of the routes involved; HELD itself is "for ever".
        spans = [(self._route_failures(r.address) or _ROUTE_DEFAULT).held_for for r in kept]
        outcome.due = HELD + (self._clock() + min(spans) if min(spans) > 0 else 0.0)

    def _admin_bounce_record(
        self,
        message: Message,
        recipient: Recipient,
        attempts: int,
        mark: AdminMark,
        attempt: Attempt | None = None,
        index: int = -1,
        said: Response | None = None,
    ) -> AdminBounce:
        """`attempt`: the one on the wire when the operator bounced the message, whose
        recipient `index` was answered `said`."""
        reason = mark.reason
        reply = Reply(550, "5.7.1", (f"Administratively bounced: {reason}" if reason else "Administratively bounced",))
        fields = self._fields(message, recipient, reply, attempts, attempt, index)
        return AdminBounce(**fields, reason=reason, operator=mark.operator, attempt_response=said)

    # --- writing -------------------------------------------------------------------------
    def _write(self, outcome: _Outcome, dsn: bool) -> None:
        message = outcome.entry.message
        failures = [f for f in outcome.failures if f.action != "failed" or wants_failure_notice(f.recipient)]
        if dsn and failures and message.envelope.sender and self._notifier is not None:
            # The DSN and the outcome it reports commit in one transaction (in the message's
            # shard): a crash leaves both or neither, never a DSN whose failures are tried,
            # and reported, again.
            spool = self._spools.of(message.id)
            settles = Settling(
                message,
                outcome.remaining,
                outcome.attempts,
                outcome.due,
                self._sealed(outcome, spool),
                outcome.queue,
            )
            stored = self._notifier(message, failures, settles)
            stored.add_done_callback(functools.partial(self._notified, outcome, spool))
        else:
            self._commit(outcome)

    def _notified(self, outcome: _Outcome, spool: Spool, stored: asyncio.Future[object]) -> None:
        if stored.cancelled():
            return  # shutting down: committed or not, the next start finds it consistent
        error = stored.exception()
        if error is not None:
            # Neither the DSN nor the outcome is stored: both are tried again.
            _log.error("message %s: DSN not stored (%s); will try again", format_id(outcome.entry.id), error)
            asyncio.get_running_loop().call_later(_RETRY_WRITE, self._write, outcome, True)
            return
        self._done(outcome, spool)

    def _sealed(self, outcome: _Outcome, spool: Spool) -> list[tuple[int, bytes]]:
        """The outcome's records, sealed for the outbox once (a retry stores the same)."""
        if not outcome.encoded and (outcome.terminal or outcome.held):
            outcome.encoded = self._outbox.seal(spool, [*outcome.terminal, *(record for _, record in outcome.held)])
        return outcome.encoded

    def _commit(self, outcome: _Outcome) -> None:
        message = outcome.entry.message
        spool = self._spools.of(message.id)
        future = spool.settle(
            message,
            outcome.remaining,
            attempts=outcome.attempts,
            due=outcome.due,
            records=self._sealed(outcome, spool),
            queue=outcome.queue,
        )
        future.add_done_callback(functools.partial(self._committed, outcome, spool))

    def _committed(self, outcome: _Outcome, spool: Spool, future: asyncio.Future[None]) -> None:
        error = future.exception()
        if error is not None:
            _log.error("message %s: outcome not written (%s); will try again", format_id(outcome.entry.id), error)
            asyncio.get_running_loop().call_later(_RETRY_WRITE, self._commit, outcome)
            return
        self._done(outcome, spool)

    def _done(self, outcome: _Outcome, spool: Spool) -> None:
        """The outcome is durable: log its records, let the message go."""
        entry = outcome.entry
        if outcome.written is not None and not outcome.written.done():
            outcome.written.set_result(None)
        if entry.generation != outcome.generation or not entry.active:
            # By construction nothing moves a SETTLING message: say so if it happened.
            _log.error("message %s: moved while its outcome was being written", format_id(entry.id))
            return
        counts = self._counts
        self._outbox.committed(spool, outcome.encoded)
        for record in outcome.terminal:
            counts.outcome(type(record).__name__, record.queue, record.site, source=record.source)
            if isinstance(record, Bounce):
                counts.classified("Bounce", record.classification)
        if any(isinstance(record, Delivery) and record.converted for record in outcome.terminal):
            counts.converted_messages += 1  # (the message, once, however many recipients it went to)
        for _, held in outcome.held:
            counts.outcome("Held", held.queue, held.site, source=held.source)
        for transient in outcome.transient:
            self._log.write(transient)
            counts.outcome("TransientFailure", transient.queue, transient.site, source=transient.source)
            if transient.classification:
                counts.classified("TransientFailure", transient.classification)
        for note in outcome.notes:
            self._log.write(note)
        if outcome.remaining is not None:
            self._active.finish(entry, State.SCHEDULED, outcome.due, self._clock())
        else:
            self._active.finish(entry, _terminal_state(outcome.terminal))

    # --- helpers -----------------------------------------------------------------------
    def _rebind_record(self, message: Message, moved: Envelope, mark: RebindMark) -> Rebind:
        """The record of an operator's rebind of `message`, `moved` being its envelope after it."""
        queue = mark.queue if mark.queue is not None else message.queue
        return Rebind(
            timestamp=self._clock(),
            id=format_id(message.id),
            queue=queue,
            recipients=[recipient.address for recipient in moved.recipients],
            from_queue=message.queue if queue != message.queue else None,
            route=mark.routing_domain,
            operator=mark.operator,
            operation=mark.operation,
            tenant=moved.tenant,
            campaign=moved.campaign,
        )

    def _hold_record(self, message: Message, held: Envelope, mark: AdminMark, queue: str | None = None) -> AdminHold:
        """The record of an operator's hold of `message`, `held` being its envelope after it;
        `queue`: the one a rebind moved it to with the hold (None: its own)."""
        return AdminHold(
            timestamp=self._clock(),
            id=format_id(message.id),
            queue=queue if queue is not None else message.queue,
            recipients=[recipient.address for recipient in held.recipients],
            reason=mark.reason,
            operator=mark.operator,
            tenant=held.tenant,
            campaign=held.campaign,
        )

    def _fields(
        self,
        message: Message,
        recipient: Recipient,
        reply: Reply,
        attempts: int,
        attempt: Attempt | None,
        index: int = -1,
    ) -> dict[str, Any]:
        """A record's fields; the peer and TLS (and the failed handshake its connection fell
        back from) are those recipient `index` of the attempt was answered by (-1: the attempt's own)."""
        peer, tls = (None, None) if attempt is None else (attempt.peer, attempt.tls)
        tls_failed = None if attempt is None else attempt.tls_failed
        if attempt is not None and index >= 0 and attempt.via:
            peer, tls, _ = attempt.peer_of(index)
            tls_failed = attempt.tls_failed_of(index)
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
            "source": attempt.source if attempt else None,
            "peer": peer,
            "tls": tls,
            "tls_failed": tls_failed,
            "auth_user": attempt.auth_user if attempt else None,
            "created": message.created,
            "duration": attempt.duration if attempt else None,
            "meta": message.envelope.metadata,
            "tenant": message.envelope.tenant,
            "campaign": message.envelope.campaign,
        }


def _resolve(future: asyncio.Future[None], done: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _terminal_state(records: list[Terminal]) -> State:
    if all(isinstance(r, Delivery) for r in records):
        return State.DELIVERED
    if any(isinstance(r, Expiration) for r in records):
        return State.EXPIRED
    if any(isinstance(r, AdminBounce) for r in records):
        return State.ADMIN_BOUNCED
    return State.BOUNCED


def _why(held: Held) -> str:
    """Why a recipient is held, as its last reply and the message's `held` say it."""
    return f"{held.cause}: {held.response.code} {held.response.text}"


def _host(peer: str | None) -> str | None:
    return peer.split(" ", 1)[0] if peer else None


def _said_by_server(message: Message, attempt: Attempt, index: int) -> str | None:
    """The host whose reply recipient `index` of `attempt` got, when a server gave it (as
    `said_by` of a bounce tells): None for Pigeon's own (no peer, a reply it wrote with a peer
    there: `Attempt.own`) and for an application's target (no mail server)."""
    if not attempt.tried or index in attempt.own or message.envelope.target is not None:
        return None
    return _host(attempt.peer_of(index)[0])


def _reached(message: Message, attempt: Attempt, index: int) -> str | None:
    """The host of the server recipient `index` of `attempt` was at when it failed, whoever's
    words say how: None when it was not tried, no server was reached (a refused connection),
    or it went to an application's target (no mail server)."""
    if not attempt.tried or message.envelope.target is not None:
        return None
    return _host(attempt.peer_of(index)[0])


def _remote_mta(message: Message, peer: str | None) -> str | None:
    """The DSN's Remote-MTA for what `peer` answered: none for an application's target (its
    name is no host's)."""
    return None if message.envelope.target is not None else _host(peer)
