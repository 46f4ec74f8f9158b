"""A pace for warnings that the same trouble would otherwise repeat at every message."""

from __future__ import annotations

import time
from collections.abc import Callable


class WarningPace:
    """At most one warning per key (a domain or a site, what about it) every `every` seconds: a
    trouble met by each message or connection of a busy destination is said once in a while, not
    every time (a failing MTA-STS policy, a step down to unverified TLS or to the clear)."""

    def __init__(self, every: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._clock = clock
        self._last: dict[str, float] = {}

    def due(self, key: str) -> bool:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._every:
            return False
        if len(self._last) > 10_000:
            self._last.clear()
        self._last[key] = now
        return True
