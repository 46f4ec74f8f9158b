"""Per-queue settings: retry schedule, expiry and DSNs, chosen by scheduled queue name.

`[[queue]]` tables in the config each name a glob (`name = "*@example.net"`,
`name = "newsletter:*"`) and override some of the `[delivery]` defaults; the first match
wins.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from pigeon.queue.retry import RetryPolicy


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    retry: RetryPolicy
    dsn: bool = True


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
