"""The race stress test: mail cycles through retries against a chaotic sink while random
bounce / suspend / resume / retry-now / rebind operations fire at it; then everything is released.

Checked from the event log and from what the sink received:

* every accepted recipient has exactly one terminal record (Delivery, Bounce, Expiration
  or AdminBounce), so none has both a Delivery and an AdminBounce;
* no message is left in the spool;
* nothing admin-bounced reached the sink, and nothing reached it twice, except where the
  sink dropped the connection after taking the message (the sender never heard the 250,
  so trying again is right).

The default run is short; `-m slow` runs the issue's size: 20,000 messages for minutes.
"""

from __future__ import annotations

import collections
import json
import random
import re
import smtplib
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

TOKEN = "race-admin-token-0123456789"
CAMPAIGNS = [f"c{n}" for n in range(8)]
DOMAINS = [f"d{n}.example" for n in range(5)]
PIGEON_ID = re.compile(rb"by mx\.pigeon\.test \(Pigeon\) with E?SMTP id ([0-9a-f]{16})")


def _call(pigeon: PigeonProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{pigeon.http_port}{path}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {TOKEN}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _send(pigeon: PigeonProcess, count: int, connections: int = 4) -> None:
    def one(first: int) -> None:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("race.test")
            for n in range(first, count, connections):
                headers = f"X-Campaign: {CAMPAIGNS[n % len(CAMPAIGNS)]}\r\nSubject: {n}\r\n\r\nbody {n}\r\n"
                client.sendmail("sender@example.org", [f"chaos@{DOMAINS[n % len(DOMAINS)]}"], headers.encode())

    threads = [threading.Thread(target=one, args=(first,)) for first in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _operator(pigeon: PigeonProcess, seconds: float, seed: int, done: collections.Counter[str]) -> None:
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        selector: dict[str, Any] = rng.choice(
            [
                {"campaign": rng.choice(CAMPAIGNS)},
                {"domain": rng.choice(DOMAINS)},
                {"queue": f"{rng.choice(CAMPAIGNS)}:*"},
            ]
        )
        roll = rng.random()
        if roll < 0.15:
            status, _ = _call(pigeon, "POST", "/api/v1/admin/bounce", {**selector, "reason": "race"})
            kind = "bounce"
        elif roll < 0.25:
            body = {**selector, "reason": "race", "duration": rng.uniform(0.5, 3)}
            status, _ = _call(pigeon, "POST", "/api/v1/admin/bounce", body)
            kind = "bounce-rule"
        elif roll < 0.5:
            duration = rng.choice([None, rng.uniform(0.5, 3)])
            body = {**selector, **({"duration": duration} if duration else {})}
            status, _ = _call(pigeon, "POST", "/api/v1/admin/suspend", body)
            kind = "suspend"
        elif roll < 0.7:
            status, rules = _call(pigeon, "GET", "/api/v1/admin/suspend")
            if rules["rules"]:
                status, _ = _call(pigeon, "DELETE", f"/api/v1/admin/suspend/{rng.choice(rules['rules'])['id']}")
            kind = "resume"
        elif roll < 0.8:
            status, rules = _call(pigeon, "GET", "/api/v1/admin/bounce")
            if rules["rules"]:
                status, _ = _call(pigeon, "DELETE", f"/api/v1/admin/bounce/{rng.choice(rules['rules'])['id']}")
            kind = "cancel"
        elif roll < 0.88:
            status, _ = _call(pigeon, "POST", "/api/v1/admin/retry", selector)
            kind = "retry"
        else:
            body = {**selector, "to_queue": f"moved-{rng.choice(CAMPAIGNS)}:x@{rng.choice(DOMAINS)}"}
            status, _ = _call(pigeon, "POST", "/api/v1/admin/rebind", body)
            kind = "rebind"
        assert status in (200, 404), (kind, status)
        done[kind] += 1
        time.sleep(rng.uniform(0.01, 0.15))


def _release(pigeon: PigeonProcess, timeout: float) -> None:
    for kind in ("bounce", "suspend"):
        for rule in _call(pigeon, "GET", f"/api/v1/admin/{kind}")[1]["rules"]:
            _call(pigeon, "DELETE", f"/api/v1/admin/{kind}/{rule['id']}")

    def drained() -> bool:
        _call(pigeon, "POST", "/api/v1/admin/retry", {"domain": "*"})
        return pigeon.spool_messages() == []

    wait_until(drained, timeout=timeout, interval=1.0)


def run_race(root: Path, messages: int, seconds: float, seed: int) -> collections.Counter[str]:
    operations: collections.Counter[str] = collections.Counter()
    with ScriptedSink(seed=seed) as sink:
        config = delivery_config(sink.endpoint, dsn=False, max_age="1h", connection_limit=8)
        config["smtp"] = {"hostname": "mx.pigeon.test"}
        config["log"] = {"level": "warning"}
        with PigeonProcess(root, http={"token": [{"name": "race", "token": TOKEN, "scopes": ["admin", "read"]}]},
                           **config) as pigeon:  # fmt: skip
            sender = threading.Thread(target=_send, args=(pigeon, messages))
            sender.start()
            _operator(pigeon, seconds, seed, operations)
            sender.join()
            _release(pigeon, timeout=max(120.0, messages / 50))
            pigeon.stop()
            records = pigeon.records()

        received = [r["id"] for r in records if r["type"] == "Reception"]
        assert len(received) == messages
        terminal = collections.defaultdict(list)
        for record in records:
            if record["type"] in ("Delivery", "Bounce", "Expiration", "AdminBounce"):
                terminal[record["id"]].append(record["type"])
        several = {spool_id: kinds for spool_id, kinds in terminal.items() if len(kinds) != 1}
        assert not several, f"recipients with more than one terminal record: {list(several.items())[:5]}"
        assert set(terminal) == set(received), "a recipient was left without a terminal record"
        outcome = {spool_id: kinds[0] for spool_id, kinds in terminal.items()}

        at_sink: collections.Counter[str] = collections.Counter()
        dropped: set[str] = set()
        for message in sink.received:
            match = PIGEON_ID.search(message.data)
            assert match, message.data[:200]
            spool_id = match.group(1).decode()
            at_sink[spool_id] += 1
            if message.dropped:
                dropped.add(spool_id)
        for spool_id, count in at_sink.items():
            if spool_id in dropped:
                continue  # the sender never heard the 250: one more try is allowed, any outcome after
            assert count == 1, f"{spool_id} reached the sink {count} times"
            assert outcome[spool_id] == "Delivery", f"{spool_id} reached the sink but ended as {outcome[spool_id]}"
        delivered = {spool_id for spool_id, kind in outcome.items() if kind == "Delivery"}
        assert delivered <= set(at_sink), "a Delivery record for a message the sink never took"
        kinds = collections.Counter(outcome.values())
        assert kinds["AdminBounce"] > 0 and kinds["Delivery"] > 0  # the operations really raced delivery
    return operations + collections.Counter({f"outcome {k}": v for k, v in kinds.items()})


@pytest.mark.timeout(600)
def test_admin_operations_racing_delivery_leave_exactly_one_outcome_per_recipient(tmp_path: Path) -> None:
    operations = run_race(tmp_path / "node", messages=1500, seconds=20, seed=11)
    print(dict(operations))
    assert operations["bounce"] + operations["bounce-rule"] > 0 and operations["suspend"] > 0


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_admin_race_soak_20000_messages(tmp_path: Path) -> None:
    operations = run_race(tmp_path / "node", messages=20_000, seconds=240, seed=23)
    print(dict(operations))
