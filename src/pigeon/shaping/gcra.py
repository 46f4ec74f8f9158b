"""GCRA: the generic cell rate algorithm, the rate limiter KumoMTA and redis-cell use.

One number of state (the theoretical arrival time) per limit: a request is allowed when
it would not make the schedule run more than `burst` intervals ahead of now. Pure maths,
no clock of its own: callers pass `now`, so tests need no sleeping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_RATE: Final = re.compile(r"\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour|d|day)\s*")
_BURST: Final = re.compile(r"\s*,\s*burst\s*=")
_PERIOD: Final = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600,
                  "d": 86400, "day": 86400}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Rate:
    """`per_second` events a second, allowing bursts of `burst` events."""

    per_second: float
    burst: int = 1

    @classmethod
    def parse(cls, text: str) -> Rate:
        """ "100/s", "6,000/min", "3000/m", "1000/h", "50/d" (the unit s, m, h or d, or sec, second, min,
        minute, hour, day); optionally ",burst=10", with white space around it or not."""
        # White space around the burst is no mistake: "100/s, burst=10" means "100/s,burst=10".
        spec, *burst_part = _BURST.split(text, maxsplit=1)
        has_burst, extra = bool(burst_part), "".join(burst_part)
        match = _RATE.fullmatch(spec)
        if match is None:
            raise ValueError(
                f"{text!r} is not a rate: a count per s, m, h or d (or sec, second, min, minute, hour, day),"
                ' like "100/s", "6000/min" or "500/h"'
            )
        count = float(match.group(1).replace("_", "").replace(",", ""))
        if count <= 0:
            raise ValueError(f"{text!r}: the rate must be above zero")
        if has_burst and not extra.strip().isdigit():
            raise ValueError(f"{text!r}: burst= needs a whole number")
        burst = int(extra) if has_burst else 1
        if burst < 1:
            raise ValueError(f"{text!r}: burst must be at least 1")
        return cls(count / _PERIOD[match.group(2)], burst)

    @property
    def interval(self) -> float:
        return 1.0 / self.per_second


def take(tat: float, now: float, interval: float, burst: int, count: int = 1) -> tuple[float, float]:
    """Book `count` slots of a limit whose theoretical arrival time is `tat`: the new TAT, and
    the seconds from `now` until the last of them may go (0: all may go now).

    The slots booked are the next `count` the schedule has; the j-th may go at
    `max(tat, now) + (j - burst + 1) * interval` (or now). This is the whole of GCRA, shared by
    the in-process limiters and mirrored by the Redis script (`pigeon.shaping.cluster`)."""
    start = tat if tat > now else now
    last_allowed = start + interval * (count - burst)
    return start + interval * count, max(0.0, last_allowed - now)


class Gcra:
    """One rate limit."""

    __slots__ = ("_rate", "_tat")

    def __init__(self, rate: Rate) -> None:
        self._rate = rate
        self._tat = 0.0  # theoretical arrival time of the next event

    def reserve(self, now: float, count: int = 1) -> float:
        """Take `count` slots: 0 if they may go now, else the seconds to wait until the last
        may (the slots are then booked)."""
        self._tat, wait = take(self._tat, now, self._rate.interval, self._rate.burst, count)
        return wait
