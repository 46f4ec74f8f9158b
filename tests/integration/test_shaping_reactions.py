"""Shaping that reacts, through real nodes: two nodes of two workers each share a Redis and
deliver to one sink, whose site has a `[[reaction]]` rule `421 4.7.0 ... rate limited ->
suspend 3s`. The sink starts answering `421 4.7.0 rate limited` to node A's mail only; every
node (B too, which never got a 421) stops delivering to the site within a second, delivery
resumes when the rule's time is over, and every message arrives exactly once. The effect is
in `pigeon shaping status`, the API and /metrics of the other node, and in node A's log."""

from __future__ import annotations

import re
import smtplib
import subprocess
import sys
import threading
import time
from collections import Counter
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

PER_NODE = 60
SUSPEND = 3.0
RATE_LIMITED = "421 4.7.0 rate limited"


def _node(root: Path, name: str, sink: ScriptedSink, redis: RedisServer) -> PigeonProcess:
    sections: dict[str, Any] = delivery_config(sink.endpoint, helo_name=f"{name}.pigeon.test", max_message_rate="30/s")
    return PigeonProcess(
        root / name,
        node={"name": name, "workers": 2},
        redis={"url": redis.url, "timeout": "1s"},
        log={"level": "info"},
        reaction=[
            {
                "id": "sink-rate-limited",
                "match": r"^421 4\.7\.0 .*rate limited",
                "site": "127.0.0.1:*",
                "action": "suspend",
                "duration": f"{SUSPEND:g}s",
            }
        ],
        **sections,
    )


def _inject(node: PigeonProcess, name: str, count: int, connections: int = 4) -> None:
    """`count` messages to `<name>-<i>@dest.test`, over a few connections (so both workers take some)."""

    def send(numbers: range) -> None:
        with smtplib.SMTP("127.0.0.1", node.smtp_port, timeout=30) as client:
            for i in numbers:
                message = EmailMessage()
                message["From"] = f"{name}@origin.test"
                message["To"] = f"{name}-{i}@dest.test"
                message["Subject"] = f"{name} {i}"
                message["Message-ID"] = f"<{name}-{i}@origin.test>"
                message.set_content("hello\n")
                client.send_message(message)

    threads = [threading.Thread(target=send, args=(range(k, count, connections),)) for k in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.mark.timeout(180)
def test_a_421_seen_by_one_node_suspends_the_site_on_every_node_until_the_rule_says(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    refusing = threading.Event()
    refused: list[float] = []  # when the sink answered 421 (time.monotonic(), as its arrivals)

    def rcpt_reply(address: str) -> str | None:
        if not refusing.is_set() or not address.startswith("a-"):
            return None
        now = time.monotonic()
        if refused and now > refused[0] + 0.3:
            return None  # a short burst of 421s: what follows the suspension goes through
        refused.append(now)
        return RATE_LIMITED

    with ScriptedSink() as sink:
        sink.rcpt_reply = rcpt_reply
        with _node(tmp_path, "a", sink, redis_server) as a, _node(tmp_path, "b", sink, redis_server) as b:
            _inject(a, "a", PER_NODE)
            _inject(b, "b", PER_NODE)
            # Both nodes deliver, then the sink starts refusing A's mail.
            wait_until(lambda: {x.helo for x in sink.arrivals} == {"a.pigeon.test", "b.pigeon.test"}, timeout=20)
            refusing.set()
            wait_until(lambda: refused, timeout=10)
            first = refused[0]

            # While it lives: the other node lists the effect (API, CLI, metrics).
            token = b.local_token
            answer = wait_until(lambda: _listed(b, token), timeout=5)
            listed_after = time.monotonic() - first
            assert answer["mode"] == "cluster", answer
            [effect] = answer["effects"]
            assert (effect["rule"], effect["action"], effect["key"], effect["node"]) == (
                "sink-rate-limited", "suspend", f"site:{sink.endpoint}", "a")  # fmt: skip
            assert effect["reply"].startswith(RATE_LIMITED)
            assert effect["expires_at"] - effect["created"] == pytest.approx(SUSPEND)
            shown = subprocess.run(
                [sys.executable, "-m", "pigeon", "shaping", "status", "-c", str(b.config_path)],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            assert shown.returncode == 0, shown.stderr
            assert "sink-rate-limited" in shown.stdout and "suspend" in shown.stdout
            assert f"site:{sink.endpoint}" in shown.stdout and "shared by the cluster" in shown.stdout
            _, metrics = b.http_get("/metrics")
            assert re.search(rb'pigeon_shaping_effects\{action="suspend",worker="0"\} 1', metrics), metrics

            # Every message arrives, exactly once.
            sink.wait_for(2 * PER_NODE, timeout=60)
            time.sleep(0.5)  # (nothing more should come)
            a.wait_records("ShapingEffect", 2)  # created and expired
            records_a, records_b = a.records("ShapingEffect"), b.records("ShapingEffect")

    counted = Counter((m.email["Message-ID"], tuple(m.recipients)) for m in sink.received)
    assert len(counted) == 2 * PER_NODE and set(counted.values()) == {1}, counted.most_common(3)

    by_node = {"a": [], "b": []}  # type: dict[str, list[float]]
    for arrival in sink.arrivals:
        by_node[arrival.helo.split(".")[0]].append(arrival.at - first)
    for node, times in by_node.items():
        assert any(t < 0 for t in times), f"{node} delivered nothing before the 421"
        # Within a second of the first 421, every node stops ...
        stalled = [round(t, 3) for t in times if 1.0 < t < SUSPEND]
        assert not stalled, f"{node} delivered {len(stalled)} messages while the site was suspended: {stalled}"
        # ... and resumes once the rule's time is over (not much later).
        after = [t for t in times if t >= SUSPEND]
        assert after, f"{node} never resumed"
        assert min(after) < SUSPEND + 1.5, f"{node} resumed {min(after):.2f}s after the 421"

    created, expired = (r for r in records_a if r["event"] == "created"), (
        r for r in records_a if r["event"] == "expired")  # fmt: skip
    [created_record], [expired_record] = list(created), list(expired)
    assert created_record["rule"] == "sink-rate-limited" and created_record["scope"] == "cluster"
    assert created_record["key"] == f"site:{sink.endpoint}" and created_record["node"] == "a"
    assert expired_record["effect"] == created_record["effect"] == effect["id"]
    assert not records_b  # one effect for the cluster, recorded by the worker that made it
    assert listed_after < 1.0, f"node b listed the effect {listed_after:.2f}s after the 421"


def _listed(node: PigeonProcess, token: str) -> Any:
    """The effects answer of `node`'s API once it lists an effect (else None)."""
    status, answer = _get(node, "/api/v1/shaping/effects", token)
    assert status == 200, answer
    return answer if answer["effects"] else None


def _get(node: PigeonProcess, path: str, token: str) -> tuple[int, Any]:
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{node.http_port}{path}")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
