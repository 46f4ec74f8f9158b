"""MX and address resolution, with a cache that honours the records' TTLs.

RFC 5321 5.1 and RFC 7505:

* MX records, lowest preference first; equal preferences in random order (per lookup);
* no MX record: the domain itself is the one exchanger (implicit MX), if it has addresses;
* a null MX (`0 .`): the domain accepts no mail, a permanent failure;
* NXDOMAIN: a permanent failure; a timeout or SERVFAIL: a transient one.

Answers, including negative ones, are cached for their TTL (bounded below and above), so
lookups happen per domain per TTL, not per message. Tests point the resolver at a DNS
server of their own on loopback: Pigeon never needs the system resolver to be sane.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from pigeon.delivery import dnswire
from pigeon.queue.attempt import Unroutable
from pigeon.smtp.replies import Reply

_MIN_TTL: Final = 5.0
_MAX_TTL: Final = 3600.0
_NEGATIVE_TTL: Final = 60.0
_FAILURE_TTL: Final = 10.0  # a transient failure is remembered briefly, to not hammer a broken server


_LOOPBACK: Final = ("127.0.0.1", "::1")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.rstrip("."))
    except ValueError:
        return False
    return True


def _is_localhost(name: str) -> bool:
    """RFC 6761 6.3: "localhost" and the names under it are the loopback addresses, answered
    without asking a DNS server (which may say NXDOMAIN: a route to localhost:2525 would fail)."""
    return name == "localhost" or name.endswith(".localhost")


class DnsFailure(Unroutable):
    """A lookup failed. `reply` says how, `permanent` whether retrying can help. To the queue
    it is a destination that cannot be resolved (the router adds the bounce class)."""

    @property
    def permanent(self) -> bool:
        return self.reply.code >= 500


@dataclass(frozen=True, slots=True)
class Exchanger:
    preference: int
    host: str  # without the trailing dot, lower-case


@dataclass(slots=True)
class _Cached:
    expires: float
    value: object


class Resolver:
    """Async MX/A/AAAA lookups (the plain cases by `dnswire`, the rest by dnspython), cached by TTL."""

    def __init__(
        self,
        nameservers: list[tuple[str, int]] | None = None,
        *,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if nameservers:
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = [dns.nameserver.Do53Nameserver(host, port) for host, port in nameservers]
        else:
            self._resolver = dns.asyncresolver.Resolver()
        self._resolver.lifetime = timeout
        self._resolver.timeout = timeout
        self._timeout = timeout
        # The first nameserver, asked directly for the plain cases (`dnswire`); dnspython
        # asks for the rest, and for every case when it is not an address on port 53 (DoH...).
        first = self._resolver.nameservers[0] if self._resolver.nameservers else None
        self._server: tuple[str, int] | None = None
        if isinstance(first, str) and _is_address(first):
            self._server = (first, self._resolver.port)
        elif isinstance(first, dns.nameserver.Do53Nameserver) and _is_address(first.address):
            self._server = (first.address, first.port)
        # A server that fails the query (SERVFAIL, REFUSED) has dnspython try the next one: when
        # there is none, the failure is the answer.
        self._alone = len(self._resolver.nameservers) == 1
        self._cache: dict[tuple[str, str], _Cached] = {}
        self._clock = clock
        self._rng = rng or random.Random()

    async def exchangers(self, domain: str) -> list[Exchanger]:
        """The hosts that take mail for `domain`, in the order to try them."""
        domain = domain.lower().rstrip(".")
        if _is_localhost(domain):
            return [Exchanger(0, domain)]  # no MX for it (RFC 6761 6.3): itself, on loopback
        records = await self._lookup(domain, "MX")
        if records is None:  # no MX: the domain itself, if it has an address (RFC 5321 5.1)
            if await self._lookup(domain, "A") is None and await self._lookup(domain, "AAAA") is None:
                raise DnsFailure(Reply(550, "5.1.2", (f"{domain} has no MX and no address record",)))
            return [Exchanger(0, domain)]
        exchangers = [Exchanger(int(pref), str(host)) for pref, host in records]
        if len(exchangers) == 1 and exchangers[0].host in ("", "."):
            raise DnsFailure(Reply(556, "5.1.10", (f"{domain} accepts no mail (null MX, RFC 7505)",)))
        exchangers = [e for e in exchangers if e.host not in ("", ".")]
        # An MX names a host, never an address (RFC 5321 5.1): "10 192.0.2.1" is a
        # misconfiguration that Postfix and Exim refuse too, not a route.
        usable = [e for e in exchangers if not _is_address(e.host)]
        if not usable:
            named = ", ".join(e.host for e in exchangers)
            text = f"{domain}'s MX names an address, not a host ({named}): not usable (RFC 5321 5.1)"
            raise DnsFailure(Reply(451, "4.4.4", (text,)))
        exchangers = usable
        self._rng.shuffle(exchangers)  # equal preferences end up in random order...
        exchangers.sort(key=lambda e: e.preference)  # ...because the sort is stable
        return exchangers

    async def addresses(self, host: str) -> list[str]:
        """IPv4 then IPv6 addresses of `host`."""
        host = host.lower().rstrip(".")
        if _is_localhost(host):
            return list(_LOOPBACK)
        found: list[str] = []
        failure: DnsFailure | None = None
        for kind in ("A", "AAAA"):
            try:
                records = await self._lookup(host, kind)
            except DnsFailure as error:
                failure = error
                continue
            found += [str(r) for r in records or ()]
        if not found:
            if failure is not None:
                raise failure
            raise DnsFailure(Reply(450, "4.4.4", (f"{host} has no address record",)))
        return found

    async def _lookup(self, name: str, kind: str) -> list[Any] | None:
        """Cached records of one type: None when the name exists but has none."""
        key = (name, kind)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached.expires > now:
            if isinstance(cached.value, DnsFailure):
                raise cached.value
            return cast(list[Any] | None, cached.value)
        if self._server is not None:
            try:
                async with asyncio.timeout(self._timeout):
                    plain = await dnswire.ask(self._server, name, kind)
            except TimeoutError:
                failure = DnsFailure(Reply(451, "4.4.3", (f"DNS lookup of {kind} {name} failed: LifetimeTimeout",)))
                self._remember(key, failure, _FAILURE_TTL)
                raise failure from None
            if plain is not None and (plain.rcode in (dnswire.NOERROR, dnswire.NXDOMAIN) or self._alone):
                return self._plain(key, plain)
        try:
            answer = await self._resolver.resolve(name, kind, raise_on_no_answer=False)
        except dns.resolver.NXDOMAIN:
            failure = DnsFailure(Reply(550, "5.1.2", (f"domain {name} does not exist (NXDOMAIN)",)))
            self._remember(key, failure, _NEGATIVE_TTL)
            raise failure from None
        except (dns.exception.Timeout, dns.resolver.NoNameservers, dns.resolver.LifetimeTimeout) as error:
            failure = DnsFailure(Reply(451, "4.4.3", (f"DNS lookup of {kind} {name} failed: {type(error).__name__}",)))
            self._remember(key, failure, _FAILURE_TTL)
            raise failure from None
        except dns.exception.DNSException as error:
            failure = DnsFailure(Reply(451, "4.4.3", (f"DNS lookup of {kind} {name} failed: {error}",)))
            self._remember(key, failure, _FAILURE_TTL)
            raise failure from None
        rrset = answer.rrset
        if rrset is None:
            self._remember(key, None, _NEGATIVE_TTL)
            return None
        if kind == "MX":
            value: list[Any] = [(r.preference, r.exchange.to_text(omit_final_dot=True).lower()) for r in rrset]
        else:
            value = [r.address for r in rrset]
        self._remember(key, value, float(rrset.ttl))
        return value

    def _plain(self, key: tuple[str, str], answer: dnswire.Answer) -> list[Any] | None:
        """What `_lookup` makes of an answer read by `dnswire`, as of dnspython's."""
        name, kind = key
        if answer.rcode not in (dnswire.NOERROR, dnswire.NXDOMAIN):
            # (as dnspython says it, once the only nameserver failed)
            failure = DnsFailure(Reply(451, "4.4.3", (f"DNS lookup of {kind} {name} failed: NoNameservers",)))
            self._remember(key, failure, _FAILURE_TTL)
            raise failure
        if answer.rcode == dnswire.NXDOMAIN:
            failure = DnsFailure(Reply(550, "5.1.2", (f"domain {name} does not exist (NXDOMAIN)",)))
            self._remember(key, failure, _NEGATIVE_TTL)
            raise failure
        if not answer.records:
            self._remember(key, None, _NEGATIVE_TTL)
            return None
        self._remember(key, answer.records, float(answer.ttl))
        return answer.records

    def _remember(self, key: tuple[str, str], value: object, ttl: float) -> None:
        ttl = min(max(ttl, _MIN_TTL), _MAX_TTL)
        if len(self._cache) > 100_000:
            self._cache.clear()  # a crude bound; a node that sees more domains than this re-resolves
        self._cache[key] = _Cached(self._clock() + ttl, value)
