"""`[[inbound]]` routes: which recipients of SMTP-received mail belong to an application.

Mail for a routed address is accepted from anyone (it is for us, unlike relaying), spooled
like any other mail with its envelope naming the target, and delivered to the target instead
of an MX. Its scheduled queue and its ready queue's site are both called `inbound:<target>`,
so retries, `max_age`, bounces and every admin operation work on it as on outbound mail.
Each route also says what becomes of mail its target refuses for good or that expires
(`InboundFailures`: who gets a DSN; held or dropped otherwise). An address no route takes at
a domain the routes name (`receives`) is unknown to a client that may not relay, not relaying.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass
from typing import Final

from pigeon.queue.policy import InboundFailures
from pigeon.smtp.address import a_label, local_value

PREFIX: Final = "inbound:"
_DEFAULT: Final = InboundFailures()


@dataclass(frozen=True, slots=True)
class InboundRoute:
    target: str
    recipient: str | None = None  # a glob over the whole address
    domain: str | None = None  # a glob over the domain
    failures: InboundFailures = _DEFAULT

    def matches(self, address: str, domain: str) -> bool:
        if self.recipient is not None:
            return fnmatch.fnmatchcase(address, self.recipient)
        return self.domain is not None and fnmatch.fnmatchcase(domain, self.domain)


class InboundRoutes:
    """The routes in configuration order; the first that matches wins."""

    def __init__(self, routes: list[InboundRoute]) -> None:
        self._routes = [
            dataclasses.replace(
                r,
                recipient=_glob_value(r.recipient) if r.recipient else None,
                domain=r.domain.lower() if r.domain else None,
            )
            for r in routes
        ]
        self._cache: dict[str, InboundRoute | None] = {}
        self._domains = frozenset(
            domain for r in self._routes if r.recipient is not None and (domain := _literal_domain(r.recipient))
        )

    def __bool__(self) -> bool:
        return bool(self._routes)

    def receives(self, address: str) -> bool:
        """Whether the domain of `address` is one we take inbound mail for, as a recipient
        pattern names it ("reply+*@app.example": app.example; a domain with a glob in it names
        none). An address there that no route takes is unknown (550 5.1.1), not a relay
        attempt. (A domain route takes every address of its domains: none is unknown there.)"""
        return address.rpartition("@")[2].lower() in self._domains

    def routing_key(self, address: str) -> str | None:
        """`inbound:<target>` for a routed recipient address, else None (the scheduled queue
        and the site of its mail)."""
        target = self.target(address)
        return None if target is None else PREFIX + target

    def target(self, address: str) -> str | None:
        """The name of the `[[target]]` a recipient address is routed to, else None."""
        route = self.route(address)
        return None if route is None else route.target

    def failures(self, address: str) -> InboundFailures | None:
        """What the route of a recipient address does with mail that failed, else None."""
        route = self.route(address)
        return None if route is None else route.failures

    def route(self, address: str) -> InboundRoute | None:
        """The first route matching a recipient address, else None."""
        if address in self._cache:
            return self._cache[address]
        # The domain as its A-label, as the config's globs are written (`config.patterns`); a
        # quoted local part as its value, the quotes being only syntax (RFC 5321 4.1.2):
        # `"billing"` is `billing`, and `"reply+q z"` is `reply+q z`, which `reply+*@...`
        # takes. (Kept quoted, a glob's `reply+*` never matched it: unknown to a client
        # outside relay_networks, relayed to the domain's MX, this node, for a relay client.)
        # Only the match: the address travels on as it was written.
        local, at, domain = address.lower().rpartition("@")
        local, domain = (local_value(local), a_label(domain)) if at else (local, domain)
        lowered = f"{local}@{domain}" if at else domain
        route = next((r for r in self._routes if r.matches(lowered, domain)), None)
        if len(self._cache) > 50_000:
            self._cache.clear()
        self._cache[address] = route
        return route


def _glob_value(pattern: str) -> str:
    """A recipient glob in lower case, its local part as its value when written as a quoted
    string (`"reply+*"@app.example` is `reply+*@app.example`), as addresses are matched."""
    local, at, domain = pattern.lower().rpartition("@")
    return f"{local_value(local)}@{domain}" if at else pattern.lower()


def _literal_domain(pattern: str) -> str | None:
    """The domain of a recipient pattern when it has no glob in it, else None."""
    _, at, domain = pattern.rpartition("@")
    if not at or not domain or any(c in domain for c in "*?["):
        return None
    return domain
