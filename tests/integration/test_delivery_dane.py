"""DANE (RFC 7672) on delivery by MX, `[dane] enabled`: a DNS server of the test's own on loopback
that answers for its "secure" zone with the AD bit (when asked with DO, as a validating resolver
does) and for another without it; SMTP sinks with STARTTLS and certificates made here. The sinks
listen on a port other than 25 (`[delivery] smtp_port`): the TLSA records are at
`_<that port>._tcp.<MX host>`."""

from __future__ import annotations

import smtplib
import ssl
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from tests.support.dane import DaneCa, Issued, self_signed
from tests.support.dns import DnsServer, Zone
from tests.support.mta_sts import PolicyServer, TestCa
from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import ScriptedSink, wait_until


def _zone(port: int, *mx: tuple[int, str, str, list[tuple[int, int, int, bytes]]], secure: bool = True) -> Zone:
    """example.net with its MX hosts (preference, name, address, TLSA records), all in a zone
    validated (`secure`) or not."""
    records: dict[str, list[tuple[Any, ...]]] = {"example.net": [("MX", pref, name) for pref, name, _, _ in mx]}
    for _, name, address, tlsa in mx:
        records[name] = [("A", address)]
        if tlsa:
            records[f"_{port}._tcp.{name}"] = [("TLSA", *record) for record in tlsa]
    return Zone(records, secure={"example.net"} if secure else set())


def _node(tmp_path: Path, dns: DnsServer, port: int, **sections: Any) -> PigeonProcess:
    delivery = {"enabled": True, "smtp_port": port, "retry_interval": "1h", "dsn": False}
    return PigeonProcess(
        tmp_path / "node",
        delivery=delivery | sections.pop("delivery", {}),
        dns={"nameservers": [dns.endpoint], "timeout": "1s"},
        mta_sts=sections.pop("mta_sts", {"enabled": False}),
        dane={"enabled": True},
        **sections,
    )


def _send(pigeon: PigeonProcess, recipient: str = "ok@example.net") -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo()
        client.mail("a@example.org")
        client.rcpt(recipient)
        code, reply = client.data(b"Subject: dane\r\n\r\nhi\r\n")
    assert code == 250, reply


def _context(tmp_path: Path, leaf: Issued, *chain: Issued) -> ssl.SSLContext:
    return leaf.context(tmp_path / "certs", *chain)


def test_a_host_whose_certificate_matches_its_dane_ee_record_gets_the_mail_and_the_record_says_so(
    tmp_path: Path,
) -> None:
    # A self-signed certificate for another name: DANE-EE checks neither (RFC 7672 3.1.1).
    port = free_port()
    leaf = self_signed("not-the-mx-name.example.org")
    with (
        DnsServer(_zone(port, (10, "mx1.example.net", "127.0.0.2", [leaf.tlsa(3, 1, 1)]))) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, leaf)) as sink,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert "certificate verified by DANE (DANE-EE 3 1 1)" in record["tls"]
        assert len(sink.received) == 1
        assert (f"_{port}._tcp.mx1.example.net", "TLSA") in dns.zone.queries


def test_a_host_whose_certificate_matches_no_record_is_passed_over_for_the_next_mx(tmp_path: Path) -> None:
    port = free_port()
    good, bad = self_signed("mx2.example.net"), self_signed("mx1.example.net")
    zone = _zone(
        port,
        (10, "mx1.example.net", "127.0.0.2", [self_signed("mx1.example.net").tlsa(3, 1, 1)]),
        (20, "mx2.example.net", "127.0.0.3", [good.tlsa(3, 1, 1)]),
    )
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, bad)) as mismatched,
        ScriptedSink(host="127.0.0.3", port=port, tls=_context(tmp_path, good)) as matching,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert record["peer"] == f"mx2.example.net [127.0.0.3]:{port}"
        assert len(matching.received) == 1
        assert not mismatched.received and not mismatched.rcpt_log


