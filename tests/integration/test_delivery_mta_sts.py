"""MTA-STS (RFC 8461) on delivery by MX: a DNS server, an HTTPS policy server and SMTP sinks of
the test's own, on loopback, under a CA of the test's own (`[mta_sts] ca_file`)."""

from __future__ import annotations

import contextlib
import smtplib
import time
from pathlib import Path
from typing import Any

from pigeon.message import parse_id, shard_of
from tests.support.dns import DnsServer, Zone
from tests.support.mta_sts import PolicyServer, TestCa
from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import AnswerSink, ScriptedSink, wait_until

_ENFORCE = "version: STSv1\nmode: enforce\nmx: mx1.example.net\nmx: *.mail.example.net\nmax_age: 86400\n"


def _zone(*mx: tuple[int, str, str], record: str | None = "v=STSv1; id=1;") -> Zone:
    """example.net with its MX hosts (preference, name, address), its policy host on 127.0.0.1
    and, unless None, its `_mta-sts` TXT record."""
    records: dict[str, list[tuple[Any, ...]]] = {
        "example.net": [("MX", preference, name) for preference, name, _ in mx],
        "mta-sts.example.net": [("A", "127.0.0.1")],
    }
    for _, name, address in mx:
        records[name] = [("A", address)]
    if record is not None:
        records["_mta-sts.example.net"] = [("TXT", record)]
    return Zone(records)


def _node(tmp_path: Path, dns: DnsServer, port: int, ca: TestCa, policies: PolicyServer | None,
          delivery: dict[str, Any] | None = None, workers: int = 1, **mta_sts: Any) -> PigeonProcess:  # fmt: skip
    settings = {"enabled": True, "smtp_port": port, "retry_interval": "1h", "dsn": False, **(delivery or {})}
    https = {"https_port": policies.port} if policies is not None else {}
    node = {"node": {"workers": workers}} if workers != 1 else {}
    return PigeonProcess(
        tmp_path / "node",
        delivery=settings,
        dns={"nameservers": [dns.endpoint], "timeout": "1s"},
        mta_sts={"ca_file": str(ca.path), **https, **mta_sts},
        **node,
    )


def _send(pigeon: PigeonProcess, recipient: str = "ok@example.net") -> str:
    """The message sent; its spool id."""
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo()
        client.mail("a@example.org")
        client.rcpt(recipient)
        code, reply = client.data(b"Subject: sts\r\n\r\nhi\r\n")
    assert code == 250, reply
    return reply.decode().rsplit(" ", 1)[-1]


def _worker_of(spool_id: str) -> int:
    return shard_of(parse_id(spool_id))


def _send_until_each_worker_took(pigeon: PigeonProcess, least: dict[int, int]) -> list[str]:
    """Mail sent until worker n has taken at least `least[n]` of it (the workers share one
    listening socket: which takes a connection is the kernel's choice). Their ids."""
    ids: list[str] = []
    while any([_worker_of(i) for i in ids].count(n) < count for n, count in least.items()):
        assert len(ids) < 80, f"workers of the mail sent: {[_worker_of(i) for i in ids]}"
        ids.append(_send(pigeon))
    return ids


def test_an_enforced_policy_delivers_over_tls_verified_for_the_mx_host(tmp_path: Path) -> None:
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    with (
        DnsServer(_zone((10, "mx1.example.net", "127.0.0.2"))) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("mx1.example.net")) as sink,
        _node(tmp_path, dns, port, ca, policies) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert "certificate verified" in record["tls"] and record["tls"].endswith("MTA-STS enforce")
        assert len(sink.received) == 1
        assert policies.requests == ["mta-sts.example.net"]
        assert ("_mta-sts.example.net", "TXT") in dns.zone.queries
        assert pigeon.metric('pigeon_mta_sts_policies_total{outcome="fetched"}') == 1
        assert pigeon.metric('pigeon_mta_sts_policies_total{outcome="failed"}') == 0


def test_an_enforced_policy_allowing_no_mx_host_defers_and_never_delivers_there(tmp_path: Path) -> None:
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    with (
        DnsServer(_zone((10, "mx.elsewhere.example", "127.0.0.2"))) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("mx.elsewhere.example")) as sink,
        _node(tmp_path, dns, port, ca, policies) as pigeon,
    ):
        _send(pigeon)
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        assert failure["response"]["code"] == 451 and failure["response"]["enhanced"] == "4.7.0"
        text = failure["response"]["text"]
        assert "no MX host of example.net (mx.elsewhere.example) is allowed" in text
        assert "example.net's MTA-STS policy (id 1, mode enforce, mx mx1.example.net, *.mail.example.net)" in text
        assert not sink.received and not sink.rcpt_log
        assert "WARNING" in pigeon.stderr() and "example.net: mail deferred: MTA-STS" in pigeon.stderr()


