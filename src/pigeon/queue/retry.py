"""When to try again: exponential backoff with jitter, capped, and never past `max_age`.

    delay(n) = min(retry_interval * 2**n, max_retry_interval) * (1 +- jitter)

`n` counts the attempts made so far (0 after the first failure). RFC 5321 4.5.4.1 asks for
at least 30 minutes between retries and a give-up time of 4-5 days; the defaults are
gentler at first (so a short outage costs minutes, not half an hour) and reach the cap
within a few attempts. Jitter spreads the retries of a burst so they do not come back as
one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    retry_interval: float = 300.0
    max_retry_interval: float = 4 * 3600.0
    max_age: float = 5 * 86400.0
    jitter: float = 0.1  # fraction of the delay, plus or minus

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the `attempts`-th failed attempt (1 for the first)."""
        exponent = max(0, attempts - 1)
        base = self.retry_interval * (2.0 ** min(exponent, 60))
        base = min(base, self.max_retry_interval)
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, base * (1.0 + spread))

    def expires(self, created: float) -> float:
        return created + self.max_age

    def next_due(self, created: float, attempts: int, now: float, rng: random.Random | None = None) -> float | None:
        """When to try next, or None if the message will have expired by then.

        A retry that would fall after the expiry is scheduled at the expiry itself, so the
        message expires on time rather than a whole backoff later.
        """
        expires = self.expires(created)
        if now >= expires:
            return None
        return min(now + self.delay(attempts, rng), expires)