def test_mail_whose_only_host_fails_dane_is_deferred_naming_dane_and_never_sent_there(tmp_path: Path) -> None:
    port = free_port()
    presented = self_signed("mx1.example.net")
    zone = _zone(port, (10, "mx1.example.net", "127.0.0.2", [self_signed("mx1.example.net").tlsa(3, 1, 1)]))
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, presented)) as sink,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon)
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        assert failure["response"]["code"] == 451 and failure["response"]["enhanced"] == "4.7.5"
        text = failure["response"]["text"]
        assert f"DANE: no TLSA record of _{port}._tcp.mx1.example.net matches the certificate" in text
        assert "TLS authenticated by DANE required" in text
        assert not sink.received and not sink.rcpt_log


def test_dane_ta_takes_a_leaf_of_the_anchor_naming_the_mx_host_and_refuses_one_for_another_name(
    tmp_path: Path,
) -> None:
    port = free_port()
    ca = DaneCa()
    zone = _zone(port, (10, "mx1.example.net", "127.0.0.2", [ca.tlsa(2, 0, 1)]))
    zone.records["other.example"] = [("MX", 10, "mx3.example.net")]
    zone.records["mx3.example.net"] = [("A", "127.0.0.3")]
    zone.records[f"_{port}._tcp.mx3.example.net"] = [("TLSA", *ca.tlsa(2, 0, 1))]
    zone.secure.add("other.example")
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, ca.issue("mx1.example.net"), ca)) as right,
        ScriptedSink(host="127.0.0.3", port=port, tls=_context(tmp_path, ca.issue("mx.other.example"), ca)) as wrong,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert "certificate verified by DANE (DANE-TA 2 0 1)" in record["tls"]
        assert len(right.received) == 1
        _send(pigeon, "ok@other.example")
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        assert failure["response"]["enhanced"] == "4.7.5"
        assert "does not chain to the trust anchor of DANE-TA 2 0 1" in failure["response"]["text"]
        assert not wrong.received and not wrong.rcpt_log


def test_mail_for_a_domain_whose_mx_is_insecure_goes_as_before_whatever_its_tlsa_records(tmp_path: Path) -> None:
    # The MX host's own zone is validated, with a TLSA record its certificate does not match:
    # the domain's MX records are not, so DANE does not apply (RFC 7672 2.2.1).
    port = free_port()
    presented = self_signed("mx1.hosts.example")
    zone = _zone(port, (10, "mx1.hosts.example", "127.0.0.2", [self_signed("x.example").tlsa(3, 1, 1)]), secure=False)
    zone.secure.add("hosts.example")
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, presented)) as sink,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert record["tls"].endswith("certificate not verified") and "DANE" not in record["tls"]
        assert len(sink.received) == 1
        assert not [q for q in dns.zone.queries if q[1] == "TLSA"]  # (no lookup for an insecure MX)


def test_a_host_whose_tlsa_lookup_fails_is_skipped(tmp_path: Path) -> None:
    port = free_port()
    first, second = self_signed("mx1.example.net"), self_signed("mx2.example.net")
    zone = _zone(
        port,
        (10, "mx1.example.net", "127.0.0.2", [first.tlsa(3, 1, 1)]),
        (20, "mx2.example.net", "127.0.0.3", [second.tlsa(3, 1, 1)]),
    )
    zone.servfail.add(f"_{port}._tcp.mx1.example.net")  # (bogus, as a validating resolver says it)
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, first)) as skipped,
        ScriptedSink(host="127.0.0.3", port=port, tls=_context(tmp_path, second)) as used,
        _node(tmp_path, dns, port) as pigeon,
    ):
        before = len(skipped.connections)
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert record["peer"] == f"mx2.example.net [127.0.0.3]:{port}"
        assert len(used.received) == 1
        assert len(skipped.connections) == before and not skipped.received


