"""The race stress test: mail with several recipients in several domains cycles through retries
against a chaotic sink, routed by MX through a DNS server that answers late (some domains very
late), while random bounce / suspend / resume / retry-now / rebind operations fire at it; then
everything is released.

It reaches the windows the first build's races lived in, and says so: route lookups that
finish after an operator moved their message (`pigeon_stale_results_total{step="route"}`),
and operations that found a message settling and acted on what its commit left
(`waited` in GET /api/v1/admin/operations).

Checked from the event log and from what the sink received (every recipient address is
unique to its message):

* every accepted recipient has exactly one terminal record (Delivery, Bounce, Expiration
  or AdminBounce), DSNs included;
* no recipient reached the sink twice, and none that ended as anything but `Delivery` reached
  it at all, except where the sink dropped the connection after taking the message (the
  sender never heard the 250, so trying again is right);
* every recipient that bounced or expired is reported in exactly one DSN;
* no message is left in the spool.

The default run is short; `-m slow` runs 20,000 messages for minutes.
"""

from __future__ import annotations

import collections
import random
import re
import smtplib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import ScriptedSink, wait_until

TOKEN = "race-admin-token-0123456789"
CAMPAIGNS = [f"c{n}" for n in range(6)]
DOMAINS = [f"d{n}.example" for n in range(12)]
SLOW = {"d3.example", "d7.example", "d11.example"}
FINAL_RECIPIENT = re.compile(r"Final-Recipient: rfc822; (\S+)")


def _zone(seed: int) -> Zone:
    records: dict[str, list[tuple[Any, ...]]] = {}
    for n, domain in enumerate(DOMAINS):
        records[domain] = [("MX", 10, f"mx{n % 4}.example")]  # domains share MX hosts: shared sites
    records["origin.example"] = [("MX", 10, "mx-origin.example")]  # where DSNs go
    records["relay.example"] = [("MX", 10, "mx-relay.example")]  # where rebinds send mail
    for host in ["mx0", "mx1", "mx2", "mx3", "mx-origin", "mx-relay"]:
        records[f"{host}.example"] = [("A", "127.0.0.1")]
    delays = {domain: ((0.4, 2.0) if domain in SLOW else (0.0, 0.05)) for domain in DOMAINS}
    return Zone(records, ttl=1, delays=delays, seed=seed)


