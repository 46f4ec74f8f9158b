"""Operators' actions on live queues: bounce, suspend, resume, retry now, inspect.

Every change goes through `state.transition()`, like the scheduler's and the dispatchers'.
That is what makes a bulk operation safe while delivery runs: whoever moves a message first
owns it, and the others see `StaleTransition` and leave it alone. The walk over the spool
runs on the event loop in batches (yielding between them), and claims each message it acts
on by putting it into the active set: the scheduler never loads a message that is active,
so a message can not be bounced by the operator and delivered by a dispatcher.

What happens to a matching message depends on where it is:

| state        | bounce                                   | suspend                          |
|--------------|------------------------------------------|----------------------------------|
| in the spool | claimed, `AdminBounce` for each recipient | left there; deferred when due    |
| scheduled    | `AdminBounce`                            | back to the spool, untried       |
| ready        | `AdminBounce` (dispatchers skip it)      | back to the spool, untried       |
| in flight    | the attempt ends; what did not get through is admin-bounced, not retried | left to finish |

Standing rules (a bounce with a duration, a suspension) are stored in the spool, so they
outlive a restart, and checked by the scheduler whenever it makes a message ready: new mail
matching them is bounced or held too, until they expire or are cancelled.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal

import msgspec

from pigeon.delivery.dispatcher import Dispatcher
from pigeon.message import Message, format_id
from pigeon.queue.settlement import Settlement
from pigeon.queue.state import ActiveSet, Entry, State
from pigeon.spool.sqlite import SqliteSpool

_log = logging.getLogger(__name__)
_BATCH: Final = 1000
_HOLD: Final = 60.0  # a suspended message is looked at again after this long (resume takes effect then)
_PROGRESS_EVERY: Final = 100_000
_KEEP_OPERATIONS: Final = 100  # recent bulk operations kept for GET /api/v1/admin/operations


class Selector(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Which messages: every given field must match (globs: "*.example.net", "spring-*")."""

    domain: str | None = None
    tenant: str | None = None
    campaign: str | None = None
    queue: str | None = None
    """The scheduled queue name, `campaign:tenant@domain`."""
    site: str | None = None
    """A ready queue's site (MX host set or next hop): suspends deliveries there, alone."""

    def empty(self) -> bool:
        return not (self.domain or self.tenant or self.campaign or self.queue or self.site)

    def matches(self, message: Message) -> bool:
        if self.site is not None:
            return False  # a site is where mail goes, not which mail: see Admin.site_held
        envelope = message.envelope
        if self.queue is not None and not fnmatch.fnmatchcase(message.queue, self.queue):
            return False
        if self.tenant is not None and not fnmatch.fnmatchcase(envelope.tenant or "", self.tenant):
            return False
        if self.campaign is not None and not fnmatch.fnmatchcase(envelope.campaign or "", self.campaign):
            return False
        if self.domain is not None:
            domain = envelope.recipients[0].domain if envelope.recipients else ""
            return fnmatch.fnmatchcase(domain, self.domain.lower())
        return True


class Rule(msgspec.Struct, omit_defaults=True):
    """A standing bounce or suspension."""

    id: str
    kind: Literal["bounce", "suspend"]
    selector: Selector
    created: float
    expires: float | None = None
    """None: until cancelled (suspensions only: a bounce without a duration is not a rule)."""
    reason: str = ""
    operator: str = ""

    def live(self, now: float) -> bool:
        return self.expires is None or now < self.expires


_RULE_ENCODER: Final = msgspec.msgpack.Encoder()
_RULE_DECODER: Final = msgspec.msgpack.Decoder(Rule)


def new_rule_id() -> str:
    return secrets.token_hex(6)


