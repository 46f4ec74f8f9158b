"""The delivery hooks' side of an attempt: what `before_delivery` and `on_delivery_outcome`
answers do to it, as attempts the queue already understands.

The dispatcher asks `before()` for each message it is about to hand to an agent, and
`after()` for each attempt the agent reports; only the queue then decides what the
(possibly changed) attempt means, as for any other. Neither ever loses or doubles a message:

* `before_delivery` failing (raising, timing out) defers the message: a transient failure
  with `451 4.3.0`, retried with the queue's backoff;
* `on_delivery_outcome` failing keeps the attempt as the agent reported it.

A `Reroute` of mail of an `[[inbound]]` route is not carried out, and said (a WARNING): that
mail goes to its application's target, as it keeps its own queue and target whatever
`on_message` answers (`Changes(queue=, route=)`); rerouted, it would leave over SMTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final, TypeAlias

from pigeon.message import Message, format_id
from pigeon.policy.answers import Defer, Fail, Reclassify, Reroute
from pigeon.policy.hooks import POLICY_ERROR, Hook, HookFailed, Policy, Verdict
from pigeon.policy.objects import Delivery, DeliveryOutcome, RecipientResult
from pigeon.queue.attempt import Attempt
from pigeon.queue.policy import PoolChooser
from pigeon.smtp.address import a_label
from pigeon.smtp.replies import Reply

_log = logging.getLogger(__name__)

BeforeAnswer: TypeAlias = Defer | Fail | Reroute
Vetted: TypeAlias = Attempt | Reroute | None
"""What `before_delivery` makes of an attempt: send it (None), report that instead, route anew."""

_MAX_REROUTES: Final = 5
"""Reroutes of one message in a row, without an attempt between, that a hook may ask for."""
_REROUTES_KEPT: Final = 10_000  # messages whose reroutes in a row are counted, at most

PoolOf = Callable[[Message], tuple[str | None, PoolChooser | None]]
"""A message's egress pool and what named it (`pigeon.queue.policy.egress_pool`)."""


