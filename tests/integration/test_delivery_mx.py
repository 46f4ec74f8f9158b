"""MX routing against a DNS server of the test's own: preference order, backups, null MX, NXDOMAIN."""

from __future__ import annotations

import smtplib
from pathlib import Path

from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import ScriptedSink, wait_until


def _node(tmp_path: Path, dns: DnsServer, port: int, *, route: list[dict[str, str]] | None = None,
          **delivery: object) -> PigeonProcess:  # fmt: skip
    """A node resolving through `dns`, its MX hosts on `port`; `delivery` overrides (no DSNs,
    no TLS by default)."""
    settings = {"enabled": True, "smtp_port": port, "retry_interval": "1s", "dsn": False, "tls": "disabled", **delivery}
    return PigeonProcess(
        tmp_path / "node", delivery=settings, dns={"nameservers": [dns.endpoint], "timeout": "1s"}, route=route or []
    )


def _terminal(pigeon: PigeonProcess) -> list[dict[str, object]]:
    return [r for r in pigeon.records() if r["type"] in ("Delivery", "Bounce", "Expiration")]


def test_mail_goes_to_the_backup_mx_when_the_preferred_one_is_down(tmp_path: Path) -> None:
    port = free_port()  # [delivery] smtp_port: the port of every MX host in this test
    zone = Zone(
        {
            "example.net": [("MX", 10, "mx1.example.net"), ("MX", 20, "mx2.example.net")],
            "mx1.example.net": [("A", "127.0.0.2")],  # nothing listens there
            "mx2.example.net": [("A", "127.0.0.3")],
        }
    )
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.3", port=port) as sink,
        _node(tmp_path, dns, port) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["ok@example.net"], b"Subject: mx\r\n\r\nhi\r\n")
        (record,) = wait_until(lambda: _terminal(pigeon))
        assert record["type"] == "Delivery"
        assert record["site"] == f"mx1.example.net,mx2.example.net:{port}"
        assert record["peer"] == f"mx2.example.net [127.0.0.3]:{port}"
        assert len(sink.received) == 1
        assert ("example.net", "MX") in dns.zone.queries


def test_null_mx_and_nxdomain_bounce_at_once(tmp_path: Path) -> None:
    zone = Zone({"nomail.example": [("MX", 0, ".")]})
    with DnsServer(zone) as dns, _node(tmp_path, dns, free_port()) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["x@nomail.example", "y@missing.example"], b"Subject: x\r\n\r\nhi\r\n")
        records = wait_until(lambda: len(_terminal(pigeon)) == 2 and _terminal(pigeon))
        outcome = {r["recipient"]: (r["type"], r["response"]["enhanced"]) for r in records}
        assert outcome == {"x@nomail.example": ("Bounce", "5.1.10"), "y@missing.example": ("Bounce", "5.1.2")}
        assert not pigeon.records("TransientFailure")


def test_dns_failure_is_transient(tmp_path: Path) -> None:
    zone = Zone(servfail={"flaky.example"})
    with DnsServer(zone) as dns, _node(tmp_path, dns, free_port()) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["x@flaky.example"], b"Subject: x\r\n\r\nhi\r\n")
        (failure, *_) = wait_until(lambda: pigeon.records("TransientFailure"))
        assert failure["response"]["enhanced"] == "4.4.3"
        assert not _terminal(pigeon)


def test_a_domain_requiring_tls_never_rides_a_plaintext_connection_opened_for_another_on_its_mx(
    tmp_path: Path,
) -> None:
    # Two domains hosted on one MX (as at any large provider) share its ready queue and its
    # connections: unless they differ in TLS policy. strict.example requires TLS; the MX does
    # not offer STARTTLS, so its mail must wait (4.7.4), even while a plaintext connection
    # opened for open.example is there to reuse.
    port = free_port()
    zone = Zone(
        {
            "open.example": [("MX", 10, "mx.hosting.example")],
            "strict.example": [("MX", 10, "mx.hosting.example")],
            "mx.hosting.example": [("A", "127.0.0.4")],
        }
    )
    strict = [{"domain": "strict.example", "tls": "required"}]
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.4", port=port) as sink,
        _node(tmp_path, dns, port, route=strict, tls="opportunistic") as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            for n in range(3):  # interleaved, so a connection to the MX is open when strict mail is ready
                client.sendmail("a@example.org", [f"o{n}@open.example"], b"Subject: open\r\n\r\nhi\r\n")
                client.sendmail("a@example.org", [f"s{n}@strict.example"], b"Subject: strict\r\n\r\nhi\r\n")
        delivered = wait_until(lambda: len(pigeon.records("Delivery")) >= 3 and pigeon.records("Delivery"))
        failures = wait_until(
            lambda: len(pigeon.records("TransientFailure")) >= 3 and pigeon.records("TransientFailure")
        )
        assert {r["recipient"].split("@")[1] for r in delivered} == {"open.example"}
        assert {r["recipient"].split("@")[1] for r in failures} == {"strict.example"}
        assert all(r["response"]["enhanced"] == "4.7.4" for r in failures), failures
        assert all("strict.example" not in rcpt for m in sink.received for rcpt in m.recipients)
        assert {r["site"] for r in delivered + failures} == {f"mx.hosting.example:{port}"}  # one site for limits


