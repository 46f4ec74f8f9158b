"""Operators' standing rules: a bounce with a duration, a suspension (of mail, or of a site).

Rules are stored in the spool, so they outlive a restart, and checked whenever the scheduler
makes a message ready (`intercept`): new mail matching them is bounced or held too, until
they expire or are cancelled. A site suspension matches no message: the dispatcher asks
`site_held` before it takes mail for a site.

A live standing bounce that matches a message wins over every suspension that matches it,
whatever the order the rules were made in (or are read back from a spool in): the bounce
answered that nothing it covers is attempted, and holding that mail would only deliver it
once the bounce ends and the suspension is resumed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

import msgspec

from pigeon.config.patterns import site_matches
from pigeon.message import Message
from pigeon.queue.names import queue_parts
from pigeon.queue.settlement import Settlement
from pigeon.queue.state import AdminMark, Entry, State
from pigeon.smtp.address import a_label
from pigeon.spool.spool import Spool

_log = logging.getLogger(__name__)
HOLD: Final = 60.0  # a suspended message is looked at again after this long (resume takes effect then)


class Selector(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Which messages: every given field must match (globs: "*.example.net", "spring-*")."""

    domain: str | None = None
    tenant: str | None = None
    campaign: str | None = None
    queue: str | None = None
    """The scheduled queue name, `campaign:tenant@domain`."""
    site: str | None = None
    """A ready queue's site (MX host set or next hop): suspends deliveries there, alone."""

    def __post_init__(self) -> None:
        # As a recipient's domain is matched (`Recipient.domain`): a U-label glob names the
        # mail of its A-label too, and both spellings make one rule (its id comes from this).
        if self.domain is not None:
            self.domain = a_label(self.domain)

    def empty(self) -> bool:
        return not (self.domain or self.tenant or self.campaign or self.queue or self.site)

    def site_only(self) -> bool:
        """Whether it names a site and nothing else (a site suspension stands alone)."""
        return self.site is not None and not (self.domain or self.tenant or self.campaign or self.queue)

    def matches(self, message: Message) -> bool:
        """Whether `message` is of the mail this selects. `tenant`, `campaign` and `domain` name
        the parts of the queue it is in now (`queue_parts`), as KumoMTA's selectors do: mail
        rebound (or put by a policy) from `ca:t@x` into `cb:t@x` is campaign cb's, to hold or
        bounce, and no longer ca's. A queue name without a domain part (`example.net`, `bulk`)
        says nothing of them: its mail's tenant, campaign and recipients' domain are matched.
        Mail never moved is matched alike either way: its queue is made of those."""
        if self.site is not None:
            return False  # a site is where mail goes, not which mail: see Rules.site_held
        if self.queue is not None and not fnmatch.fnmatchcase(message.queue, self.queue):
            return False
        if self.tenant is None and self.campaign is None and self.domain is None:
            return True
        tenant, campaign, domain = _parts(message)
        if self.tenant is not None and not fnmatch.fnmatchcase(tenant, self.tenant):
            return False
        if self.campaign is not None and not fnmatch.fnmatchcase(campaign, self.campaign):
            return False
        return self.domain is None or fnmatch.fnmatchcase(domain, self.domain.lower())

    def unmatched(self, message: Message) -> list[str]:
        """The members of this selector that do not match `message` (`queue`, `tenant`,
        `campaign`, `domain`), each as `matches` judges it; [] if it matches. Every one, not
        the first: an answer to a token bound to tenants hides a message that `tenant` misses,
        whatever else misses it too."""
        if self.site is not None:
            return ["site"]
        missed = []
        if self.queue is not None and not fnmatch.fnmatchcase(message.queue, self.queue):
            missed.append("queue")
        tenant, campaign, domain = _parts(message)
        if self.tenant is not None and not fnmatch.fnmatchcase(tenant, self.tenant):
            missed.append("tenant")
        if self.campaign is not None and not fnmatch.fnmatchcase(campaign, self.campaign):
            missed.append("campaign")
        if self.domain is not None and not fnmatch.fnmatchcase(domain, self.domain.lower()):
            missed.append("domain")
        return missed

    def of_its_tenant(self, message: Message) -> bool:
        """Whether `message` is of a tenant its `tenant` glob matches, as `matches` judges it (of
        any, without one): what a bulk operation counts as `looked_at`. A token bound to tenants
        acts through a selector naming its tenant (`tenancy.confine_selector`); counting every row
        read would tell it how much of the spool is other tenants', and by id which of theirs exist."""
        return self.tenant is None or fnmatch.fnmatchcase(_parts(message)[0], self.tenant)

    def matches_site(self, site: str) -> bool:
        """Whether `site` (`hosts[:port]`, the port left out when it is 25) is one this selector's
        site glob names. A glob without a port names its hosts on any port, as people write
        them (`mx*.example.net` holds `mx1.example.net:2525` too); one with a port, that port
        only (`:25` included)."""
        pattern = self.site
        if pattern is None:
            return False
        hosts, port = _split_port(site)
        if _split_port(pattern)[1] is None:
            return site_matches(hosts, pattern)
        return site_matches(f"{hosts}:{port or 25}", pattern)

    def describe(self) -> str:
        fields = msgspec.structs.asdict(self).items()
        return ", ".join(f"{k}={v}" for k, v in fields if v is not None) or "everything"


