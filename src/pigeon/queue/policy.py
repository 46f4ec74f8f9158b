"""Per-queue settings: retry schedule, expiry, DSNs and egress pool, chosen by scheduled queue name.

`[[queue]]` tables in the config each name a glob (`name = "*@example.net"`,
`name = "newsletter:*"`) and override some of the `[delivery]` defaults; the first match
wins.

Mail of an `[[inbound]]` route has one more: who may get a DSN when its target refuses it for
good or it expires (`InboundFailures`). Anyone may send to such an address, so a DSN there,
with the whole message under `RET=FULL`, would go to whatever sender an attacker wrote
(backscatter): by default only an authenticated sender gets one, and the message of anyone
else is held in the spool for the operator instead.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Literal

from pigeon.message import Envelope
from pigeon.queue.retry import RetryPolicy

Bounces = Literal["never", "authenticated", "always"]


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    retry: RetryPolicy
    dsn: bool = True
    pool: str | None = None  # the egress pool its mail leaves from (None: [delivery] pool)
    delay_warning: float = 0.0  # seconds deferred mail waits before its sender is told once (0: never)


@dataclass(frozen=True, slots=True)
class QueueRule:
    pattern: str
    policy: QueuePolicy


class QueuePolicies:
    def __init__(self, default: QueuePolicy, rules: list[QueueRule] | None = None) -> None:
        self.default = default
        self._rules = rules or []
        self._cache: dict[str, QueuePolicy] = {}

    def for_queue(self, name: str) -> QueuePolicy:
        policy = self._cache.get(name)
        if policy is None:
            policy = next((r.policy for r in self._rules if fnmatch.fnmatchcase(name, r.pattern)), self.default)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[name] = policy
        return policy


PoolChooser = Literal["policy", "queue", "delivery"]


def egress_pool(envelope: Envelope, policy: QueuePolicy, default: str | None) -> tuple[str | None, PoolChooser | None]:
    """The egress pool a message leaves from, and what named it: its policy hook's
    `egress_pool` ("policy"), else its `[[queue]]`'s `pool` ("queue"), else `[delivery] pool`
    ("delivery"). (None, None): the implicit source, as for mail to an application's
    `[[target]]`, which does not leave over SMTP. The order is the scheduler's (`_make_ready`)
    and `Egress.choose`'s, which applies the default."""
    if envelope.target is not None:
        return None, None
    if envelope.egress_pool:
        return envelope.egress_pool, "policy"
    if policy.pool:
        return policy.pool, "queue"
    if default:
        return default, "delivery"
    return None, None


@dataclass(frozen=True, slots=True)
class InboundFailures:
    """What an `[[inbound]]` route does with mail its target refused for good, or that expired."""

    bounces: Bounces = "authenticated"
    """Whose sender gets a DSN: "always", "authenticated" (SMTP AUTH or an API token), "never"."""
    hold: bool = True
    """Mail whose sender gets no DSN is held in the spool for an operator; False: dropped."""
    held_for: float = 30 * 86400.0
    """Seconds held mail waits for the operator before it expires (0: for ever)."""

    def withheld(self, envelope: Envelope) -> str | None:
        """Why the sender of `envelope` gets no DSN, or None when it may get one."""
        if self.bounces == "always" or (self.bounces == "authenticated" and envelope.auth_user):
            return None
        if self.bounces == "never":
            return 'not sent: [[inbound]] bounces = "never"'
        return 'not sent: sender not authenticated ([[inbound]] bounces = "authenticated")'