class DeliveryHooks:
    """`before_delivery` and `on_delivery_outcome` of a `Policy` (None-checked per call, so
    a reload that adds or drops one takes effect at the next attempt).

    `pool_of` gives a message's egress pool and what named it, as the scheduler chooses it
    (`pigeon.queue.policy.egress_pool` with the node's `[[queue]]`s and `[delivery] pool`), so
    a hook sees the pool the mail really leaves from, not only one a hook named."""

    def __init__(self, policy: Policy, classify: Callable[[Reply], str], pool_of: PoolOf) -> None:
        self._policy = policy
        self._classify = classify
        self._pool_of = pool_of
        self._reroutes: dict[int, int] = {}  # message id -> reroutes in a row, without an attempt

    @property
    def vets(self) -> bool:
        """Whether the module has a `before_delivery` hook."""
        return self._policy.before_delivery is not None

    @property
    def reviews(self) -> bool:
        """Whether the module has an `on_delivery_outcome` hook."""
        return self._policy.on_delivery_outcome is not None

    def delivery(self, message: Message, site: str, source: str | None = None) -> Delivery:
        """What the hooks are told of an attempt at `message` (made once a message: both
        hooks are told the same)."""
        return _delivery(message, site, source, self._pool_of)

    def before(self, message: Message, delivery: Delivery) -> Vetted | Coroutine[Any, Any, Vetted]:
        """None: send it. An `Attempt`: report that instead of sending (deferred or failed).
        A `Reroute`: put it back to be routed anew (never for mail of an `[[inbound]]` route:
        sent to its target). Answered at once, except for a hook that must be waited for
        (async, on a thread): then a coroutine of the answer, as a coroutine for every
        message would cost a plain hook's mail more than the hook does."""
        hook = self._policy.before_delivery
        if hook is None:
            return None
        try:
            verdict = hook(delivery, message_id=delivery.id)
            if isinstance(verdict, asyncio.Future):
                return self._vetted_later(message, delivery, verdict)
            return self._vetted(message, delivery, verdict)
        except Exception as error:
            return self._vetted(message, delivery, self._failed("before_delivery", error, delivery))

    async def _vetted_later(
        self, message: Message, delivery: Delivery, verdict: asyncio.Future[Verdict[BeforeAnswer]]
    ) -> Vetted:
        try:
            return self._vetted(message, delivery, await verdict)
        except Exception as error:
            return self._vetted(message, delivery, self._failed("before_delivery", error, delivery))

    def _failed(self, name: str, error: Exception, delivery: Delivery) -> HookFailed:
        """A hook's answer that could not be carried out (a bug of ours, or of an answer's own
        checks): the hook's failure, recorded as one (a PolicyFailure), as the module docstring
        says a failing hook's attempt goes; never an internal error of the delivery, which
        would send a message that `on_delivery_outcome` was told of again."""
        hook: Hook[Any] | None = getattr(self._policy, name)
        if hook is not None:  # (None: the policy was reloaded without it meanwhile)
            try:
                return hook.failed(error, None, delivery.id)
            except Exception:
                pass
        _log.error("policy hook %s failed (message %s): %s", name, delivery.id, error, exc_info=error)
        return HookFailed(POLICY_ERROR)

    def _vetted(self, message: Message, delivery: Delivery, verdict: Verdict[BeforeAnswer]) -> Vetted:
        if self._reroutes and not isinstance(verdict, Reroute):
            self._reroutes.pop(message.id, None)  # sent, or an attempt made: its reroutes in a row end
        if verdict is None:
            return None
        site = delivery.site
        count = len(message.envelope.recipients)
        if isinstance(verdict, HookFailed):
            return Attempt.same_for_all(verdict.reply, count, "", site)
        if isinstance(verdict, Defer):
            reply = Reply(451, "4.7.0", (verdict.reason,))
            return Attempt([reply] * count, [""] * count, site, retry_after=verdict.delay)
        if isinstance(verdict, Fail):
            reply = Reply(verdict.code, verdict.enhanced, (verdict.reason,))
            return Attempt.same_for_all(reply, count, self._classify(reply), site)
        target = message.envelope.target
        if target is not None:
            _log.warning("before_delivery answered Reroute(%r) for message %s of the [[inbound]] route's queue %s: "
                         "not carried out; it goes to its target %s", verdict.domain, format_id(message.id),
                         message.queue, target)  # fmt: skip
            return None
        routed = message.envelope.routing_domain  # None: as its recipients' own domains
        # As recipient domains are named: a U-label is its A-label; "" is their own domains.
        # (A final dot is the same name: `[[route]] domain = "a.test"` matches `a.test.` too.)
        named = verdict.domain.removesuffix(".")
        domain = a_label(named) if named else ""
        if domain == (a_label(routed) if routed else ""):
            self._reroutes.pop(message.id, None)
            return None  # already routed so: a hook that reroutes every time must not loop
        # A hook that sends it back and forth (a.test, b.test, a.test...) must not loop either:
        # past a few reroutes in a row without an attempt, it goes where it is routed now.
        if len(self._reroutes) >= _REROUTES_KEPT:
            self._reroutes.clear()  # (of messages gone meanwhile, bounced by an operator say)
        reroutes = self._reroutes[message.id] = self._reroutes.get(message.id, 0) + 1
        if reroutes > _MAX_REROUTES:
            del self._reroutes[message.id]
            _log.warning("before_delivery answered Reroute(%r) for message %s after rerouting it %d times in a row "
                         "without an attempt: not carried out; it is sent as routed now (%s)", verdict.domain,
                         format_id(message.id), _MAX_REROUTES, routed or "its recipients' domains")  # fmt: skip
            return None
        return Reroute(domain)

    def after(
        self, message: Message, attempt: Attempt, delivery: Delivery | None = None
    ) -> Attempt | Coroutine[Any, Any, Attempt]:
        """The attempt as the queue should take it: at once, or a coroutine of it for a hook
        that must be waited for. `delivery`: what `before_delivery` was told of this attempt,
        if it was (the outcome hook is told the same)."""
        hook = self._policy.on_delivery_outcome
        if hook is None:
            return attempt
        try:
            return self._review(hook, message, attempt, delivery)
        except Exception as error:
            self._failed("on_delivery_outcome", error, delivery or self.delivery(message, attempt.site, attempt.source))
            return attempt

    def _review(
        self, hook: Hook[Reclassify], message: Message, attempt: Attempt, delivery: Delivery | None
    ) -> Attempt | Coroutine[Any, Any, Attempt]:
        recipients = message.envelope.recipients
        peer_of = attempt.peer_of
        results = tuple([
            RecipientResult(
                recipient.address,
                reply.code,
                reply.enhanced,
                reply.text,
                "delivered" if reply.code < 400 else "permanent" if reply.code >= 500 else "transient",
                classification,
                peer_of(index)[0],
            )
            for index, (recipient, reply, classification) in enumerate(
                zip(recipients, attempt.replies, attempt.classifications, strict=True)
            )
        ])  # fmt: skip
        if delivery is None or delivery.site != attempt.site or delivery.source != attempt.source:
            delivery = _delivery(message, attempt.site, attempt.source, self._pool_of)
        verdict = hook(
            DeliveryOutcome(delivery, results, attempt.peer, attempt.tls, attempt.duration), message_id=delivery.id
        )
        if isinstance(verdict, asyncio.Future):
            return self._reviewed_later(message, attempt, delivery, verdict)
        return self._reviewed(message, attempt, delivery, verdict)

    async def _reviewed_later(
        self, message: Message, attempt: Attempt, delivery: Delivery, verdict: asyncio.Future[Verdict[Reclassify]]
    ) -> Attempt:
        try:
            answer = await verdict
        except Exception as error:
            self._failed("on_delivery_outcome", error, delivery)
            return attempt
        return self._reviewed(message, attempt, delivery, answer)

    def _reviewed(
        self, message: Message, attempt: Attempt, delivery: Delivery, verdict: Verdict[Reclassify]
    ) -> Attempt:
        """The attempt as the answer reclassifies it; any answer that cannot be carried out (it
        names a delivered recipient, or one of no attempt's) fails the hook and keeps the
        attempt as it was made: the messages are sent by now, and an error here must not make
        them be sent again."""
        if verdict is None or isinstance(verdict, HookFailed):
            return attempt
        try:
            return self._reclassified(message, attempt, verdict)
        except ValueError as error:  # an answer that does not fit this attempt: said without a traceback
            hook = self._policy.on_delivery_outcome
            if hook is not None:
                try:
                    hook.failed(error, None, delivery.id, show_traceback=False)
                except Exception:
                    _log.exception("policy hook on_delivery_outcome failed, and its failure could not be recorded")
            return attempt
        except Exception as error:
            self._failed("on_delivery_outcome", error, delivery)
            return attempt

    def _reclassified(self, message: Message, attempt: Attempt, verdict: Reclassify) -> Attempt:
        addresses = [recipient.address for recipient in message.envelope.recipients]
        replies, classes = list(attempt.replies), list(attempt.classifications)
        for index in _chosen(verdict.transient, addresses, replies, permanent=True):
            reply = replies[index]
            replies[index] = _moved(reply, 4, "transient")
            # The server's reply's class, for its TransientFailure records (found from outside:
            # read from Pigeon's words, "policy made it transient: ...", every one was
            # PolicyRelated).
            classes[index] = classes[index] or self._classify(reply)
        for index in _chosen(verdict.permanent, addresses, replies, permanent=False):
            replies[index] = reply = _moved(replies[index], 5, "permanent")
            classes[index] = verdict.classification or self._classify(reply)
        return attempt._replace(replies=replies, classifications=classes)