def test_an_enforced_policy_skips_hosts_without_starttls_or_a_valid_certificate(tmp_path: Path) -> None:
    # mx1 has a certificate for another name, a.mail offers no STARTTLS, b.mail is right: all
    # three are allowed by the policy, and only b.mail may have the mail, whatever [delivery] tls
    # says (opportunistic, unverified: the default). other.example's only MX is a.mail: its
    # mail waits, and says why.
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    zone = _zone(
        (10, "mx1.example.net", "127.0.0.2"),
        (20, "a.mail.example.net", "127.0.0.3"),
        (30, "b.mail.example.net", "127.0.0.4"),
    )
    zone.records["other.example"] = [("MX", 10, "a.mail.example.net")]
    zone.records["_mta-sts.other.example"] = [("TXT", "v=STSv1; id=7;")]
    zone.records["mta-sts.other.example"] = [("A", "127.0.0.1")]
    served = {"mta-sts.example.net": _ENFORCE, "mta-sts.other.example": _ENFORCE}
    with (
        DnsServer(zone) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net", "mta-sts.other.example"), served) as policies,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("not-mx1.example.net")) as wrong_name,
        ScriptedSink(host="127.0.0.3", port=port) as plaintext,
        ScriptedSink(host="127.0.0.4", port=port, tls=ca.server_context("b.mail.example.net")) as right,
        _node(tmp_path, dns, port, ca, policies) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert record["peer"] == f"b.mail.example.net [127.0.0.4]:{port}"
        assert len(right.received) == 1
        assert not wrong_name.received and not plaintext.received
        _send(pigeon, "ok@other.example")
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"), timeout=60)
        assert failure["response"]["enhanced"] == "4.7.4"
        assert "required by other.example's MTA-STS policy (id 7" in failure["response"]["text"]
        assert not plaintext.received


def test_hosts_refused_for_the_policys_tls_use_none_of_the_session_limit(tmp_path: Path) -> None:
    # RFC 8461 5: a host refused for the policy's TLS "MUST NOT be used; mail delivery SHOULD
    # proceed to the next candidate". With the default mx_session_limit (2), MX 10 (no STARTTLS)
    # and MX 20 (a certificate for another name) must not end the attempt before MX 30.
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    zone = _zone(
        (10, "a.mail.example.net", "127.0.0.3"),
        (20, "mx1.example.net", "127.0.0.2"),
        (30, "b.mail.example.net", "127.0.0.4"),
    )
    with (
        DnsServer(zone) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        ScriptedSink(host="127.0.0.3", port=port) as plaintext,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("not-mx1.example.net")) as wrong_name,
        ScriptedSink(host="127.0.0.4", port=port, tls=ca.server_context("b.mail.example.net")) as right,
        _node(tmp_path, dns, port, ca, policies) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert record["peer"] == f"b.mail.example.net [127.0.0.4]:{port}"
        assert "certificate verified" in record["tls"]
        assert len(right.received) == 1
        assert not wrong_name.received and not plaintext.received
        assert not pigeon.records("TransientFailure")


def test_hosts_refused_for_the_policys_tls_are_tried_after_the_others_at_the_next_attempt(tmp_path: Path) -> None:
    # Six MX hosts the policy allows offer no STARTTLS, and the seventh is right. Each attempt
    # tries at most mx_address_limit (5) addresses: walking the same refused hosts first at
    # every retry, the mail was never delivered. The second attempt begins with the hosts not
    # refused (the sixth, then the seventh), and the refused ones are each connected to once.
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    bad = [(10 * n, f"h{n}.mail.example.net", f"127.0.0.{n + 1}") for n in range(1, 7)]
    zone = _zone(*bad, (70, "good.mail.example.net", "127.0.0.9"))
    with (
        DnsServer(zone) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        contextlib.ExitStack() as sinks,
        ScriptedSink(host="127.0.0.9", port=port, tls=ca.server_context("good.mail.example.net")) as good,
        _node(tmp_path, dns, port, ca, policies, {"retry_interval": "2s", "max_retry_interval": "2s"}) as pigeon,
    ):
        refused = [sinks.enter_context(ScriptedSink(host=address, port=port)) for _, _, address in bad]
        before = [len(sink.connections) for sink in refused]  # (the sink's own, as it starts)
        _send(pigeon)
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        assert "not all hosts tried ([delivery] mx_address_limit 5" in failure["response"]["text"]
        (record,) = wait_until(lambda: pigeon.records("Delivery"), timeout=30)
        assert record["peer"] == f"good.mail.example.net [127.0.0.9]:{port}"
        assert len(good.received) == 1
        assert [len(sink.connections) - n for sink, n in zip(refused, before, strict=True)] == [1] * 6
        assert not any(sink.received for sink in refused)


def test_hosts_injecting_plaintext_after_starttls_are_tried_after_the_others_at_the_next_attempt(
    tmp_path: Path,
) -> None:
    # MX 10 and MX 20 answer STARTTLS with "220" and a plaintext "250" in one write (CVE-2011-0411):
    # under the enforced policy, a TLS failure of each host, as a failed handshake is. With
    # mx_address_limit 2 the first attempt tries only them (and says so); they are remembered,
    # and the retry begins with MX 30. Nothing goes to them, in the clear or otherwise.
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    zone = _zone(
        (10, "a.mail.example.net", "127.0.0.3"),
        (20, "c.mail.example.net", "127.0.0.5"),
        (30, "b.mail.example.net", "127.0.0.4"),
    )
    injecting = {"STARTTLS": "220 2.0.0 go ahead\r\n250 2.0.0 injected"}
    delivery = {"retry_interval": "2s", "max_retry_interval": "2s", "mx_address_limit": 2}
    with (
        DnsServer(zone) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        AnswerSink(injecting, extensions=("STARTTLS",), host="127.0.0.3", port=port) as first,
        AnswerSink(injecting, extensions=("STARTTLS",), host="127.0.0.5", port=port) as second,
        ScriptedSink(host="127.0.0.4", port=port, tls=ca.server_context("b.mail.example.net")) as right,
        _node(tmp_path, dns, port, ca, policies, delivery) as pigeon,
    ):
        _send(pigeon)
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        text = failure["response"]["text"]
        assert "data after the 220 reply to STARTTLS" in text
        assert "required by example.net's MTA-STS policy (id 1" in text
        assert f"tried a.mail.example.net [127.0.0.3]:{port}, c.mail.example.net [127.0.0.5]:{port}" in text
        (record,) = wait_until(lambda: pigeon.records("Delivery"), timeout=30)
        assert record["peer"] == f"b.mail.example.net [127.0.0.4]:{port}"
        assert len(right.received) == 1
        assert [len(first.sessions), len(second.sessions)] == [1, 1]  # (not again at the retry)
        assert not first.contents and not second.contents
        assert all(session[-1] == "STARTTLS" for session in first.sessions + second.sessions)


def test_a_deferral_when_every_host_fails_the_policys_tls_names_each_host_tried(tmp_path: Path) -> None:
    # No STARTTLS, a certificate for another name, plaintext after the 220 to STARTTLS: the
    # deferral says the last host's reason, and that the other two were tried.
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    zone = _zone(
        (10, "a.mail.example.net", "127.0.0.3"),
        (20, "mx1.example.net", "127.0.0.2"),
        (30, "c.mail.example.net", "127.0.0.5"),
    )
    injecting = {"STARTTLS": "220 2.0.0 go ahead\r\n250 2.0.0 injected"}
    with (
        DnsServer(zone) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        ScriptedSink(host="127.0.0.3", port=port) as plaintext,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("not-mx1.example.net")) as wrong_name,
        AnswerSink(injecting, extensions=("STARTTLS",), host="127.0.0.5", port=port) as injected,
        _node(tmp_path, dns, port, ca, policies) as pigeon,
    ):
        _send(pigeon)
        (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
        text = failure["response"]["text"]
        assert text.startswith(f"c.mail.example.net [127.0.0.5]:{port} broke the protocol: data after the 220"), text
        tried = [f"a.mail.example.net [127.0.0.3]:{port}", f"mx1.example.net [127.0.0.2]:{port}"]
        assert text.endswith(f"; tried {', '.join(tried)}, c.mail.example.net [127.0.0.5]:{port}"), text
        assert not plaintext.received and not wrong_name.received and not injected.contents


def test_a_testing_policy_delivers_as_without_it_and_warns(tmp_path: Path) -> None:
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    testing = _ENFORCE.replace("enforce", "testing")
    with (
        DnsServer(_zone((10, "mx1.example.net", "127.0.0.2"))) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": testing}) as policies,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("wrong.example.net")) as sink,
        _node(tmp_path, dns, port, ca, policies) as pigeon,
    ):
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert len(sink.received) == 1
        assert "certificate not verified" in record["tls"] and record["tls"].endswith("MTA-STS testing")
        stderr = pigeon.stderr()
        assert "example.net: MTA-STS testing: delivering to mx1.example.net [127.0.0.2]" in stderr
        assert "gave no TLS with a certificate valid for its name" in stderr


def test_a_testing_policy_warns_of_the_unverified_fallback_once_not_at_each_connection(tmp_path: Path) -> None:
    # Found from outside: each new connection to an MX whose certificate does not verify logged
    # "...; trying again on TLS without verifying the certificate" as a WARNING.
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    testing = _ENFORCE.replace("enforce", "testing")
    with (
        DnsServer(_zone((10, "mx1.example.net", "127.0.0.2"))) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": testing}) as policies,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("wrong.example.net")) as sink,
        _node(tmp_path, dns, port, ca, policies, {"max_deliveries_per_connection": 1}) as pigeon,
    ):
        for sent in range(1, 4):  # one after the other: each on a connection of its own
            _send(pigeon)
            pigeon.wait_records("Delivery", sent)  # (written a moment after the sink's 250)
        assert len(sink.received) == 3
        said = [line for line in pigeon.stderr().splitlines() if "trying again on TLS without verifying" in line]
        assert len(said) == 3  # one a connection ...
        assert [" WARNING " in line for line in said] == [True, False, False]  # ... a WARNING once


def test_a_policy_fetched_before_a_restart_is_enforced_while_its_server_is_down(tmp_path: Path) -> None:
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    with (
        DnsServer(_zone((10, "mx1.example.net", "127.0.0.2"))) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("mx1.example.net")) as allowed,
        ScriptedSink(host="127.0.0.3", port=port, tls=ca.server_context("mx.elsewhere.example")) as other,
    ):
        policies = PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE})
        with policies, _node(tmp_path, dns, port, ca, policies) as pigeon:
            _send(pigeon)
            wait_until(lambda: pigeon.records("Delivery"))
        # The policy server is gone, the MX now names a host the policy does not allow, and the
        # record a new id: the policy cannot be fetched again, and the one kept stands.
        dns.zone.records["example.net"] = [("MX", 10, "mx.elsewhere.example")]
        dns.zone.records["mx.elsewhere.example"] = [("A", "127.0.0.3")]
        dns.zone.records["_mta-sts.example.net"] = [("TXT", "v=STSv1; id=2;")]
        with pigeon:
            _send(pigeon)
            (failure,) = wait_until(lambda: pigeon.records("TransientFailure"))
            assert failure["response"]["enhanced"] == "4.7.0"
            assert "(id 1, mode enforce" in failure["response"]["text"]
            assert "its MTA-STS policy (id 2) could not be had" in pigeon.stderr()
            assert pigeon.metric('pigeon_mta_sts_policies_total{outcome="kept"}') == 1
            assert pigeon.metric('pigeon_mta_sts_policies_total{outcome="failed"}') == 0
        assert len(allowed.received) == 1 and not other.received


