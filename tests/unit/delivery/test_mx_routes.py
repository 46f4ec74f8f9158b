"""MX resolution and routing against a DNS server of our own on loopback (dnslib).

The resolver is always pointed at that server: these tests never ask the system resolver,
and the server counts every query it gets, so caching and "no DNS at all" are observable.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dnslib import AAAA, CNAME, MX, QTYPE, RCODE, RR, TXT, A, DNSRecord
from dnslib.dns import DNSError
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from pigeon.delivery import dnswire
from pigeon.delivery.mx import DnsFailure, Exchanger, ResolvConfOptions, Resolver, _resolv_conf_options
from pigeon.delivery.routes import Destination, Hop, Route, Router, TlsPolicy

TTL = 300
TIMEOUT = 0.5

# name -> records (kind, data...). A name listed with no record of a kind answers NODATA for it.
ZONE: dict[str, list[tuple[str, ...]]] = {
    "mx.example": [
        ("MX", "20", "backup.mx.example.net"),
        ("MX", "10", "a.mx.example.net"),
        ("MX", "10", "B.MX.example.net"),
    ],
    "shared.example": [
        ("MX", "5", "b.mx.example.net"),
        ("MX", "5", "backup.mx.example.net"),
        ("MX", "1", "a.mx.example.net"),
    ],
    "single.example": [("MX", "10", "mail.single.example")],
    "nullmx.example": [("MX", "0", ".")],
    "ipmx.example": [("MX", "10", "192.0.2.12")],
    "halfipmx.example": [("MX", "5", "192.0.2.13"), ("MX", "10", "mail.single.example")],
    "amx.example": [("A", "192.0.2.10")],
    "v6only.example": [("AAAA", "2001:db8::10")],
    "nothing.example": [("TXT", "v=spf1 -all")],
    "host.example": [("AAAA", "2001:db8::1"), ("A", "192.0.2.1"), ("A", "192.0.2.2")],
    "short-ttl.example": [("MX", "10", "mx.short-ttl.example")],
    "tiny-ttl.example": [("MX", "10", "mx.tiny-ttl.example")],
    "flaky-v6.example": [("A", "192.0.2.7")],
    "alias.example": [("CNAME", "host.example")],  # answered with the chain and host.example's records
    "Mixed-Case.example": [("MX", "10", "Mail.Mixed-Case.example")],
    "dup.example": [("A", "192.0.2.20"), ("A", "192.0.2.20"), ("A", "192.0.2.21")],
}
SERVFAIL = {("servfail.example", kind) for kind in ("MX", "A", "AAAA")} | {("flaky-v6.example", "AAAA")}
SERVFAIL |= {("gone-v6.example", "A")}  # (not in ZONE: its AAAA lookup says NXDOMAIN)
SILENT = {"silent.example"}  # the server never answers: the resolver times out


@dataclass
class FakeDns:
    """What the test's DNS server was asked, and how to reach it."""

    port: int
    queries: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def nameservers(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", self.port)]

    def asked(self, name: str | None = None, kind: str | None = None) -> list[tuple[str, str]]:
        with self.lock:
            return [q for q in self.queries if (name is None or q[0] == name) and (kind is None or q[1] == kind)]


class ZoneResolver(BaseResolver):  # type: ignore[misc]
    def __init__(self, record: FakeDns) -> None:
        self.record = record

    def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
        name = str(request.q.qname).rstrip(".").lower()
        kind = QTYPE[request.q.qtype]
        with self.record.lock:
            self.record.queries.append((name, kind))
        if name in SILENT:
            raise DNSError("no answer, on purpose")  # the handler logs it and sends nothing
        reply = request.reply()
        if (name, kind) in SERVFAIL:
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        records = next((r for n, r in ZONE.items() if n.lower() == name), None)
        if records is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        ttl = 10 if name.startswith("short-ttl") else 1 if name.startswith("tiny-ttl") else TTL
        owner = name
        if records and records[0][0] == "CNAME":
            reply.add_answer(RR(name + ".", QTYPE.CNAME, rdata=CNAME(records[0][1] + "."), ttl=ttl))
            owner = records[0][1]
            records = ZONE[owner]
        for record in records:
            if record[0] != kind:
                continue
            if kind == "MX":
                exchange = "." if record[2] == "." else record[2] + "."
                rdata: object = MX(exchange, int(record[1]))
            elif kind == "A":
                rdata = A(record[1])
            elif kind == "AAAA":
                rdata = AAAA(record[1])
            else:
                rdata = TXT(record[1])
            reply.add_answer(RR(owner + ".", getattr(QTYPE, kind), rdata=rdata, ttl=ttl))
        return reply


@pytest.fixture
def dns() -> Iterator[FakeDns]:
    record = FakeDns(port=0)
    server = DNSServer(ZoneResolver(record), address="127.0.0.1", port=0, logger=DNSLogger(logf=lambda _: None))
    record.port = server.server.server_address[1]
    # serve_forever polls for shutdown every poll_interval (0.5 s by default): keep stopping quick.
    thread = threading.Thread(target=server.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield record
    finally:
        server.stop()
        server.server.server_close()
        thread.join(timeout=5)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def resolver(dns: FakeDns, **options: object) -> Resolver:
    return Resolver(nameservers=dns.nameservers, timeout=TIMEOUT, **options)  # type: ignore[arg-type]


# --- Resolver: MX ------------------------------------------------------------------------------
async def test_mx_hosts_come_lowest_preference_first(dns: FakeDns) -> None:
    found = await resolver(dns).exchangers("mx.example")
    assert [e.preference for e in found] == [10, 10, 20]
    assert {e.host for e in found[:2]} == {"a.mx.example.net", "b.mx.example.net"}  # lower-cased, no final dot
    assert found[2] == Exchanger(20, "backup.mx.example.net")


async def test_equal_preferences_come_in_both_orders(dns: FakeDns) -> None:
    mx = resolver(dns, rng=random.Random(2024))
    orders = set()
    for _ in range(40):
        found = await mx.exchangers("mx.example")
        assert found[2].host == "backup.mx.example.net"  # the lower priority is always last
        orders.add((found[0].host, found[1].host))
    assert orders == {("a.mx.example.net", "b.mx.example.net"), ("b.mx.example.net", "a.mx.example.net")}
    assert len(dns.asked("mx.example", "MX")) == 1  # the order changes per lookup, not the query count


async def test_the_domain_is_looked_up_without_case_or_final_dot(dns: FakeDns) -> None:
    found = await resolver(dns).exchangers("Single.EXAMPLE.")
    assert found == [Exchanger(10, "mail.single.example")]
    assert dns.asked() == [("single.example", "MX")]


async def test_a_null_mx_is_a_permanent_failure(dns: FakeDns) -> None:
    with pytest.raises(DnsFailure) as raised:
        await resolver(dns).exchangers("nullmx.example")
    assert raised.value.permanent
    assert (raised.value.reply.code, raised.value.reply.enhanced) == (556, "5.1.10")


async def test_an_mx_naming_an_address_is_not_used(dns: FakeDns) -> None:
    # An MX names a host (RFC 5321 5.1); "10 192.0.2.12" is skipped, as Postfix and Exim do.
    assert await resolver(dns).exchangers("halfipmx.example") == [Exchanger(10, "mail.single.example")]
    with pytest.raises(DnsFailure) as raised:
        await resolver(dns).exchangers("ipmx.example")
    assert not raised.value.permanent
    assert (raised.value.reply.code, raised.value.reply.enhanced) == (451, "4.4.4")
    assert "names an address, not a host (192.0.2.12)" in raised.value.reply.text


async def test_nxdomain_is_a_permanent_failure(dns: FakeDns) -> None:
    with pytest.raises(DnsFailure) as raised:
        await resolver(dns).exchangers("nowhere.example")
    assert raised.value.permanent
    assert (raised.value.reply.code, raised.value.reply.enhanced) == (550, "5.1.2")
    assert "nowhere.example" in raised.value.reply.text


async def test_no_mx_but_an_address_means_the_domain_itself(dns: FakeDns) -> None:
    assert await resolver(dns).exchangers("amx.example") == [Exchanger(0, "amx.example")]
    assert await resolver(dns).exchangers("v6only.example") == [Exchanger(0, "v6only.example")]


async def test_no_mx_and_no_address_is_a_permanent_failure(dns: FakeDns) -> None:
    with pytest.raises(DnsFailure) as raised:
        await resolver(dns).exchangers("nothing.example")
    assert raised.value.permanent
    assert (raised.value.reply.code, raised.value.reply.enhanced) == (550, "5.1.2")


async def test_servfail_is_a_transient_failure(dns: FakeDns) -> None:
    with pytest.raises(DnsFailure) as raised:
        await resolver(dns).exchangers("servfail.example")
    assert not raised.value.permanent
    assert raised.value.reply.is_transient
    assert raised.value.reply.enhanced == "4.4.3"


async def test_a_server_that_never_answers_is_a_transient_failure(dns: FakeDns) -> None:
    with pytest.raises(DnsFailure) as raised:
        await resolver(dns).exchangers("silent.example")
    assert not raised.value.permanent
    assert raised.value.reply.code == 451
    assert dns.asked("silent.example", "MX")


# --- Resolver: several nameservers -----------------------------------------------------------------
class _RcodeResolver(BaseResolver):  # type: ignore[misc]
    """Answers every question with one rcode (SERVFAIL, REFUSED, NXDOMAIN), counting them."""

    def __init__(self, rcode: int, delay: float = 0.0) -> None:
        self.rcode = rcode
        self.delay = delay
        self.queries = 0

    def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
        self.queries += 1
        time.sleep(self.delay)
        reply = request.reply()
        reply.header.rcode = self.rcode
        if self.rcode == RCODE.NOERROR and request.q.qtype == QTYPE.A:
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A("192.0.2.99"), ttl=TTL))
        return reply


