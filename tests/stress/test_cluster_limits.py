"""Shaping limits hold for the node and for the cluster, as the receiving site sees them.

Real peers throughout: Pigeon nodes of 2 worker processes each, fed by smtp-source, relaying to
a sink on loopback that records when each connection opened and ended and when each message
arrived (tests/support/sinks.py), and a private Redis the test stops and starts again.

* 2 nodes x 2 workers sharing a Redis, `connection_limit = 5` and `max_message_rate = "200/s"`
  for the sink's site: never more than 5 connections at once at the sink, and no window of one
  second with more messages than the rate allows (GCRA's burst and the batching's slack, see
  `pigeon.shaping.cluster`). Redis is stopped mid-run: each node falls back to its share (2
  connections, 100/s) and says so; nothing is lost; when Redis returns, the cluster shares the
  whole limit again.
* 2 nodes (of 2 workers and 1) sharing a Redis that loses its data at once (killed and started
  again, or flushed), `connection_limit = 3`: never more than 3 connections at the sink, though
  no node need fall back to its share.
* 1 node x 2 workers without Redis: the limits hold for the node, not for each worker.

The default run sends 3,000 messages (2,000 without Redis); `-m slow` sends 20,000.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pigeon.shaping.cluster import SETTLE, STALE
from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import (
    ScriptedSink,
    busiest_moment,
    busiest_window,
    delivery_config,
    peak_connections,
    wait_until,
)
from tests.support.tools import SMTP_SOURCE, require

LIMIT = 5
RATE = 200.0
NODES = 2
SHARE = LIMIT // NODES
# The most messages one window of W seconds may see at RATE: GCRA's burst (1), the slots a
# worker may send up to STALE late, and 30 ms of timing jitter: a loaded event loop (Pigeon's
# or the sink's) that stalls bunches messages whose slots were apart.
JITTER = 0.03
# A CI runner of 2 cores running four test processes stalls a loop (a node's, or the sink's) for
# longer: a one-second window saw 230 and 234 there (217 allowed) in whole-suite runs, never
# alone. Over one second the check allows that much bunching; over three seconds it holds to
# JITTER, so a sustained overshoot of the rate (a few percent) still fails.
LOADED_JITTER = 0.15
STARTUP = 120  # seconds a node of two workers may take to start on a loaded machine


def allowed(rate: float, window: float, *, batched: bool, jitter: float = JITTER) -> float:
    return rate * (window + (STALE if batched else 0.0) + jitter) + 1


def node(
    root: Path,
    n: int,
    sink: ScriptedSink,
    *,
    limit: int = LIMIT,
    rate: float = RATE,
    workers: int = 2,
    idle_timeout: str = "2s",
    **sections: Any,
) -> PigeonProcess:
    config = delivery_config(
        sink.endpoint, helo_name=f"node{n}.test", max_deliveries_per_connection=50, idle_timeout=idle_timeout
    )
    return PigeonProcess(
        root / f"node{n}",
        node={"name": f"node{n}", "workers": workers},
        smtp={"hostname": f"node{n}.pigeon.test"},
        log={"level": "info"},
        shaping=[{"domain": "sink.test", "connection_limit": limit, "max_message_rate": f"{rate:g}/s"}],
        **config,
        **sections,
    )


def inject(pigeon: PigeonProcess, count: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [require(SMTP_SOURCE), "-s", "10", "-l", "1024", "-m", str(count), "-f", "a@src.test", "-t",
         "r@sink.test", f"127.0.0.1:{pigeon.smtp_port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def shaping_health(pigeon: PigeonProcess) -> dict[str, Any]:
    _, body = pigeon.http_get("/healthz")
    shaping: dict[str, Any] = json.loads(body).get("shaping", {})
    return shaping


def delivered(nodes: list[PigeonProcess]) -> int:
    return sum(len(n.records("Delivery")) for n in nodes)


def all_delivered(
    sink: ScriptedSink,
    sources: list[subprocess.Popen[bytes]],
    nodes: list[PigeonProcess],
    messages: int,
    timeout: float,
) -> list[str]:
    """Wait until the sink has `messages`, the injectors ended and every node logged its
    deliveries; returns each node's stderr."""
    sink.wait_for(messages, timeout=timeout)
    for source in sources:
        source.wait(60)
    wait_until(lambda: delivered(nodes) == messages, timeout=30)
    return [n.stderr() for n in nodes]


