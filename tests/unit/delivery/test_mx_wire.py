"""What the resolver puts on the wire and how long it keeps what comes back, against a DNS
server of the test's own on loopback (dnslib, UDP and TCP on one port): negative answers
cached for their SOA's negative TTL (RFC 2308), EDNS0 (RFC 6891) and a server that knows
none, a truncated answer asked again over TCP, and failures said in plain words."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from dnslib import CNAME, QTYPE, RCODE, RR, SOA, A, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from pigeon.delivery.mx import DnsFailure, Resolver
from tests.unit.delivery.test_mx_routes import Clock


@dataclass
class Asked:
    """One question the server got: over which protocol, of what, and the EDNS0 payload size
    it offered (None: no OPT record)."""

    protocol: str
    name: str
    kind: str
    payload: int | None


@dataclass
class Script(BaseResolver):  # type: ignore[misc]
    """The answers, by name (see `resolve`); `formerr_to_edns`: a server from before RFC 6891."""

    formerr_to_edns: bool = False
    asked: list[Asked] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def questions(self, name: str) -> list[Asked]:
        with self.lock:
            return [a for a in self.asked if a.name == name]

    def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
        name = str(request.q.qname).rstrip(".").lower()
        kind = QTYPE[request.q.qtype]
        payload = next((rr.rclass for rr in request.ar if rr.rtype == QTYPE.OPT), None)
        protocol = getattr(handler, "protocol", "udp")
        with self.lock:
            self.asked.append(Asked(protocol, name, kind, payload))
        reply = request.reply()
        if self.formerr_to_edns and payload is not None:
            reply.header.rcode = RCODE.FORMERR
            return reply
        if name.startswith("alias-"):  # a CNAME to the rest of the name: dnspython's case
            target = name.removeprefix("alias-")
            reply.add_answer(RR(name + ".", QTYPE.CNAME, rdata=CNAME(target + "."), ttl=300))
            name = target
        label = name.split(".")[0]
        if label.startswith(("nx", "nodata")):  # nx-soa5: NXDOMAIN, its SOA's MINIMUM 5; nx: none
            if label.startswith("nx"):
                reply.header.rcode = RCODE.NXDOMAIN
            if "-soa" in label:
                minimum = int(label.split("-soa")[1])
                soa = SOA("ns.example.", "hostmaster.example.", (1, 3600, 600, 86400, minimum))
                reply.add_auth(RR("example.", QTYPE.SOA, rdata=soa, ttl=max(minimum, 7200)))
            return reply
        if label == "servfail" or (label == "bigfail" and protocol == "tcp"):
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        if label.startswith("big") and protocol == "udp":
            reply.header.tc = 1  # (does not fit: ask over TCP)
            return reply
        if kind == "A":
            reply.add_answer(RR(name + ".", QTYPE.A, rdata=A("192.0.2.1"), ttl=300))
        return reply


@pytest.fixture
def script() -> Iterator[tuple[Script, tuple[str, int]]]:
    """A server answering as `Script` does, over UDP and TCP on one loopback port."""
    answers = Script()
    quiet = DNSLogger(logf=lambda _: None)
    for _ in range(20):
        udp = DNSServer(answers, address="127.0.0.1", port=0, logger=quiet)
        port = udp.server.server_address[1]
        try:
            tcp = DNSServer(answers, address="127.0.0.1", port=port, tcp=True, logger=quiet)
        except OSError:
            udp.server.server_close()
            continue
        break
    else:
        pytest.fail("no port free for both UDP and TCP")
    servers = (udp, tcp)
    threads = [
        threading.Thread(target=server.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        for server in servers
    ]
    for thread in threads:
        thread.start()
    yield answers, ("127.0.0.1", port)
    for server in servers:
        server.stop()
        server.server.server_close()
    for thread in threads:
        thread.join(timeout=5)


async def _kept(resolver: Resolver, clock: Clock, answers: Script, name: str, kind: str = "A") -> float:
    """For how many seconds (to the second) the resolver keeps its answer of `kind` for `name`:
    asked once a second until it asks the server again."""
    start = clock.now
    asked = -1  # (a CNAME chain is asked twice at first: `dnswire` leaves it to dnspython)
    for _ in range(4000):
        try:
            await resolver.addresses(name)
        except DnsFailure:
            pass
        now = len([a for a in answers.questions(name) if a.kind == kind])
        if asked < 0:
            asked = now
        elif now > asked:
            return clock.now - start
        clock.now += 1
    raise AssertionError(f"{name} never asked again")


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("nx-soa20.example", 20),  # NXDOMAIN: the SOA's MINIMUM (its TTL being longer)
        ("nodata-soa20.example", 20),  # no record of the type (NODATA): the same (RFC 2308 5)
        ("nx-soa1.example", 5),  # no less than the README's 5 seconds
        ("nx-soa86400.example", 3600),  # nor more than an hour
        ("nx.example", 60),  # no SOA to say: a minute
        ("alias-nx-soa20.example", 20),  # read by dnspython (a CNAME chain to an NXDOMAIN)
        ("alias-nodata-soa20.example", 20),
    ],
)
async def test_a_negative_answer_is_cached_for_its_soa_s_negative_ttl(
    script: tuple[Script, tuple[str, int]], name: str, kept: float
) -> None:
    answers, server = script
    clock = Clock()
    resolver = Resolver([server], timeout=2.0, clock=clock)
    assert await _kept(resolver, clock, answers, name) == kept


async def test_a_domain_created_after_its_nxdomain_gets_mail_once_the_soa_s_negative_ttl_is_past(
    script: tuple[Script, tuple[str, int]],
) -> None:
    answers, server = script
    clock = Clock()
    resolver = Resolver([server], timeout=2.0, clock=clock)
    with pytest.raises(DnsFailure) as raised:
        await resolver.exchangers("nx-soa5.example")
    assert raised.value.reply.code == 550
    clock.now += 6
    with pytest.raises(DnsFailure):
        await resolver.exchangers("nx-soa5.example")
    assert len([a for a in answers.questions("nx-soa5.example") if a.kind == "MX"]) == 2


@pytest.mark.parametrize("name", ["big.example", "alias-big.example"])
async def test_a_truncated_answer_is_asked_again_over_tcp_at_once(
    script: tuple[Script, tuple[str, int]], name: str
) -> None:
    answers, server = script
    resolver = Resolver([server], timeout=2.0)
    assert (await resolver.addresses(name))[0] == "192.0.2.1"
    asked = [(a.protocol, a.name) for a in answers.questions(name) if a.kind == "A"]
    assert asked == [("udp", name), ("tcp", name)]


@pytest.mark.parametrize("name", ["plain.example", "alias-plain.example"])
@pytest.mark.parametrize("dnssec", [False, True])
async def test_udp_questions_offer_edns0_answers_of_1232_octets(
    script: tuple[Script, tuple[str, int]], name: str, dnssec: bool
) -> None:
    answers, server = script
    resolver = Resolver([server], timeout=2.0, dnssec=dnssec)
    assert await resolver.addresses(name) == ["192.0.2.1"]
    assert {(a.protocol, a.payload) for a in answers.questions(name)} == {("udp", 1232)}


@pytest.mark.parametrize(
    ("name", "payloads"),
    [
        ("plain.example", [1232, None]),
        ("alias-plain.example", [1232, None, 1232, None]),  # `dnswire`'s, then dnspython's (a CNAME)
    ],
)
async def test_a_server_that_answers_formerr_to_edns_is_asked_without_it(
    script: tuple[Script, tuple[str, int]], name: str, payloads: list[int | None]
) -> None:
    answers, server = script
    answers.formerr_to_edns = True
    resolver = Resolver([server], timeout=2.0)
    assert await resolver.addresses(name) == ["192.0.2.1"]
    assert [a.payload for a in answers.questions(name) if a.kind == "A"] == payloads


async def test_a_lookup_that_times_out_says_so_in_plain_words() -> None:
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        resolver = Resolver([silent.getsockname()], timeout=0.3)
        with pytest.raises(DnsFailure) as raised:
            await resolver.exchangers("timeout.example")
    finally:
        silent.close()
    assert raised.value.reply.code == 451
    assert raised.value.reply.lines[0] == "DNS lookup of MX timeout.example failed: timed out after 0.3s"


@pytest.mark.parametrize("name", ["servfail.example", "bigfail.example"])  # (the latter: dnspython's, over TCP)
async def test_a_servfail_from_every_name_server_says_so_in_plain_words(
    script: tuple[Script, tuple[str, int]], name: str
) -> None:
    _, server = script
    with pytest.raises(DnsFailure) as raised:
        await Resolver([server, server], timeout=2.0).exchangers(name)
    assert raised.value.reply.code == 451
    assert raised.value.reply.lines[0] == f"DNS lookup of MX {name} failed: SERVFAIL from every name server"
