"""Writes by id that a node could not answer at once: their answer says so, and the node that holds
the message acts on it before it sends anything.

Node a runs two workers (a shard each) behind a supervisor, node b one; they share a private Redis.
A write by id issued through b while a is stopped names a `pending`, and a applies it when it
starts, before it delivers anything, whatever else made the mail due meanwhile. Issued while
Redis is away, it reaches b alone: an id b does not hold is not said to be nowhere."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pigeon.message import parse_id, shard_of
from tests.support.admin_cluster import ADMIN, admin_cluster, admin_command, inject
from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, wait_until


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture
def cluster(tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer) -> Iterator[tuple[PigeonProcess, ...]]:
    with admin_cluster(tmp_path, sink.endpoint, redis_server.url, (("a", 2), ("b", 1))) as nodes:
        yield nodes


def _api(node: PigeonProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return node.http_call(method, path, body, ADMIN)


@pytest.mark.parametrize("ended", ["resumed after", "ran out meanwhile"])
def test_a_bounce_and_a_hold_by_id_issued_while_their_node_was_stopped_are_applied_there_before_it_delivers(
    cluster: tuple[PigeonProcess, PigeonProcess], sink: ScriptedSink, ended: str
) -> None:
    # An outside tester: a suspension held node a's mail; a stopped; through b, a bounce and a
    # hold by id ("node a is not running: applied there when it starts"), then a resume; a
    # started, and delivered both messages: it took the resume with the cluster's rules before
    # its scheduler started, and read the bounce and the hold in the stream 0.15 s later. With
    # a suspension that ran out while a was down, a worker delivered its message first too.
    a, b = cluster
    duration = ["--duration", "8s"] if ended == "ran out meanwhile" else []
    shown = admin_command(a, "suspend", "--domain", "d1.test", *duration, "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    suspension = json.loads(shown.stdout)["rule"]["id"]
    made = time.monotonic()
    ids = inject(a, "user@d1.test", 4)
    assert sorted(shard_of(parse_id(spool_id)) for spool_id in ids) == [0, 0, 1, 1], ids  # each worker has two
    bounced, held = ids[:2], ids[2:]  # (one of each worker's in each)
    a.stop()
    shown = admin_command(b, "bounce", *(f"--id={spool_id}" for spool_id in bounced), "--reason", "gone")
    assert shown.returncode == 75, shown.stdout + shown.stderr
    assert shown.stdout.count("node a is not running: applied there when it starts") == 2, shown.stdout
    shown = admin_command(b, "hold", *(f"--id={spool_id}" for spool_id in held), "--reason", "wait")
    assert shown.returncode == 75, shown.stdout + shown.stderr
    assert shown.stdout.count("node a is not running: applied there when it starts") == 2, shown.stdout
    if ended == "resumed after":
        shown = admin_command(b, "resume", suspension)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "a (will apply at start)" in shown.stdout, shown.stdout
    else:
        time.sleep(max(0.0, made + 8.5 - time.monotonic()))  # the suspension is over
    a.start()
    a.wait_stderr("admin bounce by ops", count=2, timeout=20)  # each worker, of its shard
    a.wait_stderr("admin hold by ops", count=2, timeout=20)
    time.sleep(2.0)  # what a would have sent, it would have by now
    assert [r["id"] for r in a.records("Delivery")] == [] and sink.received == [], a.stderr()
    assert sorted(r["id"] for r in a.records("AdminBounce")) == sorted(bounced)
    assert sorted(r["id"] for r in a.records("AdminHold")) == sorted(held)
    assert a.stderr().count("applied before this node delivers anything") == 2, a.stderr()  # each worker


def test_a_write_by_id_while_redis_is_away_says_the_other_nodes_were_not_reached_not_that_the_message_is_nowhere(
    cluster: tuple[PigeonProcess, PigeonProcess], redis_server: RedisServer
) -> None:
    # An outside tester: with Redis killed, `pigeon bounce --id X` on b, X queued on a, said
    # "X  not found: delivered, bounced or expired already, or no such message", exit 0 (HTTP
    # 200), and a delivered X later. So did the others: exit 0 for an answer of b alone.
    a, b = cluster
    _api(a, "POST", "/api/v1/admin/suspend", {"domain": "d1.test"})
    [elsewhere] = inject(a, "user@d1.test", 1)
    [here] = inject(b, "user@d1.test", 1)
    redis_server.kill()
    shown = admin_command(b, "bounce", "--id", elsewhere, "--id", here, "--reason", "r")
    assert shown.returncode == 75, shown.stdout + shown.stderr
    assert f"  {here}  node b: bounced (1 recipient)" in shown.stdout, shown.stdout
    assert f"  {elsewhere}  not found on node b; the other nodes were not reached (Redis cannot be reached)" in (
        shown.stdout
    ), shown.stdout
    assert "no such message" not in shown.stdout, shown.stdout
    status, answer = _api(b, "POST", "/api/v1/admin/hold", {"messages": [elsewhere], "reason": "r"})
    assert status == 200, answer
    assert answer["messages"] == [{"id": elsewhere, "result": "unknown", "not_found_on": ["b"]}], answer
    assert answer["cluster"]["nodes"] == {"b": "done"} and answer["cluster"]["others_unreached"] is True, answer
    for command in (("retry", "--domain", "d1.test"), ("rebind", "--domain", "d1.test", "--routing-domain", "d2.test")):
        shown = admin_command(b, *command)
        assert shown.returncode == 75, shown.stdout + shown.stderr
        assert "Redis cannot be reached" in shown.stdout, shown.stdout
    shown = admin_command(b, "suspend", "--domain", "d3.test")
    assert shown.returncode == 75, shown.stdout + shown.stderr
    assert "sent to the other nodes once Redis answers" in shown.stdout, shown.stdout
    assert [r["id"] for r in a.records("AdminBounce")] == [], "a heard nothing"
    wait_until(lambda: a.records("AdminBounce") == [] and [r["id"] for r in b.records("AdminBounce")] == [here], 5)