def test_a_domain_without_a_record_is_delivered_as_before_without_fetching(tmp_path: Path) -> None:
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    with (
        DnsServer(_zone((10, "mx1.example.net", "127.0.0.2"), record=None)) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        ScriptedSink(host="127.0.0.2", port=port) as sink,
        _node(tmp_path, dns, port, ca, policies) as pigeon,
    ):
        started = time.monotonic()
        _send(pigeon)
        (record,) = wait_until(lambda: pigeon.records("Delivery"))
        assert time.monotonic() - started < 5
        assert "tls" not in record  # the sink offers no STARTTLS: plaintext, as without MTA-STS
        assert len(sink.received) == 1
        assert ("_mta-sts.example.net", "TXT") in dns.zone.queries  # asked, NXDOMAIN...
        assert policies.requests == []  # ... so nothing fetched


def test_a_dns_server_that_never_answers_txt_does_not_hold_delivery_past_its_timeout(tmp_path: Path) -> None:
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    zone = _zone((10, "mx1.example.net", "127.0.0.2"))
    zone.delays["_mta-sts.example.net"] = (30.0, 30.0)  # the TXT question is never answered in time
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port) as sink,
        _node(tmp_path, dns, port, ca, None) as pigeon,
    ):
        started = time.monotonic()
        _send(pigeon)
        wait_until(lambda: pigeon.records("Delivery"), timeout=20)
        assert time.monotonic() - started < 10  # [dns] timeout 1s, not the 30 s the server takes
        _send(pigeon)
        wait_until(lambda: len(pigeon.records("Delivery")) == 2, timeout=20)
        assert len(sink.received) == 2
        assert dns.zone.queries.count(("_mta-sts.example.net", "TXT")) == 1  # the failure is remembered