def test_a_domain_that_takes_no_mail_bounces_as_a_dns_failure_in_a_dsn_that_names_no_server(
    tmp_path: Path,
) -> None:
    # A null MX: Pigeon's own answer, so the DSN's Diagnostic-Code is not "smtp;" (no server
    # said it), and the bounce is a broken domain (DNSFailure), not a dead mailbox.
    port = free_port()
    zone = Zone(
        {
            "nomail.example": [("MX", 0, ".")],
            "example.org": [("MX", 10, "mx.example.org")],
            "mx.example.org": [("A", "127.0.0.5")],
        }
    )
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.5", port=port) as sink,
        _node(tmp_path, dns, port, dsn=True) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["x@nomail.example"], b"Subject: x\r\n\r\nhi\r\n")
        (bounce,) = wait_until(lambda: pigeon.records("Bounce"))
        assert bounce["classification"] == "DNSFailure"
        assert bounce["said_by"] == "pigeon"
        (dsn,) = sink.wait_for(1)
        assert dsn.recipients == ["a@example.org"]
        assert b"Diagnostic-Code: X-Pigeon; 556 5.1.10 nomail.example accepts no mail" in dsn.data
        assert b"Remote-MTA" not in dsn.data


def _samples(pigeon: PigeonProcess) -> dict[str, float]:
    _, body = pigeon.http_get("/metrics")
    lines = [line for line in body.decode().splitlines() if line.startswith("pigeon_")]
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines}


def test_a_domain_whose_every_mx_host_has_no_address_bounces_at_once_with_5_4_4_and_a_dsn(tmp_path: Path) -> None:
    # One MX host whose name does not exist (NXDOMAIN for A and AAAA), the other a name with
    # no address records (NODATA): DNS said for good that no host has an address. Postfix
    # bounces this ("5.4.4 Host or domain name not found"); a deferral would only wait for
    # max_age to say the same, days later.
    port = free_port()
    zone = Zone(
        {
            "nxmx.test": [("MX", 10, "nonexistent.nxmx.test"), ("MX", 20, "noaddress.nxmx.test")],
            "noaddress.nxmx.test": [("TXT", "a name, no address")],
            "example.org": [("MX", 10, "mx.example.org")],
            "mx.example.org": [("A", "127.0.0.6")],
        }
    )
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.6", port=port) as sink,
        _node(tmp_path, dns, port, dsn=True) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["y@nxmx.test", "z@nxmx.test"], b"Subject: x\r\n\r\nhi\r\n")
        bounces = wait_until(lambda: len(pigeon.records("Bounce")) == 2 and pigeon.records("Bounce"))
        assert sorted(b["recipient"] for b in bounces) == ["y@nxmx.test", "z@nxmx.test"]
        site = f"noaddress.nxmx.test,nonexistent.nxmx.test:{port}"
        for bounce in bounces:
            assert (bounce["response"]["code"], bounce["response"]["enhanced"]) == (550, "5.4.4"), bounce
            assert "nonexistent.nxmx.test" in bounce["response"]["text"], bounce
            assert "NXDOMAIN" in bounce["response"]["text"], bounce
            assert "noaddress.nxmx.test has no address record" in bounce["response"]["text"], bounce
            assert bounce["classification"] == "DNSFailure"
            assert bounce["said_by"] == "pigeon"
            assert bounce["site"] == site  # (the MX names are known: the site is)
            assert "peer" not in bounce  # (no host was connected to)
        assert not pigeon.records("TransientFailure")
        (dsn,) = sink.wait_for(1)
        assert dsn.recipients == ["a@example.org"]
        assert b"Diagnostic-Code: X-Pigeon; 550 5.4.4 " in dsn.data
        assert b"Remote-MTA" not in dsn.data
        samples = _samples(pigeon)
        assert samples[f'pigeon_site_recipients_total{{outcome="Bounce",site="{site}"}}'] == 2


