"""A DNS server on loopback with a zone of the test's own (dnslib): tests never ask the system resolver."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from dnslib import AAAA, CNAME, MX, QTYPE, RCODE, RR, SOA, TLSA, TXT, A, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer


@dataclass
class Zone:
    """name -> records: ("MX", preference, host) | ("A", ip) | ("AAAA", ip) | ("TXT", text) |
    ("TLSA", usage, selector, matching type, data) | ("CNAME", target); names without a trailing
    dot. A TXT text longer than 255 bytes goes as several strings. A name with a CNAME is
    answered as a recursive resolver does: the CNAME, then the target's answer (its records,
    NXDOMAIN). Answers for names at or under one of `secure` (every name of a CNAME chain)
    have the AD bit when the question has DO (as a validating resolver's, RFC 4035)."""

    records: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    servfail: set[str] = field(default_factory=set)
    secure: set[str] = field(default_factory=set)
    ttl: int = 60
    queries: list[tuple[str, str]] = field(default_factory=list)
    delays: dict[str, tuple[float, float]] = field(default_factory=dict)
    """name -> (least, most) seconds to wait before answering, at random (each query in its thread)."""
    seed: int = 0
    negative_ttl: int | None = None
    """With it, a negative answer (NXDOMAIN, or no record of the type asked) carries an SOA record
    (of the name's top-level domain) whose MINIMUM it is, its TTL `ttl` (RFC 2308 3)."""


class _Resolver(BaseResolver):  # type: ignore[misc]
    def __init__(self, zone: Zone) -> None:
        self.zone = zone
        self._random = random.Random(zone.seed)

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        kind = QTYPE[request.q.qtype]
        self.zone.queries.append((name, kind))
        delay = self.zone.delays.get(name)
        if delay is not None:
            time.sleep(self._random.uniform(*delay))
        if name in self.zone.servfail:
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        do = any(rr.rtype == QTYPE.OPT and rr.ttl & 0x8000 for rr in request.ar)
        chain = [name]
        records = self.zone.records.get(name)
        while records and records[0][0] == "CNAME" and kind != "CNAME" and len(chain) < 8:
            target = records[0][1]
            reply.add_answer(RR(name + ".", QTYPE.CNAME, rdata=CNAME(target + "."), ttl=self.zone.ttl))
            name = target
            chain.append(name)
            records = self.zone.records.get(name)
        secure = (any(n == zone or n.endswith("." + zone) for zone in self.zone.secure) for n in chain)
        if do and all(secure):
            reply.header.ad = 1
        if records is None:
            reply.header.rcode = RCODE.NXDOMAIN
            self._negative(reply, name)
            return reply
        for record in records:
            if record[0] != kind:
                continue
            if kind == "MX":
                rdata: Any = MX(record[2] + "." if record[2] != "." else ".", record[1])
            elif kind == "A":
                rdata = A(record[1])
            elif kind == "TXT":
                text = record[1].encode()
                rdata = TXT([text[i : i + 255] for i in range(0, len(text), 255)])
            elif kind == "TLSA":
                rdata = TLSA(*record[1:])
            elif kind == "CNAME":
                rdata = CNAME(record[1] + ".")
            else:
                rdata = AAAA(record[1])
            reply.add_answer(RR(name + ".", QTYPE.reverse[kind], rdata=rdata, ttl=self.zone.ttl))
        if not reply.rr:
            self._negative(reply, name)
        return reply

    def _negative(self, reply: DNSRecord, name: str) -> None:
        minimum = self.zone.negative_ttl
        if minimum is not None:
            top = name.rsplit(".", 1)[-1] + "."
            soa = SOA("ns." + top, "hostmaster." + top, (1, 3600, 600, 86400, minimum))
            reply.add_auth(RR(top, QTYPE.SOA, rdata=soa, ttl=self.zone.ttl))


class DnsServer:
    def __init__(self, zone: Zone, *, address: str = "127.0.0.1", port: int = 0) -> None:
        """`port` 53 on an `address` of its own serves resolvers that cannot be told a port
        (a resolv.conf, in a mount namespace of the test's; see `tests.support.opendkim`)."""
        self.zone = zone
        self.address = address
        quiet = DNSLogger(logf=lambda _: None)
        # Port 0: the server's own socket gets the kernel's pick, so no other process can be
        # handed the same port before it binds.
        self._server = DNSServer(_Resolver(zone), port=port, address=address, logger=quiet)
        self.port: int = self._server.server.server_address[1]
        self._server.start_thread()

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> DnsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
