"""N Pigeon nodes watching one IMAP mailbox hand each message to the application once.

Real servers throughout: a private Dovecot, a private Redis (restartable, no persistence, so a
restart loses every claim), three Pigeon processes, and a webhook receiver that counts what it
accepted by dedupe key, when, and from which node. Mail is appended while the nodes run.

* Plain run: exactly one handoff per message, and the inbox ends with none unseen.
* kill -9 of a node mid-batch: the others take its messages over; every message's dedupe key
  arrives; the only duplicates are handoffs the dead node had in flight (at most twice its
  concurrency, not a batch); and every key the application received has an InboundDelivery
  record.
* kill -9 of a node holding a batch, with the default 60 s lease: the others take its messages
  over within 10 s of the kill (its heartbeat stopped), whether they were idle or busy.
* kill -9 of a node and of Redis together, both restarted: duplicates only for the dead
  node's handoffs in flight (the restarted node, which never knew the old Redis, pauses
  like the others), nothing lost, every key recorded.
* Redis restarted (empty) mid-run while the webhook answers 500 for a while: nothing is lost,
  and duplicates are possible only for handoffs in flight while Redis lost their claims.

The default run sends 1,000 messages (each node takes its share in a few batches, and the kill
and restart points fall mid-run); `-m slow` runs the same tests with 2,000 and a longer outage.
"""

from __future__ import annotations

import collections
import hashlib
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.apps import WebhookApp, mailbox_health
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, RedisServer
from tests.support.sinks import wait_until

# Messages per run: the default, and the full size under -m slow.
SIZES = [1000, pytest.param(2000, marks=pytest.mark.slow)]
NODES = 3
BATCH = 50
CONCURRENCY = 8
IN_FLIGHT = 2 * CONCURRENCY  # handoffs a mailbox has between request and acknowledgement, at most


def mail(n: int) -> bytes:
    return (
        f"From: customer{n}@example.com\r\nTo: support@app.example\r\nMessage-ID: <n{n}@example.com>\r\n"
        f"Subject: reply {n}\r\n\r\nThis is reply number {n}.\r\n"
    ).encode()


def node_config(
    root: Path, n: int, dovecot: Dovecot, redis: RedisServer, app: WebhookApp, **mailbox: Any
) -> PigeonProcess:
    """Node `n` of the cluster: its webhook requests say which node it is (X-Test-Node)."""
    box = {
        "name": "support",
        "host": "127.0.0.1",
        "port": dovecot.port,
        "tls": "none",
        "username": "app",
        "password": "secret",
        "target": "hook",
        "lease": "5s",
        "batch": BATCH,
        "concurrency": CONCURRENCY,
        "poll_interval": "10s",
        **mailbox,
    }
    hook = {"name": "hook", "kind": "webhook", "url": app.url, "retry_interval": "1s", "max_retry_interval": "4s",
            "headers": {"X-Test-Node": f"node{n}"}}  # fmt: skip
    return PigeonProcess(
        root / f"node{n}",
        node={"name": f"node{n}"},
        redis={"url": redis.url, "timeout": "1s"},
        target=[hook],
        mailbox=[box],
    )


def start_nodes(
    root: Path, dovecot: Dovecot, redis: RedisServer, app: WebhookApp, **mailbox: Any
) -> list[PigeonProcess]:
    return [node_config(root, n, dovecot, redis, app, **mailbox).start() for n in range(NODES)]


def append_while_running(dovecot: Dovecot, count: int, chunk: int = 100, *, first: int = 0) -> threading.Thread:
    """mail(first) .. mail(first + count - 1), a chunk at a time, in a thread."""

    def run() -> None:
        for start in range(first, first + count, chunk):
            dovecot.append("app", [mail(i) for i in range(start, min(first + count, start + chunk))])
            time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def stop_all(nodes: list[PigeonProcess]) -> None:
    for node in nodes:
        try:
            node.stop()
        finally:
            node.kill()


def all_handed_over(app: WebhookApp, dovecot: Dovecot, appender: threading.Thread, total: int, timeout: float) -> None:
    """Every message reached the application, and none is left unseen in the inbox."""
    assert app.wait_distinct(total, timeout) == total
    appender.join()
    wait_until(lambda: not dovecot.unseen("app"), 60)


def delivered_records(nodes: list[PigeonProcess]) -> list[dict[str, Any]]:
    return [r for node in nodes for r in node.records("InboundDelivery")]


def unrecorded(app: WebhookApp, nodes: list[PigeonProcess]) -> set[str]:
    """Dedupe keys the application accepted that no node's log has an InboundDelivery for."""
    return set(app.accepted) - {r["dedupe_key"] for r in delivered_records(nodes)}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("messages", SIZES)