def test_a_domain_with_an_mx_host_missing_and_another_failing_for_now_is_deferred(tmp_path: Path) -> None:
    # One host does not exist, but another's lookup failed (SERVFAIL) or it has an address
    # that does not answer: it may work later, so the mail waits (Postfix: 4.4.3, retried).
    port = free_port()
    zone = Zone(
        {
            "flaky-mx.test": [("MX", 10, "nonexistent.flaky-mx.test"), ("MX", 20, "flaky.flaky-mx.test")],
            "down-mx.test": [("MX", 10, "nonexistent.down-mx.test"), ("MX", 20, "down.down-mx.test")],
            "down.down-mx.test": [("A", "127.0.0.7")],  # nothing listens there
        },
        servfail={"flaky.flaky-mx.test", "servfail.test"},
    )
    # A route's next_hop that does not exist is the operator's to fix (Postfix's relayhost: deferred).
    route = [{"domain": "relayed.test", "next_hop": f"nonexistent.relay.test:{port}"}]
    with DnsServer(zone) as dns, _node(tmp_path, dns, port, route=route) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            for domain in ("flaky-mx.test", "down-mx.test", "servfail.test", "relayed.test"):
                client.sendmail("a@example.org", [f"z@{domain}"], b"Subject: x\r\n\r\nhi\r\n")

        def twice_each() -> list[dict[str, object]] | None:
            # (twice: retried, not bounced; the down site's mail once: it then waits for a probe)
            failures = pigeon.records("TransientFailure")
            twice = ("flaky-mx.test", "servfail.test", "relayed.test")
            counts = [sum(1 for r in failures if r["recipient"] == f"z@{d}") for d in twice]
            down = any(r["recipient"] == "z@down-mx.test" for r in failures)
            return failures if min(counts) >= 2 and down else None

        failures = wait_until(twice_each, timeout=30)
        assert not pigeon.records("Bounce")
        assert not _terminal(pigeon)
        flaky = [r for r in failures if r["recipient"] == "z@flaky-mx.test"]
        down = [r for r in failures if r["recipient"] == "z@down-mx.test"]
        servfail = [r for r in failures if r["recipient"] == "z@servfail.test"]
        assert {r["response"]["enhanced"] for r in flaky} == {"4.4.3"}, flaky
        assert all("flaky.flaky-mx.test" in r["response"]["text"] for r in flaky), flaky
        assert {r["response"]["enhanced"] for r in down} == {"4.4.1"}, down
        assert {r["response"]["enhanced"] for r in servfail} == {"4.4.3"}, servfail
        relayed = [r for r in failures if r["recipient"] == "z@relayed.test"]
        assert {r["response"]["enhanced"] for r in relayed} == {"4.4.3"}, relayed
        assert all("NXDOMAIN" in r["response"]["text"] for r in relayed), relayed
        # An MX host's lookup failing, for good or for now, is the site's (the MX names are
        # known, and so is the site); the domain's own MX lookup failing leaves no site at all.
        flaky_site = f"flaky.flaky-mx.test,nonexistent.flaky-mx.test:{port}"
        assert {r.get("site") for r in flaky} == {flaky_site}
        assert all("peer" not in r for r in flaky + servfail)
        assert all("site" not in r for r in servfail)
        samples = _samples(pigeon)
        assert samples[f'pigeon_site_recipients_total{{outcome="TransientFailure",site="{flaky_site}"}}'] >= 2
        assert samples['pigeon_site_recipients_total{outcome="TransientFailure",site="-"}'] >= 2


def test_a_domain_created_after_mail_to_it_bounced_as_nxdomain_gets_mail_once_its_negative_ttl_is_past(
    tmp_path: Path,
) -> None:
    # Found from outside: the NXDOMAIN was kept 60 seconds whatever the zone's SOA said, so a
    # domain made moments after mail to it bounced lost its mail for a minute. RFC 2308: the
    # negative answer is kept for the SOA's negative TTL (here 5 s, the least Pigeon keeps).
    port = free_port()
    zone = Zone(negative_ttl=5)
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.4", port=port) as sink,
        _node(tmp_path, dns, port) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["n0@neg2.test"], b"Subject: n0\r\n\r\nhi\r\n")
        (bounce,) = wait_until(lambda: _terminal(pigeon))
        assert bounce["type"] == "Bounce" and bounce["response"]["enhanced"] == "5.1.2", bounce
        zone.records["neg2.test"] = [("MX", 10, "mx.neg2.test")]
        zone.records["mx.neg2.test"] = [("A", "127.0.0.4")]

        def delivered() -> list[dict[str, object]] | None:
            # A message every second until one is delivered: none bounces once 5 s are past.
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("a@example.org", ["n1@neg2.test"], b"Subject: n1\r\n\r\nhi\r\n")
            return [r for r in _terminal(pigeon) if r["type"] == "Delivery"] or None

        wait_until(delivered, timeout=20, interval=1.0)
        mx_queries = [q for q in dns.zone.queries if q == ("neg2.test", "MX")]
        assert len(mx_queries) == 2, dns.zone.queries  # asked again once the 5 s were past, not before
        assert sink.received
