"""A rule ended through another node stays ended on a node that restarts once Redis lost its data.

A multi-worker node's supervisor keeps the node's rules in a file its workers take at their start
(`pigeon.node.standing`); it learns the cluster's changes too (`pigeon.node.following`), so a
standing bounce or suspension cancelled through another node is not taken back from that file.
A one-worker node keeps the same file, from what its worker stores and drops: a rule made on it
holds on every worker once it runs with more, Redis's copy lost meanwhile or not."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess, to_toml
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

ADMIN = "admin-token-0123456789"
TOKENS = [{"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]}]

MakeNode = Callable[..., PigeonProcess]


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture
def make_node(tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer) -> Iterator[MakeNode]:
    made: list[PigeonProcess] = []

    def make(name: str, workers: int = 1) -> PigeonProcess:
        node = PigeonProcess(
            tmp_path / name,
            node={"name": name, "workers": workers},
            http={"token": TOKENS},
            redis={"url": redis_server.url, "timeout": "1s"},
            **delivery_config(sink.endpoint, retry_interval="1h"),
        )
        made.append(node)
        return node.start()

    yield make
    for node in made:
        node.__exit__(None)


def _api(node: PigeonProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return node.http_call(method, path, body, ADMIN)


def _send(node: PigeonProcess, domain: str, count: int = 1) -> None:
    for _ in range(count):
        status, answer = node.http_post(
            "/api/v1/inject",
            {
                "envelope_sender": "sender@example.org",
                "content": f"From: a@example.org\r\nSubject: to {domain}\r\n\r\nhello\r\n",
                "recipients": [{"email": f"user@{domain}"}],
            },
            node.local_token,
        )
        assert status == 200, answer


def _node_rules(node: PigeonProcess) -> dict[str, Any]:
    path = node.root / "spool" / "admin-rules.json"
    return json.loads(path.read_bytes()) if path.exists() else {}


def _make(node: PigeonProcess, kind: str) -> str:
    body: dict[str, Any] = {"domain": "other.test"}
    if kind == "bounce":
        body["duration"] = "2h"
    status, answer = _api(node, "POST", f"/api/v1/admin/{kind}", body)
    assert status == 200, answer
    rule_id: str = answer["rule"]["id"]
    return rule_id


@pytest.mark.parametrize("kind", ["bounce", "suspend"])
@pytest.mark.parametrize("workers", [2, 1])
def test_a_rule_ended_through_another_node_stays_ended_when_its_node_restarts_after_redis_lost_its_data(
    make_node: MakeNode, sink: ScriptedSink, redis_server: RedisServer, kind: str, workers: int
) -> None:
    b = make_node("b", workers)
    a = make_node("a")
    rule_id = _make(b, kind)
    if workers > 1:
        assert rule_id in _node_rules(b)["in_force"]
    status, ended = _api(a, "DELETE", f"/api/v1/admin/{kind}/{rule_id}")
    assert status == 200 and ended["cluster"]["nodes"] == {"a": "done", "b": "done"}, ended
    if workers > 1:  # the node's file learns the end made elsewhere
        wait_until(lambda: rule_id in _node_rules(b).get("ended", {}), 10)
        assert rule_id not in _node_rules(b)["in_force"]
    redis_server.restart()  # no persistence: the cluster's rules and their ends are gone
    b.stop()
    b.start()
    status, listed = _api(b, "GET", f"/api/v1/admin/{kind}")
    assert status == 200 and listed["rules"] == [], listed
    assert "lacked" not in b.stderr(), "a worker took the ended rule back from the node's rules"
    _send(b, "other.test", 3)
    sink.wait_for(3)
    assert not b.records("AdminBounce")


@pytest.mark.parametrize("workers", [2, 1])
def test_a_suspension_resumed_while_its_node_was_stopped_stays_resumed_there_after_redis_lost_its_data(
    make_node: MakeNode, sink: ScriptedSink, redis_server: RedisServer, workers: int
) -> None:
    # An outside tester: node c stopped, a suspension resumed through a, Redis restarted empty,
    # then c started: c held the suspension again, alone, its mail stuck (`[not held on a, b]`).
    b = make_node("b", workers)
    a = make_node("a")
    rule_id = _make(a, "suspend")
    _send(b, "other.test", 2)
    time.sleep(1.0)
    assert not sink.received, "mail the suspension holds went out"
    b.stop()
    status, resumed = _api(a, "DELETE", f"/api/v1/admin/suspend/{rule_id}")
    # b stopped, known still: it takes the resume when it starts (the answer says so: `at_start`).
    assert status == 200 and resumed["cluster"]["nodes"] == {"a": "done", "b": "at_start"}, resumed
    redis_server.kill()  # kill -9, no persistence: the resume's tombstone is gone with the rest
    redis_server.start()
    client = redis_server.client()
    try:  # a finds the rules lost, and gives back what it knows (at once, with the marker)
        wait_until(lambda: client.exists("pigeon:admin:rules:kept"), 15)
    finally:
        client.close()
    b.start()
    status, listed = _api(b, "GET", "/api/v1/admin/suspend")
    assert status == 200 and listed["rules"] == [], listed
    sink.wait_for(2)  # what it held on b goes out
    assert "admin rules: Redis had forgotten the rules ended lately: 1 ends known here given back" in a.stderr()


@pytest.mark.parametrize("workers", [2, 1])
def test_a_resume_issued_while_redis_was_away_is_sent_to_the_cluster_once_it_answers(
    make_node: MakeNode, sink: ScriptedSink, redis_server: RedisServer, workers: int
) -> None:
    a = make_node("a", workers)
    b = make_node("b")
    rule_id = _make(a, "suspend")
    _send(a, "other.test")
    _send(b, "other.test")
    assert redis_server.process is not None
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    try:
        status, resumed = _api(a, "DELETE", f"/api/v1/admin/suspend/{rule_id}")
        assert status == 200 and resumed["cluster"]["nodes"] == {"a": "done"}, resumed
        assert "sent to the other nodes once Redis answers" in resumed["cluster"]["error"], resumed
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
    time.sleep(4)
    sink.wait_for(2, timeout=20)  # a's, and b's once the resume reached it
    time.sleep(3)  # every worker of a has taken the cluster's rules again by now
    for node in (a, b):
        status, listed = _api(node, "GET", "/api/v1/admin/suspend")
        assert status == 200 and listed["rules"] == [], (node.root.name, listed)
    assert "taken from the cluster" not in a.stderr(), "the resume was undone when Redis came back"


def test_a_rule_made_on_a_one_worker_node_holds_on_every_worker_once_it_has_two_after_redis_lost_its_data(
    make_node: MakeNode, sink: ScriptedSink, redis_server: RedisServer
) -> None:
    b = make_node("b")
    rule_id = _make(b, "suspend")
    redis_server.restart()  # no persistence: the cluster's copy of the rule is gone
    b.stop()
    b.config["node"]["workers"] = 2
    b.config_path.write_text(to_toml(b.config))
    b.start()
    status, listed = _api(b, "GET", "/api/v1/admin/suspend")
    assert status == 200 and [rule["id"] for rule in listed["rules"]] == [rule_id], listed
    assert "not_held" not in listed, listed  # before: worker 1 lacked it, and delivered its share
    _send(b, "other.test", 4)  # injections go to each worker in turn
    assert sink.after(3) == []
