"""Standing rules are cluster state: a node that joins late, or new, holds what the others hold.

Suspensions and bounces with a duration live in Redis as well as in the stream, so a node
started after them (or back after `[redis] late_operations`, made 1 s here rather than 5
minutes) takes them before it delivers anything, and drops those ended meanwhile."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
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

    def make(name: str, *, start: bool = True, **redis: Any) -> PigeonProcess:
        node = PigeonProcess(
            tmp_path / name,
            node={"name": name, "workers": 1},
            http={"token": TOKENS},
            redis={"url": redis_server.url, "timeout": "1s", **redis},
            **delivery_config(sink.endpoint, retry_interval="1h"),
        )
        made.append(node)
        return node.start() if start else node

    yield make
    for node in made:
        node.__exit__(None)


def _api(node: PigeonProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return node.http_call(method, path, body, ADMIN)


def _send(node: PigeonProcess, *domains: str) -> None:
    for domain in domains:
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


def _delivered(sink: ScriptedSink) -> list[str]:
    return sorted(r.recipients[0].split("@")[1] for r in sink.received)


def _listed(node: PigeonProcess, kind: str) -> list[str]:
    status, answer = _api(node, "GET", f"/api/v1/admin/{kind}")
    assert status == 200, answer
    return sorted(rule["selector"]["domain"] for rule in answer["rules"])


def test_a_node_started_after_a_suspension_holds_it_and_releases_on_a_resume_from_another_node(
    make_node: MakeNode, sink: ScriptedSink
) -> None:
    a = make_node("a")
    status, suspended = _api(a, "POST", "/api/v1/admin/suspend", {"domain": "d07.test", "reason": "complaints"})
    assert status == 200 and suspended["cluster"]["nodes"] == {"a": "done"}, suspended
    status, bounced = _api(a, "POST", "/api/v1/admin/bounce", {"domain": "d08.test", "duration": "2h"})
    assert status == 200, bounced
    b = make_node("b")  # new: an empty spool, no cursor in the stream
    assert _listed(b, "suspend") == ["d07.test"] and _listed(b, "bounce") == ["d08.test"]
    _send(b, "d07.test", "d08.test", "other.test")
    sink.wait_for(1)
    assert len(b.wait_records("AdminBounce")) == 1
    time.sleep(1.5)
    assert _delivered(sink) == ["other.test"], "mail a suspension holds went out from the node that joined"
    # The rule b holds is the one a made: a resume on a releases b's mail.
    status, resumed = _api(a, "DELETE", f"/api/v1/admin/suspend/{suspended['rule']['id']}")
    assert status == 200 and resumed["cluster"]["nodes"] == {"a": "done", "b": "done"}, resumed
    assert resumed["made_due"] == 1
    sink.wait_for(2)
    assert _delivered(sink) == ["d07.test", "other.test"]


def test_a_node_back_past_the_age_limit_holds_what_was_suspended_meanwhile_and_not_what_was_resumed(
    make_node: MakeNode, sink: ScriptedSink
) -> None:
    a = make_node("a", late_operations="1s")
    b = make_node("b", late_operations="1s")
    status, old = _api(a, "POST", "/api/v1/admin/suspend", {"domain": "d05.test"})
    assert status == 200 and old["cluster"]["nodes"] == {"a": "done", "b": "done"}, old
    assert _listed(b, "suspend") == ["d05.test"]
    b.stop()  # (gone at once: a kill -9 would make every write below wait 30 s for it)
    status, answer = _api(a, "POST", "/api/v1/admin/suspend", {"domain": "d07.test"})
    assert status == 200, answer
    status, answer = _api(a, "POST", "/api/v1/admin/bounce", {"domain": "d08.test", "duration": "2h"})
    assert status == 200, answer
    status, answer = _api(a, "DELETE", f"/api/v1/admin/suspend/{old['rule']['id']}")
    assert status == 200, answer
    time.sleep(2.5)  # every entry b missed is past [redis] late_operations
    b.start()
    b.wait_stderr("was not applied here (past 1s")  # the bounce of what was queued then: skipped
    assert _listed(b, "suspend") == ["d07.test"] and _listed(b, "bounce") == ["d08.test"]
    _send(b, "d05.test", "d07.test", "d08.test")
    sink.wait_for(1)
    assert len(b.wait_records("AdminBounce")) == 1
    time.sleep(1.5)
    assert _delivered(sink) == ["d05.test"]


def test_a_cluster_list_says_which_nodes_do_not_hold_a_rule(make_node: MakeNode, redis_server: RedisServer) -> None:
    a = make_node("a")
    make_node("b")
    redis_server.stop()
    status, answer = _api(a, "POST", "/api/v1/admin/suspend", {"domain": "d09.test"})
    assert status == 200 and "applied on this node only" in answer["cluster"]["error"], answer
    # Sent to the cluster once Redis answers, but only by the process told: a restarted one does not.
    a.stop()
    a.start()
    redis_server.start()
    client = redis_server.client()
    try:
        wait_until(lambda: client.hlen("pigeon:admin:nodes") == 2, 15)
    finally:
        client.close()
    time.sleep(1.5)  # a node renews its presence just before it reads on
    shown = zygote.run(
        ["suspend", "--list", "--cluster", "--url", f"http://127.0.0.1:{a.http_port}", "--token", ADMIN],
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if "d09.test" in line]
    assert line.endswith("[not held on b]"), shown.stdout
    assert "nodes: a (done), b (done)" in shown.stdout


def test_a_redis_back_without_its_data_gets_the_rules_back_and_a_new_node_holds_them(
    make_node: MakeNode, sink: ScriptedSink, redis_server: RedisServer
) -> None:
    a = make_node("a")
    status, suspended = _api(a, "POST", "/api/v1/admin/suspend", {"domain": "d07.test", "reason": "complaints"})
    assert status == 200 and suspended["cluster"]["nodes"] == {"a": "done"}, suspended
    time.sleep(2.5)  # a worker looks at the cluster's rules every 2 s: this one is seen there
    redis_server.restart()  # no persistence: every key is gone
    a.wait_stderr("1 held here given back")
    b = make_node("b")
    assert _listed(b, "suspend") == ["d07.test"]
    _send(b, "d07.test", "other.test")
    sink.wait_for(1)
    time.sleep(1.5)
    assert _delivered(sink) == ["other.test"], "mail the suspension holds went out from the node that joined"
    status, resumed = _api(b, "DELETE", f"/api/v1/admin/suspend/{suspended['rule']['id']}")
    assert status == 200 and resumed["cluster"]["nodes"] == {"a": "done", "b": "done"}, resumed
    sink.wait_for(2)
    assert _delivered(sink) == ["d07.test", "other.test"]


def test_a_suspension_made_just_before_redis_loses_its_data_is_given_back_and_a_new_node_holds_it(
    make_node: MakeNode, sink: ScriptedSink, redis_server: RedisServer
) -> None:
    # An outside tester suspended on b and killed Redis at once: no worker had looked at the
    # cluster's rules since (every 2 s), none gave this one back after any later loss either,
    # and a node that joined afterwards delivered the mail the other nodes held.
    a = make_node("a")
    b = make_node("b")
    status, suspended = _api(b, "POST", "/api/v1/admin/suspend", {"domain": "sg.test"})
    assert status == 200 and suspended["cluster"]["nodes"] == {"a": "done", "b": "done"}, suspended
    redis_server.kill()  # kill -9 at once, no persistence: every key is gone
    time.sleep(1.0)
    redis_server.start()
    client = redis_server.client()
    try:
        wait_until(lambda: client.hexists("pigeon:admin:rules", suspended["rule"]["id"]), timeout=15)
    finally:
        client.close()
    assert _listed(a, "suspend") == _listed(b, "suspend") == ["sg.test"]
    c = make_node("c")
    assert _listed(c, "suspend") == ["sg.test"]
    _send(c, "sg.test", "other.test")
    sink.wait_for(1)
    time.sleep(1.5)
    assert _delivered(sink) == ["other.test"], "mail the suspension holds went out from the node that joined"