def _chosen(which: Sequence[str] | str, addresses: list[str], replies: list[Reply], *, permanent: bool) -> list[int]:
    """Indexes of the recipients named (or "all") whose failure is of the other kind."""
    if which == "all":
        return [i for i, reply in enumerate(replies) if (reply.code >= 500) == permanent and reply.code >= 400]
    lowered = [address.lower() for address in addresses]
    chosen = []
    for address in which:
        try:
            index = lowered.index(address.lower())
        except ValueError:
            raise ValueError(f"Reclassify names {address!r}, not a recipient of this attempt") from None
        reply = replies[index]
        if reply.code < 400:
            raise ValueError(f"Reclassify names {address!r}, which was delivered ({reply.code})")
        if (reply.code >= 500) == permanent:
            chosen.append(index)
    return chosen


def _moved(reply: Reply, klass: int, kind: str) -> Reply:
    """`reply` as a failure of class `klass` (4 or 5), its original wording kept in the text.

    The enhanced code keeps its subject and detail. The basic code says only what both classes
    mean alike (RFC 5321 4.2.2): 550 and 552 become 450 and 452 ("mailbox unavailable", "not
    enough storage"); any other 5xx becomes 451 (a 554 would be 454, "TLS not available");
    and a permanent failure is always 550 (451 "local error" would be 551 "user not local").
    550 and 451 say "not taken" and "try again" without claiming more."""
    enhanced = f"{klass}{reply.enhanced[1:]}" if reply.enhanced else None
    code = 550 if klass == 5 else reply.code - 100 if reply.code in (550, 552) else 451
    return Reply(code, enhanced, (f"policy made it {kind}: {reply.code} {reply.text}",))


def _delivery(message: Message, site: str, source: str | None, pool_of: PoolOf) -> Delivery:
    envelope = message.envelope
    pool, pool_from = pool_of(message)
    return Delivery(
        id=format_id(message.id),
        queue=message.queue,
        tenant=envelope.tenant,
        campaign=envelope.campaign,
        sender=envelope.sender,
        recipients=tuple(recipient.address for recipient in envelope.recipients),
        size=message.size,
        attempt=message.attempts + 1,
        site=site,
        routing_domain=envelope.routing_domain,
        egress_pool=pool,
        created=message.created,
        last_response=envelope.last_response,
        source=source,
        egress_pool_from=pool_from,
    )
