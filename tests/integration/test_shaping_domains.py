"""Domains that share MX hosts: a [[shaping]] block for one of them limits that one alone."""

from __future__ import annotations

import collections
import signal
import smtplib
import time
from pathlib import Path
from typing import Any

from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess, free_port, to_toml
from tests.support.sinks import Received, ScriptedSink, wait_until

PER_DOMAIN = 8
SHARED_MX = "mx.shared.test"


def _zone() -> Zone:
    # Two recipient domains hosted together: one site, which used to mean one ready queue.
    return Zone(
        {
            "limited.test": [("MX", 10, SHARED_MX)],
            "free.test": [("MX", 10, SHARED_MX)],
            SHARED_MX: [("A", "127.0.0.1")],
        }
    )


def _pigeon(root: Path, port: int, dns: DnsServer, shaping: list[dict[str, Any]]) -> PigeonProcess:
    return PigeonProcess(
        root,
        delivery={"enabled": True, "smtp_port": port, "dsn": False, "tls": "disabled", "idle_timeout": "1s"},
        dns={"nameservers": [dns.endpoint], "timeout": "1s"},
        shaping=shaping,
    )


def _send(pigeon: PigeonProcess, domains: tuple[str, ...]) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        for n in range(PER_DOMAIN):
            for domain in domains:
                body = f"Message-ID: <{n}.{domain}@pigeon.test>\r\nSubject: {n}\r\n\r\nhi\r\n"
                client.sendmail("a@example.org", [f"user@{domain}"], body.encode())


def _copies(received: list[Received]) -> collections.Counter[tuple[str, str]]:
    """How many times each (Message-ID, recipient) reached the sink."""
    return collections.Counter((r.email["Message-ID"], rcpt) for r in received for rcpt in r.recipients)


def _arrivals(sink: ScriptedSink, domain: str) -> list[float]:
    return [a.at for r, a in zip(sink.received, sink.arrivals, strict=True) if r.recipients[0].endswith(domain)]


def _ready(pigeon: PigeonProcess) -> list[dict[str, Any]]:
    status, answer = pigeon.http_call("GET", "/api/v1/queues", token=pigeon.local_token)
    assert status == 200, answer
    rows: list[dict[str, Any]] = answer["ready"]
    return rows


def _reload(pigeon: PigeonProcess, shaping: list[dict[str, Any]]) -> None:
    pigeon.config["shaping"] = shaping
    pigeon.config_path.write_text(to_toml(pigeon.config))
    assert pigeon.process is not None
    before = pigeon.stderr().count("reloaded:")
    pigeon.process.send_signal(signal.SIGHUP)
    wait_until(lambda: pigeon.stderr().count("reloaded:") > before, timeout=10)


def test_a_rate_limit_for_one_domain_throttles_it_alone_in_a_queue_of_its_own(tmp_path: Path) -> None:
    port = free_port()
    limited = [{"domain": "limited.test", "max_message_rate": "2/s"}]
    with (
        DnsServer(_zone()) as dns,
        ScriptedSink(port=port) as sink,
        _pigeon(tmp_path / "node", port, dns, limited) as pigeon,
    ):
        _send(pigeon, ("limited.test", "free.test"))
        # While the limited domain's mail trickles out, the API shows the two queues apart.
        rows = wait_until(lambda: [r for r in _ready(pigeon) if r["domain"] == "limited.test"], timeout=10)
        assert rows[0]["path"] == f"default->limited.test@{SHARED_MX}:{port} (tls disabled)"
        assert [r["domain"] for r in _ready(pigeon) if r["path"] == f"default->{SHARED_MX}:{port} (tls disabled)"] in (
            [None],
            [],  # (free.test's mail may all be out already)
        )
        assert rows[0]["site"] == f"{SHARED_MX}:{port}"
        wait_until(lambda: len(_arrivals(sink, "free.test")) == PER_DOMAIN, timeout=10)
        sink.wait_for(2 * PER_DOMAIN, timeout=30)
        deliveries = pigeon.wait_records("Delivery", 2 * PER_DOMAIN)
    free, slow = _arrivals(sink, "free.test"), _arrivals(sink, "limited.test")
    # 2/s: the limited domain's 8 messages need at least 3.5 s; the other's are not held back.
    assert slow[-1] - slow[0] >= 3.0, slow
    assert free[-1] - free[0] < 1.5, free
    assert max(free) < max(slow)
    assert set(_copies(sink.received).values()) == {1} and len(_copies(sink.received)) == 2 * PER_DOMAIN
    queues = {r["queue"] for r in deliveries}  # the scheduled queues are as before: one per domain
    assert queues == {"limited.test", "free.test"}