def _split_port(site: str) -> tuple[str, str | None]:
    """`hosts[:port]` as (hosts, port or None); an IPv6 literal's colons are no port's."""
    hosts, colon, port = site.rpartition(":")
    if not colon or "]" in port:
        return site, None
    return hosts, port


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
    """The name of the API token that asked for it."""
    via: str = ""
    """What the request came through: "cli" (the `pigeon` command) or "api" ("": made before
    this was kept)."""
    bound_to: list[str] | None = None
    """The tenants of the token that made it (`[[http.token]] tenants`), sorted; None: a token
    bound to none, the operator's (and every rule made before this was kept). A token bound to
    tenants reaches (cancels, resumes) only the rules of tokens bound to none but its tenants
    (`pigeon.listener.http.tenancy.reaches`): not the operator's suspension of its mail."""

    def live(self, now: float) -> bool:
        return self.expires is None or now < self.expires

    def hold_until(self, now: float) -> float:
        """When a message this suspension holds is looked at again."""
        return now + HOLD if self.expires is None else min(now + HOLD, self.expires)


_RULE_ENCODER: Final = msgspec.msgpack.Encoder()
_RULE_DECODER: Final = msgspec.msgpack.Decoder(Rule)


def decode_rule(blob: bytes) -> Rule:
    """A rule as a spool stores it (raises `msgspec.DecodeError`)."""
    return _RULE_DECODER.decode(blob)


def new_rule_id() -> str:
    return secrets.token_hex(6)


def standing_rule_id(kind: str, selector: Selector, bound_to: list[str] | None = None) -> str:
    """The id of the rule of `kind` for exactly `selector` that lasts until cancelled: named by
    what it covers, not by the request that made it. Identical requests issued at once reach
    the workers and nodes in different orders; each makes (or finds) the rule under this one
    id, so every copy is the same rule, and one cancel ends it everywhere. Made by a token
    bound to tenants (`bound_to`), it is named in that binding's own ids (`bound_rule_id`):
    the operator's suspension of the same selector is another rule, out of the token's reach."""
    canonical = kind.encode() + b"\0" + msgspec.json.encode(selector)
    if bound_to is not None:
        return bound_rule_id(bound_to, hashlib.sha256(canonical).hexdigest()[:12])
    return hashlib.sha256(canonical).hexdigest()[:12]


BOUND_ID_LENGTH: Final = 24
"""Hex digits of the id of a rule or operation a token bound to tenants asks for (`bound_rule_id`):
not the 12 of every id Pigeon makes otherwise, so it never names one of those."""


def bound_rule_id(bound_to: list[str], given: str) -> str:
    """The id a token bound to the tenants `bound_to` gets for a rule or operation it names
    `given` (or that is made for it): one of that binding's own ids, the same for the same
    `given`, so a request sent again is that rule again. Another binding's ids, the operator's
    and every id Pigeon makes are none of them (96 bits: one cannot be searched for), so
    giving an id can never find, and so tell of, a rule the token cannot see."""
    canonical = b"bound\0" + msgspec.json.encode(sorted(bound_to)) + b"\0" + given.encode()
    return hashlib.sha256(canonical).hexdigest()[:BOUND_ID_LENGTH]


SAME_DURATION: Final = 1.0
"""Seconds two durations (or two ends) may differ by and be one: each worker and node counts a rule's end from
its own clock (`created` plus the duration), which rounds the difference."""


def same_rule(held: Rule, asked: Rule) -> bool:
    """Whether `asked`, a rule a request makes under `held`'s id, is `held` asked for again: the
    same kind, the same selector, and both until cancelled or both for the same duration, or
    ending at the same moment (a rule sent on by a node of an earlier Pigeon that was cut off
    from Redis when it was made says what was left of it). A client's id is a key for asking
    again safely, not a name to take from another rule."""
    if held.kind != asked.kind or held.selector != asked.selector or held.bound_to != asked.bound_to:
        return False
    if held.expires is None or asked.expires is None:
        return held.expires is None and asked.expires is None
    if abs(held.expires - asked.expires) < SAME_DURATION:
        return True
    return abs((held.expires - held.created) - (asked.expires - asked.created)) < SAME_DURATION