def test_three_nodes_hand_each_message_over_exactly_once(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer, messages: int
) -> None:
    with WebhookApp() as app:
        nodes = start_nodes(tmp_path, dovecot, redis_server, app)
        try:
            appender = append_while_running(dovecot, messages)
            all_handed_over(app, dovecot, appender, messages, 180)
            time.sleep(1)  # anything still to come would come now
        finally:
            stop_all(nodes)
        assert sum(app.accepted.values()) == messages, "a message was handed over twice"
        assert app.accepted.most_common(1)[0][1] == 1
    records = delivered_records(nodes)
    assert len(records) == messages
    by_node = {node.config["node"]["name"]: len(node.records("InboundDelivery")) for node in nodes}
    assert sum(1 for count in by_node.values() if count) >= 2, f"one node did all the work: {by_node}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("messages", SIZES)
def test_killing_a_node_mid_batch_loses_nothing_and_every_handoff_has_its_record(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer, messages: int
) -> None:
    with WebhookApp() as app:
        app.delay = 0.05  # a batch of 100 takes most of a second: the victim dies in the middle of one
        nodes = start_nodes(tmp_path, dovecot, redis_server, app, batch=100)
        try:
            appender = append_while_running(dovecot, messages)
            victim = nodes[0]
            # Its share is a third: 150 is mid-run, with more of its batches to come.
            wait_until(lambda: app.accepted_from("node0") >= 150, 60, interval=0.005)
            victim.kill()
            killed_at = time.time()
            all_handed_over(app, dovecot, appender, messages, 180)
            time.sleep(1)  # a record written just after the last handoff
        finally:
            stop_all(nodes)
        duplicates = sum(app.accepted.values()) - messages
        assert app.accepted and len(app.accepted) == messages
    records = delivered_records(nodes)
    recovered = [r for r in records if r["detail"].startswith("recovered")]
    print(f"kill -9: {messages} distinct, {duplicates} duplicates, {len(recovered)} recorded on the dead node's behalf")
    # A duplicate needs the webhook to have accepted a message the dead node had not yet marked
    # done: at most one per handoff in flight.
    assert 0 <= duplicates <= IN_FLIGHT, f"{duplicates} duplicates: more than the dead node had in flight"
    missing = unrecorded(app, nodes)
    assert not missing, f"{len(missing)} handoffs without an InboundDelivery record"
    assert any(r["timestamp"] > killed_at for node in nodes[1:] for r in node.records("InboundDelivery"))


