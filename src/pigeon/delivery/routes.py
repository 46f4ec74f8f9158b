"""Where mail for a domain goes: a static route, or the domain's MX hosts.

A `Destination` names its *site*, the key of its ready queue: the sorted set of MX hosts
(so domains that share their MX hosts share one ready queue and its limits, KumoMTA's
"MX rollup"), or `host:port` for a static next hop. Static routes (`[[route]]` in the
config) skip the MX lookup: smart hosts, test sinks, internal relays.

A destination has a kind: SMTP hops, or an application's `[[target]]` (mail of an
`[[inbound]]` route, whose site is `inbound:<target>`), which no DNS lookup precedes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from pigeon.config.patterns import host_port
from pigeon.delivery.mta_sts import WARNINGS, Applied, Mode
from pigeon.delivery.mx import DnsFailure, Exchanger, Resolver
from pigeon.route_tenants import route_matches
from pigeon.smtp.client_auth import Credentials
from pigeon.smtp.replies import Reply

if TYPE_CHECKING:
    from pigeon.delivery.mta_sts_store import PolicyStore

_log = logging.getLogger(__name__)

_DESTINATION_TTL: Final = 30.0  # at most: less when the MX records' TTL is shorter


class TlsPolicy(enum.Enum):
    OPPORTUNISTIC = "opportunistic"  # STARTTLS when offered; plaintext otherwise or if it fails
    REQUIRED = "required"  # STARTTLS or no delivery (transient failure)
    DISABLED = "disabled"  # never STARTTLS
    IMPLICIT = "implicit"  # TLS from the first byte (RFC 8314: port 465), a [[route]]'s next hop only


@dataclass(frozen=True, slots=True)
class Hop:
    host: str  # a name (resolved at connect time) or an IP address
    port: int
    # An MX host's preference (RFC 5321 5.1): hosts of equal preference are taken in a random
    # order for each connection (`connection_order`), and this node's own decides which hosts
    # are left to send to (`ClientConnection.open`). 0 for a route's next hop or an address
    # literal. Not part of what a hop is (its equality): host and port are.
    preference: int = field(default=0, compare=False)


_ORDER: Final = random.Random()


def connection_order(hops: tuple[Hop, ...], rng: random.Random = _ORDER) -> tuple[Hop, ...]:
    """`hops` (in preference order) for one new connection: hosts of equal preference in a
    random order each time (RFC 5321 5.1: they MUST be randomized to spread the load, as
    Postfix does for each delivery), not once per cached destination, which sent every
    connection of a site to one of them for as long as its destination was cached."""
    if len(hops) < 2:
        return hops
    shuffled = list(hops)
    rng.shuffle(shuffled)
    shuffled.sort(key=lambda hop: hop.preference)  # (a stable sort: equal preferences stay shuffled)
    return tuple(shuffled)


@dataclass(frozen=True, slots=True)
class Route:
    """A `[[route]]`: mail for `domain` (a glob; "*" for all) goes to `next_hop`."""

    domain: str
    next_hop: Hop | None = None
    tls: TlsPolicy | None = None
    tls_verify: bool | None = None
    ca_file: str | None = None  # CAs to verify against instead of the system's
    auth: Credentials | None = None  # who to authenticate to `next_hop` as (SMTP AUTH); None: no AUTH
    # The tenants whose mail it is for (`[[route]] tenants`, `pigeon.route_tenants`); None: any.
    tenants: frozenset[str] | None = None

    def matches(self, domain: str) -> bool:
        return route_matches(self.domain, domain)


class Kind(enum.Enum):
    SMTP = "smtp"  # the hops' SMTP servers
    TARGET = "target"  # an application's inbound target


@dataclass(frozen=True, slots=True)
class Destination:
    site: str
    hops: tuple[Hop, ...]  # in the order to try
    tls: TlsPolicy
    tls_verify: bool
    kind: Kind = Kind.SMTP
    target: str | None = None  # Kind.TARGET: the [[target]]'s name
    ca_file: str | None = None  # with tls_verify: the CAs to trust instead of the system's
    # Where its hops came from: the domain's MX records, a [[route]]'s next_hop, or an address
    # literal; what `pigeon shaping explain` calls them ("MX hosts" only for the first).
    hops_from: Literal["mx", "route", "literal"] = "mx"
    # The domain's MTA-STS policy (RFC 8461), when one applies (mode enforce or testing; only
    # to hops from MX records): enforce leaves only the hosts it allows in `hops`, and makes
    # `tls` required and verified; testing changes nothing but what is checked and warned of.
    mta_sts: Applied | None = None
    auth: Credentials | None = None  # a [[route]]'s smart host: authenticate as (its `repr` hides the password)
    # DANE (RFC 7672) applies: `[dane] enabled` and the domain's MX records are secure (only to
    # hops from MX records). Each host's TLSA records are then looked up as it is connected to
    # (`pigeon.delivery.dane`): a host with usable ones must match them, over STARTTLS.
    dane: bool = False
    # The recipient domain whose MX records the hops are (None: a route's or an address
    # literal's): the policy domain a TLS report (RFC 8460) counts the sessions of under DANE.
    domain: str | None = field(default=None, compare=False)

    @property
    def security(self) -> str:
        """What its ready queue's name adds to the site: the TLS policy, unless it is the
        default (opportunistic, unverified). Domains whose MX hosts are the same share a ready
        queue and its connections, so a domain that requires (verified) TLS must not share
        them with one that does not: a connection opened in plaintext for one would carry the
        other's mail. Nor may connections verified against a private CA carry mail meant to be
        verified against the system's CAs, or the reverse. A connection opened under an MTA-STS
        policy says so in its records, so it carries only mail under one (in the same mode).
        Nor may a connection opened without looking at TLSA records (a domain whose MX records
        are insecure) carry mail that DANE protects, and the reverse (DANE's hosts may refuse it).
        (Nor may a connection authenticated as one user carry mail a route sends as another.)"""
        auth = self.auth
        dane = self.dane and self.kind is Kind.SMTP
        if self.kind is not Kind.SMTP or (self.tls is TlsPolicy.OPPORTUNISTIC and not self.tls_verify and not dane):
            return f" (auth {auth.username})" if auth is not None and self.kind is Kind.SMTP else ""
        verified = (f", verified by {self.ca_file}" if self.ca_file else ", verified") if self.tls_verify else ""
        sts = f", MTA-STS {self.mta_sts.policy.mode.value}" if self.mta_sts is not None else ""
        as_user = f", auth {auth.username}" if auth is not None else ""
        return f" (tls {self.tls.value}{verified}{sts}{', DANE' if dane else ''}{as_user})"


class Router:
    """Turns a recipient domain into a `Destination`."""

    def __init__(
        self,
        routes: list[Route],
        resolver: Resolver,
        *,
        tls: TlsPolicy = TlsPolicy.OPPORTUNISTIC,
        tls_verify: bool = False,
        ca_file: str | None = None,
        smtp_port: int = 25,
        classify: Callable[[Reply], str] = lambda reply: "",
        clock: Callable[[], float] = time.monotonic,
        mta_sts: PolicyStore | None = None,
        dane: bool = False,
    ) -> None:
        self._routes = routes
        self._dane = dane  # `[dane] enabled`: the resolver asks with DO (`Resolver(dnssec=True)`)
        self._sts = mta_sts
        self._classify = classify
        self._resolver = resolver
        self._tls = tls
        self._verify = tls_verify
        self._ca_file = ca_file
        self._port = smtp_port
        self._clock = clock
        self._cache: dict[str, tuple[float, Destination]] = {}
        self._targets: dict[str, Destination] = {}

    def replace(self, routes: list[Route]) -> Callable[[str, str | None], bool]:
        """New static routes (a reload): destinations worked out under the old ones are forgotten,
        so the next message for a domain is routed by the new ones. Returns whether a domain's
        route changed (`changed(domain, target)`, a `Scheduler.reroute` argument): its next hop
        or TLS settings, what its ready queue is (`Destination.site`, `security`)."""
        old, self._routes = self._routes, routes
        self._cache.clear()

        def changed(domain: str, target: str | None = None) -> bool:
            # An [[inbound]] route's mail goes to its target: no [[route]] applies. A route
            # reserved for other tenants since counts as a change: what waits for it is
            # routed again, and so refused (`reserved_for`) rather than sent.
            if target is not None:
                return False
            before, after = self._route(domain, old), self._route(domain, routes)
            reserved = (before.tenants if before else None) != (after.tenants if after else None)
            return reserved or self._settings(old, domain) != self._settings(routes, domain)

        return changed

    @property
    def routes(self) -> list[Route]:
        """The static routes in force."""
        return self._routes

    def reserved_for(self, domain: str) -> frozenset[str] | None:
        """The tenants whose mail the route of `domain` is for (its `tenants`); None: any
        tenant's (no route matches, or the first that does has no `tenants`)."""
        route = self._route(domain, self._routes)
        return route.tenants if route is not None else None

    def verifies_with_system_cas(self) -> bool:
        """Whether some mail may be verified against the system's CAs: the default's, or a
        `[[route]]`'s, verification with no `ca_file` of its own."""
        settings = [(self._verify, self._ca_file)]
        settings += [
            (r.tls_verify if r.tls_verify is not None else self._verify, r.ca_file or self._ca_file)
            for r in self._routes
        ]
        return any(verify and not trusted for verify, trusted in settings)

    def cached(self, domain: str, target: str | None = None) -> Destination | None:
        """The destination if known and fresh: no await needed (the common case)."""
        if target is not None:
            return self._target(target)
        hit = self._cache.get(domain)
        if hit is not None and hit[0] > self._clock():
            return hit[1]
        return None

    async def destination(self, domain: str, target: str | None = None) -> Destination:
        """Raises `DnsFailure` (with its reply and bounce class) when the domain cannot be resolved."""
        hit = self.cached(domain, target)
        if hit is not None:
            return hit
        try:
            return await self._resolve(domain)
        except DnsFailure as failure:
            failure.classification = self._classify(failure.reply) if failure.reply.code >= 500 else ""
            raise

    def _target(self, name: str) -> Destination:
        # An [[inbound]] route's mail: no DNS, no SMTP; the dispatcher hands it to the target.
        destination = self._targets.get(name)
        if destination is None:
            destination = Destination(f"inbound:{name}", (), self._tls, self._verify, Kind.TARGET, name)
            self._targets[name] = destination
        return destination

    async def _resolve(self, domain: str) -> Destination:
        while True:
            routes = self._routes
            try:
                destination, fresh = await self._resolve_under(routes, domain)
            except DnsFailure:
                if self._routes is routes:
                    raise
                continue  # (the new routes may not even ask the DNS)
            if self._routes is routes:
                break
            # A reload replaced the routes while the DNS answered: the destination is what the
            # new ones say (its TLS policy, say), never the old ones', cached or not.
        if len(self._cache) > 50_000:
            self._cache.clear()
        # No longer than the records it comes from are fresh (their TTL, at least the
        # resolver's floor): a TTL under 30 s is honoured.
        self._cache[domain] = (self._clock() + min(_DESTINATION_TTL, fresh), destination)
        return destination

    def _settings(
        self, routes: list[Route], domain: str
    ) -> tuple[Hop | None, TlsPolicy, bool, str | None, Credentials | None]:
        """What `routes` say of mail for `domain`: next hop (None: its MX hosts), TLS policy,
        verification, the CAs to verify against, and who to authenticate as (to a next hop only)."""
        route = self._route(domain, routes)
        tls = route.tls if route and route.tls else self._tls
        verify = route.tls_verify if route and route.tls_verify is not None else self._verify
        trusted = (route.ca_file if route and route.ca_file else self._ca_file) if verify else None
        hop = route.next_hop if route else None
        auth = route.auth if route is not None and hop is not None else None
        return hop, tls, verify, trusted, auth

    async def _resolve_under(self, routes: list[Route], domain: str) -> tuple[Destination, float]:
        """The destination, and for how many seconds it may be cached as far as DNS goes."""
        hop, tls, verify, trusted, auth = self._settings(routes, domain)
        if hop is not None:
            site = host_port(hop.host, hop.port)
            static = Destination(site, (hop,), tls, verify, ca_file=trusted, hops_from="route", auth=auth)
            return static, _DESTINATION_TTL
        if domain.startswith("[") and domain.endswith("]"):
            # An address literal (RFC 5321 4.1.3): that host, no DNS.
            address = domain[1:-1]
            address = address[5:] if address[:5].lower() == "ipv6:" else address
            literal = Hop(address, self._port)
            site = f"[{address}]:{self._port}"
            return Destination(site, (literal,), tls, verify, ca_file=trusted, hops_from="literal"), _DESTINATION_TTL
        if self._sts is None:
            exchangers, fresh, dane = await self._exchangers(domain)
            return self._by_mx(exchangers, tls, verify, trusted, dane=dane, domain=domain), fresh
        # The MTA-STS TXT lookup goes beside the MX lookup, not after it: a domain without a
        # record costs no more time than before (the policy's store never raises).
        (exchangers, fresh, dane), applied = await asyncio.gather(self._exchangers(domain), self._sts.policy(domain))
        if applied is None or applied.policy.mode is Mode.NONE:
            return self._by_mx(exchangers, tls, verify, trusted, dane=dane, domain=domain), fresh
        return self._under_policy(domain, exchangers, applied, tls, verify, trusted, dane), fresh

    async def _exchangers(self, domain: str) -> tuple[list[Exchanger], float, bool]:
        """The domain's MX hosts, how long they are fresh, and whether DANE applies to them
        (`[dane] enabled` and the MX records are secure: RFC 7672 2.2.1)."""
        if not self._dane:
            exchangers, fresh = await self._resolver.exchangers_for(domain)
            return exchangers, fresh, False
        return await self._resolver.exchangers_secure(domain)

    def _by_mx(
        self,
        exchangers: list[Exchanger],
        tls: TlsPolicy,
        verify: bool,
        trusted: str | None,
        sts: Applied | None = None,
        *,
        dane: bool = False,
        domain: str | None = None,
    ) -> Destination:
        hops = tuple(Hop(e.host, self._port, e.preference) for e in exchangers)
        site = ",".join(sorted({e.host for e in exchangers}))
        if self._port != 25:
            site += f":{self._port}"
        return Destination(site, hops, tls, verify, ca_file=trusted, mta_sts=sts, dane=dane, domain=domain)

    def _under_policy(
        self,
        domain: str,
        exchangers: list[Exchanger],
        applied: Applied,
        tls: TlsPolicy,
        verify: bool,
        trusted: str | None,
        dane: bool = False,
    ) -> Destination:
        """The destination of mail for `domain` by its MX hosts under its MTA-STS policy (RFC
        8461 4, 5). Enforce: only the hosts the policy allows, over STARTTLS verified for the MX
        host's name against the system's CAs or `[mta_sts] ca_file`, whatever `tls` and
        `tls_verify` say; none allowed is a transient failure. Testing: every host, as without
        the policy, but the certificate is checked (an unverified fallback, then the clear, as
        opportunistic TLS has them, still deliver) so that what enforcing would refuse is warned of."""
        assert self._sts is not None
        sts_cas = str(self._sts.ca_file) if self._sts.ca_file is not None else None
        allowed = [e for e in exchangers if applied.policy.allows(e.host)]
        if applied.enforced:
            if not allowed:
                hosts = ", ".join(e.host for e in exchangers)
                text = f"MTA-STS: no MX host of {domain} ({hosts}) is allowed by {applied.describe()}"
                if WARNINGS.due(f"{domain}\0no mx"):
                    _log.warning("%s: mail deferred: %s", domain, text)
                raise DnsFailure(Reply(451, "4.7.0", (text,)))
            return self._by_mx(allowed, TlsPolicy.REQUIRED, True, sts_cas, applied, dane=dane, domain=domain)
        if len(allowed) < len(exchangers) and WARNINGS.due(f"{domain}\0testing mx"):
            refused = ", ".join(e.host for e in exchangers if e not in allowed)
            _log.warning(
                "%s: MTA-STS testing: enforcing %s would leave out its MX hosts %s", domain, applied.describe(), refused
            )
        if tls is TlsPolicy.DISABLED or verify:
            return self._by_mx(exchangers, tls, verify, trusted, applied, dane=dane, domain=domain)
        return self._by_mx(exchangers, tls, True, sts_cas, applied, dane=dane, domain=domain)

    def _route(self, domain: str, routes: list[Route]) -> Route | None:
        for route in routes:
            if route.matches(domain):
                return route
        return None
