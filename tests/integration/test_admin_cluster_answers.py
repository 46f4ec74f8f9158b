"""What a cluster operation's answer says to the operator: every node it covers, and those it does not.

Node a runs one worker (its own API is the front), node b two behind a supervisor, as in
`test_admin_cluster`: each test asks one of them, as `pigeon` does, and reads the answer."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.admin_cluster import ADMIN, TOKENS, admin_cluster, admin_command
from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config, wait_until
from tests.support.tcp_proxy import TcpProxy


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture
def cluster(tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer) -> Iterator[tuple[PigeonProcess, ...]]:
    # A worker stopped is killed, and started again, after 3 s without an answer.
    with admin_cluster(tmp_path, sink.endpoint, redis_server.url, (("a", 1), ("b", 2)), worker_timeout="3s") as nodes:
        yield nodes


def _api(node: PigeonProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return node.http_call(method, path, body, ADMIN)


def _defer(node: PigeonProcess, count: int, domain: str = "example.net") -> None:
    """`count` messages the sink defers (retried in an hour): they stay queued on `node`."""
    before = len({r["id"] for r in node.records("TransientFailure")})
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
    wait_until(lambda: len({r["id"] for r in node.records("TransientFailure")}) >= before + count, 30)


@pytest.mark.parametrize("asked", ["a", "b"])
def test_an_operation_right_after_redis_lost_its_data_covers_every_node_not_only_those_back_first(
    cluster: tuple[PigeonProcess, PigeonProcess], redis_server: RedisServer, asked: str
) -> None:
    # An outside tester: 0.5 s after Redis came back empty, a retry said "nodes: c (done)" and
    # 30 messages of 90, exit 0: the nodes had not said they were there yet, and were left out.
    a, b = cluster
    _defer(a, 2)
    _defer(b, 3)
    node = a if asked == "a" else b
    redis_server.kill()  # kill -9, no persistence: every key is gone
    redis_server.start()
    status, answer = _api(node, "POST", "/api/v1/admin/retry", {"domain": "example.net"})
    assert (status, answer["made_due"]) == (200, 5), answer
    assert answer["cluster"] == {"nodes": {"a": "done", "b": "done"}}, answer
    # (Tried again, and deferred again: queued as before.)
    wait_until(lambda: len(a.records("TransientFailure")) >= 4 and len(b.records("TransientFailure")) >= 6, 30)
    redis_server.kill()
    redis_server.start()
    status, answer = _api(node, "GET", "/api/v1/queues?cluster=1")
    assert status == 200, answer
    assert answer["cluster"]["nodes"] == {"a": "done", "b": "done"}, answer
    assert sum(row["messages"] for row in answer["scheduled"]) == 5, answer


def _kill_just_after_it_renewed(node: PigeonProcess, redis_server: RedisServer, hung: float = 0.0) -> None:
    """kill -9 `node` (every process of it) just after its workers said it is there: the others
    count it as present for 10 s more, which the tests below need, whatever the machine's pace.
    With `hung`, it is stopped (SIGSTOP) then, and killed `hung` s later: they count it as
    present for that much less after the kill, as exactly as the machine's pace allows."""
    client = redis_server.client()

    def expires() -> float:
        for value in client.hvals("pigeon:admin:nodes"):
            seen = json.loads(value)
            if seen["node"] == node.root.name:
                return float(seen["expires"])
        return 0.0

    try:
        before = wait_until(expires, 15)
        wait_until(lambda: expires() > before, 15, interval=0.01)
    finally:
        client.close()
    if hung:
        assert node.process is not None
        os.killpg(node.process.pid, signal.SIGSTOP)
        time.sleep(hung)
    node.kill()


def test_an_answer_that_leaves_out_a_node_says_so_and_exits_75(
    cluster: tuple[PigeonProcess, PigeonProcess], redis_server: RedisServer
) -> None:
    # An outside tester: with node c killed, `pigeon bounce` waited 30 s, said "c (pending)" and
    # exited 0, as for a whole answer; a script could not tell. A read has nothing applied later.
    a, b = cluster
    _defer(a, 2)
    _defer(b, 3)
    _kill_just_after_it_renewed(b, redis_server)
    shown = admin_command(a, "suspend", "--list", "--cluster")
    assert shown.returncode == 75, shown.stdout + shown.stderr
    assert "nodes: a (done), b (missing)" in shown.stdout, shown.stdout
    assert "node b did not answer in time" in shown.stdout and "ask again once it is back" in shown.stdout
    shown = admin_command(a, "bounce", "--domain", "example.net")
    assert shown.returncode == 75, shown.stdout + shown.stderr
    assert "bounced 2 messages" in shown.stdout and "nodes: a (done), b (pending)" in shown.stdout, shown.stdout
    assert "a pending node applies it when it comes back" in shown.stdout, shown.stdout
    b.start()  # and so it does
    assert len(b.wait_records("AdminBounce", 3, timeout=30)) == 3


def test_a_node_killed_just_before_redis_lost_its_data_is_named_missing_not_left_out(
    cluster: tuple[PigeonProcess, PigeonProcess], redis_server: RedisServer
) -> None:
    a, b = cluster
    _defer(a, 2)
    _kill_just_after_it_renewed(b, redis_server)
    redis_server.kill()  # kill -9, no persistence: b's presence is gone with the rest
    redis_server.start()
    shown = admin_command(a, "queue", "summary", "--cluster", "--json")
    assert shown.returncode == 75, shown.stdout + shown.stderr
    assert json.loads(shown.stdout)["cluster"]["nodes"] == {"a": "done", "b": "missing"}, shown.stdout