@pytest.fixture
def rcode_server() -> Iterator[Callable[..., tuple[tuple[str, int], _RcodeResolver]]]:
    servers: list[tuple[DNSServer, threading.Thread]] = []

    def start(rcode: int, delay: float = 0.0) -> tuple[tuple[str, int], _RcodeResolver]:
        answers = _RcodeResolver(rcode, delay)
        server = DNSServer(answers, address="127.0.0.1", port=0, logger=DNSLogger(logf=lambda _: None))
        thread = threading.Thread(target=server.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        thread.start()
        servers.append((server, thread))
        return ("127.0.0.1", server.server.server_address[1]), answers

    yield start
    for server, thread in servers:
        server.stop()
        server.server.server_close()
        thread.join(timeout=5)


class _Silent:
    """A nameserver that never answers: a UDP socket that nobody reads (until `asked`)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()
        self.queries = 0

    def asked(self) -> int:
        while True:
            try:
                self.sock.recv(65535)
            except BlockingIOError:
                return self.queries
            self.queries += 1


@pytest.fixture
def silent() -> Iterator[Callable[[], _Silent]]:
    made: list[_Silent] = []

    def make() -> _Silent:
        made.append(_Silent())
        return made[-1]

    yield make
    for server in made:
        server.sock.close()


async def test_a_first_nameserver_that_never_answers_has_the_next_asked(
    dns: FakeDns, silent: Callable[[], _Silent]
) -> None:
    """The lookup's timeout is shared by the servers: the first's half gone, the second answers."""
    dead = silent()
    mx = Resolver([dead.address, *dns.nameservers], timeout=1.0)
    started = time.monotonic()
    assert await mx.exchangers("single.example") == [Exchanger(10, "mail.single.example")]
    assert 0.4 < time.monotonic() - started < 0.9
    assert dead.asked() == 1
    assert dns.asked("single.example", "MX")


async def test_a_nameserver_that_timed_out_is_asked_last_for_a_while(
    dns: FakeDns, silent: Callable[[], _Silent]
) -> None:
    dead = silent()
    clock = Clock()
    mx = Resolver([dead.address, *dns.nameservers], timeout=1.0, clock=clock)
    await mx.exchangers("single.example")
    started = time.monotonic()
    assert await mx.addresses("host.example") == ["192.0.2.1", "192.0.2.2", "2001:db8::1"]
    assert time.monotonic() - started < 0.4  # no wait for the dead server
    assert dead.asked() == 1
    clock.now += 61  # then it has its turn first again
    await mx.exchangers("mx.example")
    assert dead.asked() == 2


async def test_dnspython_too_asks_a_nameserver_that_timed_out_last(dns: FakeDns, silent: Callable[[], _Silent]) -> None:
    """What `dnswire` does not read (a CNAME chain) goes to dnspython, in the same order."""
    dead = silent()
    mx = Resolver([dead.address, *dns.nameservers], timeout=1.0)
    await mx.exchangers("single.example")
    started = time.monotonic()
    assert await mx.addresses("alias.example") == ["192.0.2.1", "192.0.2.2", "2001:db8::1"]
    assert time.monotonic() - started < 0.4
    assert dead.asked() == 1


async def test_nameservers_that_never_answer_fail_the_lookup_within_its_timeout(
    silent: Callable[[], _Silent],
) -> None:
    first, second = silent(), silent()
    mx = Resolver([first.address, second.address], timeout=0.6)
    started = time.monotonic()
    with pytest.raises(DnsFailure) as raised:
        await mx.exchangers("single.example")
    assert 0.5 < time.monotonic() - started < 0.9
    assert raised.value.reply.code == 451
    assert raised.value.reply.lines[0] == "DNS lookup of MX single.example failed: timed out after 0.6s"
    assert (first.asked(), second.asked()) == (1, 1)


@pytest.mark.parametrize("rcode", [RCODE.SERVFAIL, RCODE.REFUSED])
async def test_a_first_nameserver_that_fails_the_query_has_the_next_asked_at_once(
    dns: FakeDns, rcode_server: Callable[..., tuple[tuple[str, int], _RcodeResolver]], rcode: int
) -> None:
    failing, answers = rcode_server(rcode)
    mx = Resolver([failing, *dns.nameservers], timeout=5.0)
    started = time.monotonic()
    assert await mx.exchangers("single.example") == [Exchanger(10, "mail.single.example")]
    assert time.monotonic() - started < 1.0
    assert answers.queries == 1
    assert len(dns.asked("single.example", "MX")) == 1


async def test_the_last_nameserver_has_what_is_left_of_the_timeout(
    rcode_server: Callable[..., tuple[tuple[str, int], _RcodeResolver]],
) -> None:
    """Its share is half the timeout; the first failing at once, it has nearly all of it."""
    failing, _ = rcode_server(RCODE.SERVFAIL)
    slow, _ = rcode_server(RCODE.NOERROR, 0.7)
    assert await Resolver([failing, slow], timeout=1.0).addresses("slow.example") == ["192.0.2.99"]


async def test_when_every_nameserver_fails_the_query_the_lookup_fails_transiently(
    rcode_server: Callable[..., tuple[tuple[str, int], _RcodeResolver]],
) -> None:
    (first, first_answers), (second, second_answers) = rcode_server(RCODE.SERVFAIL), rcode_server(RCODE.REFUSED)
    with pytest.raises(DnsFailure) as raised:
        await Resolver([first, second], timeout=5.0).exchangers("single.example")
    assert raised.value.reply.code == 451
    assert (first_answers.queries, second_answers.queries) == (1, 1)  # once each: no round again


async def test_a_servfail_for_one_domain_leaves_its_nameserver_asked_for_the_others(
    dns: FakeDns, silent: Callable[[], _Silent]
) -> None:
    """One broken domain (a lame delegation, bad DNSSEC) fails only its own lookups: the server
    that said SERVFAIL still answers for every other domain, not the dead one listed after it."""
    dead = silent()
    mx = Resolver([*dns.nameservers, dead.address], timeout=0.6)
    assert await mx.exchangers("single.example") == [Exchanger(10, "mail.single.example")]
    with pytest.raises(DnsFailure) as raised:
        await mx.exchangers("servfail.example")
    assert raised.value.reply.code == 451
    assert "timed out" not in raised.value.reply.lines[0]  # the server did answer: it failed the query
    started = time.monotonic()
    assert await mx.exchangers("mx.example") != []
    assert await mx.addresses("host.example") == ["192.0.2.1", "192.0.2.2", "2001:db8::1"]
    assert time.monotonic() - started < 0.3  # asked of the working server, first
    assert dns.asked("mx.example", "MX")


async def test_lookups_of_one_name_made_at_once_ask_the_nameserver_once(dns: FakeDns) -> None:
    """A retry or resume makes thousands of messages for one domain due at once: one question
    each for its MX and its hosts' addresses, whoever asks, and a waiter that is cancelled
    takes no one else's answer with it."""
    mx = resolver(dns)
    gone = asyncio.ensure_future(mx.exchangers("mx.example"))
    asking = [mx.exchangers("mx.example") for _ in range(50)]
    addresses = [mx.addresses("host.example") for _ in range(50)]
    await asyncio.sleep(0)
    gone.cancel()
    answers = await asyncio.gather(*asking, *addresses)
    assert answers[0] and all(set(answer) == set(answers[0]) for answer in answers[:50])  # (equal preferences shuffled)
    assert all(answer == ["192.0.2.1", "192.0.2.2", "2001:db8::1"] for answer in answers[50:])
    assert len(dns.asked("mx.example", "MX")) == 1
    assert (len(dns.asked("host.example", "A")), len(dns.asked("host.example", "AAAA"))) == (1, 1)
    with pytest.raises(DnsFailure):  # a failure, too, is everyone's
        await asyncio.gather(*(mx.exchangers("servfail.example") for _ in range(10)))
    assert len(dns.asked("servfail.example", "MX")) == 1


async def test_nxdomain_from_the_first_nameserver_is_the_answer(
    dns: FakeDns, rcode_server: Callable[..., tuple[tuple[str, int], _RcodeResolver]]
) -> None:
    """As libc and dnspython: a server that says the name does not exist is not second-guessed."""
    nowhere, answers = rcode_server(RCODE.NXDOMAIN)
    with pytest.raises(DnsFailure) as raised:
        await Resolver([nowhere, *dns.nameservers], timeout=5.0).exchangers("single.example")
    assert raised.value.permanent
    assert answers.queries == 1
    assert dns.asked() == []


def test_resolv_conf_timeout_and_attempts_are_read_as_libc_does(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 127.0.0.2\noptions timeout:3 attempts:4 rotate\noptions attempts:3\n")
    assert _resolv_conf_options(str(conf)) == ResolvConfOptions(3.0, 3)
    conf.write_text("nameserver 127.0.0.2\noptions timeout:99 attempts:9 ndots:2\n")
    assert _resolv_conf_options(str(conf)) == ResolvConfOptions(30.0, 5)  # libc's bounds
    conf.write_text("nameserver 127.0.0.2\n")
    assert _resolv_conf_options(str(conf)) == ResolvConfOptions(5.0, 2)  # libc's defaults
    assert _resolv_conf_options(str(tmp_path / "none")) == ResolvConfOptions(5.0, 2)


async def test_resolv_conf_s_nameservers_are_tried_in_rounds_of_its_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resolv.conf's servers (on port 53: no test server can be there) each get its `timeout:`
    at most, their share of the lookup's timeout at most, in `attempts:` rounds."""
    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 127.0.0.2\nnameserver 127.0.0.3\noptions timeout:1 attempts:3\n")
    asked: list[str] = []

    async def no_answer(server: tuple[str, int], name: str, kind: str, dnssec: bool = False) -> dnswire.Answer | None:
        asked.append(server[0])
        raise TimeoutError  # as when the try's time is out

    monkeypatch.setattr(dnswire, "ask", no_answer)
    mx = Resolver(timeout=10.0, resolv_conf=str(conf))
    assert mx._try_timeout == 1.0
    assert Resolver(timeout=1.0, resolv_conf=str(conf))._try_timeout == 0.5  # its share
    with pytest.raises(DnsFailure):
        await mx.exchangers("single.example")
    assert asked == ["127.0.0.2", "127.0.0.3"] * 3


async def test_resolv_conf_s_rotate_spreads_the_first_question(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 127.0.0.2\nnameserver 127.0.0.3\noptions rotate attempts:1\n")
    first: list[str] = []

    async def no_answer(server: tuple[str, int], name: str, kind: str, dnssec: bool = False) -> dnswire.Answer | None:
        first.append(server[0])
        return dnswire.Answer(dnswire.NXDOMAIN, [], 0)

    monkeypatch.setattr(dnswire, "ask", no_answer)
    mx = Resolver(timeout=1.0, resolv_conf=str(conf), rng=random.Random(1))
    for n in range(20):
        with pytest.raises(DnsFailure):
            await mx.exchangers(f"d{n}.example")
    assert set(first) == {"127.0.0.2", "127.0.0.3"}


# --- Resolver: caching -------------------------------------------------------------------------
async def test_answers_are_cached_for_their_ttl(dns: FakeDns) -> None:
    clock = Clock()
    mx = resolver(dns, clock=clock)
    first = await mx.exchangers("single.example")
    clock.now += TTL - 1
    assert await mx.exchangers("single.example") == first
    assert len(dns.asked("single.example", "MX")) == 1
    clock.now += 2  # past the TTL
    assert await mx.exchangers("single.example") == first
    assert len(dns.asked("single.example", "MX")) == 2


async def test_a_short_ttl_is_honoured(dns: FakeDns) -> None:
    clock = Clock()
    mx = resolver(dns, clock=clock)
    await mx.exchangers("short-ttl.example")  # TTL 10
    clock.now += 9
    await mx.exchangers("short-ttl.example")
    assert len(dns.asked("short-ttl.example")) == 1
    clock.now += 2
    await mx.exchangers("short-ttl.example")
    assert len(dns.asked("short-ttl.example")) == 2


async def test_nxdomain_is_cached_too(dns: FakeDns) -> None:
    clock = Clock()
    mx = resolver(dns, clock=clock)
    for _ in range(3):
        with pytest.raises(DnsFailure):
            await mx.exchangers("nowhere.example")
    assert len(dns.asked("nowhere.example")) == 1
    clock.now += 3600
    with pytest.raises(DnsFailure):
        await mx.exchangers("nowhere.example")
    assert len(dns.asked("nowhere.example")) == 2


async def test_a_transient_failure_is_remembered_briefly(dns: FakeDns) -> None:
    clock = Clock()
    mx = resolver(dns, clock=clock)
    for _ in range(3):
        with pytest.raises(DnsFailure):
            await mx.exchangers("servfail.example")
    assert len(dns.asked("servfail.example")) == 1
    clock.now += 60
    with pytest.raises(DnsFailure):
        await mx.exchangers("servfail.example")
    assert len(dns.asked("servfail.example")) == 2


# --- Resolver: addresses ------------------------------------------------------------------------
async def test_addresses_are_ipv4_then_ipv6(dns: FakeDns) -> None:
    assert await resolver(dns).addresses("host.example") == ["192.0.2.1", "192.0.2.2", "2001:db8::1"]
    assert dns.asked() == [("host.example", "A"), ("host.example", "AAAA")]


async def test_addresses_of_an_ipv6_only_host(dns: FakeDns) -> None:
    assert await resolver(dns).addresses("V6ONLY.example.") == ["2001:db8::10"]


async def test_addresses_survive_a_failing_aaaa_lookup(dns: FakeDns) -> None:
    assert await resolver(dns).addresses("flaky-v6.example") == ["192.0.2.7"]


async def test_a_host_whose_every_lookup_fails_is_a_transient_failure(dns: FakeDns) -> None:
    with pytest.raises(DnsFailure) as raised:
        await resolver(dns).addresses("servfail.example")
    assert raised.value.reply.is_transient


async def test_a_host_without_addresses_is_a_transient_failure(dns: FakeDns) -> None:
    with pytest.raises(DnsFailure) as raised:
        await resolver(dns).addresses("nothing.example")
    assert (raised.value.reply.code, raised.value.reply.enhanced) == (450, "4.4.4")


async def test_addresses_of_a_host_that_does_not_exist_fail(dns: FakeDns) -> None:
    with pytest.raises(DnsFailure) as raised:
        await resolver(dns).addresses("nowhere.example")
    assert raised.value.reply.code == 550


async def test_a_host_the_dns_says_has_no_address_is_not_found_and_a_failed_lookup_is_not(dns: FakeDns) -> None:
    """`not_found` is what `ClientConnection.open` bounces on when every MX host is so: an
    answer of nothing (NXDOMAIN, no A nor AAAA), never a lookup that failed, even beside one."""
    mx = resolver(dns)
    for host in ("nowhere.example", "nothing.example"):
        with pytest.raises(DnsFailure) as raised:
            await mx.addresses(host)
        assert raised.value.not_found, host
    for host in ("servfail.example", "gone-v6.example"):
        with pytest.raises(DnsFailure) as failed:
            await mx.addresses(host)
        assert not failed.value.not_found, host
        assert failed.value.reply.is_transient, host


async def test_addresses_are_cached(dns: FakeDns) -> None:
    mx = resolver(dns)
    await mx.addresses("host.example")
    await mx.addresses("host.example")
    assert len(dns.asked("host.example")) == 2  # one A, one AAAA


async def test_localhost_names_are_loopback_without_asking_dns(dns: FakeDns) -> None:
    """RFC 6761 6.3: a route to localhost:2525, or mail for user@localhost, needs no DNS server
    (which may well say NXDOMAIN for it)."""
    mx = resolver(dns)
    assert await mx.addresses("LocalHost.") == ["127.0.0.1", "::1"]
    assert await mx.addresses("relay.localhost") == ["127.0.0.1", "::1"]
    assert await mx.exchangers("localhost") == [Exchanger(0, "localhost")]
    assert dns.asked() == []
    with pytest.raises(DnsFailure):
        await mx.addresses("localhost.example")  # only the name and those under it
    assert dns.asked("localhost.example")


async def test_an_address_found_through_a_cname_is_the_target_s(dns: FakeDns) -> None:
    # (a chain: dnspython follows it, as it did for every answer before)
    assert await resolver(dns).addresses("alias.example") == ["192.0.2.1", "192.0.2.2", "2001:db8::1"]


async def test_mx_hosts_are_lower_cased_whatever_the_server_s_case(dns: FakeDns) -> None:
    assert await resolver(dns).exchangers("mixed-case.example") == [Exchanger(10, "mail.mixed-case.example")]


async def test_a_record_the_server_repeats_is_one_address(dns: FakeDns) -> None:
    assert await resolver(dns).addresses("dup.example") == ["192.0.2.20", "192.0.2.21"]


async def test_a_plain_answer_is_read_without_dnspython(dns: FakeDns, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain answer costs one datagram each way and no dnspython machinery (a millisecond of
    CPU a query, an eighth of a worker's time for mail to a thousand domains)."""
    mx = resolver(dns)

    async def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("dnspython asked")

    monkeypatch.setattr(mx._resolver, "resolve", refused)
    assert await mx.exchangers("single.example") == [Exchanger(10, "mail.single.example")]
    assert await mx.addresses("host.example") == ["192.0.2.1", "192.0.2.2", "2001:db8::1"]
    with pytest.raises(DnsFailure) as raised:
        await mx.exchangers("nowhere.example")
    assert raised.value.permanent
    with pytest.raises(DnsFailure) as failed:
        await mx.exchangers("servfail.example")
    assert not failed.value.permanent


# --- Router ----------------------------------------------------------------------------------------
SMART_HOST = Route("*.internal.example", Hop("relay.internal.example", 2525))


async def test_a_static_route_skips_dns(dns: FakeDns) -> None:
    router = Router([SMART_HOST], resolver(dns))
    destination = await router.destination("mail.internal.example")
    assert destination == Destination(
        "relay.internal.example:2525",
        (Hop("relay.internal.example", 2525),),
        TlsPolicy.OPPORTUNISTIC,
        False,
        hops_from="route",
    )
    assert dns.asked() == []


async def test_a_route_glob_does_not_match_other_domains(dns: FakeDns) -> None:
    router = Router([SMART_HOST], resolver(dns))
    destination = await router.destination("single.example")
    assert destination.hops == (Hop("mail.single.example", 25),)
    with pytest.raises(DnsFailure):
        await router.destination("internal.example")  # "*." needs a subdomain: to DNS, which says NXDOMAIN


async def test_the_first_matching_route_wins(dns: FakeDns) -> None:
    routes = [Route("special.internal.example", Hop("10.0.0.9", 25)), SMART_HOST, Route("*", Hop("fallback", 25))]
    router = Router(routes, resolver(dns))
    assert (await router.destination("special.internal.example")).site == "10.0.0.9:25"
    assert (await router.destination("x.internal.example")).site == "relay.internal.example:2525"
    assert (await router.destination("anything.test")).site == "fallback:25"
    assert dns.asked() == []


async def test_an_mx_destination_is_named_by_its_sorted_mx_hosts(dns: FakeDns) -> None:
    router = Router([], resolver(dns))
    destination = await router.destination("mx.example")
    assert destination.site == "a.mx.example.net,b.mx.example.net,backup.mx.example.net"
    assert [hop.port for hop in destination.hops] == [25, 25, 25]
    assert destination.hops[2] == Hop("backup.mx.example.net", 25)
    assert {hop.host for hop in destination.hops[:2]} == {"a.mx.example.net", "b.mx.example.net"}


async def test_domains_sharing_their_mx_hosts_share_a_site(dns: FakeDns) -> None:
    router = Router([], resolver(dns))
    first = await router.destination("mx.example")
    second = await router.destination("shared.example")
    assert first.site == second.site
    assert second.hops[0] == Hop("a.mx.example.net", 25)  # its own preferences still order its hops


async def test_an_implicit_mx_site_is_the_domain(dns: FakeDns) -> None:
    destination = await Router([], resolver(dns)).destination("amx.example")
    assert (destination.site, destination.hops) == ("amx.example", (Hop("amx.example", 25),))


async def test_a_non_standard_port_is_part_of_the_mx_site(dns: FakeDns) -> None:
    destination = await Router([], resolver(dns), smtp_port=2525).destination("single.example")
    assert destination.site == "mail.single.example:2525"
    assert destination.hops == (Hop("mail.single.example", 2525),)


@pytest.mark.parametrize(
    ("domain", "address"),
    [("[127.0.0.1]", "127.0.0.1"), ("[IPv6:2001:db8::1]", "2001:db8::1"), ("[ipv6:::1]", "::1")],
)
async def test_an_address_literal_goes_to_that_address_without_dns(dns: FakeDns, domain: str, address: str) -> None:
    destination = await Router([], resolver(dns)).destination(domain)
    assert destination.hops == (Hop(address, 25),)
    assert destination.site == f"[{address}]:25"
    assert dns.asked() == []


@pytest.mark.parametrize(
    ("route", "tls", "verify"),
    [
        (Route("single.example", tls=TlsPolicy.REQUIRED), TlsPolicy.REQUIRED, False),
        (Route("single.example", tls_verify=True), TlsPolicy.OPPORTUNISTIC, True),
        (Route("single.example", tls=TlsPolicy.DISABLED, tls_verify=True), TlsPolicy.DISABLED, True),
        (Route("other.example", tls=TlsPolicy.REQUIRED, tls_verify=True), TlsPolicy.OPPORTUNISTIC, False),
    ],
)
async def test_route_tls_settings_override_the_defaults(
    dns: FakeDns, route: Route, tls: TlsPolicy, verify: bool
) -> None:
    destination = await Router([route], resolver(dns)).destination("single.example")
    assert (destination.tls, destination.tls_verify) == (tls, verify)
    assert destination.hops == (Hop("mail.single.example", 25),)  # no next hop: still the MX


async def test_a_route_can_turn_verification_off_when_the_default_is_on(dns: FakeDns) -> None:
    router = Router(
        [Route("*.internal.example", Hop("relay", 25), tls_verify=False)],
        resolver(dns),
        tls=TlsPolicy.REQUIRED,
        tls_verify=True,
    )
    internal = await router.destination("x.internal.example")
    outside = await router.destination("single.example")
    assert (internal.tls, internal.tls_verify) == (TlsPolicy.REQUIRED, False)
    assert (outside.tls, outside.tls_verify) == (TlsPolicy.REQUIRED, True)


async def test_a_ca_file_applies_only_where_the_certificate_is_verified_and_keeps_its_own_ready_queue(
    dns: FakeDns,
) -> None:
    router = Router(
        [
            Route("partner.example", Hop("relay", 25), TlsPolicy.REQUIRED, True, "/etc/partner-ca.pem"),
            Route("plain.example", Hop("relay", 25), ca_file="/etc/partner-ca.pem"),  # verifies nothing
        ],
        resolver(dns),
        tls_verify=False,
        ca_file="/etc/default-ca.pem",
    )
    partner = await router.destination("partner.example")
    plain = await router.destination("plain.example")
    assert partner.ca_file == "/etc/partner-ca.pem"
    assert partner.security == " (tls required, verified by /etc/partner-ca.pem)"
    assert (plain.ca_file, plain.security) == (None, "")  # the same site, another ready queue
    assert partner.site == plain.site == "relay:25"
    verifying = Router([Route("single.example", tls_verify=True)], resolver(dns), ca_file="/etc/default-ca.pem")
    assert (await verifying.destination("single.example")).ca_file == "/etc/default-ca.pem"


def test_the_system_cas_are_wanted_only_where_mail_may_be_verified_without_a_ca_file_of_its_own(
    dns: FakeDns,
) -> None:
    # (Read at start or reload when wanted, not at a first handshake: `Outbound`.)
    assert not Router([Route("a.example", tls=TlsPolicy.REQUIRED)], resolver(dns)).verifies_with_system_cas()
    assert Router([], resolver(dns), tls_verify=True).verifies_with_system_cas()
    assert not Router([], resolver(dns), tls_verify=True, ca_file="/etc/ca.pem").verifies_with_system_cas()
    partner = Route("partner.example", tls_verify=True, ca_file="/etc/partner-ca.pem")
    assert not Router([partner], resolver(dns)).verifies_with_system_cas()
    assert Router([partner, Route("b.example", tls_verify=True)], resolver(dns)).verifies_with_system_cas()
    router = Router([], resolver(dns))
    router.replace([Route("b.example", tls_verify=True)])  # a reload
    assert router.verifies_with_system_cas()


async def test_destinations_are_cached_for_a_while(dns: FakeDns) -> None:
    clock = Clock()
    router = Router([], resolver(dns, clock=clock), clock=clock)
    assert router.cached("single.example") is None
    destination = await router.destination("single.example")
    assert router.cached("single.example") == destination
    assert await router.destination("single.example") == destination
    assert len(dns.asked()) == 1
    clock.now += 31
    assert router.cached("single.example") is None


async def test_a_destination_is_cached_no_longer_than_its_mx_records_ttl(dns: FakeDns) -> None:
    """30 seconds at most; less when the records' TTL is less, down to the resolver's floor (5 s)."""
    clock = Clock()
    router = Router([], resolver(dns, clock=clock), clock=clock)
    await router.destination("short-ttl.example")  # TTL 10
    await router.destination("tiny-ttl.example")  # TTL 1
    clock.now += 4
    assert router.cached("short-ttl.example") is not None
    assert router.cached("tiny-ttl.example") is not None  # the floor
    clock.now += 2
    assert router.cached("tiny-ttl.example") is None
    clock.now += 3
    assert router.cached("short-ttl.example") is not None
    clock.now += 2
    assert router.cached("short-ttl.example") is None
    await router.destination("short-ttl.example")
    assert len(dns.asked("short-ttl.example", "MX")) == 2


async def test_an_implicit_mx_destination_is_cached_no_longer_than_its_address_s_ttl(dns: FakeDns) -> None:
    clock = Clock()
    mx = resolver(dns, clock=clock)
    router = Router([], mx, clock=clock)
    await mx.exchangers("amx.example")  # (its A record cached 300 s, its missing MX 60 s)
    clock.now += 50
    await router.destination("amx.example")
    clock.now += 11
    assert router.cached("amx.example") is None  # the MX's NODATA expired


async def test_a_dns_failure_reaches_the_caller_of_the_router(dns: FakeDns) -> None:
    router = Router([], resolver(dns))
    with pytest.raises(DnsFailure) as raised:
        await router.destination("nullmx.example")
    assert raised.value.reply.code == 556
    assert router.cached("nullmx.example") is None


# --- a reload's new routes -------------------------------------------------------------------------
def test_a_reload_says_whose_route_changed_as_its_ready_queue_sees_it(dns: FakeDns) -> None:
    relay = Hop("relay", 25)
    router = Router(
        [
            Route("plain.example", relay, TlsPolicy.DISABLED),
            Route("same.example", relay, ca_file="/etc/a.pem"),
            Route("moved.example", relay),
            Route("*.glob.example", relay, TlsPolicy.REQUIRED),
        ],
        resolver(dns),
    )
    changed = router.replace(
        [
            Route("plain.example", relay, TlsPolicy.REQUIRED),  # tls
            Route("same.example", relay, ca_file="/etc/b.pem"),  # a CA file verifying nothing
            Route("moved.example", Hop("relay2", 25)),  # next hop
            Route("x.glob.example", relay, TlsPolicy.REQUIRED),  # another route, the same settings
            Route("mx.example", tls_verify=True),  # was the MX and the defaults, now verified
        ]
    )
    assert changed("plain.example", None)
    assert changed("moved.example", None)
    assert changed("mx.example", None)
    assert not changed("same.example", None)
    assert not changed("x.glob.example", None)
    assert changed("y.glob.example", None)  # its route is gone: the MX, opportunistic
    assert not changed("single.example", None)  # no route before or after
    assert not changed("plain.example", "app")  # an [[inbound]] target's mail: no [[route]] applies


class _SlowResolver:
    """A resolver whose MX answer waits until the test lets it go."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.asked = 0

    async def exchangers_for(self, domain: str) -> tuple[list[Exchanger], float]:
        self.asked += 1
        await self.answer.wait()
        return [Exchanger(10, f"mx.{domain}")], 300.0


async def test_a_lookup_that_spans_a_reload_gives_what_the_new_routes_say() -> None:
    """The TLS policy is read before the DNS answers: a reload meanwhile must not let the old
    policy through (into a ready queue, or the cache), nor the old next hop."""
    slow = _SlowResolver()
    router = Router([Route("single.example", tls=TlsPolicy.DISABLED)], slow)  # type: ignore[arg-type]
    lookup = asyncio.ensure_future(router.destination("single.example"))
    await asyncio.sleep(0)
    assert slow.asked == 1
    router.replace([Route("single.example", tls=TlsPolicy.REQUIRED)])
    slow.answer.set()
    destination = await lookup
    assert (destination.site, destination.tls) == ("mx.single.example", TlsPolicy.REQUIRED)
    assert router.cached("single.example") == destination

    slow.answer.clear()
    router.replace([])
    lookup = asyncio.ensure_future(router.destination("other.example"))
    await asyncio.sleep(0)
    router.replace([Route("other.example", Hop("relay", 2525))])
    slow.answer.set()
    assert (await lookup).site == "relay:2525"