def test_a_host_whose_tlsa_lookup_fails_leaves_the_site_up_when_the_other_refuses_the_connection(
    tmp_path: Path,
) -> None:
    """Found from outside (for a host whose address lookup failed): the host skipped for its
    TLSA lookup may be the one that is up, so the other's refused connection does not take the
    site down; the attempt counts, and its reason names both."""
    port = free_port()
    first, second = self_signed("mx1.example.net"), self_signed("mx2.example.net")
    zone = _zone(
        port,
        (10, "mx1.example.net", "127.78.0.11", [first.tlsa(3, 1, 1)]),
        (20, "mx2.example.net", "127.78.0.12", [second.tlsa(3, 1, 1)]),  # (nothing listens: refused)
    )
    zone.servfail.add(f"_{port}._tcp.mx1.example.net")
    with DnsServer(zone) as dns, _node(tmp_path, dns, port) as pigeon:
        _send(pigeon)
        [failure] = pigeon.wait_records("TransientFailure", 1)
        text = failure["response"]["text"]
        assert failure["attempt"] == 1, failure
        assert text.startswith(f"cannot connect to mx2.example.net [127.78.0.12]:{port}: Connection refused; "), text
        assert f"; DANE: TLSA lookup of _{port}._tcp.mx1.example.net failed (" in text, text
        assert text.endswith("mx1.example.net not used (RFC 7672 2.2)"), text
        assert "is down" not in pigeon.stderr()


def test_a_host_with_tlsa_records_that_offers_no_starttls_is_refused(tmp_path: Path) -> None:
    port = free_port()
    zone = _zone(port, (10, "mx1.example.net", "127.0.0.2", [self_signed("mx1.example.net").tlsa(3, 1, 1)]))
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port) as plaintext,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon)
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        assert failure["response"]["enhanced"] == "4.7.4"
        assert "does not offer STARTTLS" in failure["response"]["text"]
        assert f"TLS authenticated by DANE required: TLSA _{port}._tcp.mx1.example.net" in failure["response"]["text"]
        assert not plaintext.received and not plaintext.rcpt_log


def test_dane_takes_precedence_over_an_enforced_mta_sts_policy_for_a_host_with_tlsa_records(
    tmp_path: Path,
) -> None:
    # RFC 8461 2: where TLSA records exist, a sender that validates DANE uses it. The host's
    # certificate is self-signed (MTA-STS would refuse it) and matches its DANE-EE record.
    port = free_port()
    ca = TestCa(tmp_path / "ca")
    leaf = self_signed("mx1.example.net")
    zone = _zone(port, (10, "mx1.example.net", "127.0.0.2", [leaf.tlsa(3, 1, 1)]))
    zone.records["mta-sts.example.net"] = [("A", "127.0.0.1")]
    zone.records["_mta-sts.example.net"] = [("TXT", "v=STSv1; id=1;")]
    policy = "version: STSv1\nmode: enforce\nmx: mx1.example.net\nmax_age: 86400\n"
    with (
        DnsServer(zone) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": policy}) as policies,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, leaf)) as sink,
        _node(tmp_path, dns, port, mta_sts={"ca_file": str(ca.path), "https_port": policies.port}) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert "certificate verified by DANE (DANE-EE 3 1 1)" in record["tls"] and "MTA-STS" not in record["tls"]
        assert policies.requests == ["mta-sts.example.net"]
        assert len(sink.received) == 1


def test_tlsa_records_none_usable_make_tls_mandatory_without_authentication(tmp_path: Path) -> None:
    # PKIX-EE (1) is not for SMTP (RFC 7672 3.1.3): TLS is still a must, any certificate will do.
    port = free_port()
    record = self_signed("elsewhere.example").tlsa(1, 1, 1)
    zone = _zone(port, (10, "mx1.example.net", "127.0.0.2", [record]))
    zone.records["example.org"] = [("MX", 10, "mx2.example.net")]
    zone.records["mx2.example.net"] = [("A", "127.0.0.3")]
    zone.records[f"_{port}._tcp.mx2.example.net"] = [("TLSA", *record)]
    zone.secure.add("example.org")
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, self_signed("mx1.example.net"))) as tls,
        ScriptedSink(host="127.0.0.3", port=port) as plaintext,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon)
        (delivery,) = wait_until(lambda: pigeon.records("Delivery"))
        unauthenticated = f"certificate not verified, DANE (TLSA _{port}._tcp.mx1.example.net, none usable)"
        assert delivery["tls"].endswith(unauthenticated)
        assert len(tls.received) == 1
        _send(pigeon, "ok@example.org")
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        assert failure["response"]["enhanced"] == "4.7.4" and "TLS required by DANE" in failure["response"]["text"]
        assert not plaintext.received


