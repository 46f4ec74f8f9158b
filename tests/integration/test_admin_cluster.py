"""Admin operations across a cluster: issued on one node, applied on every node sharing the Redis.

Node a runs one worker (its own API is the front), node b two workers behind a supervisor: an
operation issued on either reaches the other's every worker, and the answer adds up both."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config, wait_until
from tests.support.tcp_proxy import TcpProxy

ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"
TOKENS = [
    {"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]},
    {"name": "dashboard", "token": READER, "scopes": ["read"]},
]


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture
def cluster(tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer) -> Iterator[tuple[PigeonProcess, ...]]:
    with ExitStack() as stack:
        nodes = []
        for name, workers in (("a", 1), ("b", 2)):
            config = delivery_config(sink.endpoint, retry_interval="1h")
            node = PigeonProcess(
                tmp_path / name,
                node={"name": name, "workers": workers},
                http={"token": TOKENS},
                redis={"url": redis_server.url, "timeout": "1s"},
                **config,
            )
            nodes.append(stack.enter_context(node))
        yield tuple(nodes)


def _api(node: PigeonProcess, method: str, path: str, body: Any = None, token: str = ADMIN) -> tuple[int, Any]:
    return node.http_call(method, path, body, token)


def _defer(node: PigeonProcess, count: int, domain: str = "example.net") -> None:
    """`count` messages the sink defers (retried in an hour): they stay queued on `node`."""
    for n in range(count):
        status, answer = node.http_post(
            "/api/v1/inject",
            {
                "envelope_sender": "sender@example.org",
                "content": f"From: a@example.org\r\nSubject: {n}\r\n\r\nhello\r\n",
                "recipients": [{"email": f"tempfail@{domain}"}],
            },
            node.local_token,
        )
        assert status == 200, answer
    wait_until(lambda: len({r["id"] for r in node.records("TransientFailure")}) >= count, 30)


def _queued(node: PigeonProcess, cluster: bool = False) -> int:
    status, answer = _api(node, "GET", "/api/v1/queues" + ("?cluster=1" if cluster else ""), token=READER)
    assert status == 200, answer
    return sum(row["messages"] for row in answer["scheduled"])


def test_a_bulk_bounce_issued_on_one_node_reaches_mail_queued_on_the_other(
    cluster: tuple[PigeonProcess, PigeonProcess],
) -> None:
    a, b = cluster
    _defer(a, 3)
    _defer(b, 5)
    _defer(b, 2, domain="other.test")  # not selected: stays
    status, answer = _api(a, "POST", "/api/v1/admin/bounce", {"domain": "example.net", "reason": "list cleaning"})
    assert status == 200, answer
    assert answer["bounced"] == 8  # a's 3 and b's 5, added up
    assert answer["cluster"]["nodes"] == {"a": "done", "b": "done"}
    bounced_on_b = wait_until(lambda: len(b.records("AdminBounce")) == 5 and b.records("AdminBounce"))
    assert all(r["reason"] == "list cleaning" and r["operator"] == "ops" for r in bounced_on_b)
    assert len(a.records("AdminBounce")) == 3
    assert _queued(b) == 2 and _queued(a) == 0
    # One operation, one id everywhere: its progress adds up over the nodes and their workers.
    status, progress = _api(b, "GET", "/api/v1/admin/operations?cluster=1", token=READER)
    row = next(r for r in progress["operations"] if r["operation"] == answer["operation"])
    assert row["acted_on"] == 8 and row["running"] == 0


def test_a_bounce_and_a_retry_by_id_find_the_message_on_the_node_that_holds_it(
    cluster: tuple[PigeonProcess, PigeonProcess],
) -> None:
    a, b = cluster
    _defer(a, 1)
    _defer(b, 3)
    (on_a,) = {r["id"] for r in a.records("TransientFailure")}
    on_b = sorted({r["id"] for r in b.records("TransientFailure")})
    # Issued on a, for one of b's messages (on whichever of b's workers holds it), and one of a's.
    body = {"messages": [on_b[0], on_a, "00000000000000ff"], "reason": "stuck"}
    status, answer = _api(a, "POST", "/api/v1/admin/bounce", body)
    assert status == 200, answer
    # Each found row names the node that holds it: the one whose `pigeon inspect` shows it.
    assert answer["messages"] == [
        {"id": on_b[0], "result": "bounced", "recipients": 1, "node": "b"},
        {"id": on_a, "result": "bounced", "recipients": 1, "node": "a"},
        {"id": "00000000000000ff", "result": "not_found"},
    ]
    assert (answer["bounced"], answer["cluster"]["nodes"]) == (2, {"a": "done", "b": "done"})
    assert [r["id"] for r in wait_until(lambda: b.records("AdminBounce"))] == [on_b[0]]
    assert [r["id"] for r in a.records("AdminBounce")] == [on_a]
    assert _api(b, "GET", "/api/v1/admin/bounce?cluster=1")[1]["rules"] == []  # no standing rule anywhere
    # Issued on b (its supervisor), for another of its own: only that one is due now.
    status, answer = _api(b, "POST", "/api/v1/admin/retry", {"messages": [on_b[1]]})
    assert status == 200, answer
    assert answer["messages"] == [{"id": on_b[1], "result": "made_due", "node": "b"}] and answer["made_due"] == 1
    wait_until(lambda: [r["id"] for r in b.records("TransientFailure")].count(on_b[1]) == 2)  # tried again
    assert [r["id"] for r in b.records("TransientFailure")].count(on_b[2]) == 1  # not
    assert _queued(b) == 2


@pytest.mark.parametrize(
    ("action", "body"),
    [("bounce", {"domain": "example.net"}), ("rebind", {"domain": "example.net", "to_queue": "moved"})],
)
def test_a_bulk_operation_a_node_gets_late_leaves_alone_the_mail_it_accepted_since(
    tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer, action: str, body: dict[str, str]
) -> None:
    # Node b reaches Redis through a proxy the test cuts: it keeps accepting mail, and reads
    # the operation issued meanwhile on node a once its way to Redis is back.
    said = f"admin {action} by ops of domain=example.net"
    with ExitStack() as stack:
        proxy = stack.enter_context(TcpProxy(redis_server.port))
        a, b = (
            stack.enter_context(
                PigeonProcess(
                    tmp_path / name,
                    node={"name": name, "workers": 1},
                    http={"token": TOKENS},
                    redis={"url": url, "timeout": "1s"},
                    **delivery_config(sink.endpoint, retry_interval="1h"),
                )
            )
            for name, url in (("a", redis_server.url), ("b", proxy.url))
        )
        _defer(b, 2)  # queued when the operation is issued: acted on
        proxy.cut()
        answers: list[tuple[int, Any]] = []
        asking = threading.Thread(target=lambda: answers.append(_api(a, "POST", f"/api/v1/admin/{action}", body)))
        asking.start()  # (a waits up to 30 s for b's answer)
        wait_until(lambda: said in a.stderr(), 15)
        _defer(b, 5)  # 5 more, accepted after it was issued: their senders were told 250
        proxy.restore()
        wait_until(lambda: said in b.stderr(), 30)
        asking.join(40)
        assert answers and answers[0][0] == 200, answers
        time.sleep(1)  # the operation had its time to reach the others, had it been going to
        assert f"{said}: 2 messages" in b.stderr()
        status, queues = _api(b, "GET", "/api/v1/queues", token=READER)
        assert status == 200, queues
        queued = {row["queue"]: row["messages"] for row in queues["scheduled"]}
        assert queued["example.net"] == 5, queued
        early = {r["id"] for r in b.records("TransientFailure")[:2]}
        if action == "bounce":
            assert {r["id"] for r in b.records("AdminBounce")} == early
        else:
            assert queued["moved"] == 2, queued


def test_a_suspension_issued_on_either_node_holds_and_resumes_on_both(
    cluster: tuple[PigeonProcess, PigeonProcess], sink: ScriptedSink
) -> None:
    a, b = cluster
    status, answer = _api(b, "POST", "/api/v1/admin/suspend", {"tenant": "acme", "reason": "complaints"})
    assert status == 200, answer
    rule_id = answer["rule"]["id"]
    assert answer["cluster"]["nodes"] == {"a": "done", "b": "done"}
    # The same rule, under the same id, stands on a (issued on b's supervisor).
    status, listed = _api(a, "GET", "/api/v1/admin/suspend", token=READER)
    assert [r["id"] for r in listed["rules"]] == [rule_id]
    for node in (a, b):
        status, injected = node.http_post(
            "/api/v1/inject",
            {
                "envelope_sender": "sender@example.org",
                "content": "From: a@example.org\r\nX-Tenant: acme\r\nSubject: held\r\n\r\nhello\r\n",
                "recipients": [{"email": f"user@{node.config['node']['name']}.example"}],
            },
            node.local_token,
        )
        assert status == 200, injected
    time.sleep(1.5)
    assert not sink.received, "a suspended tenant's mail went out"
    status, answer = _api(a, "DELETE", f"/api/v1/admin/suspend/{rule_id}")
    assert status == 200, answer
    assert answer["cancelled"] and answer["made_due"] == 2  # one on each node
    # The resume is one operation, under the rule's id, on every worker of both nodes.
    status, progress = _api(a, "GET", "/api/v1/admin/operations?cluster=1", token=READER)
    resumes = [r for r in progress["operations"] if r["kind"] == "resume"]
    assert [(r["operation"], r["acted_on"]) for r in resumes] == [(rule_id, 2)], resumes
    sink.wait_for(2)
    status, listed = _api(b, "GET", "/api/v1/admin/suspend?cluster=1", token=READER)
    assert listed["rules"] == [] and listed["cluster"]["nodes"] == {"a": "done", "b": "done"}


def test_identical_suspensions_issued_at_once_on_both_nodes_are_one_rule_that_one_resume_ends(
    cluster: tuple[PigeonProcess, PigeonProcess], sink: ScriptedSink
) -> None:
    a, b = cluster
    on = [a, b] * 3
    start = threading.Barrier(len(on))
    answers: list[tuple[int, Any]] = []

    def suspend(node: PigeonProcess) -> None:
        start.wait()
        answers.append(_api(node, "POST", "/api/v1/admin/suspend", {"tenant": "conc1"}))

    threads = [threading.Thread(target=suspend, args=(node,)) for node in on]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [status for status, _ in answers] == [200] * len(on), answers
    # Before: each node made its own first request's rule, and answered with it.
    (rule_id,) = {answer["rule"]["id"] for _, answer in answers}
    status, listed = _api(a, "GET", "/api/v1/admin/suspend?cluster=1", token=READER)
    assert [r["id"] for r in listed["rules"]] == [rule_id]
    for node in (a, b):
        status, injected = node.http_post(
            "/api/v1/inject",
            {
                "envelope_sender": "sender@example.org",
                "content": "From: a@example.org\r\nX-Tenant: conc1\r\nSubject: held\r\n\r\nhello\r\n",
                "recipients": [{"email": f"user@{node.config['node']['name']}.example"}],
            },
            node.local_token,
        )
        assert status == 200, injected
    time.sleep(1.0)
    assert not sink.received, "a suspended tenant's mail went out"
    status, answer = _api(a, "DELETE", f"/api/v1/admin/suspend/{rule_id}")
    assert (status, answer["cancelled"], answer["made_due"]) == (200, True, 2), answer  # one on each node
    sink.wait_for(2)
    status, listed = _api(b, "GET", "/api/v1/admin/suspend?cluster=1", token=READER)
    assert listed["rules"] == []


def test_cluster_reads_add_up_every_nodes_queues_and_the_cli_shows_them(
    cluster: tuple[PigeonProcess, PigeonProcess],
) -> None:
    a, b = cluster
    _defer(a, 2)
    _defer(b, 3)
    assert _queued(a) == 2
    assert _queued(a, cluster=True) == 5
    assert _queued(b, cluster=True) == 5
    shown = zygote.run(
        ["queue", "summary", "--cluster", "--url", f"http://127.0.0.1:{a.http_port}", "--token", READER],
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "nodes: a (done), b (done)" in shown.stdout
    row = next(line for line in shown.stdout.splitlines() if "example.net" in line)
    assert row.split()[1] == "5"


def test_a_read_only_token_cannot_bounce_anywhere_in_the_cluster(cluster: tuple[PigeonProcess, PigeonProcess]) -> None:
    a, b = cluster
    _defer(a, 1)
    _defer(b, 1)
    for node in (a, b):
        status, answer = _api(node, "POST", "/api/v1/admin/bounce", {"domain": "*"}, token=READER)
        assert status == 403, answer
        status, answer = _api(node, "POST", "/api/v1/admin/bounce", {"reason": "no selector"})
        assert status == 400, answer
    time.sleep(1.0)  # what another node would have applied, it would have by now
    assert _queued(a) == 1 and _queued(b) == 1
    assert not a.records("AdminBounce") and not b.records("AdminBounce")


@pytest.mark.parametrize(
    ("action", "body", "field"),
    [("bounce", {"domain": "[abc"}, "$.domain"), ("suspend", {"site": "mx[1.test"}, "$.site"),
     ("suspend", {"domain": "exa[mple.net"}, "$.domain"), ("retry", {"domain": "exa[mple.net"}, "$.domain")],
)  # fmt: skip
def test_a_domain_or_site_glob_with_a_set_left_open_is_refused_on_either_node_and_no_node_holds_it(
    cluster: tuple[PigeonProcess, PigeonProcess], action: str, body: dict[str, str], field: str
) -> None:
    for node in cluster:
        status, answer = _api(node, "POST", f"/api/v1/admin/{action}", body)
        assert (status, answer.get("field")) == (400, field), answer
        assert "'[' set that is not closed" in answer["error"], answer
    time.sleep(1.0)  # what another node would have taken, it would have by now
    for node in cluster:
        for kind in ("bounce", "suspend"):
            status, answer = _api(node, "GET", f"/api/v1/admin/{kind}?cluster=1", token=READER)
            assert (status, answer["rules"]) == (200, []), answer
        status, answer = _api(node, "GET", "/api/v1/admin/operations?cluster=1", token=READER)
        assert (status, answer["operations"]) == (200, []), answer


def test_without_redis_an_operation_applies_on_the_node_asked_and_says_the_others_were_not_told(
    cluster: tuple[PigeonProcess, PigeonProcess], redis_server: RedisServer
) -> None:
    a, b = cluster
    _defer(a, 2)
    _defer(b, 2)
    redis_server.stop()
    status, answer = _api(a, "POST", "/api/v1/admin/bounce", {"domain": "example.net"})
    assert status == 200, answer
    assert answer["bounced"] == 2
    assert "applied on this node only" in answer["cluster"]["error"]
    assert _queued(b) == 2
    # A read changed nothing: it says it shows this node only, not to issue it again.
    status, answer = _api(a, "GET", "/api/v1/queues?cluster=1")
    assert status == 200, answer
    assert "this node's answer only; the other nodes were not asked" in answer["cluster"]["error"], answer
    assert "issue it again" not in answer["cluster"]["error"]
    # `pigeon top --once --cluster` exits as the other reads of the cluster do (it exited 0).
    top = zygote.run(["top", "--once", "--cluster", "-c", str(a.config_path), "--token", READER], text=True, timeout=60)
    assert top.returncode == 75, (top.stdout, top.stderr)
    assert "cluster: a done  (Redis cannot be reached" in top.stdout  # (cut at the terminal's width)
    # When Redis is back, operations reach every node again.
    redis_server.start()
    status, answer = wait_until(
        lambda: (
            (r := _api(a, "POST", "/api/v1/admin/retry", {"domain": "example.net"}))[1]["cluster"]["nodes"]
            == {"a": "done", "b": "done"}
            and r
        ),
        30,
        interval=1.0,
    )
    assert status == 200


def test_the_first_operation_after_redis_restarted_reaches_every_node(
    cluster: tuple[PigeonProcess, PigeonProcess], redis_server: RedisServer
) -> None:
    _, b = cluster
    # b's supervisor is the front of its two workers: it keeps Redis connections of its own
    # for the operations it is asked, idle between them.
    status, answer = _api(b, "POST", "/api/v1/admin/retry", {"domain": "example.net"})
    assert answer["cluster"] == {"nodes": {"a": "done", "b": "done"}}, answer
    redis_server.stop()
    redis_server.start()
    client = redis_server.client()
    try:
        # Both nodes' workers read the stream again (they say so with their presence).
        wait_until(lambda: client.hlen("pigeon:admin:nodes") == 2, 15)
    finally:
        client.close()
    time.sleep(1.5)  # a worker renews its presence just before it reads on
    status, answer = _api(b, "POST", "/api/v1/admin/retry", {"domain": "example.net"})
    assert status == 200, answer
    assert answer["cluster"] == {"nodes": {"a": "done", "b": "done"}}, answer


def test_an_operation_does_not_wait_for_a_node_that_stopped_but_names_it_pending(
    cluster: tuple[PigeonProcess, PigeonProcess],
) -> None:
    a, b = cluster
    b.stop()  # a graceful stop: its two workers say they are gone
    started = time.monotonic()
    status, answer = _api(a, "POST", "/api/v1/admin/retry", {"domain": "example.net"})
    assert status == 200, answer
    # It reads the stream on from where it stopped when it starts: it is told, later.
    assert answer["cluster"]["nodes"] == {"a": "done", "b": "pending"}, answer
    assert list(answer["cluster"]["not_running"]) == ["b"]
    assert time.monotonic() - started < 5  # not the 30 s a node present but silent is waited for


def _cli(node: PigeonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run(
        [*args, "-c", str(node.config_path), "--token", ADMIN],
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("action", ["bounce", "hold"])
def test_an_id_write_while_the_node_holding_it_is_stopped_says_it_is_pending_there_not_missing(
    cluster: tuple[PigeonProcess, PigeonProcess], action: str
) -> None:
    a, b = cluster
    _defer(b, 1)
    (on_b,) = {r["id"] for r in b.records("TransientFailure")}
    b.stop()
    said = _cli(a, action, "--id", on_b, "--reason", "b is down")
    # Not "not found", exit 0: the operator would send it again, and b then acts on it anyway.
    assert said.returncode == 75, (said.stdout, said.stderr)
    lines = said.stdout.splitlines()
    assert lines[:3] == [
        f"{'bounced' if action == 'bounce' else 'held'} 0 messages",
        f"  {on_b}  not found on the nodes that answered; node b is not running: applied there when it starts, "
        "if it holds it (within [redis] late_operations)",
        "nodes: a (done), b (pending)",
    ]
    assert lines[3].startswith("warning: node b is not running (stopped, or gone, at ")
    assert "it applies it when it starts" in lines[3]
    status, answer = _api(a, "POST", f"/api/v1/admin/{action}", {"messages": [on_b], "reason": "b is down"})
    assert status == 200 and answer["messages"] == [{"id": on_b, "result": "pending", "pending_on": ["b"]}], answer
    b.start()
    record = "AdminBounce" if action == "bounce" else "AdminHold"
    taken = wait_until(lambda: b.records(record), 30)
    assert [(r["id"], r["reason"]) for r in taken][:1] == [(on_b, "b is down")]


def test_a_node_asked_to_inspect_a_message_another_node_holds_points_at_the_cluster(
    cluster: tuple[PigeonProcess, PigeonProcess],
) -> None:
    a, b = cluster
    _defer(b, 1)
    (on_b,) = {r["id"] for r in b.records("TransientFailure")}
    held = _cli(a, "hold", "--id", on_b, "--reason", "look")
    assert held.returncode == 0, held.stderr
    assert held.stdout.splitlines()[1] == f"  {on_b}  node b: held (1 recipient): `pigeon retry --id` releases it"
    inspected = _cli(a, "inspect", on_b)
    assert inspected.returncode != 0
    assert f"no message {on_b} here (node a); another node of the cluster may hold it" in inspected.stderr
    assert "names the node that holds each message it finds" in inspected.stderr
    shown = _cli(b, "inspect", on_b)
    assert shown.returncode == 0 and "look" in shown.stdout  # the node named shows it


def test_top_shows_the_whole_clusters_queues_and_counters(cluster: tuple[PigeonProcess, PigeonProcess]) -> None:
    a, b = cluster
    _defer(a, 1)
    _defer(b, 2)

    def received(text: str) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("pigeon_messages_received_total ")
        )

    status, body = b.http_get("/metrics")
    assert status == 200 and received(body.decode()) == 2
    request = urllib.request.Request(f"http://127.0.0.1:{a.http_port}/metrics?cluster=1")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401  # every node works for it: a token is needed
    request.add_header("Authorization", f"Bearer {READER}")
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    assert received(text) == 3 and "# pigeon cluster nodes: a=done b=done" in text
    shown = zygote.run(
        ["top", "--once", "--cluster", "--url", f"http://127.0.0.1:{b.http_port}", "--token", READER],
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "cluster: a done, b done" in shown.stdout
    assert "spool 3 messages" in shown.stdout


def test_a_rule_made_or_ended_while_a_node_is_stopped_is_said_to_apply_there_at_start_and_exits_0(
    cluster: tuple[PigeonProcess, PigeonProcess],
) -> None:
    a, b = cluster
    b.stop()
    # The rule is in Redis's rules before the answer, and b takes those before it delivers:
    # nothing for the operator to do again, unlike a one-off write b may never apply.
    said = _cli(a, "suspend", "--domain", "example.net", "--reason", "b is down")
    assert said.returncode == 0, (said.stdout, said.stderr)
    lines = said.stdout.splitlines()
    assert lines[1] == "nodes: a (done), b (will apply at start)", lines
    assert lines[2].startswith("note: node b is not running (stopped, or gone, at "), lines
    assert "it takes the cluster's suspensions and standing bounces as they are then, this change included" in lines[2]
    status, listed = _api(a, "GET", "/api/v1/admin/suspend", token=READER)
    (rule_id,) = [rule["id"] for rule in listed["rules"]]
    status, answer = _api(a, "POST", "/api/v1/admin/bounce", {"campaign": "spring", "duration": "1h"})
    assert status == 200 and answer["cluster"]["nodes"] == {"a": "done", "b": "at_start"}, answer
    assert list(answer["cluster"]["not_running"]) == ["b"]
    # A one-off write still may not reach b: pending, exit 75.
    retried = _cli(a, "retry", "--domain", "example.net")
    assert retried.returncode == 75 and "nodes: a (done), b (pending)" in retried.stdout, retried.stdout
    b.start()
    status, listed = _api(b, "GET", "/api/v1/admin/suspend", token=READER)
    assert [rule["id"] for rule in listed["rules"]] == [rule_id]  # taken at its start, as said
    b.stop()
    resumed = _cli(a, "resume", rule_id)
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    assert "nodes: a (done), b (will apply at start)" in resumed.stdout.splitlines()
    b.start()
    status, listed = _api(b, "GET", "/api/v1/admin/suspend", token=READER)
    assert listed["rules"] == []  # the end taken at its start too


def test_a_decommissioned_node_is_forgotten_and_writes_no_longer_name_it(
    cluster: tuple[PigeonProcess, PigeonProcess],
) -> None:
    a, b = cluster
    listed = _cli(a, "cluster", "nodes")
    assert listed.returncode == 0, listed.stderr
    heading, *rows = listed.stdout.splitlines()
    assert [row.split()[:3] for row in rows] == [["a", "running", "1"], ["b", "running", "2"]], rows
    # Each column under its heading, with names shorter than NODE too (they sat 3 columns left).
    assert all(row.index("running") == heading.index("STATE") for row in rows), listed.stdout
    refused = _cli(a, "cluster", "forget", "b")
    assert refused.returncode == 2
    assert "pigeon: 409: node b is running (it renewed its presence " in refused.stderr
    assert "stop it first (SIGTERM to its pigeon serve, systemctl stop pigeon on its host), then forget it" in (
        refused.stderr
    )
    b.stop()
    status, known = _api(a, "GET", "/api/v1/cluster/nodes", token=READER)
    assert status == 200 and [(n["node"], n["running"], n.get("left")) for n in known["nodes"]] == [
        ("a", True, None),
        ("b", False, True),
    ], known
    listed = _cli(a, "cluster", "nodes")
    assert "named pending by admin writes until " in listed.stdout and "`pigeon cluster forget b`" in listed.stdout
    assert _cli(a, "retry", "--domain", "example.net").returncode == 75  # named pending, for a day
    forgot = _cli(a, "cluster", "forget", "b")
    assert forgot.returncode == 0, forgot.stderr
    assert forgot.stdout.startswith("forgot node b (spool id ")
    assert "cluster: node b (spool id " in a.stderr() and "asked by ops" in a.stderr()
    retried = _cli(a, "retry", "--domain", "example.net")
    assert retried.returncode == 0, (retried.stdout, retried.stderr)
    assert "nodes: a (done)" in retried.stdout.splitlines()
    status, known = _api(a, "GET", "/api/v1/cluster/nodes", token=READER)
    assert [n["node"] for n in known["nodes"]] == ["a"]
    again = _cli(a, "cluster", "forget", "b")
    assert again.returncode == 2 and "no node named 'b' is known to the cluster (known: a)" in again.stderr
    b.start()  # known again once it runs
    status, known = _api(a, "GET", "/api/v1/cluster/nodes", token=READER)
    assert [(n["node"], n["running"]) for n in known["nodes"]] == [("a", True), ("b", True)]


def test_a_node_forgotten_just_before_redis_lost_its_data_stays_forgotten(
    cluster: tuple[PigeonProcess, PigeonProcess], redis_server: RedisServer
) -> None:
    # An outside tester: `pigeon cluster forget b`, then Redis restarted empty within a second:
    # 10 s later `pigeon cluster nodes` listed b again, and writes named it pending (exit 75):
    # a's worker had last seen the presence hash before the forget, and gave b's entry back.
    a, b = cluster
    b.stop()
    client = redis_server.client()

    def renewed_by_a() -> float:
        for value in client.hvals("pigeon:admin:nodes"):
            seen = json.loads(value)
            if seen["node"] == "a":
                return float(seen["expires"])
        return 0.0

    try:
        # Just after a renewed (and looked at the hash: b in it), so that the forget and the loss
        # both come before its next look, 2 s later.
        before = renewed_by_a()
        wait_until(lambda: renewed_by_a() > before, 15, interval=0.01)
        status, answer = _api(a, "DELETE", "/api/v1/cluster/nodes/b")
        assert status == 200 and [row["node"] for row in answer["forgotten"]] == ["b"], answer
        redis_server.kill()  # kill -9, no persistence: the forget is lost with the rest
        redis_server.start()
        wait_until(lambda: renewed_by_a() > 0, 15)  # a is back, and gave back what it had seen
    finally:
        client.close()
    listed = _cli(a, "cluster", "nodes")
    assert listed.returncode == 0, listed.stderr
    assert [row.split()[:2] for row in listed.stdout.splitlines()[1:]] == [["a", "running"]], listed.stdout
    retried = _cli(a, "retry", "--domain", "example.net")
    assert retried.returncode == 0, (retried.stdout, retried.stderr)
    assert "nodes: a (done)" in retried.stdout.splitlines()


def test_the_cluster_member_of_every_write_is_documented_in_the_openapi_document(
    cluster: tuple[PigeonProcess, PigeonProcess],
) -> None:
    import jsonschema_rs

    a, b = cluster
    b.stop()
    document = json.loads(a.http_get("/api/openapi.json")[1])
    writes = {
        "/api/v1/admin/bounce": {"domain": "example.net", "reason": "x"},
        "/api/v1/admin/suspend": {"domain": "example.org"},
        "/api/v1/admin/retry": {"domain": "example.net"},
        "/api/v1/admin/rebind": {"domain": "example.net", "to_queue": "other@example.net"},
        "/api/v1/admin/hold": {"messages": ["00000000000000ff"], "reason": "x"},
    }
    for path, body in writes.items():
        status, answer = _api(a, "POST", path, body)
        assert status == 200, (path, answer)
        schema = document["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        documented = schema["properties"]["cluster"]
        # Every member a client reads is documented (objects take more, so the schema alone says little).
        assert set(answer["cluster"]) == {"nodes", "not_running"} <= set(documented["properties"]), (path, answer)
        validator = jsonschema_rs.validator_for({"components": document["components"], **schema})
        assert not [e.message for e in validator.iter_errors(answer)], (path, answer)
