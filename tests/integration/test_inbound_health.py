"""What /healthz and the log say about a mailbox that cannot do its job, and about several nodes
watching one mailbox without [redis] (each hands every message over): against a private Dovecot."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from tests.support import zygote
from tests.support.apps import (
    WebhookApp,
    customer_mail,
    imap_mailbox,
    mailbox_health,
    redis_in_use_for_a_while,
    webhook_target,
)
from tests.support.process import PigeonProcess, free_port
from tests.support.services import Dovecot, RedisServer
from tests.support.sinks import wait_until


def health(node: PigeonProcess) -> tuple[int, dict[str, Any]]:
    status, body = node.http_get("/healthz")
    return status, json.loads(body)


def test_a_mailbox_that_cannot_connect_is_degraded_then_down_with_a_503(tmp_path: Path) -> None:
    box = {
        "name": "support",
        "host": "127.0.0.1",
        "port": free_port(),  # nothing listens there
        "tls": "none",
        "username": "app",
        "password": "secret",
        "target": "hook",
        "down_after": "2s",
    }
    with WebhookApp() as app, PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
        status, body = health(node)
        assert (status, body["status"], body["inbound"]["support"]["status"]) == (200, "degraded", "degraded")
        status, body = wait_until(lambda: (answer := health(node))[0] == 503 and answer, 10)
        assert body["status"] == "down"
        assert body["inbound"]["support"]["status"] == "down"
        assert "Connection refused" in body["inbound"]["support"]["error"]
        assert body["spool"]["status"] == "ok"  # the rest of the node works: said per component


def test_a_mailbox_handing_over_a_backlog_longer_than_down_after_stays_ok(tmp_path: Path, dovecot: Dovecot) -> None:
    """A node restarted with a backlog: its first batch takes longer than `down_after`, and the
    mailbox, which works all along, is neither degraded nor down (no 503 to a load balancer)."""
    dovecot.append("app", [customer_mail(i) for i in range(40)])
    with WebhookApp() as app:
        app.delay = 0.3  # 40 messages, 2 at a time: about 6 s for the batch, three times down_after
        box = imap_mailbox(dovecot, "hook", concurrency=2, down_after="2s")
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            assert app.wait_distinct(1, 20) >= 1
            states: list[tuple[int, str]] = []
            polls = set()
            deadline = time.monotonic() + 60
            while len(app.accepted) < 40 and time.monotonic() < deadline:
                status, body = health(node)
                states.append((status, body["inbound"]["support"]["status"]))
                polls.add(body["inbound"]["support"]["last_poll"])
                time.sleep(0.25)
            assert len(app.accepted) == 40
            assert len(states) > 10, states  # the backlog took a while
            assert set(states) == {(200, "ok")}, states
            assert len(polls) > 2, polls  # last_poll moves while the batch is handed over


def test_a_dead_target_shows_in_healthz_and_top_until_it_accepts_again(tmp_path: Path, dovecot: Dovecot) -> None:
    """Sidekiq's Redis refuses connections: every handoff fails for now. The mailbox works, so it
    is degraded, not down (past down_after too), and says which target fails and why; once the
    target takes a message again the mailbox is ok."""
    dovecot.append("app", [customer_mail(i) for i in range(3)])
    sidekiq = RedisServer(tmp_path / "sidekiq")  # not started yet: its port refuses connections
    jobs = {"name": "jobs", "kind": "sidekiq", "redis_url": sidekiq.url, "retry_interval": "200ms",
            "max_retry_interval": "500ms"}  # fmt: skip
    box = imap_mailbox(dovecot, "jobs", down_after="1s")
    try:
        with PigeonProcess(tmp_path / "p", target=[jobs], mailbox=[box]) as node:
            node.wait_records("InboundFailure", 3, timeout=20)
            wait_until(lambda: health(node)[1]["inbound"]["support"]["status"] == "degraded", 10)
            time.sleep(1.5)  # past down_after
            status, body = health(node)
            mailbox = body["inbound"]["support"]
            assert (status, body["status"], mailbox["status"]) == (200, "degraded", "degraded")
            assert mailbox["error"].startswith(f"target jobs: Sidekiq's Redis ({sidekiq.url})"), mailbox
            assert "refused" in mailbox["error"], mailbox
            shown = zygote.run(
                ["top", "-c", str(node.config_path), "--once"],
                text=True,
                timeout=60,
                check=False,
                env={**os.environ, "COLUMNS": "300"},
            )
            assert shown.returncode == 0, shown.stderr
            (row,) = [line for line in shown.stdout.splitlines() if line.startswith("support ")]
            assert row.split()[1:3] == ["jobs", "degraded"] and "target jobs: Sidekiq's Redis" in row, row
            sidekiq.start()
            with sidekiq.client() as client:
                wait_until(lambda: client.llen("queue:default") == 3, 20)
            mailbox = wait_until(lambda: (m := health(node)[1]["inbound"]["support"])["status"] == "ok" and m, 10)
            assert mailbox["error"] is None
            # A recovery, said at INFO: a WARNING would page someone for good news.
            assert "INFO pigeon.inbound.mailbox: mailbox support: target jobs accepts messages again" in node.stderr()
    finally:
        sidekiq.stop()


def test_a_dead_targets_error_goes_once_nothing_is_left_to_hand_it(tmp_path: Path, dovecot: Dovecot) -> None:
    # The messages it refused were removed at the source (by a person, say): nothing is left
    # for the target, so its last refusal no longer makes the mailbox degraded.
    dovecot.append("app", [customer_mail(i) for i in range(2)])
    sidekiq = RedisServer(tmp_path / "sidekiq")  # never started: its port refuses connections
    jobs = {"name": "jobs", "kind": "sidekiq", "redis_url": sidekiq.url, "retry_interval": "200ms",
            "max_retry_interval": "500ms"}  # fmt: skip
    with PigeonProcess(tmp_path / "p", target=[jobs], mailbox=[imap_mailbox(dovecot, "jobs")]) as node:
        wait_until(lambda: health(node)[1]["inbound"]["support"]["status"] == "degraded", 20)
        with dovecot.connect("app") as imap:
            imap.select("INBOX")
            imap.uid("STORE", "1:*", "+FLAGS.SILENT", "(\\Deleted)")
            imap.expunge()
        mailbox = wait_until(lambda: (m := health(node)[1]["inbound"]["support"])["status"] == "ok" and m, 20)
        assert mailbox["error"] is None


def test_a_mailbox_without_redis_is_a_loud_risk_at_start_and_in_healthz(tmp_path: Path, dovecot: Dovecot) -> None:
    with WebhookApp() as app:
        box = imap_mailbox(dovecot, "hook")
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            mailbox = wait_until(lambda: (m := health(node)[1]["inbound"]["support"])["status"] == "ok" and m, 10)
            assert mailbox["arbitration"] == "local"
            assert "another node watching this mailbox would hand every message over again" in mailbox["warning"]
            assert "WARNING pigeon.node.node: mailbox support: no [redis]" in node.stderr()


def test_two_nodes_on_one_mailbox_without_redis_notice_each_other(tmp_path: Path, dovecot: Dovecot) -> None:
    with WebhookApp() as app:
        app.delay = 1.0  # handoffs overlap, even on a loaded machine: both nodes find the messages unseen
        box = imap_mailbox(dovecot, "hook", poll_interval="1s")
        nodes = [
            PigeonProcess(tmp_path / name, node={"name": name}, target=[webhook_target(app)], mailbox=[box])
            for name in ("node-a", "node-b")
        ]
        with nodes[0], nodes[1]:
            wait_until(lambda: all(health(n)[1]["inbound"]["support"]["last_poll"] for n in nodes), 10)
            dovecot.append("app", [customer_mail(i) for i in range(10)])
            assert app.wait_distinct(10, 30) == 10
            wait_until(lambda: not dovecot.unseen("app"), 20)
            said = [n.stderr() for n in nodes]
            states = [health(n) for n in nodes]
        # Each message went to the application once per node that took it: what the warning is about.
        assert sum(app.accepted.values()) > 10
        noticed = [i for i, text in enumerate(said) if "was also taken by node" in text]
        assert noticed, said
        for i in noticed:
            other = "node-b" if i == 0 else "node-a"
            assert f"also taken by node '{other}'" in said[i]
            assert "give the nodes a shared [redis] url" in said[i]
            status, body = states[i]
            assert (status, body["status"]) == (200, "degraded")
            assert body["inbound"]["support"]["status"] == "degraded"
            assert f"node '{other}'" in body["inbound"]["support"]["conflict"]


def test_a_node_with_redis_notices_a_node_without_redis_on_its_mailbox(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    """One node left without [redis] beside nodes with it (a rollout half done) hands every
    message over again, whatever their claims: the node with Redis sees the other's keyword
    appear on messages it claims, says so once (a WARNING) and is degraded with a `conflict`."""
    redis_in_use_for_a_while(redis_server)  # no pause for a Redis that may have lost its data
    with WebhookApp() as app:
        box = imap_mailbox(dovecot, "hook", batch=2, poll_interval="1s")
        hook_b, hook_a = (webhook_target(app, headers={"X-Test-Node": name}) for name in ("node-b", "node-a"))
        with_redis = PigeonProcess(tmp_path / "b", node={"name": "node-b"}, redis={"url": redis_server.url},
                                   target=[hook_b], mailbox=[box])  # fmt: skip
        # Its batch takes every message (it marks them all), whichever the node with Redis took.
        whole = imap_mailbox(dovecot, "hook", poll_interval="1s")
        without = PigeonProcess(tmp_path / "a", node={"name": "node-a"}, target=[hook_a], mailbox=[whole])
        # Each node's handoffs wait until released: the node with Redis has looked at every
        # message (its first two batches) before the other starts, and the other has marked its
        # batch and holds it, unacknowledged, while the node with Redis claims the rest.
        app.hold("node-b")
        app.hold("node-a")
        with with_redis:
            wait_until(lambda: mailbox_health(with_redis)["last_poll"], 10)
            dovecot.append("app", [customer_mail(i) for i in range(10)])
            wait_until(lambda: app.started >= 1, 20)
            with without:
                wait_until(lambda: dovecot.uids("app", "KEYWORD $PigeonNode_node-a"), 20)
                app.release("node-b")
                mailbox = wait_until(lambda: (m := mailbox_health(with_redis)).get("conflict") and m, 30)
                app.release("node-a")
                wait_until(lambda: not dovecot.unseen("app"), 30)
                said = with_redis.stderr()
                status, body = health(with_redis)
    assert mailbox["status"] == "degraded"
    assert (status, body["status"]) == (200, "degraded")
    assert "node 'node-a'" in body["inbound"]["support"]["conflict"]
    assert "without [redis]" in body["inbound"]["support"]["conflict"]
    warnings = [line for line in said.splitlines() if "WARNING" in line and "also taken by node 'node-a'" in line]
    assert len(warnings) == 1, said
    assert "give node 'node-a' the same [redis] url" in warnings[0]


def test_a_node_with_redis_takes_over_what_a_stopped_node_without_it_marked_without_a_conflict(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    """A rollout done right: the node without [redis] stopped with its batch unacknowledged,
    its keyword on those messages, before the nodes with Redis started. They hand them over,
    and no conflict is said: no node runs without [redis] any more."""
    redis_in_use_for_a_while(redis_server)
    dovecot.append("app", [customer_mail(i) for i in range(5)])
    with dovecot.connect("app") as imap:
        imap.select("INBOX")
        assert imap.uid("STORE", "1:3", "+FLAGS.SILENT", "($PigeonNode_node-a)")[0] == "OK"
    with WebhookApp() as app:
        box = imap_mailbox(dovecot, "hook", batch=2)
        with PigeonProcess(tmp_path / "b", node={"name": "node-b"}, redis={"url": redis_server.url},
                           target=[webhook_target(app)], mailbox=[box]) as node:  # fmt: skip
            assert app.wait_distinct(5, 30) == 5
            wait_until(lambda: not dovecot.unseen("app"), 20)
            mailbox = wait_until(lambda: (m := mailbox_health(node))["status"] == "ok" and m, 10)
            said = node.stderr()
    assert "conflict" not in mailbox
    assert "also taken by node" not in said


def test_a_mailbox_not_connected_yet_after_the_node_starts_says_so_in_healthz(tmp_path: Path) -> None:
    """Its server accepts the connection and says nothing yet (a slow greeting): until the first
    search the mailbox is "degraded", and `error` says why. Before, it was `null`."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        box = {
            "name": "support",
            "host": "127.0.0.1",
            "port": port,
            "tls": "none",
            "username": "app",
            "password": "secret",
            "target": "hook",
            "timeout": "30s",  # the greeting is waited for all along the test
        }
        with WebhookApp() as app, PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            status, body = health(node)
            mailbox = body["inbound"]["support"]
            assert (status, mailbox["status"], mailbox["connected"]) == (200, "degraded", False), body
            assert mailbox["error"] == f"not connected yet (connecting to 127.0.0.1:{port})", body