class Admin:
    """The operations, for one worker's shards."""

    def __init__(
        self,
        *,
        spools: Mapping[int, SqliteSpool],
        primary: SqliteSpool,
        active: ActiveSet,
        settlement: Settlement,
        rewind: Callable[[float], None],
        dispatcher: Dispatcher,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._spools = spools
        self._primary = primary
        self._active = active
        self._settlement = settlement
        self._rewind = rewind
        self._dispatcher = dispatcher
        self._clock = clock
        self._rules: dict[str, Rule] = {}
        self._operations: OrderedDict[str, dict[str, Any]] = OrderedDict()
        for spool in spools.values():
            for rule_id, blob in spool.rules():
                try:
                    self._rules[rule_id] = _RULE_DECODER.decode(blob)
                except msgspec.DecodeError:
                    _log.error("admin rule %s in %s cannot be read: ignored", rule_id, spool.directory)
        dispatcher.held = self.site_held
        for rule in self._rules.values():
            self._release_later(rule)

    def site_held(self, site: str) -> bool:
        """Whether a live suspension holds deliveries to `site` (the dispatcher asks)."""
        now = self._clock()
        return any(
            r.kind == "suspend"
            and r.selector.site is not None
            and r.live(now)
            and fnmatch.fnmatchcase(site, r.selector.site)
            for r in self._rules.values()
        )

    def _release_later(self, rule: Rule) -> None:
        # A site suspension that runs out must restart the connections it stopped.
        if rule.selector.site is not None and rule.expires is not None:
            delay = max(0.0, rule.expires - self._clock())
            asyncio.get_running_loop().call_later(delay + 0.01, self._dispatcher.kick_all)

    # --- the scheduler asks, for every message it makes ready ----------------------------------
    def intercept(self, entry: Entry) -> bool:
        """Apply standing rules to a SCHEDULED message. True if one took it."""
        if not self._rules:
            return False
        now = self._clock()
        message = entry.message
        for rule in self._rules.values():
            if not rule.live(now) or not rule.selector.matches(message):
                continue  # (site suspensions match no message: the dispatcher holds those)
            if rule.kind == "bounce":
                self._settlement.admin_bounce(entry, State.SCHEDULED, rule.reason, rule.operator)
            else:
                self._settlement.defer(entry, State.SCHEDULED, min(now + _HOLD, rule.expires or now + _HOLD))
            return True
        return False

    # --- operations ------------------------------------------------------------------------
    async def bounce(
        self, selector: Selector, *, reason: str, operator: str, duration: float | None, rule_id: str | None
    ) -> dict[str, Any]:
        """Bounce every matching message now; with a duration, also new ones until it ends."""
        rule = None
        if duration:
            rule = await self._add_rule("bounce", selector, reason, operator, duration, rule_id)

        settling: list[Entry] = []  # what the walk's current batch is settling

        def act(message: Message) -> bool:
            entry = self._claim(message)
            if entry is None:
                return False
            if entry.state in (State.SCHEDULED, State.READY):
                if not self._settlement.admin_bounce(entry, entry.state, reason, operator):
                    return False
                settling.append(entry)
                return True
            if entry.state is State.IN_FLIGHT:
                entry.notes["admin_bounce"] = (reason, operator)
                return True
            return False

        bounced = await self._walk(selector, act, "bounce", settling, rule_id)
        _log.warning("admin bounce by %s of %s: %d messages (%s)", operator, _describe(selector), bounced, reason)
        return {"bounced": bounced, "rule": _rule_view(rule)}

    async def suspend(
        self, selector: Selector, *, reason: str, operator: str, duration: float | None, rule_id: str | None
    ) -> dict[str, Any]:
        """Hold matching mail in the spool (untried) until resumed or `duration` is over."""
        rule = await self._add_rule("suspend", selector, reason, operator, duration, rule_id)
        if selector.site is not None:
            self._release_later(rule)
            waiting = sum(
                len(q)
                for q in self._dispatcher.queues.values()
                if fnmatch.fnmatchcase(q.destination.site, selector.site)
            )
            _log.warning("admin suspend by %s of deliveries to %s (%s)", operator, selector.site, reason)
            return {"held": waiting, "rule": _rule_view(rule)}
        until = self._clock() + _HOLD if rule.expires is None else min(self._clock() + _HOLD, rule.expires)
        held = 0
        for entry in self._active:  # what the spool holds is deferred when it falls due
            if entry.state in (State.SCHEDULED, State.READY) and selector.matches(entry.message):
                held += self._settlement.defer(entry, entry.state, until)
        _log.warning("admin suspend by %s of %s (%s)", operator, _describe(selector), reason)
        return {"held": held, "rule": _rule_view(rule)}

    async def cancel(self, rule_id: str, kind: str) -> dict[str, Any]:
        """End a standing bounce, or resume a suspension (what it held goes out again now)."""
        rule = self._rules.get(rule_id)
        if rule is None or rule.kind != kind:
            return {"cancelled": False}
        del self._rules[rule_id]
        await asyncio.gather(*(spool.save_rule(rule_id, None) for spool in self._spools.values()))
        made_due = 0
        if kind == "suspend" and rule.selector.site is not None:
            self._dispatcher.kick_all()
        elif kind == "suspend":
            made_due = (await self.retry(rule.selector))["made_due"]
        return {"cancelled": True, "made_due": made_due}

    async def rebind(
        self,
        selector: Selector,
        *,
        queue: str | None,
        routing_domain: str | None,
        operator: str,
        operation: str | None = None,
    ) -> dict[str, Any]:
        """Move matching messages to another scheduled queue and/or route them as if their
        recipients were in `routing_domain` (its [[route]] or MX); they are due at once.
        A message in flight is left to its attempt (counted as skipped)."""
        now = self._clock()
        settling: list[Entry] = []
        skipped = 0

        def act(message: Message) -> bool:
            nonlocal skipped
            entry = self._claim(message)
            if entry is None:
                return False
            if entry.state not in (State.SCHEDULED, State.READY):
                skipped += entry.state is State.IN_FLIGHT
                return False
            envelope = entry.message.envelope
            if routing_domain is not None:
                envelope = msgspec.structs.replace(envelope, routing_domain=routing_domain or None)
            if not self._settlement.defer(entry, entry.state, now, queue=queue, envelope=envelope):
                return False
            settling.append(entry)
            return True

        rebound = await self._walk(selector, act, "rebind", settling, operation)
        self._rewind(now)
        _log.warning("admin rebind by %s of %s: %d messages to queue=%s route=%s", operator, _describe(selector),
                     rebound, queue, routing_domain)  # fmt: skip
        return {"rebound": rebound, "skipped": skipped}

    async def retry(self, selector: Selector, operation: str | None = None) -> dict[str, Any]:
        """Make matching deferred messages due now."""
        now = self._clock()
        by_spool: dict[int, list[int]] = {}

        def act(message: Message) -> bool:
            if message.due <= now or message.id in self._active:
                return False  # due already, or being worked on: its owner sets its next due
            by_spool.setdefault(message.id & 63, []).append(message.id)
            return True

        made_due = await self._walk(selector, act, "retry", operation=operation)
        await asyncio.gather(*(self._spools[shard].make_due(ids, now) for shard, ids in by_spool.items()))
        self._rewind(now)
        return {"made_due": made_due}

    async def summary(self, ready_queues: Iterable[Any]) -> dict[str, Any]:
        """Scheduled queues (from the spool, counted in a thread) and ready queues."""
        now = self._clock()
        counts = await asyncio.gather(*(asyncio.to_thread(spool.queue_counts, now) for spool in self._spools.values()))
        scheduled: dict[str, dict[str, Any]] = {}
        for rows in counts:
            for queue, messages, due, oldest in rows:
                row = scheduled.setdefault(queue, {"queue": queue, "messages": 0, "due": 0, "oldest": oldest})
                row["messages"] += messages
                row["due"] += due or 0
                row["oldest"] = min(row["oldest"], oldest)
        for entry in self._active:
            counted = scheduled.get(entry.message.queue)
            if counted is not None:
                counted[entry.state.value] = counted.get(entry.state.value, 0) + 1
        ready = [
            {"path": q.path, "site": q.destination.site, "queued": len(q), "connections": q.connections}
            for q in ready_queues
            if len(q) or q.connections
        ]
        return {"scheduled": sorted(scheduled.values(), key=lambda r: r["queue"]), "ready": ready}

    def rules(self, kind: str) -> list[dict[str, Any]]:
        now = self._clock()
        return [msgspec.to_builtins(r) for r in self._rules.values() if r.kind == kind and r.live(now)]

    def inspect(self, spool_id: int) -> dict[str, Any] | None:
        entry = self._active.get(spool_id)
        message = entry.message if entry is not None else None
        if message is None:
            spool = self._spools.get(spool_id & 63)
            message = spool.get(spool_id) if spool is not None else None
            if message is None:
                return None
        envelope = message.envelope
        return {
            "id": format_id(message.id),
            "queue": message.queue,
            "state": entry.state.value if entry is not None else "scheduled",
            "in_memory": entry is not None,
            "site": entry.site if entry is not None else None,
            "sender": envelope.sender,
            "recipients": [r.address for r in envelope.recipients],
            "size": message.size,
            "created": message.created,
            "attempts": message.attempts,
            "next_due": message.due,
            "last_response": envelope.last_response,
            "tenant": envelope.tenant,
            "campaign": envelope.campaign,
            "metadata": envelope.metadata,
        }

    # --- helpers -----------------------------------------------------------------------------
    def _claim(self, message: Message) -> Entry | None:
        """The message's entry, made active (owned) if it was only in the spool."""
        entry = self._active.get(message.id)
        if entry is None:
            entry = self._active.add(message)  # from now on the scheduler leaves it to us
        return None if entry.state.terminal else entry

    def operations(self) -> list[dict[str, Any]]:
        """Recent bulk operations, running or done, with how far they got."""
        return list(self._operations.values())

    async def _walk(
        self,
        selector: Selector,
        act: Callable[[Message], bool],
        name: str,
        settling: list[Entry] | None = None,
        operation: str | None = None,
    ) -> int:
        done = seen = 0
        progress: dict[str, Any] = {
            "operation": operation or new_rule_id(),
            "kind": name,
            "selector": msgspec.to_builtins(selector),
            "looked_at": 0,
            "acted_on": 0,
            "running": 1,  # added up over workers: how many are still at it
            "started": self._clock(),
        }
        self._operations[progress["operation"]] = progress
        while len(self._operations) > _KEEP_OPERATIONS:
            self._operations.popitem(last=False)
        for spool in list(self._spools.values()):
            after = 0
            while batch := spool.scan(after, _BATCH):
                started = time.perf_counter()
                after = batch[-1].id
                done += sum(1 for message in batch if selector.matches(message) and act(message))
                seen += len(batch)
                progress["looked_at"], progress["acted_on"] = seen, done
                if seen % _PROGRESS_EVERY < _BATCH:
                    _log.info("admin %s: %d messages looked at, %d acted on", name, seen, done)
                # Wait until this batch's settlements are written (they finish in commit
                # callbacks: there is no event to wait on), then rest as long again: the
                # operation takes at most about half of the loop and of the commit thread,
                # and reception and delivery go on in the other half.
                while settling and any(not entry.settled for entry in settling):  # noqa: ASYNC110
                    await asyncio.sleep(0.002)
                if settling:
                    settling.clear()
                await asyncio.sleep(time.perf_counter() - started)
        progress.update(looked_at=seen, acted_on=done, running=0, finished=self._clock())
        return done

    async def _add_rule(
        self,
        kind: Literal["bounce", "suspend"],
        selector: Selector,
        reason: str,
        operator: str,
        duration: float | None,
        rule_id: str | None,
    ) -> Rule:
        now = self._clock()
        rule = Rule(
            rule_id or new_rule_id(),
            kind,
            selector,
            now,
            expires=now + duration if duration else None,
            reason=reason,
            operator=operator,
        )
        await self._primary.save_rule(rule.id, _RULE_ENCODER.encode(rule))
        self._rules[rule.id] = rule
        return rule


def _rule_view(rule: Rule | None) -> dict[str, Any] | None:
    return msgspec.to_builtins(rule) if rule is not None else None


def _describe(selector: Selector) -> str:
    fields: Iterable[tuple[str, Any]] = msgspec.structs.asdict(selector).items()
    return ", ".join(f"{k}={v}" for k, v in fields if v is not None) or "everything"