@pytest.mark.timeout(300)
def test_a_node_killed_holding_a_batch_is_taken_over_within_ten_seconds(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    """The default 60 s lease, so only the dead node's missing heartbeat can free its claims
    this soon. The others are idle (in IDLE) when it dies, then busy with new mail when its
    heartbeat runs out: they must look at its messages again in time either way."""
    held = [mail(i) for i in range(BATCH)]
    keys = {hashlib.sha256(raw).hexdigest() for raw in held}
    with WebhookApp() as app:
        # The victim's handoffs wait until the others run (however long they take to start),
        # then go slowly, 8 a second: it dies early in its batch. The others', quickly.
        app.hold("node0")
        app.node_delay["node0"] = 1.0
        app.delay = 0.05
        options = {"lease": "60s", "poll_interval": "60s"}
        victim = node_config(tmp_path, 0, dovecot, redis_server, app, **options).start()
        others = [node_config(tmp_path, n, dovecot, redis_server, app, **options) for n in range(1, NODES)]
        nodes = [victim, *others]
        try:
            dovecot.append("app", held)
            wait_until(lambda: mailbox_health(victim)["claims"] >= BATCH, 60, interval=0.01)
            for node in others:
                node.start()  # they find every message held by the victim, and idle
            app.release("node0")
            wait_until(lambda: app.accepted_from("node0") >= 1, 30, interval=0.01)
            victim.kill()
            killed_at = time.time()
            appender = append_while_running(dovecot, 500, first=BATCH)
            wait_until(lambda: keys <= set(app.first_arrivals()), 90)
            all_handed_over(app, dovecot, appender, BATCH + 500, 120)
        finally:
            stop_all(nodes)
    arrived = app.first_arrivals()
    taken_over = [key for key in keys if arrived[key] > killed_at]
    late = max(arrived[key] for key in keys) - killed_at
    print(f"{len(taken_over)} of the victim's {BATCH} messages taken over, the last {late:.1f}s after the kill")
    assert taken_over, "the victim had handed its whole batch over before it died"
    assert late <= 10, f"the last of the dead node's messages arrived {late:.1f}s after the kill"
    # Duplicates: only the victim's handoffs in flight (its requests the webhook still accepted).
    assert sum(app.accepted.values()) - len(app.accepted) <= IN_FLIGHT


@pytest.mark.timeout(300)
@pytest.mark.parametrize("messages", SIZES)
def test_a_node_and_redis_killed_together_repeat_only_handoffs_in_flight(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer, messages: int
) -> None:
    """Redis comes back empty (no done marks, no claims, no epoch) and the node comes back
    without knowing the Redis it knew: what it had accepted must have been acknowledged at the
    mailbox (but for what was in flight), and it must not grab the others' messages while
    they put their claims back."""
    with WebhookApp() as app:
        app.delay = 0.05
        nodes = start_nodes(tmp_path, dovecot, redis_server, app, batch=100)
        try:
            appender = append_while_running(dovecot, messages)
            victim = nodes[0]
            wait_until(lambda: app.accepted_from("node0") >= 150, 60, interval=0.005)
            victim.kill()
            redis_server.kill()
            redis_server.start()
            victim.start()
            all_handed_over(app, dovecot, appender, messages, 180)
            time.sleep(1)
        finally:
            stop_all(nodes)
        duplicates = sum(app.accepted.values()) - messages
        assert len(app.accepted) == messages
    print(f"node and Redis killed: {messages} distinct, {duplicates} duplicates")
    # Not a batch (100 here): only what the dead node had in flight.
    assert duplicates <= IN_FLIGHT, f"{duplicates} duplicates: more than the dead node had in flight"
    missing = unrecorded(app, nodes)
    assert not missing, f"{len(missing)} handoffs without an InboundDelivery record"


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("messages", "outage"), [(1000, 10), pytest.param(2000, 30, marks=pytest.mark.slow)])
def test_redis_restart_and_a_failing_webhook_lose_nothing(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer, messages: int, outage: float
) -> None:
    """Redis restarts 5 s into the outage, and the outage outlasts it by more than the longest
    retry interval (4 s): messages fail before and after their claims and backoffs are lost."""
    with WebhookApp() as app:
        nodes = start_nodes(tmp_path, dovecot, redis_server, app)
        try:
            appender = append_while_running(dovecot, messages)
            wait_until(lambda: len(app.accepted) >= messages * 3 // 20, 60)
            app.fail_until = time.time() + outage
            time.sleep(5)
            redis_server.restart()  # every claim, backoff and done mark is gone
            failing_ends = app.fail_until
            wait_until(lambda: len(app.accepted) >= messages // 2 or time.time() > failing_ends + 60, 120)
            redis_server.restart()  # and once more while handoffs succeed
            all_handed_over(app, dovecot, appender, messages, 240)
        finally:
            stop_all(nodes)
        duplicates = sum(app.accepted.values()) - messages
        assert len(app.accepted) == messages
        assert app.refused >= 1
    failures = [r for node in nodes for r in node.records("InboundFailure")]
    print(f"Redis restarts: {messages} distinct, {duplicates} duplicates, {len(failures)} failed attempts")
    assert failures and not any(r.get("permanent") for r in failures)
    # Duplicates need a handoff in flight while Redis lost its claim: at most what the nodes
    # had in flight at the two restarts.
    assert duplicates <= 2 * NODES * IN_FLIGHT, f"{duplicates} duplicates"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_soak_with_kills_redis_restarts_and_outages_loses_nothing(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    """-m slow: 30,000 messages while, every few seconds, a random node is killed and started
    again, Redis restarts empty, or the webhook fails for a few seconds."""
    total = 30_000
    rng = random.Random(5)
    events: collections.Counter[str] = collections.Counter()
    with WebhookApp() as app:
        app.delay = 0.01
        nodes = start_nodes(tmp_path, dovecot, redis_server, app)
        try:
            appender = append_while_running(dovecot, total)
            while len(app.accepted) < total * 0.9:
                time.sleep(rng.uniform(2, 5))
                event = rng.choice(["kill", "redis", "outage"])
                events[event] += 1
                if event == "kill":
                    node = rng.choice(nodes)
                    node.kill()
                    node.start()
                elif event == "redis":
                    redis_server.restart()
                else:
                    app.fail_until = time.time() + rng.uniform(1, 5)
            all_handed_over(app, dovecot, appender, total, 300)
        finally:
            stop_all(nodes)
        duplicates = sum(app.accepted.values()) - total
    print(f"soak: {total} distinct, {duplicates} duplicates, events {dict(events)}")
    # Each kill may duplicate what the node had in flight; each Redis restart what was in
    # flight on every node.
    assert duplicates <= events["kill"] * IN_FLIGHT + events["redis"] * NODES * IN_FLIGHT
    missing = unrecorded(app, nodes)
    assert not missing, f"{len(missing)} handoffs without an InboundDelivery record"