def test_a_policy_one_worker_fetched_is_enforced_by_the_other_when_the_record_is_stripped(tmp_path: Path) -> None:
    # Found from outside ([node] workers = 2, HIGH): once the _mta-sts TXT record was stripped
    # (an attacker on the DNS path, who also named an MX of its own), the worker that had never
    # fetched the policy took the domain as having none and sent its share of the mail to the
    # attacker's host, although its sibling held the enforced policy in memory and in its file.
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    zone = _zone((10, "mx1.example.net", "127.0.0.2"))
    zone.ttl = 1  # (the resolver keeps answers 5 s at least)
    with (
        DnsServer(zone) as dns,
        PolicyServer(ca.server_context("mta-sts.example.net"), {"mta-sts.example.net": _ENFORCE}) as policies,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("mx1.example.net")) as allowed,
        ScriptedSink(host="127.0.0.3", port=port, tls=ca.server_context("mx.attacker.example")) as attacker,
        _node(tmp_path, dns, port, ca, policies, workers=2) as pigeon,
    ):
        fetcher = _worker_of(_send(pigeon))
        wait_until(lambda: pigeon.records("Delivery"))
        assert policies.requests == ["mta-sts.example.net"]  # one worker fetched it; the other has seen no mail
        del dns.zone.records["_mta-sts.example.net"]
        dns.zone.records["example.net"] = [("MX", 5, "mx.attacker.example"), ("MX", 10, "mx1.example.net")]
        dns.zone.records["mx.attacker.example"] = [("A", "127.0.0.3")]
        sent = 1 + len(_send_until_each_worker_took(pigeon, {1 - fetcher: 3}))
        delivered = pigeon.wait_records("Delivery", sent, timeout=30)
        assert {r["peer"] for r in delivered} == {f"mx1.example.net [127.0.0.2]:{port}"}
        assert {_worker_of(r["id"]) for r in delivered} == {0, 1}
        assert len(allowed.received) == sent and not attacker.received and not attacker.rcpt_log
        assert policies.requests == ["mta-sts.example.net"]


