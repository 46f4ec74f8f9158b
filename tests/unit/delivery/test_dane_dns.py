"""What DANE asks of the resolver (`[dane] enabled`): the DO bit on every question, the AD bit
of each answer remembered with it, TLSA records read, against a DNS server of the test's own
on loopback that sets AD only for names of its "secure" zone, and only when asked with DO (as
a validating resolver does: RFC 3225, RFC 4035 3.2.3)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from dnslib import CNAME, MX, QTYPE, RCODE, RR, TLSA, A, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from pigeon.delivery.dane import HostPolicy, LookupFailed, Record, host_policy
from pigeon.delivery.mx import DnsFailure, Exchanger, Resolver
from pigeon.delivery.routes import Router

DIGEST = bytes(range(32))
ZONE: dict[str, list[tuple[str, object]]] = {
    "secure.example": [("MX", "mx.secure.example")],
    "mx.secure.example": [("A", "192.0.2.1")],
    "_25._tcp.mx.secure.example": [("TLSA", (3, 1, 1, DIGEST)), ("TLSA", (2, 0, 1, DIGEST))],
    "alias.secure.example": [("CNAME", "mx.secure.example")],  # (answered by dnspython)
    "insecure.example": [("MX", "mx.insecure.example")],
    "mx.insecure.example": [("A", "192.0.2.2")],
    "_25._tcp.mx.insecure.example": [("TLSA", (3, 1, 1, DIGEST))],
    "nodata.secure.example": [("A", "192.0.2.3")],
    "_25._tcp.pkix.secure.example": [("TLSA", (1, 1, 1, DIGEST)), ("TLSA", (3, 1, 9, DIGEST))],
    "_2525._tcp.mx.secure.example": [("TLSA", (3, 0, 1, DIGEST))],
}
SECURE = ("secure.example",)  # names at or under these are answered with AD (when asked with DO)
SERVFAIL = {"_25._tcp.bogus.secure.example"}


@dataclass
class Dns:
    port: int = 0
    queries: list[tuple[str, str, bool]] = field(default_factory=list)  # (name, type, DO set)

    def asked(self, kind: str) -> list[tuple[str, str, bool]]:
        return [q for q in self.queries if q[1] == kind]


class _Zone(BaseResolver):  # type: ignore[misc]
    def __init__(self, dns: Dns) -> None:
        self.dns = dns

    def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
        name = str(request.q.qname).rstrip(".").lower()
        kind = QTYPE[request.q.qtype]
        do = any(rr.rtype == QTYPE.OPT and rr.ttl & 0x8000 for rr in request.ar)
        self.dns.queries.append((name, kind, do))
        reply = request.reply()
        if name in SERVFAIL:
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        if do and any(name == zone or name.endswith("." + zone) for zone in SECURE):
            reply.header.ad = 1
        records = ZONE.get(name)
        if records is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        owner = name
        if records[0][0] == "CNAME":
            target = str(records[0][1])
            reply.add_answer(RR(name + ".", QTYPE.CNAME, rdata=CNAME(target + "."), ttl=300))
            owner, records = target, ZONE[target]
        for rtype, data in records:
            if rtype != kind:
                continue
            if rtype == "MX":
                rdata: object = MX(f"{data}.", 10)
            elif rtype == "A":
                rdata = A(str(data))
            else:
                usage, selector, mtype, digest = data  # type: ignore[misc]
                rdata = TLSA(usage, selector, mtype, digest)
            reply.add_answer(RR(owner + ".", getattr(QTYPE, rtype), rdata=rdata, ttl=300))
        return reply


@pytest.fixture
def dns() -> Iterator[Dns]:
    record = Dns()
    server = DNSServer(_Zone(record), address="127.0.0.1", port=0, logger=DNSLogger(logf=lambda _: None))
    record.port = server.server.server_address[1]
    thread = threading.Thread(target=server.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield record
    finally:
        server.stop()
        server.server.server_close()
        thread.join(timeout=5)


def _resolver(dns: Dns, *, dnssec: bool = True) -> Resolver:
    return Resolver([("127.0.0.1", dns.port)], timeout=0.5, dnssec=dnssec)


async def test_with_dnssec_every_question_has_the_do_bit_and_secure_answers_say_so(dns: Dns) -> None:
    resolver = _resolver(dns)
    exchangers, _, secure = await resolver.exchangers_secure("secure.example")
    assert exchangers == [Exchanger(10, "mx.secure.example")] and secure
    assert await resolver.addresses_secure("mx.secure.example") == (["192.0.2.1"], True)
    assert (await resolver.exchangers_secure("insecure.example"))[2] is False
    assert await resolver.addresses_secure("mx.insecure.example") == (["192.0.2.2"], False)
    assert dns.queries and all(do for _, _, do in dns.queries)


async def test_without_dnssec_no_question_has_the_do_bit_and_no_answer_is_secure(dns: Dns) -> None:
    resolver = _resolver(dns, dnssec=False)
    assert (await resolver.exchangers_secure("secure.example"))[2] is False
    assert (await resolver.addresses_secure("mx.secure.example"))[1] is False
    assert dns.queries and not any(do for _, _, do in dns.queries)


async def test_tlsa_records_are_read_with_their_security_and_cached(dns: Dns) -> None:
    resolver = _resolver(dns)
    records, secure = await resolver.tlsa("_25._tcp.mx.secure.example")
    assert records == [(3, 1, 1, DIGEST), (2, 0, 1, DIGEST)] and secure
    assert await resolver.tlsa("_25._tcp.mx.insecure.example") == ([(3, 1, 1, DIGEST)], False)
    await resolver.tlsa("_25._tcp.mx.secure.example")
    assert len([q for q in dns.asked("TLSA") if q[0] == "_25._tcp.mx.secure.example"]) == 1


async def test_no_tlsa_record_is_none_and_a_missing_name_nxdomain(dns: Dns) -> None:
    resolver = _resolver(dns)
    assert await resolver.tlsa("nodata.secure.example") == (None, True)
    with pytest.raises(DnsFailure) as missing:
        await resolver.tlsa("_25._tcp.nowhere.secure.example")
    assert missing.value.permanent


async def test_a_tlsa_lookup_that_fails_is_a_transient_failure(dns: Dns) -> None:
    with pytest.raises(DnsFailure) as failed:
        await _resolver(dns).tlsa("_25._tcp.bogus.secure.example")
    assert not failed.value.permanent


async def test_an_answer_read_by_dnspython_keeps_its_ad_bit(dns: Dns) -> None:
    # A CNAME in the answer is dnspython's to follow: it asks with DO too, and reads AD.
    assert await _resolver(dns).addresses_secure("alias.secure.example") == (["192.0.2.1"], True)
    assert all(do for _, _, do in dns.queries)


async def test_a_host_with_secure_usable_tlsa_records_must_match_them(dns: Dns) -> None:
    policy = await host_policy(_resolver(dns), "mx.secure.example", 25, True)
    assert policy == HostPolicy(
        "mx.secure.example", "_25._tcp.mx.secure.example", (Record(3, 1, 1, DIGEST), Record(2, 0, 1, DIGEST))
    )


async def test_the_tlsa_name_is_that_of_the_port_connected_to(dns: Dns) -> None:
    policy = await host_policy(_resolver(dns), "mx.secure.example", 2525, True)
    assert policy is not None and policy.records == (Record(3, 0, 1, DIGEST),)


async def test_secure_tlsa_records_none_usable_mean_tls_without_authentication(dns: Dns) -> None:
    policy = await host_policy(_resolver(dns), "pkix.secure.example", 25, True)
    assert policy == HostPolicy("pkix.secure.example", "_25._tcp.pkix.secure.example", ())


async def test_insecure_or_missing_tlsa_records_mean_no_dane(dns: Dns) -> None:
    resolver = _resolver(dns)
    assert await host_policy(resolver, "mx.insecure.example", 25, True) is None
    assert await host_policy(resolver, "nowhere.secure.example", 25, True) is None  # NXDOMAIN
    assert await host_policy(resolver, "nodata.secure.example", 25, True) is None


async def test_a_host_whose_addresses_are_insecure_has_no_tlsa_lookup(dns: Dns) -> None:
    assert await host_policy(_resolver(dns), "mx.secure.example", 25, False) is None
    assert not dns.asked("TLSA")


async def test_a_failed_tlsa_lookup_leaves_the_host_unused_and_says_why(dns: Dns) -> None:
    with pytest.raises(LookupFailed) as failed:
        await host_policy(_resolver(dns), "bogus.secure.example", 25, True)
    assert failed.value.reply.code == 451 and failed.value.reply.enhanced == "4.7.5"
    assert "DANE: TLSA lookup of _25._tcp.bogus.secure.example failed" in failed.value.reply.text


async def test_mail_under_dane_has_a_ready_queue_apart_from_the_same_hosts_mail_without(dns: Dns) -> None:
    # A connection opened without looking at TLSA records must not carry mail DANE protects.
    # (insecure.example's MX is mx.secure.example too, but its own MX records are not validated.)
    ZONE["shared.example"] = [("MX", "mx.secure.example")]
    try:
        router = Router([], _resolver(dns), dane=True)
        secure = await router.destination("secure.example")
        shared = await router.destination("shared.example")
    finally:
        del ZONE["shared.example"]
    assert secure.dane and secure.security == " (tls opportunistic, DANE)"
    assert not shared.dane and shared.security == ""
    assert secure.site == shared.site == "mx.secure.example"
    off = await Router([], _resolver(dns, dnssec=False)).destination("secure.example")
    assert not off.dane and off.security == ""


async def test_the_addresses_of_a_cname_say_the_name_its_chain_ends_at(dns: Dns) -> None:
    resolver = _resolver(dns)
    assert await resolver.addresses_canonical("alias.secure.example") == (["192.0.2.1"], True, "mx.secure.example")
    assert await resolver.addresses_canonical("mx.secure.example") == (["192.0.2.1"], True, "mx.secure.example")


async def test_an_nxdomain_says_whether_it_was_validated(dns: Dns) -> None:
    resolver = _resolver(dns)
    with pytest.raises(DnsFailure) as secure:
        await resolver.tlsa("_25._tcp.nowhere.secure.example")
    with pytest.raises(DnsFailure) as insecure:
        await resolver.tlsa("_25._tcp.nowhere.insecure.example")
    assert secure.value.secure and not insecure.value.secure


async def test_a_cname_s_target_s_tlsa_records_come_first(dns: Dns) -> None:
    policy = await host_policy(_resolver(dns), "alias.secure.example", 25, True, "mx.secure.example")
    assert policy is not None and policy.name == "_25._tcp.mx.secure.example"
    assert policy.base == "mx.secure.example" and policy.names == ("mx.secure.example", "alias.secure.example")
    # None at the target (a secure NXDOMAIN): the original name's (RFC 7672 2.2.2).
    policy = await host_policy(_resolver(dns), "pkix.secure.example", 25, True, "nowhere.secure.example")
    assert policy is not None and policy.name == "_25._tcp.pkix.secure.example"
    # An insecure answer at the target: no DANE, whatever the original name has.
    assert await host_policy(_resolver(dns), "mx.secure.example", 25, True, "mx.insecure.example") is None