def test_a_reload_moves_waiting_mail_to_the_queue_its_new_block_gives_and_back_exactly_once(tmp_path: Path) -> None:
    port = free_port()
    site = f"{SHARED_MX}:{port}"
    shared, own = f"default->{site} (tls disabled)", f"default->free.test@{site} (tls disabled)"
    with (
        DnsServer(_zone()) as dns,
        ScriptedSink(port=port) as sink,
        _pigeon(tmp_path / "node", port, dns, []) as pigeon,
    ):
        # The site suspended: every message waits, ready, in a queue the reloads can move it from.
        status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", {"site": site}, token=pigeon.local_token)
        assert status == 200, answer
        _send(pigeon, ("limited.test", "free.test"))
        waiting = {shared: (None, 2 * PER_DOMAIN)}
        wait_until(lambda: {r["path"]: (r["domain"], r["queued"]) for r in _ready(pigeon)} == waiting)

        _reload(pigeon, [{"domain": "free.test", "max_message_rate": "100/s"}])
        assert f"reload: {PER_DOMAIN} waiting messages moved to the ready queues" in pigeon.stderr()
        rows = {r["path"]: (r["domain"], r["queued"]) for r in _ready(pigeon)}
        assert rows == {shared: (None, PER_DOMAIN), own: ("free.test", PER_DOMAIN)}

        _reload(pigeon, [])  # the block removed: its mail goes back to the site's queue
        assert pigeon.stderr().count(f"reload: {PER_DOMAIN} waiting messages moved") == 2
        # The emptied own queue stays listed past its idle_timeout (1s; idle queues are swept on
        # the scheduler's tick, once a second): the site's suspension holds it.
        time.sleep(4)
        rows = {r["path"]: (r["domain"], r["queued"], len(r["suspended_by"])) for r in _ready(pigeon)}
        assert rows == {shared: (None, 2 * PER_DOMAIN, 1), own: ("free.test", 0, 1)}

        _reload(pigeon, [{"domain": "free.test", "max_message_rate": "100/s"}])  # and once more, then resume
        status, answer = pigeon.http_call(
            "DELETE", f"/api/v1/admin/suspend/{answer['rule']['id']}", None, pigeon.local_token
        )
        assert status == 200, answer
        sink.wait_for(2 * PER_DOMAIN, timeout=20)
        deliveries = pigeon.wait_records("Delivery", 2 * PER_DOMAIN)
        time.sleep(0.5)  # nothing more comes
        copies = _copies(sink.received)
    assert len(copies) == 2 * PER_DOMAIN and set(copies.values()) == {1}, copies
    assert len(deliveries) == 2 * PER_DOMAIN


def test_ready_queues_left_empty_for_their_idle_timeout_are_forgotten(tmp_path: Path) -> None:
    port = free_port()
    gauge = f'pigeon_ready_queue_messages{{site="{SHARED_MX}:{port}"}}'

    def metrics() -> str:
        status, body = pigeon.http_get("/metrics")
        assert status == 200
        return body.decode()

    limited = [{"domain": "limited.test", "max_message_rate": "100/s"}]
    with (
        DnsServer(_zone()) as dns,
        ScriptedSink(port=port) as sink,
        _pigeon(tmp_path / "node", port, dns, limited) as pigeon,
    ):
        _send(pigeon, ("limited.test", "free.test"))
        sink.wait_for(2 * PER_DOMAIN)
        assert gauge in metrics()  # the site's queues, empty now, still known
        # idle_timeout is 1s: then the connections close and the empty queues go.
        wait_until(lambda: gauge not in metrics(), timeout=8)
        _send(pigeon, ("limited.test",))  # mail again: a queue again
        sink.wait_for(3 * PER_DOMAIN)
        assert gauge in metrics()