def _call(pigeon: PigeonProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return pigeon.http_call(method, path, body, TOKEN)


def _send(pigeon: PigeonProcess, count: int, seed: int, connections: int = 4) -> dict[str, int]:
    """`count` messages of 2-4 recipients in 1-3 domains; new domains come into use as it goes,
    so route lookups start all along. Returns each recipient's message number."""
    owners: dict[str, int] = {}
    lock = threading.Lock()

    def one(first: int) -> None:
        rng = random.Random(seed * 1000 + first)
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("race.test")
            for n in range(first, count, connections):
                in_use = DOMAINS[: min(len(DOMAINS), 3 + n * len(DOMAINS) // count)]
                domains = rng.sample(in_use, rng.randint(1, min(3, len(in_use))))
                recipients = [f"chaos-{n}-{k}@{rng.choice(domains)}" for k in range(rng.randint(2, 4))]
                campaign = CAMPAIGNS[n % len(CAMPAIGNS)]
                headers = f"X-Campaign: {campaign}\r\nMessage-ID: <m{n}@race.test>\r\nSubject: {n}\r\n\r\nbody {n}\r\n"
                client.sendmail(f"sender-{n}@origin.example", recipients, headers.encode())
                with lock:
                    owners.update((r, n) for r in recipients)

    threads = [threading.Thread(target=one, args=(first,)) for first in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return owners


def _stale_lookups(pigeon: PigeonProcess) -> float:
    _, metrics = pigeon.http_get("/metrics")
    return _metric(metrics.decode(), 'pigeon_stale_results_total{step="route"}')


def _windows_reached(pigeon: PigeonProcess, waited: dict[str, int]) -> bool:
    return _stale_lookups(pigeon) > 0 and sum(waited.values()) > 0


def _aim_at_window_1(pigeon: PigeonProcess, rng: random.Random, n: int) -> None:
    """One message to a slow domain, moved at once: its route lookup (0.4 s at least, unless
    the answer is still cached) ends after the rebind. Chance alone may not get there when the
    sender ran ahead of the operator (a loaded machine): the mail was all routed already."""
    domain = rng.choice(sorted(SLOW))
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail(f"aim-{n}@origin.example", [f"aim-{n}@{domain}"], f"Subject: aim {n}\r\n\r\naim\r\n".encode())
    time.sleep(0.1)
    _call(pigeon, "POST", "/api/v1/admin/rebind", {"domain": domain, "routing_domain": "relay.example"})


def _operator(
    pigeon: PigeonProcess, seconds: float, seed: int, done: collections.Counter[str], waited: dict[str, int]
) -> None:
    """Random operations for `seconds`, and on (up to a minute more) until both windows were
    reached: on a loaded machine fewer operations fit in the time, and chance may miss them."""
    rng = random.Random(seed)
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds or (
        elapsed < seconds + 60 and not (done["rebind"] and _windows_reached(pigeon, waited))
    ):
        selector: dict[str, Any] = rng.choice(
            [
                {"campaign": rng.choice(CAMPAIGNS)},
                {"domain": rng.choice(DOMAINS)},
                {"queue": f"{rng.choice(CAMPAIGNS)}:*"},
            ]
        )
        roll = rng.random()
        if roll < 0.12:
            status, _ = _call(pigeon, "POST", "/api/v1/admin/bounce", {**selector, "reason": "race"})
            kind = "bounce"
        elif roll < 0.2:
            body = {**selector, "reason": "race", "duration": rng.uniform(0.5, 3)}
            status, _ = _call(pigeon, "POST", "/api/v1/admin/bounce", body)
            kind = "bounce-rule"
        elif roll < 0.4:
            duration = rng.choice([None, rng.uniform(0.5, 3)])
            body = {**selector, **({"duration": duration} if duration else {})}
            status, _ = _call(pigeon, "POST", "/api/v1/admin/suspend", body)
            kind = "suspend"
        elif roll < 0.55:
            status, rules = _call(pigeon, "GET", "/api/v1/admin/suspend")
            if rules["rules"]:
                status, _ = _call(pigeon, "DELETE", f"/api/v1/admin/suspend/{rng.choice(rules['rules'])['id']}")
            kind = "resume"
        elif roll < 0.6:
            status, rules = _call(pigeon, "GET", "/api/v1/admin/bounce")
            if rules["rules"]:
                status, _ = _call(pigeon, "DELETE", f"/api/v1/admin/bounce/{rng.choice(rules['rules'])['id']}")
            kind = "cancel"
        elif roll < 0.7:
            status, _ = _call(pigeon, "POST", "/api/v1/admin/retry", selector)
            kind = "retry"
        else:
            where: dict[str, Any] = {"routing_domain": rng.choice(["relay.example", ""])}
            if rng.random() < 0.3:
                where["to_queue"] = f"moved-{rng.choice(CAMPAIGNS)}:x@{rng.choice(DOMAINS)}"
            status, _ = _call(pigeon, "POST", "/api/v1/admin/rebind", {**selector, **where})
            kind = "rebind"
        assert status in (200, 404), (kind, status)
        done[kind] += 1
        if elapsed >= seconds and not _stale_lookups(pigeon):
            _aim_at_window_1(pigeon, rng, done["aimed"])
            done["aimed"] += 1
        # The view keeps the last 100 operations: read it as we go.
        for operation in _call(pigeon, "GET", "/api/v1/admin/operations")[1]["operations"]:
            waited[operation["operation"]] = operation.get("waited", 0)
        time.sleep(rng.uniform(0.01, 0.12))


def _release(pigeon: PigeonProcess, timeout: float) -> None:
    for kind in ("bounce", "suspend"):
        for rule in _call(pigeon, "GET", f"/api/v1/admin/{kind}")[1]["rules"]:
            _call(pigeon, "DELETE", f"/api/v1/admin/{kind}/{rule['id']}")

    def drained() -> bool:
        _call(pigeon, "POST", "/api/v1/admin/retry", {"domain": "*"})
        return pigeon.spool_messages() == []

    wait_until(drained, timeout=timeout, interval=1.0)


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def run_race(root: Path, messages: int, seconds: float, seed: int) -> collections.Counter[str]:
    operations: collections.Counter[str] = collections.Counter()
    port = free_port()
    with DnsServer(_zone(seed)) as dns, ScriptedSink(port=port, seed=seed) as sink:
        config: dict[str, Any] = {
            "delivery": {
                "enabled": True,
                "smtp_port": port,
                "tls": "disabled",
                "dsn": True,
                "retry_interval": "1s",
                "max_retry_interval": "2s",
                "idle_timeout": "2s",
                "max_age": "1h",
                "connection_limit": 8,
            },
            "dns": {"nameservers": [dns.endpoint], "timeout": "3s"},
            "smtp": {"hostname": "mx.pigeon.test"},
            "log": {"level": "warning"},
        }
        tokens = {"token": [{"name": "race", "token": TOKEN, "scopes": ["admin", "read"]}]}
        with PigeonProcess(root, http=tokens, **config) as pigeon:
            owners: dict[str, int] = {}
            sender = threading.Thread(target=lambda: owners.update(_send(pigeon, messages, seed)))
            sender.start()
            waits: dict[str, int] = {}
            _operator(pigeon, seconds, seed, operations, waits)
            sender.join()
            _release(pigeon, timeout=max(180.0, messages / 40))
            _, metrics = pigeon.http_get("/metrics")
            pigeon.stop()
            waited = sum(waits.values())
            records = pigeon.records()

    stale = _metric(metrics.decode(), 'pigeon_stale_results_total{step="route"}')
    operations["stale route lookups"] = int(stale)
    operations["operations waited for a settling message"] = waited

    # Every recipient of every reception (DSNs included) has exactly one terminal record.
    received = {(r["id"], rcpt) for r in records if r["type"] == "Reception" for rcpt in r["recipients"]}
    terminal: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for record in records:
        if record["type"] in ("Delivery", "Bounce", "Expiration", "AdminBounce"):
            terminal[(record["id"], record["recipient"])].append(record["type"])
    several = {key: kinds for key, kinds in terminal.items() if len(kinds) != 1}
    assert not several, f"recipients with more than one terminal record: {list(several.items())[:5]}"
    assert set(terminal) == received, f"without a terminal record: {list(received - set(terminal))[:5]}"
    assert len([1 for _, rcpt in received if rcpt in owners]) == len(owners), "a test recipient was not received"
    outcome = {rcpt: kinds[0] for (_, rcpt), kinds in terminal.items() if rcpt in owners}

    # What reached the sink: each test recipient at most once, and only if it ended as Delivery.
    at_sink: collections.Counter[str] = collections.Counter()
    ambiguous: set[str] = set()
    reported: collections.Counter[str] = collections.Counter()
    for message in sink.received:
        for rcpt in message.recipients:
            if rcpt in owners:
                at_sink[rcpt] += 1
                if message.dropped:
                    ambiguous.add(rcpt)
        if b"report-type=delivery-status" in message.data:
            reported.update(r for r in FINAL_RECIPIENT.findall(message.data.decode(errors="replace")) if r in owners)
    for rcpt, count in at_sink.items():
        if rcpt in ambiguous:
            continue  # the sender never heard the 250: one more try is allowed, any outcome after
        assert count == 1, f"{rcpt} reached the sink {count} times"
        assert outcome[rcpt] == "Delivery", f"{rcpt} reached the sink but ended as {outcome[rcpt]}"
    delivered = {rcpt for rcpt, kind in outcome.items() if kind == "Delivery"}
    assert delivered <= set(at_sink), "a Delivery record for a recipient the sink never took"

    # One DSN line for each recipient that bounced or expired (null senders get none: DSNs here).
    failed = collections.Counter(rcpt for rcpt, kind in outcome.items() if kind in ("Bounce", "Expiration"))
    assert reported == failed, f"DSNs {sum(reported.values())} for {sum(failed.values())} failures"

    kinds = collections.Counter(outcome.values())
    assert kinds["AdminBounce"] > 0 and kinds["Delivery"] > 0 and kinds["Bounce"] > 0  # they really raced
    return operations + collections.Counter({f"outcome {k}": v for k, v in kinds.items()})


@pytest.mark.timeout(900)
def test_admin_operations_racing_delivery_leave_exactly_one_outcome_per_recipient(tmp_path: Path) -> None:
    operations = run_race(tmp_path / "node", messages=1500, seconds=20, seed=11)
    print(dict(operations))
    assert operations["bounce"] + operations["bounce-rule"] > 0 and operations["rebind"] > 0
    assert operations["stale route lookups"] > 0, "no lookup finished after its message moved: window 1 not reached"
    assert operations["operations waited for a settling message"] > 0, "window 2 not reached"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_admin_race_soak_20000_messages(tmp_path: Path) -> None:
    operations = run_race(tmp_path / "node", messages=20_000, seconds=240, seed=23)
    print(dict(operations))
    assert operations["stale route lookups"] > 0 and operations["operations waited for a settling message"] > 0