def _ca_file(tmp_path: Path, ca: DaneCa) -> str:
    path = tmp_path / "route-ca.pem"
    path.write_bytes(ca.certificate.public_bytes(serialization.Encoding.PEM))
    return str(path)


def test_tlsa_records_none_usable_leave_a_route_s_tls_verify_as_it_is(tmp_path: Path) -> None:
    # RFC 7672: only usable TLSA records replace PKIX. None usable make TLS mandatory and take
    # nothing away: a route that verifies still verifies (a certificate of its CA goes through,
    # a self-signed one is deferred as without DANE), and says so in the record.
    port = free_port()
    ca = DaneCa()
    record = self_signed("elsewhere.example").tlsa(1, 1, 1)
    zone = _zone(port, (10, "mx1.example.net", "127.0.0.2", [record]))
    zone.records["example.org"] = [("MX", 10, "mx2.example.org")]
    zone.records["mx2.example.org"] = [("A", "127.0.0.3")]
    zone.records[f"_{port}._tcp.mx2.example.org"] = [("TLSA", *record)]
    zone.secure.add("example.org")
    route = {"tls": "required", "tls_verify": True, "ca_file": _ca_file(tmp_path, ca)}
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, ca.issue("mx1.example.net"), ca)) as good,
        ScriptedSink(host="127.0.0.3", port=port, tls=_context(tmp_path, self_signed("mx2.example.org"))) as bad,
        _node(tmp_path, dns, port, route=[{"domain": d} | route for d in ("example.net", "example.org")]) as pigeon,
    ):
        _send(pigeon)
        (delivery,) = wait_until(lambda: pigeon.records("Delivery"))
        assert delivery["tls"].endswith(f"certificate verified, DANE (TLSA _{port}._tcp.mx1.example.net, none usable)")
        assert len(good.received) == 1
        _send(pigeon, "ok@example.org")
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        assert failure["response"]["enhanced"] == "4.7.5"
        assert "CERTIFICATE_VERIFY_FAILED" in failure["response"]["text"]
        assert "DANE" not in failure["response"]["text"]  # (the route's check failed, not DANE's)
        assert not bad.received and not bad.rcpt_log


def test_delivery_tls_verify_holds_for_a_host_of_a_secure_domain_without_tlsa_records(tmp_path: Path) -> None:
    port = free_port()
    zone = _zone(port, (10, "mx1.example.net", "127.0.0.2", []))
    delivery = {"tls": "required", "tls_verify": True, "ca_file": _ca_file(tmp_path, DaneCa())}
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, self_signed("mx1.example.net"))) as sink,
        _node(tmp_path, dns, port, delivery=delivery) as pigeon,
    ):
        _send(pigeon)
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        assert "CERTIFICATE_VERIFY_FAILED" in failure["response"]["text"]
        assert not sink.received and not sink.rcpt_log


def test_tlsa_records_none_usable_with_opportunistic_tls_verify_fall_back_to_unverified_tls_never_the_clear(
    tmp_path: Path,
) -> None:
    # As without DANE, a route that asks to verify but not for TLS takes TLS unverified when the
    # certificate does not verify; DANE's TLSA records keep it from the clear.
    port = free_port()
    record = self_signed("elsewhere.example").tlsa(0, 0, 1)
    zone = _zone(port, (10, "mx1.example.net", "127.0.0.2", [record]))
    delivery = {"tls_verify": True, "ca_file": _ca_file(tmp_path, DaneCa())}
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, self_signed("mx1.example.net"))) as sink,
        _node(tmp_path, dns, port, delivery=delivery) as pigeon,
    ):
        _send(pigeon)
        (record_,) = wait_until(lambda: pigeon.records("Delivery"))
        assert record_["tls"].endswith(
            f"certificate not verified, DANE (TLSA _{port}._tcp.mx1.example.net, none usable)"
        )
        assert len(sink.received) == 1


