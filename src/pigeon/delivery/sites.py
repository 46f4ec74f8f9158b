"""Dead sites: a destination none of whose hosts takes a connection is backed off as a whole.

When a connection to a site fails because every host refused it, timed out, or ended it
before a word of its greeting (a reset, a close; not a 421, a
TLS failure, nor while a host was left untried for a DNS lookup that failed for now:
`Unreachable.site_down`), the site is *down*. Its mail is then
not tried message by message: the dispatcher defers the message that connection was for
with that failure, and what else waits for the site with `451 4.4.1 not tried: <site> is
down` (keeping that failure as their `last_response`: an expiry names it), none of them
counting an attempt, until the next *probe*: one connection,
`site_retry_interval` after it went down, then twice as long after each probe that fails, up
to `max_site_retry_interval`. A probe that connects (or any connection that opens) brings
the site up, and its mail flows at once.

Pure state with an injected clock: no sockets, no timers. The probe is driven by the mail:
what was deferred is due again when the probe is, and the first connection asked for then
is the probe.

BUGS: the state is each worker process's own. Workers of one node (and nodes of a cluster)
find a dead site each by itself, and probe it each on its own schedule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from pigeon.smtp.replies import Reply

# A probe is due this much before its time: the mail deferred to it comes back on the
# scheduler's clock (wall time, a tick), and must not find the probe a moment early and be
# deferred again for nothing.
_EARLY: Final = 0.25
_REMEMBERED: Final = 1000  # sites that came back up, still shown (as up) in /metrics


@dataclass(slots=True)
class _Down:
    since: float
    interval: float  # until the next probe, from the last failure
    next_probe: float
    reason: Reply  # the failure that took it down, or the last probe's
    probing: bool = False
    probes: int = 0  # probes that failed


class SiteHealth:
    """Which sites are down, and when each is probed next."""

    def __init__(
        self, interval: float = 60.0, max_interval: float = 600.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.max_interval = max(interval, max_interval)
        self._clock = clock
        self._down: dict[str, _Down] = {}
        self._known: dict[str, None] = {}  # sites ever down, oldest first (for /metrics)

    def is_down(self, site: str) -> bool:
        return site in self._down

    def probing(self, site: str) -> bool:
        """A probe of this down site is under way: what waits for it waits for the verdict."""
        down = self._down.get(site)
        return down is not None and down.probing

    def until_probe(self, site: str) -> float:
        """Seconds until the next probe of a down site may start (0: it may now; 0 for a
        site that is up). Mail deferred by this much finds the probe due when it is back."""
        down = self._down.get(site)
        if down is None:
            return 0.0
        return max(0.0, down.next_probe - _EARLY - self._clock())

    def probe(self, site: str) -> bool:
        """Start the probe of a down site if it is due and none is under way. True: the
        caller opens one connection, and reports `failed` or `connected` (or `abandoned`)."""
        down = self._down.get(site)
        if down is None or down.probing or self.until_probe(site) > 0:
            return False
        down.probing = True
        return True

    def probe_now(self) -> list[str]:
        """An operator retried mail (`POST /api/v1/admin/retry`): every down site with no probe
        under way may probe at once, so the first of its mail to come ready opens one connection
        rather than being deferred again. Its backoff stands: a probe that fails waits twice as
        long as the last one did. The sites made due (for the log)."""
        now = self._clock()
        due = []
        for site, down in self._down.items():
            if not down.probing and down.next_probe > now:
                down.next_probe = now
                due.append(site)
        return due

    def forget(self, site: str) -> bool:
        """No route leads to `site` any more (a reload): it is no longer held down, so its
        empty ready queues are not kept and listed as down for a probe no mail will ever
        make. A site whose probe is under way is kept (its verdict is on its way). True if it
        was down. (Were mail to come for it after all, its first connection finds it down
        again at no attempt's cost, as the first one did.)"""
        down = self._down.get(site)
        if down is None or down.probing:
            return False
        del self._down[site]
        return True

    def abandoned(self, site: str) -> None:
        """The probe never opened a connection (no slot free, nothing left to send, a stop):
        the next connection asked for probes instead."""
        down = self._down.get(site)
        if down is not None:
            down.probing = False

    def failed(self, site: str, reason: Reply, *, probe: bool = False) -> bool:
        """No host of `site` took a connection. True if that took it down (it was up): the
        caller logs it. A failed `probe` doubles the wait before the next, up to the ceiling."""
        now = self._clock()
        down = self._down.get(site)
        if down is None:
            self._down[site] = _Down(now, self.interval, now + self.interval, reason)
            self._known.pop(site, None)
            self._known[site] = None
            if len(self._known) > _REMEMBERED:  # forget the sites up the longest, never one down
                up = [known for known in self._known if known not in self._down]
                for known in up[: len(self._known) - _REMEMBERED]:
                    del self._known[known]
            return True
        if probe:  # (else a connection asked for before it went down: the schedule stands)
            down.probing = False
            down.probes += 1
            down.interval = min(down.interval * 2, self.max_interval)
            down.next_probe = now + down.interval
            down.reason = reason
        return False

    def connected(self, site: str) -> tuple[float, int] | None:
        """A connection to `site` opened: it is up. If it was down, for how many seconds and
        after how many failed probes (the caller logs that); else None."""
        down = self._down.pop(site, None)
        return None if down is None else (self._clock() - down.since, down.probes)

    def reason(self, site: str) -> Reply | None:
        down = self._down.get(site)
        return None if down is None else down.reason

    def states(self) -> Iterator[tuple[str, bool]]:
        """(site, down) of every site that has been down (for /metrics: a site that came back
        reads 0 rather than vanishing)."""
        for site in self._known:
            yield site, site in self._down

    def down_sites(self) -> list[str]:
        return list(self._down)


def not_tried(site: str, source: str | None = None, user: str | None = None) -> Reply:
    """What mail for a down site is deferred with (from `source`, a `[[source]]`, when it is
    down for that source alone); for a route that authenticates as `user`, the site may as
    well have refused the credentials (the cause, kept beside it, says which)."""
    origin = f" from source {source}" if source else ""
    if user is not None:
        return Reply(451, "4.4.1", (f"not tried: {site} is down or refused authentication as {user}{origin}",))
    return Reply(451, "4.4.1", (f"not tried: {site} is down{origin}",))