@pytest.mark.timeout(180)  # c pending: the retry waits 30 s for it, on a busy machine after slow starts
@pytest.mark.parametrize("asked", ["a", "b"])
def test_a_node_killed_2s_before_redis_lost_its_data_is_named_pending_though_the_wait_after_the_loss_outlasts_it(
    tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer, asked: str
) -> None:
    # An outside tester, nodes a (1 worker), b (2) and c (1): kill -9 c, 2 s later kill -9
    # Redis and start it empty, 0.5 s later `pigeon retry`: "nodes: a (done), b (done)", exit 0.
    # c's presence, given back as last seen, ran out during the 5 s the retry waited after the loss.
    with ExitStack() as stack:
        a, b, c = (
            stack.enter_context(
                PigeonProcess(
                    tmp_path / name,
                    node={"name": name, "workers": workers},
                    http={"token": TOKENS},
                    redis={"url": redis_server.url, "timeout": "1s"},
                    **delivery_config(sink.endpoint, retry_interval="1h"),
                )
            )
            for name, workers in (("a", 1), ("b", 2), ("c", 1))
        )
        _defer(a, 2)
        _defer(b, 3)
        # What the others last saw of c when it was killed is up to 6 s old (it renews every 2 to
        # 3 s, and they look as often): here 3.5 s, so that it runs out 6.5 s after the kill,
        # within the 5 s the retry waits after the loss, whatever the phase of their looks.
        _kill_just_after_it_renewed(c, redis_server, hung=3.5)
        time.sleep(2.0)
        redis_server.kill()
        redis_server.start()
        time.sleep(0.5)
        shown = admin_command(a if asked == "a" else b, "retry", "--domain", "example.net")
        assert shown.returncode == 75, shown.stdout + shown.stderr
        assert "5 messages due now" in shown.stdout, shown.stdout
        assert "nodes: a (done), b (done), c (pending)" in shown.stdout, shown.stdout


def test_a_suspension_made_while_a_worker_of_another_node_restarts_says_it_was_made_and_holds_every_nodes_mail(
    cluster: tuple[PigeonProcess, PigeonProcess],
) -> None:
    # An outside tester: node a's worker 1 stopped (kill -STOP), `pigeon suspend` on b said
    # "already suspended until resumed by rule ...; nothing added", though the suspension was
    # new: a's worker, restarted meanwhile, took it from its node's rules before it read the
    # request, and answered that it held it already.
    a, b = cluster
    _defer(a, 2, "d4.test")
    _defer(b, 4, "d4.test")
    stopped = b.shard_owner(1)
    os.kill(stopped, signal.SIGSTOP)
    shown = admin_command(a, "suspend", "--domain", "d4.test", "--reason", "x")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"worker 1 (pid {stopped}) has not answered the supervisor" in b.stderr()
    first = shown.stdout.splitlines()[0]
    assert first.startswith("suspended until resumed (rule ") and first.endswith("6 messages held"), shown.stdout
    assert "nodes: a (done), b (done)" in shown.stdout, shown.stdout
    # Asked again, every worker of every node holds it already: that is "nothing added".
    shown = admin_command(b, "suspend", "--domain", "d4.test", "--reason", "x")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.startswith("already suspended until resumed by rule "), shown.stdout


def test_a_rule_made_while_redis_was_away_reaches_the_other_nodes_as_that_very_rule_without_an_error(
    tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer
) -> None:
    # An outside tester: a 15 s bounce made on b while Redis was killed, Redis back 5 s later,
    # and every worker of the other nodes logged an ERROR: they had taken the rule from the
    # cluster's copy (15 s), then refused b's stream entry of it, its duration cut to what was
    # left (9 s), as another rule under its id. Here node b reaches Redis through a proxy, back
    # only once a has sent the rule: b's workers take the cluster's copy, then read the entry.
    with ExitStack() as stack:
        proxy = stack.enter_context(TcpProxy(redis_server.port))
        a, b = (
            stack.enter_context(
                PigeonProcess(
                    tmp_path / name,
                    node={"name": name, "workers": workers},
                    http={"token": TOKENS},
                    redis={"url": url, "timeout": "1s"},
                    **delivery_config(sink.endpoint, retry_interval="1h"),
                )
            )
            for name, workers, url in (("a", 1, redis_server.url), ("b", 2, proxy.url))
        )
        redis_server.kill()
        shown = admin_command(a, "bounce", "--domain", "d1.test", "--duration", "15s")
        assert shown.returncode == 75, shown.stdout + shown.stderr  # (b's part is not in the answer)
        assert "applied on this node only for now" in shown.stdout, shown.stdout
        time.sleep(3)  # what is left of it is 12 s, not 15
        proxy.cut()
        redis_server.start()
        a.wait_stderr("made here while Redis was away, sent to the other nodes now")
        proxy.restore()
        b.wait_stderr("admin bounce by ops of domain=d1.test", count=2)  # each worker read the entry
        rules = []
        for node in (a, b):
            status, listed = _api(node, "GET", "/api/v1/admin/bounce")
            assert status == 200 and len(listed["rules"]) == 1, listed
            rules.append({key: listed["rules"][0][key] for key in ("id", "created", "expires")})
        assert rules[0] == rules[1], rules  # one rule: the same start and end everywhere
        ran_out = [
            line.split("admin rules: ", 1)[1]
            for node in (a, b)
            for line in node.wait_stderr(" ran out at ", timeout=20).splitlines()
            if " ran out at " in line
        ]
        assert len(ran_out) == 2 and ran_out[0] == ran_out[1], ran_out
        for node in (a, b):
            assert "refused here" not in node.stderr() and " ERROR " not in node.stderr(), node.root.name
