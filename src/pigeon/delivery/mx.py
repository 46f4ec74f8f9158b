"""MX and address resolution, with a cache that honours the records' TTLs.

RFC 5321 5.1 and RFC 7505:

* MX records, lowest preference first; equal preferences in random order (per lookup, and
  again per connection: `routes.connection_order`);
* no MX record: the domain itself is the one exchanger (implicit MX), if it has addresses;
* a null MX (`0 .`): the domain accepts no mail, a permanent failure;
* NXDOMAIN: a permanent failure; a timeout or SERVFAIL: a transient one.

Each nameserver is asked in turn (`Resolver._ask`): one that does not answer within its share
of the lookup's timeout, or fails the query (SERVFAIL, REFUSED), has the next one asked; an
answer (NXDOMAIN too) ends the lookup, as with libc and dnspython.

Answers are cached for their TTL, negative ones (NXDOMAIN, no record of the type) for the
negative TTL of the SOA record in their authority section (RFC 2308 5: the lesser of its TTL
and MINIMUM field; 60 seconds when there is none), all bounded below and above (5 seconds, an
hour), so lookups happen per domain per TTL, not per message. Questions go over UDP with
EDNS0 offering 1232-octet answers (without EDNS to a server that answers FORMERR to it); a
truncated answer is asked again over TCP at once. Tests point the resolver at a DNS
server of their own on loopback: Pigeon never needs the system resolver to be sane.

With `dnssec` (`[dane] enabled`), every question carries the DO bit, and each answer is
remembered with whether the nameserver set the AD bit (validated it): what DANE (RFC 7672)
asks of the MX, address and TLSA records (`exchangers_secure`, `addresses_secure`, `tlsa`).
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
import dns.flags
import dns.message
import dns.nameserver
import dns.rcode
import dns.rdatatype
import dns.resolver

from pigeon.delivery import dnswire
from pigeon.queue.attempt import Unroutable
from pigeon.smtp.replies import Reply

_MIN_TTL: Final = 5.0
_MAX_TTL: Final = 3600.0
_NEGATIVE_TTL: Final = 60.0  # a negative answer without an SOA record to say how long (RFC 2308 5)
_PAYLOAD: Final = 1232  # the UDP answer size EDNS0 offers: the DNS flag day 2020's
_FAILURE_TTL: Final = 10.0  # a transient failure is remembered briefly, to not hammer a broken server
_SLOW_FOR: Final = 60.0  # a nameserver that did not answer in time is asked last for this long


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


@dataclass(frozen=True, slots=True)
class ResolvConfOptions:
    """What libc takes from resolv.conf's `options` for how long to wait: `timeout` seconds a
    try (RES_TIMEOUT 5, at most RES_MAXRETRANS 30), `attempts` rounds of the servers (RES_DFLRETRY
    2, at most RES_MAXRETRY 5). (`rotate` dnspython reads.)"""

    timeout: float = 5.0
    attempts: int = 2


def _resolv_conf_options(path: str) -> ResolvConfOptions:
    """resolv.conf's `timeout:` and `attempts:` options (the last of each wins, as in libc);
    the defaults for a file that cannot be read or says nothing of them."""
    timeout, attempts = 5.0, 2
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        return ResolvConfOptions()
    for line in lines:
        words = line.split()
        if not words or words[0] != "options":
            continue
        for option in words[1:]:
            name, _, value = option.partition(":")
            if name not in ("timeout", "attempts") or not value.isdigit():
                continue
            if name == "timeout":
                timeout = float(min(max(int(value), 1), 30))
            else:
                attempts = min(max(int(value), 1), 5)
    return ResolvConfOptions(timeout, attempts)


def _negative_ttl(response: Any) -> float | None:
    """RFC 2308 5: how long a negative answer (a dnspython message) may be cached, the lesser
    of the TTL of the SOA record in its authority section and that record's MINIMUM field;
    None without one."""
    for rrset in response.authority:
        if rrset.rdtype == dns.rdatatype.SOA and len(rrset):
            return float(min(rrset.ttl, rrset[0].minimum))
    return None


def _every_server_said(errors: list[Any]) -> str:
    """What the name servers said when none gave an answer (dnspython's NoNameservers), in
    plain words: "SERVFAIL from every name server"."""
    said: list[str] = []
    for error in errors:
        what = error[3] if len(error) > 3 else None
        if isinstance(what, str):
            text = what  # an rcode: SERVFAIL, REFUSED...
        elif isinstance(what, dns.message.Truncated):
            text = "a truncated answer"
        elif isinstance(what, (dns.exception.FormError, EOFError)):
            text = "a malformed answer"
        elif isinstance(what, OSError):
            text = what.strerror or "a network error"
        else:
            text = str(what) or "no usable answer"
        if text not in said:
            said.append(text)
    if not said:
        return "no usable answer from any name server"
    return f"{said[0]} from every name server" if len(said) == 1 else ", ".join(said) + " from the name servers"


_ADDRESS_ORDER: Final = random.Random()


def address_order(addresses: list[str], rng: random.Random = _ADDRESS_ORDER) -> list[str]:
    """A host's `addresses` (IPv4 then IPv6, as `Resolver.addresses` gives them) in the order
    to try them for one connection: each family's in a random order, IPv4 first still (as
    Postfix's `smtp_randomize_addresses`), so that a host's load is spread over its addresses
    rather than always falling on the first its DNS names."""
    if len(addresses) < 2:
        return addresses
    four = [a for a in addresses if ":" not in a]
    six = [a for a in addresses if ":" in a]
    rng.shuffle(four)
    rng.shuffle(six)
    return four + six


class DnsFailure(Unroutable):
    """A lookup failed. `reply` says how, `permanent` whether retrying can help. To the queue
    it is a destination that cannot be resolved (the router adds the bounce class). `secure`:
    an NXDOMAIN the nameserver validated (asked with DO: a secure denial of existence, which
    DANE tells from an insecure one: RFC 7672 2.2.2). `not_found`: the DNS answered, and the
    answer is that there is nothing (NXDOMAIN; for `addresses`, a host with neither A nor AAAA
    records), as opposed to a lookup that failed (a timeout, SERVFAIL): whatever its code, an
    MX host so is one that no retry reaches while the records say so (`ClientConnection.open`)."""

    secure: bool = False
    not_found: bool = False

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
    secure: bool = False  # the answer had the AD bit (asked with DO: `dnssec`)
    canonical: str | None = None  # the end of the CNAME chain the answer followed, if it followed one


Tlsa = tuple[int, int, int, bytes]
"""A TLSA record as the resolver gives it: (usage, selector, matching type, data)."""

_Found = tuple[list[Any] | None, bool]  # a lookup's records (None: NODATA), and whether they are secure


class Resolver:
    """Async MX/A/AAAA/TXT lookups (the plain cases by `dnswire`, the rest by dnspython), cached by TTL."""

    def __init__(
        self,
        nameservers: list[tuple[str, int]] | None = None,
        *,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        resolv_conf: str = "/etc/resolv.conf",
        dnssec: bool = False,
    ) -> None:
        # `timeout` bounds a whole lookup, every server asked (dnspython's lifetime). Each try
        # has a share of it, so that a server that does not answer leaves time for the next.
        # Servers of our own (`[dns] nameservers`): one round, each server `timeout / n`, the
        # last what is left.
        # resolv.conf's: libc's `timeout:` (default 5 s, at most 30) and `attempts:` (default 2,
        # at most 5) rounds, each try also at most `timeout / n`; and its `rotate`.
        attempts = 1
        try_timeout = timeout
        self._rest_to_last = bool(nameservers)
        if nameservers:
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = [dns.nameserver.Do53Nameserver(host, port) for host, port in nameservers]
        else:
            self._resolver = dns.asyncresolver.Resolver(resolv_conf)
            options = _resolv_conf_options(resolv_conf)
            try_timeout, attempts = options.timeout, options.attempts
        count = max(len(self._resolver.nameservers), 1)
        self._try_timeout = min(try_timeout, timeout / count)
        self._attempts = attempts
        self._resolver.lifetime = timeout
        self._resolver.timeout = self._try_timeout
        self._timeout = timeout
        # DO asks a validating resolver to say (AD) whether it validated the answer (RFC 3225,
        # 4035 3.2.3): DANE's question. Without it no answer is taken as secure, AD or not.
        self._dnssec = dnssec
        self._resolver.use_edns(0, dns.flags.DO if dnssec else 0, _PAYLOAD)
        # The nameservers, asked directly for the plain cases (`dnswire`); dnspython asks for
        # the rest, and for every case when one is not an address on port 53 (DoH...).
        servers: list[tuple[str, int]] = []
        for server in self._resolver.nameservers:
            if isinstance(server, str) and _is_address(server):
                servers.append((server, self._resolver.port))
            elif isinstance(server, dns.nameserver.Do53Nameserver) and _is_address(server.address):
                servers.append((server.address, server.port))
            else:
                servers = []
                break
        self._servers = servers
        self._rotate = bool(self._resolver.rotate)
        # server -> until when it is asked last: it did not answer in time lately (as libc and
        # unbound put a server that times out aside), so a dead first server does not cost
        # every lookup its share of the timeout.
        self._slow: dict[tuple[str, int], float] = {}
        self._cache: dict[tuple[str, str], _Cached] = {}
        self._asking: dict[tuple[str, str], asyncio.Future[_Found]] = {}
        self._clock = clock
        self._rng = rng or random.Random()

    async def exchangers(self, domain: str) -> list[Exchanger]:
        """The hosts that take mail for `domain`, in the order to try them."""
        return (await self.exchangers_for(domain))[0]

    async def exchangers_for(self, domain: str) -> tuple[list[Exchanger], float]:
        """`exchangers`, and for how many more seconds the records they come from are fresh
        (their TTL, as cached: see `_remember`)."""
        exchangers, fresh, _ = await self.exchangers_secure(domain)
        return exchangers, fresh

    async def exchangers_secure(self, domain: str) -> tuple[list[Exchanger], float, bool]:
        """`exchangers_for`, and whether the MX records (or their secure absence, for the domain
        itself as its exchanger) were validated by the nameserver (RFC 7672 2.2.1)."""
        domain = domain.lower().rstrip(".")
        if _is_localhost(domain):
            return [Exchanger(0, domain)], _MAX_TTL, False  # no MX for it (RFC 6761 6.3): itself, on loopback
        records, secure = await self._lookup_secure(domain, "MX")
        fresh = self._fresh((domain, "MX"))
        if records is None:  # no MX: the domain itself, if it has an address (RFC 5321 5.1)
            for kind in ("A", "AAAA"):
                if await self._lookup(domain, kind) is not None:
                    return [Exchanger(0, domain)], min(fresh, self._fresh((domain, kind))), secure
            raise DnsFailure(Reply(550, "5.1.2", (f"{domain} has no MX and no address record",)))
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
        return exchangers, fresh, secure

    def _fresh(self, key: tuple[str, str]) -> float:
        cached = self._cache.get(key)
        return max(cached.expires - self._clock(), 0.0) if cached is not None else 0.0

    async def addresses(self, host: str) -> list[str]:
        """IPv4 then IPv6 addresses of `host`."""
        return (await self.addresses_secure(host))[0]

    async def addresses_secure(self, host: str) -> tuple[list[str], bool]:
        """`addresses`, and whether every lookup that gave an answer (A, AAAA: records or none)
        was validated: a host whose addresses may be forged has no TLSA records worth looking
        up (RFC 7672 2.2.2). (A lookup that failed gave no address to connect to.)"""
        host = host.lower().rstrip(".")
        if _is_localhost(host):
            return list(_LOOPBACK), False
        found: list[str] = []
        failed: DnsFailure | None = None  # a lookup that failed (a timeout, SERVFAIL)
        missing: DnsFailure | None = None  # an answer that the name does not exist (NXDOMAIN)
        secure = True
        for kind in ("A", "AAAA"):
            try:
                records, validated = await self._lookup_secure(host, kind)
            except DnsFailure as error:
                if error.not_found:
                    missing = error
                else:
                    failed = error
                continue
            secure = secure and validated
            found += [str(r) for r in records or ()]
        if not found:
            # A lookup that failed wins: the other's "nothing" may not be the whole truth (an A
            # lookup timed out, the AAAA one said NXDOMAIN), and the host may yet be reached.
            if failed is not None:
                raise failed
            if missing is not None:
                raise missing
            nothing = DnsFailure(Reply(450, "4.4.4", (f"{host} has no address record",)))
            nothing.not_found = True
            raise nothing
        return found, secure

    async def addresses_canonical(self, host: str) -> tuple[list[str], bool, str]:
        """`addresses_secure`, and the name the addresses are of: the end of the CNAME chain
        the answers followed (RFC 7672 2.2.2's "expanded name"), `host` itself when there was
        none. (Only worth anything when secure: the AD bit covers the whole answer, chain and all.)"""
        host = host.lower().rstrip(".")
        found, secure = await self.addresses_secure(host)
        for kind in ("A", "AAAA"):
            cached = self._cache.get((host, kind))
            if cached is not None and cached.canonical is not None:
                return found, secure, cached.canonical
        return found, secure, host

    async def tlsa(self, name: str) -> tuple[list[Tlsa] | None, bool]:
        """The TLSA records of `name` ("_25._tcp.mx.example.net"), None when it has none, and
        whether the answer was validated. Raises `DnsFailure`: NXDOMAIN (permanent: no records;
        its `secure` whether validated) or a failure (SERVFAIL, a timeout: with a validating
        resolver, possibly a bogus answer)."""
        records, secure = await self._lookup_secure(name.lower().rstrip("."), "TLSA")
        return (None if records is None else [cast(Tlsa, r) for r in records]), secure

    async def texts(self, name: str) -> list[str] | None:
        """The TXT records of `name`, each one text (its strings joined); None when the name
        exists but has none. Raises `DnsFailure`: NXDOMAIN (permanent) or a failure."""
        records = await self._lookup(name.lower().rstrip("."), "TXT")
        return None if records is None else [str(r) for r in records]

    async def _lookup(self, name: str, kind: str) -> list[Any] | None:
        """Cached records of one type: None when the name exists but has none. A question
        already on its way is not asked again: when a retry or a resume makes thousands of
        messages for one domain due at once, they all wait for the one answer."""
        return (await self._lookup_secure(name, kind))[0]

    async def _lookup_secure(self, name: str, kind: str) -> _Found:
        """`_lookup`, and whether the answer was validated (see `dnssec`)."""
        key = (name, kind)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached.expires > now:
            if isinstance(cached.value, DnsFailure):
                raise cached.value
            return cast(list[Any] | None, cached.value), cached.secure
        asking = self._asking.get(key)
        if asking is None:
            asking = self._asking[key] = asyncio.ensure_future(self._resolve(name, kind))
            asking.add_done_callback(lambda done: self._answered(key, done))
        # Shielded: one waiter cancelled (its delivery stopped) cancels no one else's answer.
        return await asyncio.shield(asking)

    def _answered(self, key: tuple[str, str], done: asyncio.Future[_Found]) -> None:
        if self._asking.get(key) is done:
            del self._asking[key]
        if not done.cancelled():
            done.exception()  # (seen: every waiter may have gone)

    async def _resolve(self, name: str, kind: str) -> _Found:
        """`_lookup`'s question, asked: the answer is cached (a failure too, for a while)."""
        key = (name, kind)
        tcp = False
        if self._servers:
            try:
                plain = await self._ask(name, kind)
            except TimeoutError:
                raise self._failed(key, f"timed out after {self._timeout:g}s") from None
            if plain is not None and plain.truncated:
                tcp = True  # (the answer does not fit in a datagram: asking over UDP again is no use)
            elif plain is not None:
                return self._plain(key, plain)
        try:
            answer = await self._dnspython_resolve(name, kind, tcp)
        except dns.resolver.NXDOMAIN as error:
            failure = DnsFailure(Reply(550, "5.1.2", (f"domain {name} does not exist (NXDOMAIN)",)))
            failure.not_found = True
            responses = list(cast(dict[Any, Any], error.responses()).values())  # type: ignore[no-untyped-call]
            failure.secure = self._dnssec and any(bool(r.flags & dns.flags.AD) for r in responses)
            ttls = [ttl for ttl in map(_negative_ttl, responses) if ttl is not None]
            self._remember(key, failure, min(ttls) if ttls else _NEGATIVE_TTL)
            raise failure from None
        except (dns.exception.Timeout, dns.resolver.LifetimeTimeout):
            raise self._failed(key, f"timed out after {self._timeout:g}s") from None
        except dns.resolver.NoNameservers as error:
            raise self._failed(key, _every_server_said(error.kwargs.get("errors") or [])) from None
        except dns.exception.DNSException as error:
            raise self._failed(key, str(error)) from None
        rrset = answer.rrset
        secure = self._dnssec and bool(answer.response.flags & dns.flags.AD)
        canonical = answer.canonical_name.to_text(omit_final_dot=True).lower()
        expanded = canonical if canonical != name else None  # (a CNAME chain was followed: DANE's question)
        if rrset is None:
            negative = _negative_ttl(answer.response)
            self._remember(key, None, _NEGATIVE_TTL if negative is None else negative, secure, expanded)
            return None, secure
        if kind == "MX":
            value: list[Any] = [(r.preference, r.exchange.to_text(omit_final_dot=True).lower()) for r in rrset]
        elif kind == "TXT":
            value = [b"".join(r.strings).decode("utf-8", "replace") for r in rrset]
        elif kind == "TLSA":
            value = [(r.usage, r.selector, r.mtype, bytes(r.cert)) for r in rrset]
        else:
            value = [r.address for r in rrset]
        self._remember(key, value, float(rrset.ttl), secure, expanded)
        return value, secure

    def _failed(self, key: tuple[str, str], why: str) -> DnsFailure:
        """A lookup that failed for now (a timeout, SERVFAIL), remembered briefly."""
        name, kind = key
        failure = DnsFailure(Reply(451, "4.4.3", (f"DNS lookup of {kind} {name} failed: {why}",)))
        self._remember(key, failure, _FAILURE_TTL)
        return failure

    async def _dnspython_resolve(self, name: str, kind: str, tcp: bool) -> dns.resolver.Answer:
        """dnspython's answer (over TCP from the start with `tcp`); asked again without EDNS when
        a server answered FORMERR, as one that knows no EDNS does (RFC 6891 7): dnspython
        itself only drops such a server."""
        try:
            return await self._dnspython().resolve(name, kind, tcp=tcp, raise_on_no_answer=False)
        except dns.resolver.NoNameservers as error:
            if not any(said == "FORMERR" for _, _, _, said, *_ in error.kwargs.get("errors") or []):
                raise
        return await self._dnspython(edns=False).resolve(name, kind, tcp=tcp, raise_on_no_answer=False)

    def _dnspython(self, *, edns: bool = True) -> dns.asyncresolver.Resolver:
        """dnspython, for what `dnswire` does not read: its servers in `_order`'s order when one
        timed out lately, lest it wait for that one first (a CNAME answer after a dead server);
        without `edns`, one that sends no OPT record."""
        if edns and (not self._slow or len(self._servers) < 2):
            return self._resolver
        ordered = dns.asyncresolver.Resolver(configure=False)
        if self._servers:
            ordered.nameservers = [dns.nameserver.Do53Nameserver(host, port) for host, port in self._order()]
        else:
            ordered.nameservers = self._resolver.nameservers
        ordered.timeout, ordered.lifetime = self._resolver.timeout, self._resolver.lifetime
        if edns:
            ordered.use_edns(self._resolver.edns, self._resolver.ednsflags, self._resolver.payload)
        else:
            ordered.use_edns(False)
        return ordered

    def _order(self) -> list[tuple[str, int]]:
        """The servers in the order to ask them: as listed (from a random one on, with
        resolv.conf's `rotate`), those that timed out lately last."""
        servers = self._servers
        if self._rotate and len(servers) > 1:
            start = self._rng.randrange(len(servers))
            servers = servers[start:] + servers[:start]
        if not self._slow:
            return servers
        now = self._clock()
        for server, until in list(self._slow.items()):
            if until <= now:
                del self._slow[server]
        return sorted(servers, key=lambda server: server in self._slow)  # (a stable sort)

    async def _ask(self, name: str, kind: str) -> dnswire.Answer | None:
        """The answer of the first server that gives one, by `dnswire`, within the lookup's
        `timeout`; None: a case for dnspython. A server that does not answer within its try's
        time, or fails the query (SERVFAIL, REFUSED...), has the next one asked, as libc and
        dnspython do; one that fails it is not asked again for this question (only: a SERVFAIL
        is about one name, a lame delegation or broken DNSSEC, not the server). NXDOMAIN is an
        answer: no other server is asked. When a server failed the query and no other answered,
        the last failure is the answer; when none answered at all in time, TimeoutError."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        servers = list(self._order())  # (a copy: `_order` may give `self._servers` itself)
        failed: dnswire.Answer | None = None
        for round_ in range(self._attempts):
            for server in list(servers):
                left = deadline - loop.time()
                if left <= 0:
                    if failed is not None:
                        return failed
                    raise TimeoutError
                last = round_ == self._attempts - 1 and server is servers[-1]
                try:
                    # The last server of our own has what is left (its elders may have failed
                    # at once); resolv.conf's servers have no more than its `timeout:`.
                    async with asyncio.timeout(left if last and self._rest_to_last else min(self._try_timeout, left)):
                        answer = await dnswire.ask(server, name, kind, dnssec=self._dnssec)
                except TimeoutError:
                    self._slow[server] = self._clock() + _SLOW_FOR
                    continue
                self._slow.pop(server, None)
                if answer is None or answer.rcode in (dnswire.NOERROR, dnswire.NXDOMAIN):
                    return answer
                failed = answer
                servers.remove(server)
            if not servers:
                return failed
        if failed is not None:
            return failed
        raise TimeoutError

    def _plain(self, key: tuple[str, str], answer: dnswire.Answer) -> _Found:
        """What `_lookup` makes of an answer read by `dnswire`, as of dnspython's."""
        name = key[0]
        negative = _NEGATIVE_TTL if answer.negative_ttl is None else float(answer.negative_ttl)
        if answer.rcode not in (dnswire.NOERROR, dnswire.NXDOMAIN):
            said = dns.rcode.to_text(dns.rcode.Rcode.make(answer.rcode))
            raise self._failed(key, f"{said} from every name server")
        if answer.rcode == dnswire.NXDOMAIN:
            failure = DnsFailure(Reply(550, "5.1.2", (f"domain {name} does not exist (NXDOMAIN)",)))
            failure.not_found = True
            failure.secure = self._dnssec and answer.secure
            self._remember(key, failure, negative)
            raise failure
        secure = self._dnssec and answer.secure
        if not answer.records:
            self._remember(key, None, negative, secure)
            return None, secure
        self._remember(key, answer.records, float(answer.ttl), secure)
        return answer.records, secure

    def _remember(
        self, key: tuple[str, str], value: object, ttl: float, secure: bool = False, canonical: str | None = None
    ) -> None:
        ttl = min(max(ttl, _MIN_TTL), _MAX_TTL)
        if len(self._cache) > 100_000:
            self._cache.clear()  # a crude bound; a node that sees more domains than this re-resolves
        self._cache[key] = _Cached(self._clock() + ttl, value, secure, canonical)