def assert_connections_within(sink: ScriptedSink, limit: int, origin: float, what: str) -> None:
    """At most `limit` connections were ever open at once; if not, say when (from `origin`, the
    moment of `what`) and which."""
    peak, when, at_peak = busiest_moment(sink.connections)
    assert peak <= limit, f"{peak} connections at {when - origin:+.3f}s from {what}: " + ", ".join(
        f"{c.helo} {c.opened - when:+.3f}..{c.ended - when:+.3f}" for c in at_peak
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("messages", [3000, pytest.param(20_000, marks=pytest.mark.slow)])
def test_two_nodes_of_two_workers_keep_to_the_sites_limits_through_a_redis_outage(
    tmp_path: Path, redis_server: RedisServer, messages: int
) -> None:
    with ScriptedSink() as sink:
        nodes = [node(tmp_path, n, sink, redis={"url": redis_server.url, "timeout": "1s"}) for n in range(NODES)]
        try:
            for pigeon in nodes:
                pigeon.start(wait=False)
            for pigeon in nodes:
                pigeon.wait_ready(STARTUP)
            sources = [inject(pigeon, messages // NODES) for pigeon in nodes]
            sink.wait_for(messages // 3, timeout=240)

            redis_stopped = time.monotonic()
            redis_server.stop()
            wait_until(lambda: all(shaping_health(n).get("mode") == "fallback" for n in nodes), timeout=10)
            health = shaping_health(nodes[0])
            assert health["status"] == "degraded" and "share" in health["error"], health
            # (The node's health is its worst worker's: each worker falls back at its own next call.)
            wait_until(lambda: nodes[0].metric('pigeon_shaping_fallback{worker="0"}') == 1, timeout=10)
            # Long enough for the shares to show: each node's connections and rate at its share.
            wait_until(lambda: len(sink.received) >= messages // 3 + 4 * RATE, timeout=120)
            redis_started = time.monotonic()
            redis_server.start()
            wait_until(lambda: all(shaping_health(n).get("mode") == "cluster" for n in nodes), timeout=10)
            wait_until(lambda: nodes[1].metric('pigeon_shaping_shared{worker="1"}') == 1, timeout=10)

            sink.wait_for(messages, timeout=max(240, 3 * messages / RATE))
            for source in sources:
                source.wait(60)
            wait_until(lambda: delivered(nodes) == messages, timeout=30)
            assert all(n.spool_messages() == [] for n in nodes)
            logs = [n.stderr() for n in nodes]
        finally:
            for pigeon in nodes:
                pigeon.stop()
                pigeon.kill()

    assert len(sink.received) == messages, "a message was lost or sent twice"
    connections, arrivals = sink.connections, sink.arrivals
    times = [a.at for a in arrivals]
    # The whole run, shared or not, outage and return included: the site's limits hold.
    peak, when, at_peak = busiest_moment(connections)
    assert peak <= LIMIT, (
        f"{peak} connections at {when - redis_stopped:+.3f}s from Redis's stop ({redis_started - redis_stopped:.1f}s "
        f"later it started): " + ", ".join(f"{c.helo} {c.opened - when:+.3f}..{c.ended - when:+.3f}" for c in at_peak)
    )
    busiest, at = busiest_window(times, 1.0)
    assert busiest <= allowed(RATE, 1.0, batched=True, jitter=LOADED_JITTER), f"{busiest} in the second from {at}"
    busiest, at = busiest_window(times, 3.0)
    assert busiest <= allowed(RATE, 3.0, batched=True), (
        f"{busiest} messages in the 3 s from {at - redis_stopped:+.3f}s from Redis's stop "
        f"({redis_started - redis_stopped:.1f}s later it started)"
    )
    # During the outage (once the connections opened before it ended after their message),
    # each node kept to its share.
    outage = (redis_stopped + SETTLE + 1.0, redis_started)
    assert outage[1] - outage[0] > 1.5, "the outage was too short to show anything"
    for n in range(NODES):
        helo = f"node{n}.test"
        assert peak_connections(connections, *outage, helo=helo) <= SHARE
        during = [a.at for a in arrivals if a.helo == helo and outage[0] <= a.at < outage[1]]
        assert during, f"{helo} sent nothing during the outage"
        most, at = busiest_window(during, 1.0)
        assert most <= allowed(RATE / NODES, 1.0, batched=False), f"{helo}: {most} in the second from {at}"
    # Back to shared limits: together the nodes used more than the sum of their shares.
    assert peak_connections(connections, since=redis_started + 2 * SETTLE) > NODES * SHARE
    for log in logs:
        assert "does not answer" in log and "answers again" in log


@pytest.mark.timeout(600)
@pytest.mark.parametrize("loss", ["restarted", "flushed"])
def test_two_nodes_keep_to_the_connection_limit_when_redis_loses_its_data_at_once(
    tmp_path: Path, redis_server: RedisServer, loss: str
) -> None:
    """An outside tester killed Redis (kill -9) and started it again at once, empty, with two
    nodes (of 2 workers and 1) sending: no call failed, so neither fell back to its share, and
    the sink saw 4 to 6 connections for a limit of 3, for 19 s and 29 s: the connections waiting
    for a lease took the whole limit from the empty Redis, the heartbeats put back the leases of
    those still open on top. Here Redis is restarted (a call may fail meanwhile, and a node fall
    back for a moment) or flushed (no call fails: what the tester saw, every time)."""
    limit, messages = 3, 2000
    with ScriptedSink() as sink:
        nodes = [
            node(tmp_path, n, sink, limit=limit, workers=2 - n, redis={"url": redis_server.url, "timeout": "1s"})
            for n in range(NODES)
        ]
        try:
            for pigeon in nodes:
                pigeon.start(wait=False)
            for pigeon in nodes:
                pigeon.wait_ready(STARTUP)
            sources = [inject(nodes[0], messages * 7 // 10), inject(nodes[1], messages * 3 // 10)]
            sink.wait_for(messages // 4, timeout=240)
            lost = time.monotonic()
            if loss == "restarted":
                redis_server.kill()  # kill -9, no persistence: every key is gone ...
                redis_server.start()  # ... and back straight away
            else:
                client = redis_server.client()
                client.flushall()
                client.close()
            logs = all_delivered(sink, sources, nodes, messages, max(240, 3 * messages / RATE))
        finally:
            for pigeon in nodes:
                pigeon.stop()
                pigeon.kill()

    assert len(sink.received) == messages, "a message was lost or sent twice"
    assert_connections_within(sink, limit, lost, "Redis's loss of its data")
    assert any("lost the connection leases" in log for log in logs)
    assert peak_connections(sink.connections, since=lost + 2 * SETTLE) == limit  # the whole limit, shared again


@pytest.mark.timeout(600)
def test_three_nodes_keep_to_the_limits_when_redis_comes_back_and_hangs_again_at_once(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """An outside tester, 3 nodes (of 2 workers, 1 and 1), a limit of 3 connections and 50/s:
    Redis stopped, started again empty 8 s later, and stopped (SIGSTOP) 0.2 s after every
    worker said it answers again, for 10 s. The one heartbeat in between counted only the nodes
    the empty Redis had seen since, and the nodes fell back to shares of 1/1 and 1/2: 5
    connections, 91 messages a second. And on SIGCONT Redis ran the lease calls given up on
    during the hang: leases no connection held, for which every node cut its connections, and
    nothing went for 5 s."""
    limit, rate, messages = 3, 50.0, 1500
    with ScriptedSink() as sink:
        redis = {"url": redis_server.url, "timeout": "1s"}
        nodes = [
            node(tmp_path, n, sink, limit=limit, rate=rate, workers=2 if n == 0 else 1, redis=redis) for n in range(3)
        ]
        try:
            for pigeon in nodes:
                pigeon.start(wait=False)
            for pigeon in nodes:
                pigeon.wait_ready(STARTUP)
            sources = [inject(pigeon, messages // 3) for pigeon in nodes]
            sink.wait_for(150, timeout=240)
            redis_server.stop()
            time.sleep(8)
            redis_server.start()
            wait_until(lambda: sum(n.stderr().count("answers again: limits") for n in nodes) >= 4, timeout=10)
            time.sleep(0.2)
            hung = time.monotonic()
            assert redis_server.process is not None
            redis_server.process.send_signal(signal.SIGSTOP)
            try:
                time.sleep(10)
            finally:
                redis_server.process.send_signal(signal.SIGCONT)
            woke = time.monotonic()
            logs = all_delivered(sink, sources, nodes, messages, 3 * messages / rate)
        finally:
            for pigeon in nodes:
                pigeon.stop()
                pigeon.kill()

    assert len(sink.received) == messages, "a message was lost or sent twice"
    assert_connections_within(sink, limit, hung, "Redis's hang")
    times = [a.at for a in sink.arrivals]
    busiest, at = busiest_window(times, 1.0)
    assert busiest <= allowed(rate, 1.0, batched=True, jitter=LOADED_JITTER), (
        f"{busiest} in the second from {at - hung:+.3f}s from Redis's hang"
    )
    for log in logs:
        assert "share (1/3)" in log and "share (1/1)" not in log and "share (1/2)" not in log
        assert "no room" not in log
    # Back from the hang, mail goes on: no second without a message (the cut connections and
    # the leases no one held stopped it for 5 s).
    after = sorted(t for t in times if woke <= t < woke + 6)
    gaps = [b - a for a, b in zip([woke, *after], after, strict=False)]
    assert after and max(gaps) < SETTLE + 1, f"nothing sent for {max(gaps, default=0):.1f} s after Redis woke"


@pytest.mark.timeout(300)
def test_idle_connections_of_one_node_make_room_for_another_nodes_mail(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """An outside tester saw a node with a backlog held to 1 connection of 3 for 10 s
    (`idle_timeout`) each time another node's queue drained: the other's idle connections kept
    their leases, not knowing anyone waited (a node makes room by itself only when it holds the
    whole limit). Here both nodes send, node0 little: once it is done, node1 has the whole
    limit within a couple of seconds."""
    limit, rate, little, much = 3, 50.0, 60, 600
    with ScriptedSink() as sink:
        redis = {"url": redis_server.url, "timeout": "1s"}
        nodes = [
            node(tmp_path, n, sink, limit=limit, rate=rate, workers=1, idle_timeout="10s", redis=redis)
            for n in range(2)
        ]
        try:
            for pigeon in nodes:
                pigeon.start(wait=False)
            for pigeon in nodes:
                pigeon.wait_ready(STARTUP)
            sources = [inject(nodes[1], much), inject(nodes[0], little)]
            wait_until(lambda: sum(1 for a in sink.arrivals if a.helo == "node0.test") == little, timeout=60)
            sink.wait_for(little + much, timeout=120)
            for source in sources:
                source.wait(60)
        finally:
            for pigeon in nodes:
                pigeon.stop()
                pigeon.kill()

    done = max(a.at for a in sink.arrivals if a.helo == "node0.test")
    idle = [c for c in sink.connections if c.helo == "node0.test" and c.ended > done]
    # (All of it, too, when node1's injection started late: in a loaded full suite node0 once
    # took the 3 connections before node1 had mail waiting. What counts is how soon they go.)
    assert 0 < len(idle) <= limit, "node0 did not hold part of the limit idle: nothing to show"
    # Room is made within a heartbeat and a half and `_MAKE_ROOM` (not `idle_timeout`, 10 s).
    held = max(c.ended for c in idle) - done
    assert held < 4.0, f"node0 held an idle connection {held:.1f} s while node1 waited"
    assert peak_connections(sink.connections, since=done + 4, until=done + 6, helo="node1.test") == limit


@pytest.mark.timeout(300)
@pytest.mark.parametrize("messages", [2000, pytest.param(20_000, marks=pytest.mark.slow)])
def test_one_node_of_two_workers_keeps_to_the_limits_without_redis(tmp_path: Path, messages: int) -> None:
    """Each worker used to apply the limits on its own: twice the connections and the rate."""
    with ScriptedSink() as sink:
        pigeon = node(tmp_path, 0, sink)
        try:
            pigeon.start(wait=False).wait_ready(STARTUP)
            source = inject(pigeon, messages)
            sink.wait_for(messages, timeout=max(120, 3 * messages / RATE))
            source.wait(60)
            wait_until(lambda: delivered([pigeon]) == messages, timeout=30)
            health = shaping_health(pigeon)
        finally:
            pigeon.stop()
            pigeon.kill()
    assert len(sink.received) == messages
    assert peak_connections(sink.connections) == LIMIT  # the limit was reached, not exceeded
    busiest, at = busiest_window([a.at for a in sink.arrivals], 1.0)
    assert busiest <= allowed(RATE, 1.0, batched=False), f"{busiest} messages in the second from {at}"
    assert health == {"status": "ok", "mode": "node"}