def describe_rule(rule: Rule) -> str:
    """`suspension 16bf153e5139 of domain=e.test (until resumed)`: for people, in errors and logs."""
    what = "suspension" if rule.kind == "suspend" else "standing bounce"
    return f"{what} {rule.id} of {rule.selector.describe()} ({_lasting(rule)})"


def describe_asked(rule: Rule) -> str:
    """`suspend of domain=e.test (for 3600s)`: what a request asked for, in a refusal beside the
    rule that refuses it (so two rules of one selector read apart by their durations)."""
    return f"{rule.kind} of {rule.selector.describe()} ({_lasting(rule)})"


def _lasting(rule: Rule) -> str:
    if rule.expires is not None:
        return f"for {rule.expires - rule.created:.0f}s"
    return "until resumed" if rule.kind == "suspend" else "until cancelled"


class RuleIdTaken(Exception):
    """A rule, or an operation that makes none (`asked` None, `what` says which), asked for under
    the id of another live rule (another kind, selector or duration): refused, and nothing
    changes. `held` is the rule that has the id."""

    def __init__(self, held: Rule, asked: Rule | None, what: str = "") -> None:
        what = describe_asked(asked) if asked is not None else what
        super().__init__(
            f"id {held.id} names the {describe_rule(held)} already, not a {what}: "
            "leave id out (one is made), or give another"
        )
        self.held = held
        self.asked = asked


def refuse_operation_id(operation: tuple[str, str] | None, held: Rule | None, now: float) -> None:
    """`RuleIdTaken` if `operation` ((its id, what it does)), an operation that makes no rule (a
    bounce without a duration, a retry, a rebind), has the id of `held`, a live rule: an id names
    one thing, and a one-off under a rule's id would take the rule's place in the operations'
    progress (and read as that rule asked again)."""
    if operation is not None and held is not None and held.live(now):
        raise RuleIdTaken(held, None, operation[1])


def taken_by(held: Rule | None, asked: Rule, now: float) -> Rule | None:
    """The live rule other than `asked` that holds `asked`'s id, if any (what refuses it)."""
    if held is None or not held.live(now) or same_rule(held, asked):
        return None
    return held


