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
