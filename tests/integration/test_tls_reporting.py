"""SMTP TLS Reporting (RFC 8460): sessions under example.net's MTA-STS policy counted, and the
report sent where its `_smtp._tls` TXT record says, by HTTPS and by mail, each through real
sockets: a DNS server, the policy's HTTPS server, a report endpoint and SMTP sinks of the
test's own, on loopback, under a CA of the test's own."""

from __future__ import annotations

import base64
import email
import email.policy
import gzip
import json
import smtplib
import time
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from pigeon.dkim.keys import generate_key, record_text, write_key
from pigeon.message import parse_id, shard_of
from tests.support.dane import self_signed
from tests.support.dkim import dkimpy_verify
from tests.support.dns import DnsServer, Zone
from tests.support.mta_sts import PolicyServer, ReportServer, TestCa
from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import AnswerSink, ScriptedSink, wait_until

_ENFORCE = "version: STSv1\nmode: enforce\nmx: *.mail.example.net\nmx: mx1.example.net\nmax_age: 86400\n"
_STRINGS = ["version: STSv1", "mode: enforce", "mx: *.mail.example.net", "mx: mx1.example.net", "max_age: 86400"]


def _zone(rua: str) -> Zone:
    """example.net: MX 10 a.mail (no STARTTLS), MX 20 b.mail (a certificate for another name),
    MX 30 mx1 (right); its policy, and its TLS reporting record naming `rua`. reports.example:
    where mailed reports go (127.0.0.5)."""
    return Zone(
        {
            "example.net": [
                ("MX", 10, "a.mail.example.net"),
                ("MX", 20, "b.mail.example.net"),
                ("MX", 30, "mx1.example.net"),
            ],
            "a.mail.example.net": [("A", "127.0.0.3")],
            "b.mail.example.net": [("A", "127.0.0.4")],
            "mx1.example.net": [("A", "127.0.0.2")],
            "mta-sts.example.net": [("A", "127.0.0.1")],
            "_mta-sts.example.net": [("TXT", "v=STSv1; id=1;")],
            "_smtp._tls.example.net": [("TXT", f"v=TLSRPTv1; rua={rua}")],
            "tlsrpt.example.net": [("A", "127.0.0.1")],
            "reports.example": [("MX", 10, "mx.reports.example")],
            "mx.reports.example": [("A", "127.0.0.5")],
        }
    )


def _node(
    tmp_path: Path, dns: DnsServer, port: int, ca: TestCa, policies: PolicyServer | None, **more: Any
) -> PigeonProcess:
    return PigeonProcess(
        tmp_path / "node",
        node={"name": "n1", **more.pop("node", {})},
        delivery={"enabled": True, "smtp_port": port, "retry_interval": "1h", "dsn": False},
        dns={"nameservers": [dns.endpoint], "timeout": "1s"},
        mta_sts={"ca_file": str(ca.path), "https_port": policies.port} if policies else {"enabled": False},
        tls_rpt={
            "enabled": True,
            "interval": "2s",
            "organization_name": "Pigeon Test",
            "contact_info": "postmaster@sender.example",
            "report_sender": "tlsrpt@sender.example",
            "ca_file": str(ca.path),
        },
        **more,
    )


def _send(pigeon: PigeonProcess) -> str:
    """The message sent; its spool id."""
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo()
        client.mail("a@example.org")
        client.rcpt("ok@example.net")
        code, reply = client.data(b"Subject: rpt\r\n\r\nhi\r\n")
    assert code == 250, reply
    return reply.decode().rsplit(" ", 1)[-1]


def _totals(reports: list[dict[str, Any]]) -> tuple[int, dict[tuple[str, str, str], int]]:
    """Successes, and failures by (result type, MX host, address), over `reports`."""
    successes = 0
    failures: dict[tuple[str, str, str], int] = {}
    for report in reports:
        for policy in report["policies"]:
            successes += policy["summary"]["total-successful-session-count"]
            for detail in policy["failure-details"]:
                key = (detail["result-type"], detail["receiving-mx-hostname"], detail["receiving-ip"])
                failures[key] = failures.get(key, 0) + detail["failed-session-count"]
    return successes, failures