class Rules:
    """The live rules of one worker (each worker stores its copy in its own spool)."""

    def __init__(
        self,
        *,
        spools: Mapping[int, Spool],
        settlement: Settlement,
        expires: Callable[[Message], float] = lambda message: math.inf,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._spools = spools
        self._settlement = settlement
        self._expires = expires
        """When a message reaches its queue's `max_age` (a suspension does not stop that clock)."""
        self._clock = clock
        self.kept: Callable[[Rule, bool], None] = lambda rule, in_force: None
        """Told of each rule stored (True) and each dropped (False), once its spools have it so: a
        node of one worker keeps the node's rules from it (`pigeon.node.standing`)."""
        self._rules: dict[str, Rule] = {}
        for spool in spools.values():
            for rule_id, blob in spool.rules():
                try:
                    self._rules[rule_id] = _RULE_DECODER.decode(blob)
                except msgspec.DecodeError:
                    _log.error("admin rule %s in %s cannot be read: ignored", rule_id, spool.directory)

    def __iter__(self) -> Any:
        return iter(list(self._rules.values()))

    def get(self, rule_id: str) -> Rule | None:
        return self._rules.get(rule_id)

    def held_as(self, rule: Rule) -> Rule | None:
        """The live rule held under `rule`'s id if it is `rule` asked for again (`same_rule`);
        None if none is; `RuleIdTaken` if another rule has that id."""
        held = self._rules.get(rule.id)
        if held is None or not held.live(self._clock()):
            return None
        if not same_rule(held, rule):
            raise RuleIdTaken(held, rule)
        return held

    async def add(self, rule: Rule, spool: Spool) -> None:
        """Store `rule` (in `spool`), then apply it. `RuleIdTaken` if another live rule has its
        id: one is never replaced by another (an expired one may be)."""
        if (held := taken_by(self._rules.get(rule.id), rule, self._clock())) is not None:
            raise RuleIdTaken(held, rule)
        await spool.save_rule(rule.id, _RULE_ENCODER.encode(rule))
        self._rules[rule.id] = rule
        self.kept(rule, True)

    async def remove(self, rule_id: str) -> Rule | None:
        rule = self._rules.pop(rule_id, None)
        if rule is not None:
            for spool in self._spools.values():
                await spool.save_rule(rule_id, None)
            self.kept(rule, False)
        return rule

    def listed(self, kind: str) -> list[dict[str, Any]]:
        now = self._clock()
        return [msgspec.to_builtins(r) for r in self._rules.values() if r.kind == kind and r.live(now)]

    def site_held(self, site: str) -> bool:
        """Whether a live suspension holds deliveries to `site` (the dispatcher asks)."""
        if not self._rules:
            return False
        now = self._clock()
        return any(r.kind == "suspend" and r.live(now) and r.selector.matches_site(site) for r in self._rules.values())

    def standing(self, kind: str, selector: Selector, bound_to: list[str] | None = None) -> Rule | None:
        """A live rule of `kind` for exactly `selector` that lasts until cancelled, made by a token
        of the binding `bound_to` (None: unbound), if any: asking for it again is asking for what
        is already so. Another binding's (the operator's, to a bound token) is not the one asked
        for: it is out of the asker's reach, and answering with it would hand it the rule."""
        now = self._clock()
        for rule in self._rules.values():
            if (
                rule.kind == kind
                and rule.selector == selector
                and rule.bound_to == bound_to
                and rule.expires is None
                and rule.live(now)
            ):
                return rule
        return None

    def _matching(self, message: Message, now: float) -> tuple[Rule | None, list[Rule]]:
        """The live standing bounce that matches `message` (the first, if several do), and
        every live suspension that matches it."""
        bounce = None
        suspensions = []
        for rule in self._rules.values():
            if not rule.live(now) or not rule.selector.matches(message):
                continue  # (site suspensions match no message: the dispatcher holds those)
            if rule.kind == "bounce":
                bounce = bounce or rule
            else:
                suspensions.append(rule)
        return bounce, suspensions

    def bounce_of(self, message: Message) -> Rule | None:
        """The live standing bounce that ends `message` when it falls due, if any."""
        if not self._rules:
            return None
        return self._matching(message, self._clock())[0]

    def suspension_of(self, message: Message) -> Rule | None:
        """The live suspension that holds `message` when it falls due, if any: none if a live
        standing bounce matches it (that bounces it, as `intercept` applies them)."""
        if not self._rules:
            return None
        bounce, suspensions = self._matching(message, self._clock())
        return suspensions[0] if bounce is None and suspensions else None

    def suspensions_of(self, message: Message) -> list[Rule]:
        """Every live suspension that holds `message`: who holds its queue, and why (none if a
        live standing bounce matches it: that mail is bounced, not held)."""
        bounce, suspensions = self._matching(message, self._clock())
        return suspensions if bounce is None else []

    def holding(self, message: Message) -> list[Rule]:
        """Every live rule that matches `message` as it is now: the standing bounces that end it
        and the suspensions that hold it when it falls due (whichever acts first)."""
        if not self._rules:
            return []
        now = self._clock()
        return [rule for rule in self._rules.values() if rule.live(now) and rule.selector.matches(message)]

    def site_suspensions(self, site: str) -> list[Rule]:
        """Every live suspension of deliveries to `site`: who stopped its ready queues, and why."""
        now = self._clock()
        rules = self._rules.values()
        return [r for r in rules if r.kind == "suspend" and r.live(now) and r.selector.matches_site(site)]

    def hold_until(self, rule: Rule, message: Message, now: float) -> float:
        """When `message`, held by the suspension `rule`, is looked at again: after `HOLD`, at the
        rule's end, or when the message reaches its `max_age`, whichever comes first. Held mail
        still expires (an `Expiration`, and its DSN) on time: a suspension nobody resumes must
        not keep it for ever, nor an hour's suspension make a one-minute max_age an hour."""
        return min(rule.hold_until(now), max(now, self._expires(message)))

    def intercept(self, entry: Entry) -> bool:
        """Apply standing rules to a SCHEDULED message about to be routed. True if one took it."""
        if not self._rules:
            return False
        now = self._clock()
        message = entry.message
        assert entry.state is State.SCHEDULED
        bounce, suspensions = self._matching(message, now)
        if bounce is not None:  # (before any suspension, whichever was made first)
            self._settlement.admin_bounce(entry, AdminMark(bounce.reason, bounce.operator))
            return True
        if suspensions:
            self._settlement.defer(entry, self.hold_until(suspensions[0], message, now))
            return True
        return False


def _parts(message: Message) -> tuple[str, str, str]:
    """The tenant, campaign and domain a selector matches `message` by: its queue name's, or
    (a queue a policy hook named, such as "bulk") its envelope's."""
    parts = queue_parts(message.queue)
    if parts is not None:
        return parts
    envelope = message.envelope
    domain = envelope.recipients[0].domain if envelope.recipients else ""
    return envelope.tenant or "", envelope.campaign or "", domain
