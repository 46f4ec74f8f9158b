"""MX routing against a DNS server of the test's own: preference order, backups, null MX, NXDOMAIN."""

from __future__ import annotations

import smtplib
from pathlib import Path

from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import ScriptedSink, wait_until


def _node(tmp_path: Path, dns: DnsServer, port: int) -> PigeonProcess:
    return PigeonProcess(
        tmp_path / "node",
        delivery={"enabled": True, "smtp_port": port, "retry_interval": "1s", "dsn": False, "tls": "disabled"},
        dns={"nameservers": [dns.endpoint], "timeout": "1s"},
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