def test_under_mta_sts_and_tlsa_records_none_usable_a_certificate_that_does_not_verify_is_mta_sts_s_refusal(
    tmp_path: Path,
) -> None:
    port = free_port()
    ca = TestCa(tmp_path / "ca")
    zone = _zone(port, (10, "mx1.example.net", "127.0.0.2", [self_signed("x.example").tlsa(1, 1, 1)]))
    zone.records["mta-sts.example.net"] = [("A", "127.0.0.1")]
    zone.records["_mta-sts.example.net"] = [("TXT", "v=STSv1; id=1;")]
    policy = "version: STSv1\nmode: enforce\nmx: mx1.example.net\nmax_age: 86400\n"
    with (
        DnsServer(zone) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": policy}) as policies,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, self_signed("mx1.example.net"))) as sink,
        _node(tmp_path, dns, port, mta_sts={"ca_file": str(ca.path), "https_port": policies.port}) as pigeon,
    ):
        _send(pigeon)
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        text = failure["response"]["text"]
        assert "CERTIFICATE_VERIFY_FAILED" in text and "required by example.net's MTA-STS policy" in text
        assert "TLS required by DANE" not in text
        assert not sink.received


def _cname_zone(port: int, tlsa: dict[str, list[tuple[int, int, int, bytes]]]) -> Zone:
    """example.net's MX mx.example.net, a CNAME to host.hosting.example (both zones secure),
    with TLSA records at the names `tlsa` says (original or target)."""
    zone = Zone(
        {
            "example.net": [("MX", 10, "mx.example.net")],
            "mx.example.net": [("CNAME", "host.hosting.example")],
            "host.hosting.example": [("A", "127.0.0.2")],
        },
        secure={"example.net", "hosting.example"},
    )
    for name, records in tlsa.items():
        zone.records[f"_{port}._tcp.{name}"] = [("TLSA", *record) for record in records]
    return zone


def _sni(context: ssl.SSLContext) -> list[str | None]:
    said: list[str | None] = []
    context.sni_callback = lambda _obj, name, _ctx: said.append(name)  # type: ignore[assignment,misc,func-returns-value]
    return said


def test_an_mx_host_that_is_a_cname_has_the_tlsa_records_of_its_target_first_and_names_it_in_sni(
    tmp_path: Path,
) -> None:
    # RFC 7672 2.2.2: the TLSA base domain is the end of the (secure) CNAME chain; SNI says it
    # (8.1). A record at the original name, which the target's hide, would not match.
    port = free_port()
    leaf = self_signed("host.hosting.example")
    tlsa = {"host.hosting.example": [leaf.tlsa(3, 1, 1)], "mx.example.net": [self_signed("x.example").tlsa(3, 1, 1)]}
    context = _context(tmp_path, leaf)
    sni = _sni(context)
    with (
        DnsServer(_cname_zone(port, tlsa)) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=context) as sink,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert "certificate verified by DANE (DANE-EE 3 1 1)" in record["tls"]
        assert len(sink.received) == 1
        assert sni == ["host.hosting.example"]


def test_a_cname_target_without_tlsa_records_has_those_of_the_mx_host_name_and_dane_ta_takes_either_name(
    tmp_path: Path,
) -> None:
    # A secure NXDOMAIN at the target: the original name's records (RFC 7672 2.2.2). DANE-TA's
    # reference identifiers are both names (3.2.2): a leaf naming only the target will do.
    port = free_port()
    ca = DaneCa()
    with (
        DnsServer(_cname_zone(port, {"mx.example.net": [ca.tlsa(2, 0, 1)]})) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, ca.issue("host.hosting.example"), ca)) as sink,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert "certificate verified by DANE (DANE-TA 2 0 1)" in record["tls"]
        assert len(sink.received) == 1
        assert (f"_{port}._tcp.host.hosting.example", "TLSA") in dns.zone.queries


def test_an_mx_host_that_is_a_cname_whose_certificate_matches_no_record_of_its_target_is_refused(
    tmp_path: Path,
) -> None:
    port = free_port()
    tlsa = {"host.hosting.example": [self_signed("host.hosting.example").tlsa(3, 1, 1)]}
    with (
        DnsServer(_cname_zone(port, tlsa)) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=_context(tmp_path, self_signed("mx.example.net"))) as sink,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon)
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        assert f"no TLSA record of _{port}._tcp.host.hosting.example matches" in failure["response"]["text"]
        assert not sink.received and not sink.rcpt_log