_EXPECTED_FAILURES = {
    ("starttls-not-supported", "a.mail.example.net", "127.0.0.3"): 1,
    ("certificate-host-mismatch", "b.mail.example.net", "127.0.0.4"): 1,
}


# CVE-2011-0411: the 220 to STARTTLS and a plaintext reply in the same write.
_INJECTING = {"STARTTLS": "220 2.0.0 go ahead\r\n250 2.0.0 injected"}


def test_hosts_injecting_plaintext_after_starttls_are_reported_and_passed_over_for_the_next(tmp_path: Path) -> None:
    # a.mail and b.mail both answer STARTTLS with plaintext after the 220: under the enforced
    # policy each is a TLS failure of its host (validation-failure), passed over without using
    # mx_session_limit (2), and mx1 has the mail at the first attempt. Never in the clear.
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    with (
        ReportServer(ca.server_context("tlsrpt.example.net")) as endpoint,
        DnsServer(_zone(f"https://tlsrpt.example.net:{endpoint.port}/v1/report")) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        AnswerSink(_INJECTING, extensions=("STARTTLS",), host="127.0.0.3", port=port) as first,
        AnswerSink(_INJECTING, extensions=("STARTTLS",), host="127.0.0.4", port=port) as second,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("mx1.example.net")) as right,
        _node(tmp_path, dns, port, ca, policies) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert record["peer"] == f"mx1.example.net [127.0.0.2]:{port}"
        assert len(right.received) == 1
        assert not pigeon.records("TransientFailure")
        assert [session[-1] for session in first.sessions + second.sessions] == ["STARTTLS", "STARTTLS"]
        assert not first.contents and not second.contents

        def reports() -> list[dict[str, Any]]:
            return [json.loads(gzip.decompress(body)) for _, _, body in endpoint.reports]

        expected = {
            ("validation-failure", "a.mail.example.net", "127.0.0.3"): 1,
            ("validation-failure", "b.mail.example.net", "127.0.0.4"): 1,
        }
        wait_until(lambda: _totals(reports()) == (1, expected), timeout=20)
        reasons = [
            detail["failure-reason-code"]
            for report in reports()
            for policy in report["policies"]
            for detail in policy["failure-details"]
        ]
        assert all("data after the 220 reply to STARTTLS" in reason for reason in reasons), reasons


def test_sessions_under_a_policy_are_reported_by_https_post_once_per_interval(tmp_path: Path) -> None:
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    with (
        ReportServer(ca.server_context("tlsrpt.example.net")) as endpoint,
        DnsServer(_zone(f"https://tlsrpt.example.net:{endpoint.port}/v1/report")) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        ScriptedSink(host="127.0.0.3", port=port) as plaintext,
        ScriptedSink(host="127.0.0.4", port=port, tls=ca.server_context("not-b.mail.example.net")) as wrong_name,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("mx1.example.net")) as right,
        _node(tmp_path, dns, port, ca, policies) as pigeon,
    ):
        _send(pigeon)
        wait_until(lambda: pigeon.records("Delivery"))
        assert len(right.received) == 1 and not plaintext.received and not wrong_name.received

        def reports() -> list[dict[str, Any]]:
            return [json.loads(gzip.decompress(body)) for _, _, body in endpoint.reports]

        wait_until(lambda: _totals(reports()) == (1, _EXPECTED_FAILURES), timeout=20)
        time.sleep(4.5)  # two more intervals: nothing more is sent (no traffic, nothing twice)
        received = reports()
        assert _totals(received) == (1, _EXPECTED_FAILURES)
        assert {path for path, _, _ in endpoint.reports} == {"/v1/report"}
        assert {kind for _, kind, _ in endpoint.reports} == {"application/tlsrpt+gzip"}
        ids = [report["report-id"] for report in received]
        assert len(ids) == len(set(ids))  # (the session may straddle two intervals: a report each)
        for report in received:
            assert report["organization-name"] == "Pigeon Test"
            assert report["contact-info"] == "postmaster@sender.example"
            assert ".n1.example.net@sender.example" in report["report-id"]
            dates = report["date-range"]
            assert dates["start-datetime"].endswith("Z") and dates["end-datetime"] > dates["start-datetime"]
            (policy,) = report["policies"]
            assert policy["policy"] == {
                "policy-type": "sts",
                "policy-string": _STRINGS,
                "policy-domain": "example.net",
                "mx-host": ["*.mail.example.net", "mx1.example.net"],
            }
            for detail in policy["failure-details"]:
                assert detail["sending-mta-ip"].startswith("127.")
        wrong = [d for r in received for p in r["policies"] for d in p["failure-details"]
                 if d["result-type"] == "certificate-host-mismatch"]  # fmt: skip
        assert "Hostname mismatch" in wrong[0]["failure-reason-code"]


