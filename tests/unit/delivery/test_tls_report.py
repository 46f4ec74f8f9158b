"""SMTP TLS Reporting (RFC 8460), the pure part: the TXT record, the result types, the counts."""

from __future__ import annotations

from pigeon.delivery.mta_sts import Applied, parse_policy
from pigeon.delivery.tls_report import Counts, classify, parse_record, report, sts_policy, summed


def test_a_record_names_its_mailto_and_https_uris_and_nothing_else() -> None:
    text = "v=TLSRPTv1; rua=mailto:tls@example.net, https://r.example.net/v1 ,ftp://no.example"
    assert parse_record([text, "v=spf1 -all"]) == ["mailto:tls@example.net", "https://r.example.net/v1"]


def test_no_record_two_records_or_one_without_rua_is_nowhere_to_report() -> None:
    assert parse_record([]) == []
    assert parse_record(["v=TLSRPTv1; rua=mailto:a@x.example", "v=TLSRPTv1; rua=mailto:b@x.example"]) == []
    assert parse_record(["v=TLSRPTv1;"]) == []
    assert parse_record(["v=TLSRPTv10; rua=mailto:a@x.example"]) == []


def test_tls_failures_map_onto_the_rfc_8460_result_types() -> None:
    assert classify("tls-not-offered", "", dane=False) == "starttls-not-supported"
    assert classify("tls-refused", "454 4.7.0 TLS not available", dane=False) == "starttls-not-supported"
    expired = "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: certificate has expired (_ssl.c:1006)"
    assert classify("tls-failed", expired, dane=False) == "certificate-expired"
    mismatch = "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, certificate is not valid"
    assert classify("tls-failed", mismatch, dane=False) == "certificate-host-mismatch"
    unknown = "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate"
    assert classify("tls-failed", unknown, dane=False) == "certificate-not-trusted"
    no_match = "DANE: no TLSA record of _25._tcp.mx.example.net matches the certificate"
    assert classify("tls-failed", no_match, dane=True) == "certificate-not-trusted"
    assert classify("tls-failed", "connection reset by the server", dane=False) == "validation-failure"
    # STARTTLS offered and accepted, then plaintext after its 220: no certificate was at fault.
    injected = "data after the 220 reply to STARTTLS, before the TLS handshake: 250 certificate has expired"
    assert classify("tls-injected", injected, dane=False) == "validation-failure"


def test_two_workers_counts_sum_into_one_report_with_its_failure_details() -> None:
    applied = Applied(
        "example.net", parse_policy("version: STSv1\nmode: enforce\nmx: mx.example.net\nmax_age: 60\n"), "1"
    )
    first, second = Counts(), Counts()
    for counts in (first, second):
        counts.success("example.net", sts_policy(applied))
        counts.failure("example.net", sts_policy(applied), "starttls-not-supported", sending_ip="192.0.2.1",
                       mx_host="MX.example.net.", receiving_ip="198.51.100.1")  # fmt: skip
    domains = summed([first.take(), second.take()])
    assert not first and not second
    body = report("example.net", domains["example.net"], start=0, end=86400, organization="o", contact="c",
                  report_id="id")  # fmt: skip
    assert body["date-range"] == {"start-datetime": "1970-01-01T00:00:00Z", "end-datetime": "1970-01-01T23:59:59Z"}
    (policy,) = body["policies"]
    assert policy["policy"]["policy-string"] == ["version: STSv1", "mode: enforce", "mx: mx.example.net", "max_age: 60"]
    assert policy["summary"] == {"total-successful-session-count": 2, "total-failure-session-count": 2}
    assert policy["failure-details"] == [
        {
            "result-type": "starttls-not-supported",
            "sending-mta-ip": "192.0.2.1",
            "receiving-mx-hostname": "mx.example.net",
            "receiving-ip": "198.51.100.1",
            "failed-session-count": 2,
        }
    ]
