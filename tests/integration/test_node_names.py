"""One live node per `[node] name` in a cluster (`pigeon.node.presence`): a second node under a
live node's name does not start, but a node back from a kill -9, or under the name of one that
died, does; and two that started unseen while Redis was away say so once it answers."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import delivery_config


def _node(root: Path, name: str, redis_server: RedisServer, workers: int = 1) -> PigeonProcess:
    # Delivery on (to nowhere: nothing is sent): the presence in Redis is the admin stream's.
    return PigeonProcess(
        root,
        node={"name": name, "workers": workers},
        redis={"url": redis_server.url, "timeout": "500ms"},
        **delivery_config("127.0.0.1:9"),
    )


def test_a_second_node_under_a_live_nodes_name_exits_2_and_one_back_from_a_kill_starts_at_once(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    with _node(tmp_path / "a", "a", redis_server, workers=2) as a, _node(tmp_path / "b", "b", redis_server):
        # Its own entry, left by the run killed, does not hold it back (nor wait it out).
        a.kill()
        started = time.monotonic()
        a.start()
        assert "was present lately: waiting" not in a.stderr()
        assert time.monotonic() - started < 20, a.stderr()  # (not 10 s of presence on top of a loaded start)
        assert "taken by a node that runs now" not in a.stderr()
        d = _node(tmp_path / "d", "a", redis_server)
        d.start(wait=False)
        assert d.wait_exit() == 2
        assert 'pigeon: cannot start: configuration error: [node] name "a" is taken by a node that runs now' in (
            d.stderr()
        )
        assert "2 worker(s)" in d.stderr()
        assert "worker" not in d.stderr().split("cannot start", 1)[0]  # stopped before it started any
        status, health = a.http_get("/healthz")
        assert status == 200, health
        # The cluster's own nodes, each with workers of one name, do not take each other for namesakes.
        assert "another node named" not in a.stderr()


def test_a_node_under_the_name_of_one_that_died_starts_once_its_presence_runs_out(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    a = _node(tmp_path / "a", "a", redis_server).start()
    time.sleep(1)  # (its first renewal made)
    a.kill()  # kill -9: its entry stays, no longer renewed
    with _node(tmp_path / "d", "a", redis_server) as d:
        assert "cannot start" not in d.stderr()


def test_a_node_starts_while_redis_is_away_and_two_of_one_name_say_so_once_it_answers(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_server.stop()
    with _node(tmp_path / "a", "a", redis_server) as a, _node(tmp_path / "d", "a", redis_server) as d:
        assert "starting without checking that no other node runs" in a.stderr()
        redis_server.start()
        for node in (a, d):
            node.wait_stderr('another node named "a", as this one is, runs now', timeout=20)