def test_a_mailto_report_is_queued_as_a_multipart_report_and_delivered(tmp_path: Path) -> None:
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    key = generate_key("ed25519-sha256")
    write_key(tmp_path / "key.pem", key)
    dkim = {"domain": "sender.example", "selector": "rpt", "private_key": str(tmp_path / "key.pem"),
            "algorithm": "ed25519-sha256"}  # fmt: skip
    zone = _zone("mailto:ok@reports.example")
    zone.records["rpt._domainkey.sender.example"] = [("TXT", record_text(key))]
    with (
        DnsServer(zone) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        ScriptedSink(host="127.0.0.3", port=port),
        ScriptedSink(host="127.0.0.4", port=port, tls=ca.server_context("not-b.mail.example.net")),
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("mx1.example.net")),
        ScriptedSink(host="127.0.0.5", port=port) as reports_sink,
        _node(tmp_path, dns, port, ca, policies, dkim=[dkim]) as pigeon,
    ):
        _send(pigeon)

        def reports() -> list[dict[str, Any]]:
            return [json.loads(gzip.decompress(_attachment(m.data)[1])) for m in reports_sink.received]

        wait_until(lambda: _totals(reports()) == (1, _EXPECTED_FAILURES), timeout=20)
        first = reports_sink.received[0]
        assert first.sender == "tlsrpt@sender.example" and first.recipients == ["ok@reports.example"]
        message = email.message_from_bytes(first.data, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        assert message.get_content_type() == "multipart/report"
        assert message.get_param("report-type") == "tlsrpt"
        assert message["TLS-Report-Domain"] == "example.net"
        assert message["TLS-Report-Submitter"] == "sender.example"
        assert message["From"] == "tlsrpt@sender.example"
        report_id = reports()[0]["report-id"]
        subject = " ".join(message["Subject"].split())
        assert subject == f"Report Domain: example.net Submitter: sender.example Report-ID: <{report_id}>"
        text, attachment = message.get_payload()  # type: ignore[misc]
        assert text.get_content_type() == "text/plain"
        # The text says the interval as the JSON does (it said 17:37:00Z where the JSON ends 17:36:59Z).
        dates = reports()[0]["date-range"]
        assert f"from {dates['start-datetime']} to {dates['end-datetime']}:" in text.get_content()
        assert attachment.get_content_type() == "application/tlsrpt+gzip"
        filename = attachment.get_filename()
        assert filename.startswith("sender.example!example.net!") and filename.endswith("!n1.json.gz")
        signature = message["DKIM-Signature"]
        assert signature is not None and "d=sender.example" in signature and "s=rpt" in signature
        assert dkimpy_verify(first.data, dns) == [True]
        time.sleep(4.5)
        assert len({r["report-id"] for r in reports()}) == len(reports_sink.received)  # (none twice)


def _attachment(data: bytes) -> tuple[str, bytes]:
    """The report part of a mailed report: its Content-Type and its decoded bytes."""
    message = email.message_from_bytes(data, policy=email.policy.default)
    for part in message.walk():
        if part.get_content_type() == "application/tlsrpt+gzip":
            return part.get_content_type(), base64.b64decode(part.get_payload())
    raise AssertionError("no application/tlsrpt+gzip part")


def test_each_interval_is_one_report_per_domain_whichever_worker_delivered(tmp_path: Path) -> None:
    # Two workers each deliver some of the mail (each opening its own sessions): their counts
    # are summed into one report per interval, never one per worker.
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    with (
        ReportServer(ca.server_context("tlsrpt.example.net")) as endpoint,
        DnsServer(_zone(f"https://tlsrpt.example.net:{endpoint.port}/")) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        ScriptedSink(host="127.0.0.3", port=port),
        ScriptedSink(host="127.0.0.4", port=port, tls=ca.server_context("not-b.mail.example.net")),
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("mx1.example.net")) as right,
        _node(tmp_path, dns, port, ca, policies, node={"workers": 2}) as pigeon,
    ):
        workers: set[int] = set()
        sent = 0
        while workers != {0, 1}:
            assert sent < 40
            sent += 1
            workers.add(shard_of(parse_id(_send(pigeon))))
        wait_until(lambda: len(right.received) == sent == len(pigeon.records("Delivery")))

        def reports() -> list[dict[str, Any]]:
            return [json.loads(gzip.decompress(body)) for _, _, body in endpoint.reports]

        delivered = len(pigeon.records("Delivery"))
        wait_until(lambda: _totals(reports())[0] >= delivered, timeout=20)
        time.sleep(4.5)
        received = reports()
        ids = [r["report-id"] for r in received]
        assert len(ids) == len(set(ids))
        starts = [r["date-range"]["start-datetime"] for r in received]
        assert len(starts) == len(set(starts))  # (one report per interval, not one per worker)
        successes, failures = _totals(received)
        assert successes == delivered  # (a session per message: each worker's first, or none reused)
        assert sum(failures.values()) >= 2


