"""A standing rule with a duration is stamped once, where it is issued (the supervisor, when the
client's request reaches it): every worker holds it with the `created` and `expires` the answer
gave, and no mail it holds goes out before that `expires`.

An outside tester found each worker stamping the rule with its own clock as it read the request:
the workers of one node held different ends, and mail went out 60-80 ms before the `expires`
the operator was told."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pigeon.message import parse_id, shard_of
from pigeon.node.standing import RULES_FILE
from pigeon.node.standing import decode as decode_standing
from pigeon.queue.rules import Rule
from tests.integration.test_worker_standing_rules import DOMAIN, _send_to_every_shard, _worker_pid
from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config, wait_until


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


def _times(rule: dict[str, Any]) -> tuple[str, float, float]:
    return rule["id"], rule["created"], rule["expires"]


@pytest.mark.parametrize("kind", ["suspend", "bounce"])
def test_every_worker_holds_a_rule_with_a_duration_as_the_answer_stamped_it(
    tmp_path: Path, sink: ScriptedSink, kind: str
) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, **delivery_config(sink.endpoint)) as pigeon:
        status, answer = pigeon.http_call(
            "POST", f"/api/v1/admin/{kind}", {"domain": "x.test", "duration": "1h"}, pigeon.local_token
        )
        assert status == 200, answer
        told = _times(answer["rule"])
        assert told[2] - told[1] == 3600.0
        for index in (0, 1):
            status, listed = pigeon.worker_call(index, "GET", f"/api/v1/admin/{kind}")
            assert status == 200, listed
            assert [_times(rule) for rule in listed["rules"]] == [told], f"worker {index}"
        # The node's standing rules (what a worker that starts takes) hold the same.
        kept = decode_standing((pigeon.spool_path / RULES_FILE).read_bytes()).in_force[told[0]]
        assert (kept.id, kept.created, kept.expires) == told


def test_no_mail_a_suspension_holds_goes_out_before_the_end_its_answer_gave(tmp_path: Path, sink: ScriptedSink) -> None:
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, **config) as pigeon:
        # Worker 0, whose rule the answer shows, reads the request a second after worker 1 does
        # (a loaded machine, a long walk before it): the rule must end when the answer says all
        # the same, on both.
        paused = _worker_pid(pigeon, 0)
        os.kill(paused, signal.SIGSTOP)
        answered: list[tuple[int, Any]] = []
        asking = threading.Thread(
            target=lambda: answered.append(
                pigeon.http_call(
                    "POST", "/api/v1/admin/suspend", {"domain": DOMAIN, "duration": "6s"}, pigeon.local_token
                )
            )
        )
        try:
            asking.start()
            time.sleep(1.0)
        finally:
            os.kill(paused, signal.SIGCONT)
        asking.join(30)
        ((status, answer),) = answered
        assert status == 200, answer
        expires = answer["rule"]["expires"]
        sent = _send_to_every_shard(pigeon, sink, at_least=1)  # (held: it asserts nothing is delivered)
        assert time.time() < expires - 1.5, "the mail was sent too slowly to be held: the test proves nothing"
        records = wait_until(lambda: len(found := pigeon.records("Delivery")) >= sent and found, timeout=30)
        assert {shard_of(parse_id(record["id"])) for record in records} == {0, 1}
        # The sink's clock is this process's: each message taken no sooner than the answer said.
        wall = time.time() - time.monotonic()
        taken = sorted(arrival.at + wall for arrival in sink.arrivals)
        assert len(taken) == sent and taken[0] >= expires, [round(at - expires, 3) for at in taken]


def test_every_node_of_a_cluster_holds_a_rule_with_a_duration_as_the_node_asked_stamped_it(
    tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer
) -> None:
    """The origin's stream entry carries when it was issued: each node's workers make the rule
    from then, as the origin's own did, and as Redis keeps it for a node that joins later."""

    def node(name: str, workers: int) -> PigeonProcess:
        redis = {"url": redis_server.url, "timeout": "1s"}
        return PigeonProcess(
            tmp_path / name, node={"name": name, "workers": workers}, redis=redis, **delivery_config(sink.endpoint)
        )

    with node("a", 2) as a, node("b", 1) as b:
        # Issued through a's supervisor, then on b, a node of one worker (no supervisor).
        for origin, kind in ((a, "suspend"), (b, "bounce")):
            body = {"domain": f"{kind}.test", "duration": "1h"}
            status, answer = origin.http_call("POST", f"/api/v1/admin/{kind}", body, origin.local_token)
            assert status == 200 and answer["cluster"]["nodes"] == {"a": "done", "b": "done"}, answer
            told = _times(answer["rule"])
            for index in (0, 1):
                _, listed = a.worker_call(index, "GET", f"/api/v1/admin/{kind}")
                assert [_times(rule) for rule in listed["rules"]] == [told]
            status, listed = b.http_call("GET", f"/api/v1/admin/{kind}", token=b.local_token)
            assert [_times(rule) for rule in listed["rules"]] == [told], listed
            client = redis_server.client()
            try:
                kept = msgspec.json.decode(client.hget("pigeon:admin:rules", told[0]), type=Rule)
            finally:
                client.close()
            assert (kept.id, kept.created, kept.expires) == told  # what a node that joins later takes