def test_a_new_policy_one_worker_fetched_is_enforced_by_the_other_while_its_server_is_down(tmp_path: Path) -> None:
    # Found from outside ([node] workers = 2, MEDIUM): one worker fetched the domain's new
    # policy (id 2), which drops mx1; the other kept id 1 and, the policy server down, went on
    # sending to mx1, which the domain's policy no longer allows.
    ca = TestCa(tmp_path / "ca")
    port = free_port()
    both = "version: STSv1\nmode: enforce\nmx: mx1.example.net\nmx: mx2.example.net\nmax_age: 86400\n"
    mx2_only = "version: STSv1\nmode: enforce\nmx: mx2.example.net\nmax_age: 86400\n"
    zone = _zone((10, "mx1.example.net", "127.0.0.2"), (20, "mx2.example.net", "127.0.0.4"))
    zone.ttl = 1  # (the resolver keeps answers 5 s at least)
    served = {"mta-sts.example.net": both}
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.2", port=port, tls=ca.server_context("mx1.example.net")) as mx1,
        ScriptedSink(host="127.0.0.4", port=port, tls=ca.server_context("mx2.example.net")) as mx2,
    ):
        policies = PolicyServer(ca.server_context("mta-sts.example.net"), served)
        with policies, _node(tmp_path, dns, port, ca, policies, workers=2) as pigeon:
            first = _send_until_each_worker_took(pigeon, {0: 1, 1: 1})  # both hold id 1
            pigeon.wait_records("Delivery", len(first), timeout=30)
            assert len(mx1.received) == len(first) and not mx2.received
            dns.zone.records["_mta-sts.example.net"] = [("TXT", "v=STSv1; id=2;")]
            served["mta-sts.example.net"] = mx2_only
            time.sleep(6)  # (the record as both workers' resolvers had it runs out)
            fetcher = _worker_of(_send(pigeon))  # this one fetches id 2 ...
            pigeon.wait_records("Delivery", len(first) + 1, timeout=30)
            assert len(mx2.received) == 1
            policies.stop()  # ... and the policy server goes down
            later = _send_until_each_worker_took(pigeon, {1 - fetcher: 3})
            delivered = pigeon.wait_records("Delivery", len(first) + 1 + len(later), timeout=30)
            peers = {r["peer"] for r in delivered if parse_id(r["id"]) not in {parse_id(i) for i in first}}
            assert peers == {f"mx2.example.net [127.0.0.4]:{port}"}
            assert len(mx1.received) == len(first) and len(mx2.received) == 1 + len(later)
            assert not pigeon.records("TransientFailure")
            assert "could not be had" not in pigeon.stderr()  # the other worker took id 2 from its sibling
