"""An id names one thing: an operation that makes no rule (a bounce without a duration, a retry,
a rebind) under the id of a live rule is refused (409 naming the rule), at every door, and does
nothing. Before, it was answered 200, acted (bounced what the selector matched), and took the
rule's place in the operations' progress. A refusal says what was asked beside the rule that
refuses it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pigeon.listener.http.openapi import document
from tests.integration.test_admin_rule_ids import TOKENS, _api, _send
from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config, wait_until


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


def _node(tmp_path: Path, sink: ScriptedSink, workers: int, name: str = "node", **more: Any) -> PigeonProcess:
    return PigeonProcess(
        tmp_path / name,
        node={"name": name, "workers": workers},
        http={"token": TOKENS},
        **more,
        **delivery_config(sink.endpoint),
    )


def _operations(pigeon: PigeonProcess) -> list[Any]:
    status, answer = _api(pigeon, "GET", "/api/v1/admin/operations")
    assert status == 200, answer
    return sorted(answer["operations"], key=lambda op: (op["operation"], op["started"]))


def _refused(asked: PigeonProcess, held: PigeonProcess, rule_id: str, kind: str) -> None:
    """Each operation that makes no rule, under `rule_id`: 409 naming the rule, nothing done (the
    operations' progress, as `held` shows it, unchanged: the rule's entry not replaced)."""
    before = _operations(held)
    for path, body in [
        ("bounce", {"domain": "s3.test", "id": rule_id}),
        ("retry", {"domain": "s3.test", "id": rule_id}),
        ("rebind", {"domain": "s3.test", "id": rule_id, "routing_domain": "s1.test"}),
    ]:
        status, answer = _api(asked, "POST", f"/api/v1/admin/{path}", body)
        assert status == 409, answer
        assert (answer["field"], answer["rule"]["id"], answer["rule"]["kind"]) == ("$.id", rule_id, kind), answer
        assert "(an operation, not a rule)" in answer["error"], answer
        _documented(f"/api/v1/admin/{path}", status, answer)
    assert _operations(held) == before


def _documented(path: str, status: int, answer: Any) -> None:
    """The answer is one the OpenAPI document lists for the operation, with its schema: it
    listed no 409 for a retry or a rebind (schemathesis's seed 7, at length, had one)."""
    import jsonschema_rs  # schemathesis's own validator, installed with it

    responses = document()["paths"][path]["post"]["responses"]
    assert str(status) in responses, (path, status, sorted(responses))
    schema = responses[str(status)]["content"]["application/json"]["schema"]
    validator = jsonschema_rs.validator_for({"components": document()["components"], **schema})
    assert not [error.message for error in validator.iter_errors(answer)], (path, answer)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_operation_under_a_live_rule_id_is_refused_and_does_nothing(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    with _node(tmp_path, sink, workers) as pigeon:
        status, made = _api(pigeon, "POST", "/api/v1/admin/bounce", {"domain": "s1.test", "id": "r1", "duration": "1h"})
        assert status == 200, made
        suspension = {"domain": "s2.test", "id": "h1", "duration": "2h"}
        status, held = _api(pigeon, "POST", "/api/v1/admin/suspend", suspension)
        assert (status, held["rule"]["id"]) == (200, "h1"), held
        _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "s3.test", "duration": "1h"})
        for _ in range(3):
            _send(pigeon, "user@s3.test")
        _refused(pigeon, pigeon, "r1", "bounce")
        _refused(pigeon, pigeon, "h1", "suspend")
        assert not pigeon.records("AdminBounce")
        status, answer = _api(pigeon, "GET", "/api/v1/admin/bounce")
        assert [rule["id"] for rule in answer["rules"]] == ["r1"]
        # A different duration under a rule's id: the refusal says what was asked too.
        status, answer = _api(
            pigeon, "POST", "/api/v1/admin/suspend", {"domain": "s2.test", "id": "h1", "duration": "1h"}
        )
        assert status == 409, answer
        assert "not a suspend of domain=s2.test (for 3600s)" in answer["error"], answer
        status, answer = _api(pigeon, "DELETE", "/api/v1/admin/suspend/h1")
        assert (status, answer["cancelled"]) == (200, True), answer
        # Ended, the id names nothing: an operation may take it.
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"domain": "s3.test", "id": "h1"})
        assert (status, answer["bounced"], answer["operation"]) == (200, 3, "h1"), answer


def test_a_queue_glob_with_white_space_is_refused(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path, sink, 1) as pigeon:
        for path in ("bounce", "suspend", "retry", "rebind"):
            status, answer = _api(pigeon, "POST", f"/api/v1/admin/{path}", {"queue": "a b*"})
            assert (status, answer.get("field")) == (400, "$.queue"), answer
            assert "no white space" in answer["error"], answer


def test_in_a_cluster_an_operation_under_a_rule_id_is_refused_on_every_node(
    tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer
) -> None:
    redis = {"url": redis_server.url, "timeout": "1s"}
    with _node(tmp_path, sink, 2, "a", redis=redis) as a, _node(tmp_path, sink, 1, "b", redis=redis) as b:
        status, made = _api(a, "POST", "/api/v1/admin/bounce", {"domain": "s1.test", "id": "r1", "duration": "1h"})
        assert status == 200, made
        wait_until(lambda: [r["id"] for r in _api(b, "GET", "/api/v1/admin/bounce")[1]["rules"]] == ["r1"])
        _send(b, "user@s3.test")
        _refused(b, a, "r1", "bounce")
        _refused(a, b, "r1", "bounce")
        time.sleep(1.0)  # what the stream would have carried has reached both nodes by now
        assert not a.records("AdminBounce") and not b.records("AdminBounce")
