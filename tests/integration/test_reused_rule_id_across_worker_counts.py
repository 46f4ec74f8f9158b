"""An id reused after its rule ended names the new rule everywhere: on every worker, whatever the
node's worker count, and in the cluster's rules in Redis.

A client's `id` is free again once its rule has ended (run out, cancelled). A worker that still
keeps the ended rule under that id in its shard must take the new one from the node's rules when
it starts: before, a worker that kept an expired rule under the id passed the new one over (it
"held" that id already), said nothing, and delivered the mail the new rule suspends. Redis kept
the expired rule too (the first one made stood), so a node that joined later never took the new."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration import test_node_rules_across_worker_counts as counts
from tests.support.process import PigeonProcess, to_toml
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config

SUSPENDED = "b.test"


def _suspend(pigeon: PigeonProcess, domain: str, duration: str) -> dict[str, object]:
    body = {"domain": domain, "id": "K", "duration": duration}
    status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", body, token=pigeon.local_token)
    assert status == 200, answer
    return answer


def _restart_with(pigeon: PigeonProcess, workers: int, restart: str) -> None:
    if restart == "sigterm":
        counts._restart_with(pigeon, workers)
        return
    pigeon.kill()
    pigeon.config["node"]["workers"] = workers
    pigeon.config_path.write_text(to_toml(pigeon.config))
    pigeon.start()


def _held_everywhere(pigeon: PigeonProcess, sink: ScriptedSink, workers: int) -> None:
    [line] = pigeon.cli("suspend", "--list").splitlines()
    assert line.startswith("K ") and SUSPENDED in line and "not held" not in line, line
    sent = counts._send_to_every_worker(pigeon, SUSPENDED, workers)
    time.sleep(3)
    delivered = counts._to(sink, SUSPENDED)
    assert not delivered, f"{len(delivered)} of {len(sent)} delivered to a suspended domain"


@pytest.mark.parametrize("restart", ["sigterm", "kill"])
def test_an_id_reused_after_its_rule_ran_out_holds_on_every_worker_once_the_node_has_two(
    tmp_path: Path, restart: str
) -> None:
    with ScriptedSink() as sink, counts._node(tmp_path, sink, 2) as pigeon:
        _suspend(pigeon, "a.test", "3s")
        time.sleep(3.5)
        _restart_with(pigeon, 1, restart)
        assert _suspend(pigeon, SUSPENDED, "1h")["already"] is False
        _restart_with(pigeon, 2, restart)
        _held_everywhere(pigeon, sink, 2)
        assert f"worker 1 lacked suspension K of domain={SUSPENDED}" in pigeon.stderr()


def test_an_id_reused_after_its_rule_ran_out_is_the_clusters_for_a_node_that_joins_later(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    def node(name: str) -> PigeonProcess:
        return PigeonProcess(
            tmp_path / name,
            node={"name": name, "workers": 2, "worker_timeout": "2s"},
            redis={"url": redis_server.url, "timeout": "1s"},
            **delivery_config(sink.endpoint),
        )

    with ScriptedSink() as sink, node("a") as a:
        _suspend(a, "a.test", "3s")
        time.sleep(3.5)
        assert _suspend(a, SUSPENDED, "1h")["already"] is False
        with node("c") as c:
            _held_everywhere(c, sink, 2)