def test_dane_sessions_are_reported_under_the_tlsa_records_of_each_mx_host(tmp_path: Path) -> None:
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    good, bad = self_signed("mx2.example.net"), self_signed("mx1.example.net")
    published = self_signed("mx1.example.net").tlsa(3, 1, 1)
    with ReportServer(ca.server_context("tlsrpt.example.net")) as endpoint:
        zone = Zone(
            {
                "example.net": [("MX", 10, "mx1.example.net"), ("MX", 20, "mx2.example.net")],
                "mx1.example.net": [("A", "127.0.0.2")],
                "mx2.example.net": [("A", "127.0.0.3")],
                f"_{port}._tcp.mx1.example.net": [("TLSA", *published)],
                f"_{port}._tcp.mx2.example.net": [("TLSA", *good.tlsa(3, 1, 1))],
                "_smtp._tls.example.net": [("TXT", f"v=TLSRPTv1;rua=https://tlsrpt.example.net:{endpoint.port}/")],
                "tlsrpt.example.net": [("A", "127.0.0.1")],
            },
            secure={"example.net"},
        )
        with (
            DnsServer(zone) as dns,
            ScriptedSink(host="127.0.0.2", port=port, tls=bad.context(tmp_path / "certs")),
            ScriptedSink(host="127.0.0.3", port=port, tls=good.context(tmp_path / "certs")) as matching,
            _node(tmp_path, dns, port, ca, None, dane={"enabled": True}) as pigeon,
        ):
            _send(pigeon)
            wait_until(lambda: len(matching.received) == 1)

            def reports() -> list[dict[str, Any]]:
                return [json.loads(gzip.decompress(body)) for _, _, body in endpoint.reports]

            expected = {("certificate-not-trusted", "mx1.example.net", "127.0.0.2"): 1}
            wait_until(lambda: _totals(reports()) == (1, expected), timeout=20)
            policies = {
                (p["policy"]["policy-type"], tuple(p["policy"]["policy-string"]), p["policy"]["policy-domain"])
                for r in reports()
                for p in r["policies"]
            }
            assert policies == {
                ("tlsa", (f"3 1 1 {published[3].hex().upper()}",), "example.net"),
                ("tlsa", (f"3 1 1 {good.tlsa(3, 1, 1)[3].hex().upper()}",), "example.net"),
            }
            assert all("mx-host" not in p["policy"] for r in reports() for p in r["policies"])
