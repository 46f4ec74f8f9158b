"""Operators' actions on live queues: bounce, suspend, resume, rebind, retry now, inspect.

A bulk operation walks the spool in id order, in batches, on the event loop. For each
matching message it acts on what the message is *now*:

| where the message is                  | bounce                  | suspend               | rebind           |
|---------------------------------------|-------------------------|-----------------------|------------------|
| only in the spool                     | claimed, `AdminBounce`  | held when due (rule)  | claimed, moved   |
| scheduled / ready / taken, not sent   | `AdminBounce`           | back to the spool     | moved, due now   |
| being sent (its attempt began)        | the rest admin-bounced  | left to finish        | the rest moved   |
| settling (an outcome being written)   | waits for the commit, then acts on the row it left, if any |||

A held message (mail of an `[[inbound]]` route its target refused for good, or that expired,
kept in the spool instead of bounced to its sender) is released by `retry`: it is attempted
again, with `max_age` counted afresh. Resuming a suspension does not release it.

`hold` holds messages by id (`postsuper -h`), as a bounce by id finds them: claimed and put
back due at `HELD` with the operator's reason (`AdminHold`); one being sent, as far as its
attempt leaves it, when the attempt ends. Released by `retry` of its id only (a retry by
selector leaves it, `on_hold`; so does a retry by id of a token bound to tenants, of a hold
that is not its binding's: `Envelope.hold_bound_to`), with `max_age` still counted from its arrival: held mail does
not expire while held, and released past `max_age` it expires at its next turn, with the usual
DSN. A rebind moves it and leaves it held.

A rebind leaves mail of an `[[inbound]]` route as it is (held or not; counted in its answer):
that mail goes to its application's target, never to another queue or route, as it keeps its
own queue and target whatever a policy hook answers (`Changes(queue=, route=)`, `Reroute`).

"The rest": what that attempt does not deliver ends with `AdminBounce` instead of a retry, or is
moved and due at once, when the attempt ends. A bounce, a hold or a rebind of a message being
sent is committed to its row before the operator is answered (`Settlement.after_attempt`,
`rebind_after_attempt`): an attempt that never ends (a stop cuts it before its content went, a
crash) leaves the row to be bounced, held or moved as it is loaded again, never attempted where
it was. A bounce wins over a rebind; a hold and a rebind both apply (moved, and held there).

Claiming a message (putting it into the active set) is what keeps the scheduler from loading
it meanwhile; acting moves it to `settling` through `queue.settlement`, so a route lookup or a
delivery agent holding a lease on it finds the lease stale and drops its result. A message
is never acted on from an in-memory copy that a settlement may have changed: a settling one is
waited for, and its row read again.

Each batch waits for its commits, then rests as long as it took, so an operation takes at
most about half of the loop and of the commit thread and reception and delivery go on.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, BinaryIO, Final

import msgspec

from pigeon.message import HELD, Message, SpoolId, envelope_tenant, format_id, shard_of
from pigeon.queue import listing
from pigeon.queue.names import queue_parts
from pigeon.queue.ready import ReadyQueue, ReadyQueues
from pigeon.queue.rules import Rule, RuleIdTaken, Rules, Selector, describe_rule, new_rule_id, taken_by
from pigeon.queue.settlement import Settlement, marks_after_attempt
from pigeon.queue.state import ActiveSet, AdminMark, Entry, RebindMark, State
from pigeon.shaping.effects import Effect
from pigeon.spool.shards import Spools
from pigeon.spool.spool import Spool

_log = logging.getLogger(__name__)
_BATCH: Final = 1000
_PROGRESS_EVERY: Final = 100_000
_KEEP_OPERATIONS: Final = 100  # recent bulk operations kept for GET /api/v1/admin/operations
_MAX_WAITS: Final = 100  # a message settling again and again: give up on it, say so

__all__ = ["Admin", "Selector", "new_rule_id"]


# A scheduled queue's counts, every one always there, 0 or not: a client reads them without defaults.
class ScheduledQueue(msgspec.Struct, kw_only=True):
    """A scheduled queue: its messages in the spool, and those of them a worker holds in
    memory, by state. With `?cluster=1`, added up over every worker and node."""

    queue: str
    messages: int
    due: int  # due now
    held: int  # held ([[inbound]] mail an operator releases: `pigeon retry`)
    suspended: int
    """Held by an operator's suspension (until `pigeon resume` or its end): every message of a
    queue a suspension holds but those being sent or settling, and of any other queue those
    waiting in the ready queue of a site a suspension holds (`pigeon suspend --site`). What
    `pigeon suspend` answered as `held`, and what came due under it since."""
    scheduled: int  # in memory, its destination being looked up
    ready: int  # in a ready queue, waiting for a connection
    in_flight: int  # being delivered
    settling: int  # its outcome being made durable
    oldest: float  # the oldest message's arrival (Unix time)
    later: int = 0
    """In the spool, due at a time to come: its next retry (after a deferral, or a site found
    down), or when a suspension that holds it looks at it again."""
    next_due: float | None = None  # when the first of those is due (Unix time)
    suspended_by: list[Rule] = msgspec.field(default_factory=list)
    """The live suspensions that hold this queue's mail: each with its id, the `operator` (the
    name of the API token that asked), the `reason` given and when it ends. Judged on one of
    its messages: every message of a `campaign:tenant@domain` queue is matched by that name's
    parts alike (`Selector.matches`; of a queue named without "@", by a policy or a rebind, by
    each one's tenant, campaign and domain, which may differ). Else the suspensions of
    sites (`pigeon suspend --site`) whose ready queues hold some of its mail, as `suspended`
    counts it."""


class ReadyQueueRow(msgspec.Struct):
    """A ready queue (`source->site`, or `source->domain@site`): what waits in it, the
    connections open for it, and the shaping reactions' effects it waits under."""

    path: str
    source: str
    site: str
    queued: int
    connections: int
    provider: str | None  # the mailbox provider whose shaping the site's MX names matched
    effects: list[Effect]
    down: bool = False
    """No host of the site takes a connection: its mail waits, untried, for a probe
    (`[delivery] site_retry_interval`). With several workers: true if any worker found it so."""
    # The domain whose queue of its own this is (a [[shaping]] block names it); None: the
    # site's queue, shared by its other domains.
    domain: str | None = None
    suspended_by: list[Rule] = msgspec.field(default_factory=list)
    """The operators' live suspensions of deliveries to its site (`pigeon suspend --site`)."""


class QueueSummary(msgspec.Struct):
    """GET /api/v1/queues."""

    scheduled: list[ScheduledQueue]
    ready: list[ReadyQueueRow]


_IN_MEMORY: Final = frozenset({State.SCHEDULED, State.READY, State.IN_FLIGHT, State.SETTLING})


class _Done(enum.Enum):
    ACTED = "acted"
    MARKED = "marked"  # being sent: acted on when its attempt ends, on what the attempt leaves
    IGNORED = "ignored"  # not ours to act on (does not match, already gone, nothing to do)


_Act = Callable[[Entry], "tuple[_Done, asyncio.Future[None] | None]"]


class Admin:
    """The operations, for one worker's shards."""

    def __init__(
        self,
        *,
        spools: Spools,
        primary: Spool,
        active: ActiveSet,
        settlement: Settlement,
        rules: Rules,
        ready: ReadyQueues,
        rewind: Callable[[float], None],
        kick: Callable[[], None],
        promote: Callable[[Entry], None],
        connections: Callable[[str], int] = lambda path: 0,
        provider: Callable[[str], str | None] = lambda path: None,
        effects: Callable[[str], list[Effect]] = lambda path: [],
        holding: Callable[[ReadyQueue], str | None] = lambda queue: None,
        down: Callable[[ReadyQueue], bool] = lambda queue: False,
        probe_down: Callable[[], None] = lambda: None,
        pool_of: Callable[[Message], tuple[str | None, str | None]] = lambda message: (
            message.envelope.egress_pool,
            "policy" if message.envelope.egress_pool else None,
        ),
        reserved_for: Callable[[str], frozenset[str] | None] = lambda domain: None,
        clock: Callable[[], float] = time.time,
        pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._spools = spools
        self._primary = primary
        self._active = active
        self._settlement = settlement
        self._rules = rules
        self._ready = ready
        self._rewind = rewind
        """Make the scheduler read the spool again from a due time (and wake it)."""
        self._kick = kick
        """Start connections wherever mail waits (a site's suspension ended)."""
        self._promote = promote
        """Hand a claimed message the operation left alone to the scheduler."""
        self._connections = connections
        self._provider = provider
        """The provider whose limits a ready queue is delivered under (by its path), if any."""
        self._effects = effects
        """The reactions' effects on a ready queue (by its path): why it waits or is slowed."""
        self._holding = holding
        """What holds a ready queue's mail, if a reaction's suspension does (`Dispatcher.holding`)."""
        self._down = down
        """Whether a ready queue's site is down from its source (`pigeon.delivery.sites`): its
        mail waits for a probe."""
        self._probe_down = probe_down
        """Make the probe of every down site due now (an operator's retry)."""
        self._pool_of = pool_of
        self._reserved_for = reserved_for
        """The tenants the `[[route]]` of a domain is reserved for (`Router.reserved_for`); None: any."""
        """The egress pool a message leaves from, and what named it (`pigeon.queue.policy.egress_pool`)."""
        self._clock = clock
        self._pause = pause
        # By (id, `rule_created`): each resume of a rule id is a row of its own.
        self._operations: OrderedDict[tuple[str, float | None], dict[str, Any]] = OrderedDict()
        self._rules_changing = asyncio.Lock()
        """Held from looking for a standing rule to storing (or dropping) one: a request that
        finds none must not let an identical one find none too while it stores its own."""
        self._written: OrderedDict[str, int] = OrderedDict()
        """Rule id -> the number of the latest write to it its node's supervisor passed on here
        (`written`): what a hand-over of older rules may not undo (`adopt`)."""
        self._ended_at: OrderedDict[str, float] = OrderedDict()
        """Rule id -> when this worker last ended it: the cluster's copy of that rule, made before
        (an end issued while Redis was away, not yet sent), is not taken back (`adopt`)."""
        self._handing_over: set[asyncio.Task[None]] = set()
        """Walks of standing bounces handed over (`adopt`), running beside the node's work."""
        for rule in rules:
            self._release_later(rule)

    def _release_later(self, rule: Rule) -> None:
        # A site suspension that runs out must restart the connections it stopped.
        if rule.selector.site is not None and rule.expires is not None:
            delay = max(0.0, rule.expires - self._clock())
            asyncio.get_running_loop().call_later(delay + 0.01, self._kick)

    # --- operations ------------------------------------------------------------------------
    async def bounce(
        self,
        selector: Selector,
        *,
        reason: str,
        operator: str,
        duration: float | None,
        rule_id: str | None,
        via: str = "",
        accepted_before: float | None = None,
        issued: float | None = None,
        messages: Sequence[SpoolId] | None = None,
        bound_to: list[str] | None = None,
    ) -> dict[str, Any]:
        """Bounce every matching message now; with a duration, also new ones until it ends.
        `accepted_before`: only those accepted before then (`time.time()`), for a bounce
        another node was asked for seconds ago: what this node accepted since was not queued
        when the operator asked, and its sender was told it is. `issued`: when the request was
        issued, the rule's `created` (`_new_rule`). `bound_to`: the tenants of the token that
        asked (`Rule.bound_to`; None: unbound), kept with the rule; of `messages`, another
        tenant's is answered `not_found` without being read (`_batches`).

        `messages`: only these (`postsuper -d`), those `selector` matches too, and no rule
        (the request refuses a duration with them). The answer then says of each what became
        of it (`messages`: `_by_id`): the same walk, so a message being sent ends as a bulk
        bounce leaves it, with one terminal record per recipient."""
        rule = already = None
        if duration:
            async with self._rules_changing:  # (one id, one rule: looked up and stored at once)
                asked = self._new_rule("bounce", selector, reason, operator, duration, rule_id, via, issued, bound_to)
                already = self._held_as(asked, operator)
                rule = already or await self._add_rule(asked)
        mark = AdminMark(reason, operator)
        became: dict[SpoolId, tuple[str, int]] = {}  # of each message acted on: what, how many recipients
        missed: dict[SpoolId, list[str]] = {}  # named, not selected: the selector's members that miss it

        def act(entry: Entry) -> tuple[_Done, asyncio.Future[None] | None]:
            if accepted_before is not None and entry.message.created > accepted_before:
                return _Done.IGNORED, None
            recipients = len(entry.message.envelope.recipients)
            if entry.state is State.IN_FLIGHT and entry.started:
                became[entry.id] = ("after_attempt", recipients)
                return _Done.MARKED, self._settlement.after_attempt(entry, "bounce", mark)
            became[entry.id] = ("bounced", recipients)
            return _Done.ACTED, self._settlement.admin_bounce(entry, mark)

        bounced, after_attempt = await self._walk(
            selector, act, "bounce", rule_id, claim=True, ids=messages, missed=missed, of_tenants=bound_to
        )
        why = f" ({reason})" if reason else ""
        _log.warning("admin bounce by %s of %s: %s, %d of them once their attempt ends%s", operator,
                     _described(selector, messages), _messages(bounced), after_attempt, why)  # fmt: skip
        # A message being sent is bounced only as far as its attempt does not deliver it: said
        # apart, so "bounced 60" does not hide that 20 of them went out meanwhile.
        answer: dict[str, Any] = {"bounced": bounced, "after_attempt": after_attempt, "rule": _rule_view(rule)}
        if rule is not None:
            answer["already"] = already is not None  # asked again under its id: it stands as it was
        if messages is not None:
            answer["messages"] = _by_id(messages, became, missed)
        return answer

    async def hold(
        self,
        selector: Selector,
        *,
        messages: Sequence[SpoolId],
        reason: str,
        operator: str,
        operation: str | None = None,
        bound_to: list[str] | None = None,
    ) -> dict[str, Any]:
        """Hold these messages (`postsuper -h`), of those `selector` matches too: each goes back
        to the spool untried, due at `HELD` (never by itself, and it does not expire while held),
        with the operator's reason and an `AdminHold` record, until an operator releases it
        (`pigeon retry --id`: its `max_age` still counts from its arrival) or bounces it. One
        being sent is held when its attempt ends, as far as that attempt leaves it (the same walk
        as a bounce by id). One held already (by an operator, or an `[[inbound]]` route's) is
        left as it is: neither claimed nor released. Makes no rule: ids only, never new mail.
        `bound_to`: the tenants of the token that asked (None: unbound): another tenant's message
        is answered `not_found` without being read (`_batches`), and they are kept with the hold
        (`Envelope.hold_bound_to`): who may release it (`retry`'s `kept`)."""
        mark = AdminMark(reason, operator, tuple(bound_to) if bound_to is not None else None)
        became: dict[SpoolId, tuple[str, int]] = {}
        missed: dict[SpoolId, list[str]] = {}

        def held_already(message: Message) -> bool:
            if message.envelope.held is None:
                return False
            became[message.id] = ("already_held", 0)
            return True  # (not claimed: claimed and left, the scheduler would release it)

        def act(entry: Entry) -> tuple[_Done, asyncio.Future[None] | None]:
            recipients = len(entry.message.envelope.recipients)
            if entry.state is State.IN_FLIGHT and entry.started:
                became[entry.id] = ("after_attempt", recipients)
                return _Done.MARKED, self._settlement.after_attempt(entry, "hold", mark)
            became[entry.id] = ("held", recipients)
            return _Done.ACTED, self._settlement.hold(entry, mark)

        held, after_attempt = await self._walk(
            selector,
            act,
            "hold",
            operation,
            claim=True,
            leave=held_already,
            ids=messages,
            missed=missed,
            of_tenants=bound_to,
        )
        why = f" ({reason})" if reason else ""
        _log.warning("admin hold by %s of %s: %s, %d of them once their attempt ends%s", operator,
                     _described(selector, messages), _messages(held), after_attempt, why)  # fmt: skip
        return {"held": held, "after_attempt": after_attempt, "messages": _by_id(messages, became, missed)}

    async def suspend(
        self,
        selector: Selector,
        *,
        reason: str,
        operator: str,
        duration: float | None,
        rule_id: str | None,
        via: str = "",
        issued: float | None = None,
        bound_to: list[str] | None = None,
    ) -> dict[str, Any]:
        """Hold matching mail in the spool (untried) until resumed or `duration` is over. The
        same suspension asked for again (same selector, until resumed, by a token of the same
        binding) is the one in force: answered with it (`already`), not a second rule that would
        need its own resume. `issued`: when the request was issued, the rule's `created`
        (`_new_rule`). `bound_to`: the tenants of the token that asked (`Rule.bound_to`)."""
        async with self._rules_changing:
            already = self._rules.standing("suspend", selector, bound_to) if duration is None else None
            asked = self._new_rule("suspend", selector, reason, operator, duration, rule_id, via, issued, bound_to)
            already = already or self._held_as(asked, operator)
            rule = already or await self._add_rule(asked)
        if already is not None:
            _log.info("admin suspend by %s of %s: already suspended by %s", operator, selector.describe(), rule.id)
        put_back: set[SpoolId] = set()
        held = await self._enforce(rule, put_back)
        if selector.site is None:
            # What the spool alone holds is held too (when it falls due): `held` counts it, as
            # the queue summary's `suspended` and `pigeon resume`'s `made_due` do.
            held += await self._only_in_spool(selector, put_back)
        said = f" ({reason})" if reason else ""  # (no reason given: no empty "()")
        if selector.site is not None:
            _log.warning("admin suspend by %s of deliveries to %s%s", operator, selector.site, said)
        else:
            _log.warning("admin suspend by %s of %s%s", operator, selector.describe(), said)
        return {"held": held, "rule": _rule_view(rule), "already": already is not None}

    async def _enforce(self, rule: Rule, acted_on: set[SpoolId] | None = None) -> int:
        """Apply a rule just stored to what is in memory: how many messages it holds (or bounces),
        their ids added to `acted_on`. What only the spool holds meets a suspension when it falls
        due (`Rules.intercept`); a standing bounce walks the spool too (`_bounce_handed_over`)."""
        selector = rule.selector
        if selector.site is not None:
            self._release_later(rule)
            return sum(len(q) for q in self._ready if selector.matches_site(q.site))
        now = self._clock()
        mark = AdminMark(rule.reason, rule.operator)
        acted: list[asyncio.Future[None]] = []
        for entry in self._active:
            if entry.state is State.SETTLING or (entry.state is State.IN_FLIGHT and entry.started):
                continue  # what a settlement leaves meets the rule when it falls due again
            if entry.state in _UNSENT and selector.matches(entry.message):
                if rule.kind == "bounce":
                    acted.append(self._settlement.admin_bounce(entry, mark))
                else:
                    acted.append(self._settlement.defer(entry, self._rules.hold_until(rule, entry.message, now)))
                if acted_on is not None:
                    acted_on.add(entry.id)
        await asyncio.gather(*acted)
        return len(acted)

    async def _bounce_handed_over(self, rule: Rule, in_memory: int) -> None:
        """A standing bounce this worker was handed (`adopt`), applied to what is in memory
        (`in_memory` messages), bounces now what else it would bounce when it falls due: the
        spool's mail, as the bounce's own walk does on the workers and nodes the write reached
        (claimed, so neither the scheduler nor the dispatcher has it meanwhile). Else mail a
        suspension holds in the spool, due again only after `HOLD`, would wait for up to a
        minute. Left alone: mail due after the rule ends (it never meets the rule; held
        `[[inbound]]` mail is such), and all of it once the rule is ended meanwhile (a cancel
        while this walks)."""
        mark = AdminMark(rule.reason, rule.operator)
        ends = rule.expires if rule.expires is not None else float("inf")

        def leave(message: Message) -> bool:
            return self._rules.get(rule.id) is not rule or message.due >= ends

        def act(entry: Entry) -> tuple[_Done, asyncio.Future[None] | None]:
            if entry.state is State.IN_FLIGHT and entry.started:
                return _Done.MARKED, self._settlement.after_attempt(entry, "bounce", mark)
            return _Done.ACTED, self._settlement.admin_bounce(entry, mark)

        bounced, after_attempt = await self._walk(rule.selector, act, "bounce", rule.id, claim=True, leave=leave)
        if bounced or in_memory:
            _log.warning("admin rules: standing bounce %s of %s, handed over: %s, %d of them once their "
                         "attempt ends", rule.id, rule.selector.describe(), _messages(in_memory + bounced),
                         after_attempt)  # fmt: skip

    def _handed_over(self, walk: asyncio.Task[None]) -> None:
        self._handing_over.discard(walk)
        if not walk.cancelled() and (error := walk.exception()) is not None:
            # Nothing lost: what it did not reach meets the rule when it falls due.
            _log.error("admin rules: %s failed; the rest meets the bounce when it falls due", walk.get_name(),
                       exc_info=error)  # fmt: skip

    async def _only_in_spool(self, selector: Selector, counted: set[SpoolId]) -> int:
        """The messages `selector` matches that only the spool holds (deferred: none in memory,
        none of `counted`), but held `[[inbound]]` mail, which waits for an operator anyway.
        A walk of the spool in batches, resting between them as a bulk operation does."""
        found = 0
        for spool in list(self._spools.values()):
            after = 0
            while batch := spool.scan(after, _BATCH):
                started = time.perf_counter()
                after = batch[-1].id
                for message in batch:
                    if (
                        message.envelope.held is None
                        and message.id not in counted
                        and self._active.get(message.id) is None
                        and selector.matches(message)
                    ):
                        found += 1
                await self._pause(time.perf_counter() - started)
        return found

    def written(self, rule_id: str, generation: int) -> None:
        """A write to the standing rule `rule_id`, numbered `generation` by this node's
        supervisor, has reached this worker (noted before it is carried out): no rule handed
        over from before it may undo it (`adopt`, `pigeon.node.standing`)."""
        if self._written.get(rule_id, -1) < generation:
            self._written.pop(rule_id, None)
            self._written[rule_id] = generation
            while len(self._written) > _KEEP_WRITTEN:  # the oldest: long since in what is handed over
                self._written.popitem(last=False)

    def _newer(self, rule_id: str, changed: Mapping[str, int] | None) -> bool:
        """A write newer than what a hand-over says of `rule_id` has reached this worker."""
        return changed is not None and self._written.get(rule_id, -1) > changed.get(rule_id, 0)

    async def adopt(
        self, in_force: list[Rule], ended: dict[str, str], changed: Mapping[str, int] | None = None
    ) -> tuple[list[Rule], list[Rule]]:
        """Take the cluster's standing rules as they are now (a node starting, or back from a
        Redis outage): every rule `in_force` this worker does not hold yet is stored and
        applied, as the stream would have done (a suspension to what is in memory; a standing
        bounce to the spool's mail too, held mail included: `_bounce_handed_over`); every rule it holds that
        was `ended` (id -> kind) since is cancelled, releasing what it held. A rule this worker
        holds that the cluster never knew (made while Redis was away) is left alone, and a rule
        this worker ended after the cluster's copy was made is not taken back (an end issued
        while Redis was away, which its node sends on once Redis answers).
        Idempotent: rules are matched by id. (What was added, what was ended.)

        `changed` (the node's rules, from its supervisor): id -> the number of the write that
        made or ended it. A rule a newer write has reached this worker for is left as that write
        leaves it: a hand-over that a resume overtook does not suspend again, nor a stale
        tombstone end a suspension made again. Looked at under the lock the writes take."""
        now = self._clock()
        added: list[Rule] = []
        async with self._rules_changing:
            for rule in in_force:
                # Only a live rule holds its id: one that has run out here (kept in the shard until
                # replaced) is not the rule handed over, which reuses the id after it ended.
                if (held := self._rules.get(rule.id)) is not None and not held.live(now):
                    held = None
                if held is not None and taken_by(held, rule, now) is not None:
                    # Never one rule for another under one id (the doors refuse it: only a rule made
                    # on a node cut off from Redis can meet this). Kept, and said: each is ended
                    # by its id where it is held.
                    _log.error("admin rules: %s is not taken here: this worker holds the %s under that id",
                               describe_rule(rule), describe_rule(held))  # fmt: skip
                if held is not None or not rule.live(now) or self._newer(rule.id, changed):
                    continue
                if rule.created <= self._ended_at.get(rule.id, float("-inf")):
                    continue  # ended here since it was made: not taken back
                await self._rules.add(rule, self._primary)
                added.append(rule)
        for rule in added:
            # Not if a write to it came meanwhile (a cancel waiting for the lock): nothing bounced.
            if self._rules.get(rule.id) is not rule or self._newer(rule.id, changed):
                continue
            acted = await self._enforce(rule)  # (at once: the walk reaches what is in memory in its turn)
            if rule.kind == "bounce":
                # Not awaited: a walk of a large spool takes minutes, and adopt runs within
                # limits (a worker's start-up, a node's join of the cluster) it must not spend.
                # The rule is stored: what falls due meanwhile meets it all the same.
                walk = asyncio.create_task(self._bounce_handed_over(rule, acted), name=f"bounce {rule.id} handed over")
                self._handing_over.add(walk)
                walk.add_done_callback(self._handed_over)
        gone: list[Rule] = []
        for rule_id, kind in ended.items():
            held = self._rules.get(rule_id)
            if held is None or held.kind != kind:
                continue
            if (await self.cancel(rule_id, kind, unless=lambda i: self._newer(i, changed)))["cancelled"]:
                gone.append(held)
        return added, gone

    async def cancel(self, rule_id: str, kind: str, unless: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """End a standing bounce, or resume a suspension (what it held goes out again now).
        `unless`: asked of the id under the lock the writes take; true leaves the rule be."""
        async with self._rules_changing:  # (a suspend re-making this id stores it after the drop)
            rule = self._rules.get(rule_id)
            if rule is None or rule.kind != kind or (unless is not None and unless(rule_id)):
                return {"cancelled": False}
            await self._rules.remove(rule_id)
            self._ended_at.pop(rule_id, None)
            self._ended_at[rule_id] = self._clock()
            while len(self._ended_at) > _KEEP_WRITTEN:
                self._ended_at.popitem(last=False)
        made_due = 0
        if kind == "suspend" and rule.selector.site is not None:
            # What it held waits in the site's ready queues, and goes now: counted as the suspend
            # counted it (`held`), but for a site another suspension still holds.
            made_due = sum(
                len(q) for q in self._ready if rule.selector.matches_site(q.site) and not self._rules.site_held(q.site)
            )
            self._kick()
        elif kind == "suspend":
            # Each resume of a rule id is its own row in the operations' progress, not the last
            # one's: told apart by when the suspension it ended was made, which every worker and
            # node holds alike (so their rows for one resume still add up to one).
            released = await self.retry(rule.selector, rule_id, release=False, kind="resume", of_rule=rule.created)
            # What a standing bounce covers goes out as a bounce, not an attempt: said apart.
            answer = {"cancelled": True, "made_due": released["made_due"], "bounced": released["bounced"]}
            if released["suspended"]:
                # Held still by another suspension (the operator's, to a token bound to tenants,
                # which it cannot resume): said, so that no one waits for it to go, but not named.
                answer["suspended"] = released["suspended"]
            return answer
        return {"cancelled": True, "made_due": made_due}

    async def rebind(
        self,
        selector: Selector,
        *,
        queue: str | None,
        routing_domain: str | None,
        operator: str,
        operation: str | None = None,
        accepted_before: float | None = None,
        beyond: Callable[[Rule], bool] | None = None,
    ) -> dict[str, Any]:
        """Move matching messages to another scheduled queue and/or route them as if their
        recipients were in `routing_domain` (its [[route]] or MX); they are due at once. Of a
        message being sent, what its attempt leaves is moved when the attempt ends.
        `accepted_before`: as for `bounce`, only those accepted before then.

        Mail of an `[[inbound]]` route (its envelope names a target) is left as it is, not even
        claimed: it goes to its application's target from its own queue, and moving it would
        send an application's mail out over SMTP. The answer counts it (`inbound_left`).

        `beyond`: the rules the asker cannot end (a token bound to tenants: the operator's,
        `tenancy.reaches`). Mail one of them holds (a suspension) or ends (a standing bounce)
        is left where it is, not even claimed, and counted (`held_left`, given whenever `beyond`
        is): selectors match a message's queue as it is now, so moved within its own tenant it
        would leave the operator's suspension of its queue or campaign behind, and go out.

        Mail whose tenant the `[[route]]` of `routing_domain` is not for (`[[route]] tenants`:
        one reserved for other tenants, or mail of no tenant) is left where it is, not even
        claimed, and counted (`reserved_left`, given whenever such a route is the target): moved,
        it would never be sent but bounce as it came due (found from outside: `rebound 1
        message`, and the mail bounced), and an operator who means to bounce it has `bounce`."""
        now = self._clock()
        mark = RebindMark(queue, routing_domain, operator, operation)
        inbound_left = held_left = reserved_left = 0
        # (routing_domain "" routes by the recipients' own domains, as the mail arrived by them)
        reserved = self._reserved_for(routing_domain) if routing_domain else None

        def left_alone(message: Message) -> bool:
            nonlocal inbound_left, held_left, reserved_left
            if message.envelope.target is not None:
                inbound_left += 1
                return True
            if reserved is not None and message.envelope.tenant not in reserved:
                reserved_left += 1
                return True
            if beyond is not None and any(beyond(rule) for rule in self._rules.holding(message)):
                held_left += 1  # the operator's hold holds: not the asker's to lift by moving the mail
                return True
            return False

        def act(entry: Entry) -> tuple[_Done, asyncio.Future[None] | None]:
            if accepted_before is not None and entry.message.created > accepted_before:
                return _Done.IGNORED, None
            if entry.state is State.IN_FLIGHT and entry.started:
                return _Done.MARKED, self._settlement.rebind_after_attempt(entry, mark)
            moved = mark
            pending = entry.message.envelope.rebind_after_attempt
            if pending is not None:
                # Its row carries a rebind asked while an attempt was on the wire, cut short and
                # not yet applied (a stop, a crash): this one goes on from where that one moved it.
                moved = RebindMark.of(pending).then(mark)
            envelope = msgspec.structs.replace(moved.envelope(entry.message.envelope), rebind_after_attempt=None)
            # Mail an operator held moves, and stays held (due at `HELD`): only a release lets it go.
            until = entry.message.due if envelope.hold_operator is not None else now
            return _Done.ACTED, self._settlement.defer(entry, until, queue=moved.queue, envelope=envelope, rebind=moved)

        rebound, after_attempt = await self._walk(selector, act, "rebind", operation, claim=True, leave=left_alone)
        self._rewind(now)
        left = f"; {_messages(inbound_left)} of [[inbound]] routes left as they are: they go to their target"
        left = left if inbound_left else ""
        if held_left:
            left += f"; {_messages(held_left)} left in place, held by a rule the token cannot end"
        if reserved_left:
            left += (f"; {_messages(reserved_left)} left in place: the [[route]] of {routing_domain} is reserved "
                     "for other tenants than theirs")  # fmt: skip
        _log.warning("admin rebind by %s of %s: %s to queue=%s route=%s%s", operator, selector.describe(),
                     _messages(rebound), queue, routing_domain, left)  # fmt: skip
        answer: dict[str, Any] = {"rebound": rebound, "after_attempt": after_attempt, "inbound_left": inbound_left}
        if beyond is not None:
            answer["held_left"] = held_left
        if reserved is not None:
            answer["reserved_left"] = reserved_left
        return answer

    async def retry(
        self,
        selector: Selector,
        operation: str | None = None,
        *,
        release: bool = True,
        kind: str = "retry",
        of_rule: float | None = None,
        messages: Sequence[SpoolId] | None = None,
        bound_to: list[str] | None = None,
        kept: Callable[[list[str] | None], bool] | None = None,
    ) -> dict[str, Any]:
        """Make matching deferred messages due now (a settling one: once its outcome is written),
        held ones too unless `release` is False. `kind`: the operation's name in its progress;
        `of_rule`: a resume's, when the rule it ended was made (`rule_created` in its progress).
        Of those, the ones a live standing bounce covers are bounced as they come due, not
        attempted: counted apart (`bounced`), not as `made_due`; and those a suspension holds
        are left held by it (`suspended`), not `made_due` either: held mail of theirs is released
        all the same (its hold lifted, the suspension holds it until its end or resume).
        `messages`: only these (`postqueue -i`), of those `selector` matches; the answer says of
        each what became of it. Mail an operator held (`hold`) is released by its id alone: a
        retry by selector leaves it held, counted in `on_hold`. `kept`: the operators' holds the
        asker cannot release (a token bound to tenants: one it did not make, or one of a token
        of another tenant too, `tenancy.releases`), of which one named by id is left held too
        (its row `held`, counted in `on_hold`), not made due: else the operator's hold of a
        tenant's mail would be the tenant's to lift, and the mail would go out. `bound_to`: the
        tenants of the token that asked: of `messages`, another tenant's is answered `not_found`
        without being read (`_batches`)."""
        now = self._clock()
        suspended = bounced = on_hold = released_suspended = pending_bounces = 0
        became: dict[SpoolId, tuple[str, int]] = {}
        missed: dict[SpoolId, list[str]] = {}

        def deferred(message: Message) -> bool:
            nonlocal suspended, bounced, on_hold, released_suspended
            if message.due <= now or not (release or message.envelope.held is None):
                became[message.id] = ("already_due", 0)
                return False
            if messages is None and message.envelope.hold_operator is not None:
                # An operator held it, one message at a time (`pigeon hold`): only a release of
                # it by its id lets it go, not a retry of its queue or domain (`postqueue -f`).
                on_hold += 1
                return False
            if message.envelope.hold_operator is not None and kept is not None and kept(message.envelope.hold_bound_to):
                # Named by id, but held by someone the asker cannot release (the operator): left
                # held, said without whose hold it is or why (`pigeon inspect` says that).
                on_hold += 1
                became[message.id] = ("held", 0)
                return False
            if self._rules.suspension_of(message) is not None:
                suspended += 1  # due now, it would only be held again: said, not claimed as done
                became[message.id] = ("suspended", 0)
                if message.envelope.held is None:
                    return False
                # Held for an operator too: released (what was asked), and the suspension holds
                # it, untried, until it ends. Counted as what it is now, not as `made_due`.
                released_suspended += 1
                return True
            if self._rules.bounce_of(message) is not None:
                bounced += 1  # (held by a suspension, and missed by the bounce's walk: cut short by a stop)
                became[message.id] = ("bounced", 0)
                return True
            became[message.id] = ("made_due", 0)
            return True

        def in_memory(entry: Entry) -> asyncio.Future[None] | None:
            nonlocal on_hold, pending_bounces
            # Routed, waiting for a connection, or being sent: due already, unless an operator
            # held or bounced it while its attempt was on the wire (`Settlement.after_attempt`).
            bounce, hold = marks_after_attempt(entry) if release and entry.state is State.IN_FLIGHT else (None, None)
            if bounce is not None:
                # A bounce is final: a retry does not take it back. What that attempt does not
                # deliver is bounced when it ends, and said so, not "due".
                pending_bounces += 1
                became[entry.id] = ("bounced", 0)
                return None
            bound = list(hold.bound_to) if hold is not None and hold.bound_to is not None else None
            if hold is not None and (messages is None or (kept is not None and kept(bound))):
                # Not this operation's to release (by selector; or a token bound to tenants, of
                # the operator's hold): held when the attempt ends, as an applied hold stays.
                on_hold += 1
                became[entry.id] = ("held", 0)
                return None
            if hold is not None:
                # Released by its id before the hold applied: the hold is cancelled (in the row
                # too, before the answer), and the attempt's outcome leaves it as any would.
                became[entry.id] = ("hold_cancelled", 0)
                return self._settlement.cancel_hold(entry)
            became[entry.id] = ("already_due", 0)
            return None

        # Mail of a down site made due would only be deferred again, untried, until its
        # scheduled probe: the operator may know the host is back, so it probes now. Before
        # the rows are written: the scheduler may read and route them as soon as their commit
        # lands, before this hears that it did. (A message does not know its site before it
        # is routed, so every down site's probe is due.)
        probe = self._probe_down if kind == "retry" else None
        # (What it chose is what it answers: a row written since it was read, by a hold by id
        # say, is left as that write left it, as if the write came just after this retry.)
        made_due, _ = await self._make_due(
            selector,
            deferred,
            kind,
            operation,
            before_commit=probe,
            of_rule=of_rule,
            ids=messages,
            in_memory=in_memory,
            missed=missed,
            of_tenants=bound_to,
        )
        made_due -= bounced + released_suspended
        bounced += pending_bounces
        answer: dict[str, Any] = {"made_due": made_due, "suspended": suspended, "bounced": bounced}
        if on_hold:
            answer["on_hold"] = on_hold
        if messages is not None:
            answer["messages"] = _by_id(messages, became, missed)
        return answer

    async def retry_deferred_to(self, when: float, *, margin: float = 1.0, untried: bool = False) -> int:
        """Make due now the deferred messages due at `when` (within `margin` seconds): those a
        suspension deferred to its end, when an operator ended it early; with `untried`, those
        a hold deferred to its probe, none of them tried (a smart host's refused AUTH, lifted
        by a reload that changed the password). (A message whose own backoff happens to end in
        the same instant goes early too: one attempt sooner.)"""
        if when - margin <= self._clock():
            return 0  # due then anyway

        def deferred_then(message: Message) -> bool:
            tried = untried or bool(message.attempts)
            return tried and abs(message.due - when) <= margin and message.envelope.held is None

        kind = "retry after a hold was lifted" if untried else "retry after a suspension ended"
        _, made_due = await self._make_due(Selector(), deferred_then, kind, None)
        return made_due

    async def retry_waiting_for_probes(
        self, probes: Collection[float], rerouted: Callable[[Message], bool], *, margin: float = 1.0
    ) -> int:
        """A reload changed the routes: make due now the deferred messages that `rerouted` says
        go elsewhere now and that wait only for the probe of a site found down, due at one of
        `probes` (within `margin` seconds; held mail is not). Mail of a down site is deferred,
        untried, to its next probe (`pigeon.delivery.sites`): routed afresh now, it goes where
        its new route says, not after a probe of a site it no longer goes to. A message a real
        attempt deferred keeps its own retry (unless it happens to fall in the same instant:
        one attempt sooner). How many were made due."""
        now = self._clock()
        times = sorted(when for when in probes if when - margin > now)  # (one due then: due anyway)
        if not times:
            return 0

        def waiting_for_probe(message: Message) -> bool:
            if message.envelope.held is not None or not rerouted(message):
                return False
            return any(abs(message.due - when) <= margin for when in times)

        _, made_due = await self._make_due(
            Selector(), waiting_for_probe, "retry after a reload changed the routes", None
        )
        return made_due

    async def _make_due(
        self,
        selector: Selector,
        wanted: Callable[[Message], bool],
        kind: str,
        operation: str | None,
        *,
        before_commit: Callable[[], None] | None = None,
        of_rule: float | None = None,
        ids: Sequence[SpoolId] | None = None,
        in_memory: Callable[[Entry], asyncio.Future[None] | None] | None = None,
        missed: dict[SpoolId, list[str]] | None = None,
        of_tenants: Collection[str] | None = None,
    ) -> tuple[int, int]:
        """The spool rows matching `selector` and `wanted`, due now (in memory: due already,
        their owner sets their next due; `in_memory` is told of each): how many it chose, and
        how many of those it changed. Each is written only if its due is still the one `wanted`
        was asked about (`Spool.make_due`): the walk rests between batches and writes at its
        end, and a row changed meanwhile (a hold by id answered `held`, at `HELD`) is left as
        that change left it, never made due on what the walk read before. `before_commit` runs
        if there are any, before they are written. `ids`: of these messages only (`missed` as
        `_walk` fills it, `of_tenants` as it takes it)."""
        now = self._clock()
        by_shard: dict[int, list[tuple[int, float]]] = {}

        def act(entry: Entry) -> tuple[_Done, asyncio.Future[None] | None]:
            # (What `in_memory` writes, the walk waits for before it answers.)
            return _Done.IGNORED, in_memory(entry) if in_memory is not None else None

        def spool_only(message: Message) -> bool:
            if not wanted(message):
                return False
            by_shard.setdefault(shard_of(message.id), []).append((message.id, message.due))
            return True

        made_due, _ = await self._walk(
            selector,
            act,
            kind,
            operation,
            claim=False,
            spool_only=spool_only,
            of_rule=of_rule,
            ids=ids,
            missed=missed,
            of_tenants=of_tenants,
        )
        if made_due and before_commit is not None:
            before_commit()
        changed = await asyncio.gather(*(self._spools[shard].make_due(rows, now) for shard, rows in by_shard.items()))
        self._rewind(now)
        return made_due, sum(changed)

    # --- reading ---------------------------------------------------------------------------
    async def summary(self) -> dict[str, Any]:
        """Scheduled queues (from the spool, counted in a thread) and ready queues: a
        `QueueSummary`, as the JSON GET /api/v1/queues answers with."""
        now = self._clock()
        counts = await asyncio.gather(
            *(asyncio.to_thread(spool.queue_counts, now, HELD) for spool in self._spools.values())
        )
        scheduled: dict[str, ScheduledQueue] = {}
        one_of: dict[str, int] = {}  # a message of each queue: which suspensions hold it
        for rows in counts:
            for queue, messages, due, held, oldest, spool_id, later, next_due in rows:
                one_of.setdefault(queue, spool_id)
                row = scheduled.get(queue)
                if row is None:
                    row = scheduled[queue] = ScheduledQueue(
                        queue=queue,
                        messages=0,
                        due=0,
                        held=0,
                        suspended=0,
                        scheduled=0,
                        ready=0,
                        in_flight=0,
                        settling=0,
                        oldest=oldest,
                    )
                row.messages += messages
                row.due += due or 0
                row.held += held or 0
                row.oldest = min(row.oldest, oldest)
                row.later += later or 0
                if next_due is not None:
                    row.next_due = next_due if row.next_due is None else min(row.next_due, next_due)
        for queue, spool_id in one_of.items():
            message = self._spools.of(spool_id).get(spool_id)
            if message is not None:
                scheduled[queue].suspended_by = self._rules.suspensions_of(message)
        site_held: dict[str, list[Rule]] = {}  # (asked once a site: many entries share a few sites)
        by_site: dict[str, dict[str, Rule]] = {}  # each queue's mail held by a site's suspension: whose
        for entry in self._active:
            counted = scheduled.get(entry.message.queue)
            if counted is not None and entry.state in _IN_MEMORY:
                setattr(counted, entry.state.value, getattr(counted, entry.state.value) + 1)
                if entry.state is State.READY and not counted.suspended_by and entry.site is not None:
                    held_there = site_held.get(entry.site)
                    if held_there is None:
                        held_there = site_held[entry.site] = self._rules.site_suspensions(entry.site)
                    if held_there:
                        counted.suspended += 1
                        by_site.setdefault(counted.queue, {}).update((rule.id, rule) for rule in held_there)
        for row in scheduled.values():
            if row.suspended_by:  # all of it held, but what is on the wire or being written
                row.suspended = max(0, row.messages - row.held - row.in_flight - row.settling)
        for queue, rules in by_site.items():  # part of it held: those counted, and who holds them
            scheduled[queue].suspended_by = list(rules.values())
        ready = []
        for q in self._ready:
            connections = self._connections(q.path)
            # An empty queue under an effect is listed too: the mail whose reply started a
            # suspension waits in its scheduled queue, and this row is where it says why.
            effects = self._effects(q.path)
            # A site that is down is listed too: its mail waits in the scheduled queues, untried.
            down = self._down(q)
            suspended_by = self._rules.site_suspensions(q.site)
            if len(q) or connections or effects or down or suspended_by:
                source = q.path.partition("->")[0]  # the implicit source too, by its name
                provider = self._provider(q.path)
                ready.append(
                    ReadyQueueRow(
                        q.path,
                        source,
                        q.site,
                        len(q),
                        connections,
                        provider,
                        effects,
                        down,
                        q.domain if q.own else None,
                        suspended_by,
                    )
                )
        summary = QueueSummary(sorted(scheduled.values(), key=lambda r: r.queue), ready)
        result: dict[str, Any] = msgspec.to_builtins(summary)
        return result

    def rules(self, kind: str) -> list[dict[str, Any]]:
        return self._rules.listed(kind)

    def suspensions(self) -> list[str]:
        """The ids of the live suspensions this worker holds (`SUSPENSIONS_HELD`)."""
        now = self._clock()
        return [rule.id for rule in self._rules if rule.kind == "suspend" and rule.live(now)]

    def rule(self, rule_id: str) -> Rule | None:
        """The rule this worker holds under `rule_id` (live or not), if any."""
        return self._rules.get(rule_id)

    def standing(self) -> list[Rule]:
        """Every standing rule this worker holds (live or not: the caller knows the time)."""
        return list(self._rules)

    def inspect(self, spool_id: int, tenants: Collection[str] | None = None) -> dict[str, Any] | None:
        """What `pigeon inspect` shows of a message this worker holds (None: it holds none of
        this id). `tenants`: of their mail only (`listing.tenant_of`; None: anyone's): another
        tenant's is None, as one not held, told before its row is read whole (`_whose`), so
        that a token bound to tenants cannot tell it from an absent id by the time it takes."""
        if tenants is not None:
            held, tenant = self._whose(spool_id)
            if not held or tenant is None or tenant not in tenants:
                return None
        entry = self._active.get(spool_id)
        message = entry.message if entry is not None else None
        if message is None:
            spool = self._spools.get(shard_of(spool_id))
            message = spool.get(spool_id) if spool is not None else None
            if message is None:
                return None
        envelope = message.envelope
        # Its state and the suspension holding it as `pigeon queue list` says them: one reading.
        state, suspension = self._state_of(message, entry, self._clock())
        pool, pool_from = self._pool_of(message)
        # A reaction's suspension holding it: the one on its ready queue now, else the one its
        # last deferral was made under (it waits for its end), as its expiry would name it.
        held_by = envelope.held_by
        if entry is not None and entry.state is State.READY and entry.ready is not None:
            held_by = self._holding(entry.ready) or held_by
        return {
            "id": format_id(message.id),
            "queue": message.queue,
            "state": state,
            "in_memory": entry is not None,
            "site": entry.site if entry is not None else None,
            # The egress [[source]] of its ready queue, once it is in one (None: the implicit source).
            "source": entry.source if entry is not None else None,
            "sender": envelope.sender,
            # The sender it came with, where the policy's on_message changed it (None: it did not).
            "original_sender": envelope.original_sender,
            "recipients": [r.address for r in envelope.recipients],
            # The domain it is routed as, instead of its recipients' (`pigeon rebind
            # --routing-domain`, a policy's Reroute); None: theirs.
            "routing_domain": envelope.routing_domain,
            "size": message.size,
            "created": message.created,
            "attempts": message.attempts,
            "next_due": listing.next_due(message, state, suspension),
            "held": envelope.held,
            # The operator (API token) who held it (`pigeon hold`); None: no operator's hold.
            "hold_operator": envelope.hold_operator,
            # The tenants of the token that held it, sorted (None: a token bound to none, the
            # operator): a token bound to tenants releases only a hold of theirs (`tenancy.releases`).
            "hold_bound_to": envelope.hold_bound_to,
            # When held mail ends unreleased ([[inbound]] held_for); None: it waits for ever.
            "held_until": message.due - HELD if envelope.held is not None and message.due > HELD else None,
            "last_response": envelope.last_response,
            "tenant": envelope.tenant,
            "campaign": envelope.campaign,
            "metadata": envelope.metadata,
            # The pool it leaves from (None: the implicit source), and what named it: "policy" (its
            # policy hook), "queue" (its [[queue]]), "delivery" ([delivery] pool).
            "egress_pool": pool,
            "egress_pool_from": pool_from,
            # The operator's suspension that holds it (until `pigeon resume` or its end), if any,
            # its queue's or its site's: not one that came after its attempt began (the attempt goes on).
            "suspended_by": suspension.id if suspension is not None else None,
            # The shaping reaction's suspension that holds it (or held it when it was last
            # deferred): "shaping reaction <rule> (suspend <key> until <time>) after <reply>".
            "held_by_effect": held_by,
        }

    def _whose(self, spool_id: int) -> tuple[bool, str | None]:
        """Whether this worker holds message `spool_id`, and whose mail it is (`listing.tenant_of`),
        told from its queue name, or where that has no tenant part from its envelope's `tenant`
        alone (`envelope_tenant`): neither its body nor the rest of its envelope is read, nor its
        body's file looked at. Its spool row is read by id (`Spool.peek`) whether or not there is
        one, and whether or not the message is in memory: an absent id costs the same indexed
        read as another tenant's message, in memory or not."""
        spool = self._spools.get(shard_of(spool_id))
        stored = spool.peek(spool_id) if spool is not None else None
        entry = self._active.get(spool_id)
        if entry is not None:
            return True, listing.tenant_of(entry.message)  # (decoded already)
        if stored is None or spool is None:
            return False, None
        queue, envelope = stored
        parts = queue_parts(queue)
        if parts is not None:
            return True, parts[0] or None
        if envelope is not None:
            return True, envelope_tenant(envelope)
        # A name with an '@' but no tenant part (`a:b:c@x`, `@x`: an operator named it outright),
        # which the peek does not read the envelope of: the row, whole.
        message = spool.get(spool_id)
        return (True, message.envelope.tenant) if message is not None else (False, None)

    async def list_messages(
        self,
        selector: Selector,
        *,
        states: frozenset[str] | None = None,
        tenants: frozenset[str] | None = None,
        after: int = 0,
        limit: int = listing.DEFAULT_LIMIT,
    ) -> dict[str, Any]:
        """A page of the queued messages `selector` matches, oldest first, after id `after`: each
        with its state (`listing.STATES`; those of `states` only, None: all), of `tenants`' mail
        only (None: anyone's). See `pigeon.queue.listing`."""
        now = self._clock()
        site_held: dict[str, Rule | None] = {}

        def entry_of(row: Message) -> dict[str, Any] | None:
            entry = self._active.get(row.id)
            message = row if entry is None else entry.message
            if entry is not None and entry.state.terminal:
                return None  # gone: its row is about to be removed
            if not selector.matches(message):
                return None
            if tenants is not None and listing.tenant_of(message) not in tenants:
                return None
            state, suspension = self._state_of(message, entry, now, site_held)
            if states is not None and state not in states:
                return None
            return listing.listed(message, state, suspension)

        pages = [
            await listing.shard_page(spool, after, limit, entry_of, self._pause)
            for spool in list(self._spools.values())
        ]
        return listing.merge_pages(pages, limit)

    def _state_of(
        self, message: Message, entry: Entry | None, now: float, site_held: dict[str, Rule | None] | None = None
    ) -> tuple[str, Rule | None]:
        """What a queued message is doing (`listing.STATES`; an entry's own state once it is
        delivered or bounced), and the operator's suspension that holds it, if any: one reading,
        for `pigeon queue list` and `pigeon inspect` alike. `message`: its row, or its entry's
        message; `site_held`: each site's first suspension, filled as sites are asked (a page
        asks once a site: many messages share a few)."""
        started = entry is not None and entry.state is State.IN_FLIGHT and entry.started
        unsent = entry is None or (entry.state in _UNSENT and not started)
        # Mail held for an operator is held, whatever suspension covers it too: only a release
        # by id lets it go, and a resume leaves it held.
        suspension = self._rules.suspension_of(message) if unsent and message.envelope.held is None else None
        if suspension is None and entry is not None and entry.state is State.READY and entry.site is not None:
            # Waiting in a site's ready queue: a suspension of that site holds it there (as the
            # queue summary counts it `suspended`, and names the rule in `suspended_by`).
            if site_held is None:
                suspension = next(iter(self._rules.site_suspensions(entry.site)), None)
            else:
                if entry.site not in site_held:
                    site_held[entry.site] = next(iter(self._rules.site_suspensions(entry.site)), None)
                suspension = site_held[entry.site]
        if entry is not None and entry.state is not State.READY:
            return entry.state.value, suspension  # scheduled, in_flight, settling (or over)
        if suspension is not None:
            return "suspended", suspension
        if entry is not None:
            return "ready", None
        if message.envelope.held is not None:
            return "held", None
        return ("due" if message.due <= now else "deferred"), None

    def operations(self) -> list[dict[str, Any]]:
        """Recent bulk operations, running or done, with how far they got."""
        return list(self._operations.values())

    # --- the walk ----------------------------------------------------------------------------
    async def _walk(
        self,
        selector: Selector,
        act: _Act,
        name: str,
        operation: str | None,
        *,
        claim: bool,
        spool_only: Callable[[Message], bool] | None = None,
        leave: Callable[[Message], bool] | None = None,
        of_rule: float | None = None,
        ids: Sequence[SpoolId] | None = None,
        missed: dict[SpoolId, list[str]] | None = None,
        of_tenants: Collection[str] | None = None,
    ) -> tuple[int, int]:
        """Act on every matching message but those `leave` is true of (neither claimed nor
        acted on); (acted on, of which marked: acted on when their attempt ends). `of_rule`:
        when the rule `operation` names was made, for a walk that ends it (a resume). `ids`:
        of these messages only, read by id rather than by a walk of the whole spool; `missed`
        filled with those of them found here that `selector` does not match, by id: the
        selector's members that miss it (`Selector.unmatched`). `of_tenants`: the tenants of
        the token that asked (None: unbound): of `ids`, another tenant's message is not read
        (`_batches`)."""
        acted = marked = seen = read = 0
        shown = msgspec.to_builtins(selector)
        if ids is not None:  # (not "{}": an operation on named messages is not one on everything)
            shown["messages"] = [format_id(spool_id) for spool_id in ids]
        progress: dict[str, Any] = {
            "operation": operation or new_rule_id(),
            "kind": name,
            "selector": shown,
            "looked_at": 0,  # rows read: of a selector naming a tenant, that tenant's (`Selector.of_its_tenant`)
            "acted_on": 0,
            "waited": 0,  # messages it found settling and acted on once their outcome was written
            "after_attempt": 0,  # of those acted on, being sent: acted on as far as the attempt leaves them
            "running": 1,  # added up over workers: how many are still at it
            "started": self._clock(),
        }
        if of_rule is not None:
            progress["rule_created"] = of_rule
        self._operations[progress["operation"], of_rule] = progress
        while len(self._operations) > _KEEP_OPERATIONS:
            self._operations.popitem(last=False)

        def one(message: Message, commits: list[asyncio.Future[None]], settling: list[_Settling]) -> None:
            nonlocal acted, marked
            done, future = self._act(message, selector, act, claim, spool_only, settling, leave, missed)
            if future is not None:
                commits.append(future)
            acted += done is not _Done.IGNORED
            marked += done is _Done.MARKED

        for batch in self._batches(ids, of_tenants):
            started = time.perf_counter()
            commits: list[asyncio.Future[None]] = []
            settling: list[_Settling] = []
            for message in batch:
                one(message, commits, settling)
            # Of a selector naming a tenant, that tenant's rows alone (`Selector.of_its_tenant`):
            # the count a token bound to it reads tells nothing of other tenants' mail.
            seen += len(batch) if selector.tenant is None else sum(map(selector.of_its_tenant, batch))
            read += len(batch)
            # Settling messages: once their outcome is written, act on the row it left.
            for _ in range(_MAX_WAITS):
                if not settling:
                    break
                progress["waited"] += len(settling)
                await asyncio.gather(*(s.settled for s in settling))
                again, settling = settling, []
                for waited in again:
                    row = self._spools.of(waited.id).get(waited.id)
                    if row is not None:
                        one(row, commits, settling)
            for waited in settling:
                _log.warning("admin %s: message %s kept settling; left alone", name, format_id(waited.id))
            await asyncio.gather(*commits)
            progress.update(looked_at=seen, acted_on=acted, after_attempt=marked)
            if read % _PROGRESS_EVERY < _BATCH:
                _log.info("admin %s: %s looked at, %d acted on", name, _messages(seen), acted)
            await self._pause(time.perf_counter() - started)
        progress.update(looked_at=seen, acted_on=acted, after_attempt=marked, running=0, finished=self._clock())
        return acted, marked

    def _batches(
        self, ids: Sequence[SpoolId] | None, of_tenants: Collection[str] | None = None
    ) -> Iterator[list[Message]]:
        """The spool rows a walk looks at, a batch at a time, each batch read as the walk comes
        to it (after the previous one's commits and rest): every row, in id order; or the rows
        of `ids` that this worker's shards hold (none of another worker's or node's), and with
        `of_tenants` (a bound token's write) of those tenants' mail alone. Another tenant's
        message is left out as one not held is, told from its queue name (`_whose`) before
        its row is read whole, and so found by the same one indexed read as an absent id: a
        bound token's write takes as long for either (it read the message, set it aside as
        `not_selected`, then rested, and its answer came 0.07-0.09 ms later; it said `not_found`
        all the same, `tenancy.confined_answer`)."""
        if ids is None:
            for spool in list(self._spools.values()):
                after = 0
                while batch := spool.scan(after, _BATCH):
                    after = batch[-1].id
                    yield batch
            return
        for start in range(0, len(ids), _BATCH):
            rows = []
            for spool_id in ids[start : start + _BATCH]:
                if of_tenants is not None:
                    held, tenant = self._whose(spool_id)
                    if not held or tenant is None or tenant not in of_tenants:
                        continue
                shard = self._spools.get(shard_of(spool_id))  # (None: another worker's, or another node's)
                row = shard.get(spool_id) if shard is not None else None
                if row is not None:
                    rows.append(row)
            if rows:
                yield rows

    def _act(
        self,
        row: Message,
        selector: Selector,
        act: _Act,
        claim: bool,
        spool_only: Callable[[Message], bool] | None,
        settling: list[_Settling],
        leave: Callable[[Message], bool] | None = None,
        missed: dict[SpoolId, list[str]] | None = None,
    ) -> tuple[_Done, asyncio.Future[None] | None]:
        """Act on one message as it is now. `row` is its spool row, read just before (with no
        await since), so it is current unless the message is in memory. One `selector` does
        not match goes into `missed` (if given), with the members that miss it."""
        entry = self._active.get(row.id)
        if entry is None:
            if not selector.matches(row):
                if missed is not None:
                    missed[row.id] = selector.unmatched(row)
                return _Done.IGNORED, None
            if leave is not None and leave(row):
                return _Done.IGNORED, None  # not claimed: the scheduler goes on with it as it would
            if spool_only is not None:
                return (_Done.ACTED if spool_only(row) else _Done.IGNORED), None
            if not claim:
                return _Done.IGNORED, None
            entry = self._active.add(row)  # claimed: from now on the scheduler leaves it to us
            done, future = act(entry)
            if entry.state is State.SCHEDULED:
                self._promote(entry)  # not acted on after all: the scheduler's again
            return done, future
        elif not selector.matches(entry.message):
            if missed is not None and not entry.state.terminal:
                missed[row.id] = selector.unmatched(entry.message)
            return _Done.IGNORED, None
        if entry.state is State.SETTLING:
            settling.append(_Settling(entry.id, self._active.settled(entry)))
            return _Done.IGNORED, None
        if entry.state.terminal:
            return _Done.IGNORED, None
        if leave is not None and leave(entry.message):
            return _Done.IGNORED, None
        return act(entry)

    def _new_rule(
        self,
        kind: Any,
        selector: Selector,
        reason: str,
        operator: str,
        duration: float | None,
        rule_id: str | None,
        via: str,
        issued: float | None,
        bound_to: list[str] | None = None,
    ) -> Rule:
        """The rule a request makes, `created` when it was `issued` (None: now) and ending
        `duration` after. Stamped once where the request was issued (a node's supervisor, its
        one worker, the origin node of a cluster), so every worker and node that makes it holds
        the same times as the answer, not each the moment it read the request: else the workers
        of one node end it at different moments, and mail goes out before the end the operator
        was told."""
        now = self._clock() if issued is None else issued
        return Rule(
            rule_id or new_rule_id(),
            kind,
            selector,
            now,
            expires=now + duration if duration else None,
            reason=reason,
            operator=operator,
            via=via,
            bound_to=bound_to,
        )

    def _held_as(self, asked: Rule, operator: str) -> Rule | None:
        """The rule `asked` is, if this worker holds it already (asked again under its id);
        `RuleIdTaken`, said in the log, if another rule has that id."""
        try:
            return self._rules.held_as(asked)
        except RuleIdTaken as taken:
            _log.warning("admin %s by %s of %s refused: %s", asked.kind, operator, asked.selector.describe(), taken)
            raise

    async def _add_rule(self, rule: Rule) -> Rule:
        await self._rules.add(rule, self._primary)
        return rule

    def stored_content(self, spool_id: int) -> bytes | BinaryIO | None:
        """A message's stored bytes, as `inspect` finds it (`pigeon inspect --content`): the
        copy delivery holds in memory, else its shard's (`Spool.stored_body`: a large body's
        file, open); None if it is not here. Raises SpoolError if its body cannot be read."""
        entry = self._active.get(spool_id)
        message = entry.message if entry is not None else None
        spool = self._spools.get(shard_of(spool_id))
        if message is None and spool is not None:
            message = spool.get(spool_id)
        if message is not None and message.data is not None:
            return message.data
        return None if message is None or spool is None else spool.stored_body(message.body_id)


_KEEP_WRITTEN: Final = 10_000  # rule writes remembered (`Admin.written`)
_UNSENT: Final = frozenset({State.SCHEDULED, State.READY, State.IN_FLIGHT})


class _Settling:
    __slots__ = ("id", "settled")

    def __init__(self, spool_id: SpoolId, settled: asyncio.Future[None]) -> None:
        self.id = spool_id
        self.settled = settled


NOT_FOUND: Final = "not_found"
"""A message asked for by id that the worker does not hold (delivered, bounced or expired
already, or never its, or another tenant's to a token bound to tenants)."""
NOT_SELECTED: Final = "not_selected"
"""A message asked for by id that is queued here, but that the selector given with the ids
(`--id X --domain other.example`) does not match: left alone. Its row's `unmatched` names the
selector's members that miss it; to a token bound to tenants, one `tenant` misses is another
tenant's, answered as `not_found` (`pigeon.listener.http.tenancy.confined_answer`)."""


def _by_id(
    ids: Sequence[SpoolId], became: Mapping[SpoolId, tuple[str, int]], missed: Mapping[SpoolId, list[str]]
) -> list[dict[str, Any]]:
    """What became of each message asked for by id, in the order asked: `result`, and for a
    bounce how many `recipients` it ended (or ends as far as its attempt under way leaves them),
    for a hold how many it held; of one the selector does not match, `not_selected` and the
    selector's members that miss it.
    Every worker and node says it of every id, `not_found` of those it does not hold; their
    answers are added up by id (`pigeon.node.answers`), the one that found it winning."""
    rows: list[dict[str, Any]] = []
    for spool_id in ids:
        result, recipients = became.get(spool_id, (NOT_FOUND, 0))
        row: dict[str, Any] = {"id": format_id(spool_id), "result": result}
        if result == NOT_FOUND and spool_id in missed:
            row.update(result=NOT_SELECTED, unmatched=missed[spool_id])
        if result in ("bounced", "after_attempt", "held") and recipients:
            row["recipients"] = recipients
        rows.append(row)
    return rows


def _described(selector: Selector, ids: Sequence[SpoolId] | None) -> str:
    """What an operation acts on, for the log: its selector, or the messages it names."""
    if ids is None:
        return selector.describe()
    named = ", ".join(format_id(spool_id) for spool_id in ids[:10]) + (", ..." if len(ids) > 10 else "")
    return f"messages {named}" + ("" if selector.empty() else f" ({selector.describe()})")


def _rule_view(rule: Rule | None) -> dict[str, Any] | None:
    return msgspec.to_builtins(rule) if rule is not None else None


def _messages(count: int) -> str:
    """ "1 message", "2 messages": for the operator's log lines."""
    return f"{count} message{'' if count == 1 else 's'}"
