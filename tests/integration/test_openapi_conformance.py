"""The OpenAPI document against the live server: schemathesis generates requests from the
document and checks every answer (no 5xx, documented status codes and content types, bodies
that match their schemas, schema-valid requests accepted, invalid ones refused)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

TOKEN = "conformance-token-0123456789"


def _schemathesis(pigeon: PigeonProcess, seed: int, *options: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert binary, "schemathesis is a test dependency: ./scripts/test installs it"
    command = [
        binary, "run", f"http://127.0.0.1:{pigeon.http_port}/api/openapi.json",
        "--header", f"Authorization: Bearer {TOKEN}",
        "--checks", "all", "--suppress-health-check", "all", "--seed", str(seed), "--no-color", *options,
    ]  # fmt: skip
    # Each regex strategy built once per run, not once per operation (tests/support/schemathesis_hooks.py).
    environment = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": str(Path(__file__).parent.parent / "support" / "schemathesis_hooks.py"),
    }
    # Its working directory gets its cache (.schemathesis/): the node's, not the checkout.
    return subprocess.run(
        command, capture_output=True, text=True, timeout=900, check=False, cwd=pigeon.root, env=environment
    )


def _node(root: Path, sink: ScriptedSink) -> PigeonProcess:
    tokens = [{"name": "conformance", "token": TOKEN, "scopes": ["inject", "admin", "read"]}]
    return PigeonProcess(root, http={"token": tokens}, log={"level": "warning"}, **delivery_config(sink.endpoint))


# Each seed sends other requests: one seed passing said little (seed 7 passed with the admin
# tenant and campaign globs documented as taking control characters, which seeds 1-6 and 8-10
# each found). So a few seeds by default, and seeds 1-10 in the slow run.
SEEDS: Final = (2, 7)
MORE_SEEDS: Final = tuple(seed for seed in range(1, 11) if seed not in SEEDS)


# About 12 s of schemathesis's CPU a seed (a minute and a half before its regex strategies were
# shared); on a 2-core runner shared with 3 other test workers it once took 285 s: the usual
# 300 s would fail it for the machine's load, not for Pigeon.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [*SEEDS, *(pytest.param(seed, marks=pytest.mark.slow) for seed in MORE_SEEDS)])
def test_the_api_answers_as_its_openapi_document_says(tmp_path: Path, seed: int) -> None:
    with ScriptedSink() as sink, _node(tmp_path / "node", sink) as pigeon:
        result = _schemathesis(pigeon, seed, "--phases", "fuzzing", "--max-examples", "3")
    assert result.returncode == 0, result.stdout[-6000:]
    assert "Tested: 21" in result.stdout  # every operation of the document was exercised


# About 6 minutes of CPU a seed: seed 7 found a 409 undocumented for a retry and a rebind, and
# parts documented as taken with nothing to send.
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", [7, 1])
def test_the_api_answers_as_its_openapi_document_says_at_length(tmp_path: Path, seed: int) -> None:
    with ScriptedSink() as sink, _node(tmp_path / "node", sink) as pigeon:
        result = _schemathesis(pigeon, seed, "--phases", "coverage,fuzzing,stateful", "--max-examples", "40")
    assert result.returncode == 0, result.stdout[-6000:]


def _call(pigeon: PigeonProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return pigeon.http_call(method, path, body, TOKEN)


def test_the_admin_answers_to_real_requests_match_the_documented_schemas(tmp_path: Path) -> None:
    # Fuzzed requests are mostly refused, so the answers to ones that act are checked here:
    # every member a client generated from the document would read is there, with its type.
    import jsonschema_rs  # schemathesis's own validator, installed with it

    with ScriptedSink() as sink, _node(tmp_path / "node", sink) as pigeon:
        sink.rcpt_reply = lambda address: "451 4.3.0 try later"  # everything stays queued
        document = json.loads(pigeon.http_get("/api/openapi.json")[1])
        status, injected = _call(
            pigeon,
            "POST",
            "/api/v1/inject",
            {
                "envelope_sender": "app@example.org",
                "recipients": [{"email": "a@held.test"}, {"email": "b@held.test"}],
                "content": {"from": {"email": "app@example.org"}, "subject": "x", "text": "hi\n"},
            },
        )
        assert status == 200, injected
        spool_id = injected["recipients"][0]["id"]
        pigeon.wait_records("TransientFailure", 2)

        def checked(method: str, template: str, path: str, body: Any = None) -> dict[str, Any]:
            status, answer = _call(pigeon, method, path, body)
            assert status == 200, (path, answer)
            schema = document["paths"][template][method.lower()]["responses"]["200"]["content"]["application/json"]
            validator = jsonschema_rs.validator_for({"components": document["components"], **schema["schema"]})
            errors = [f"{e.instance_path}: {e.message}" for e in validator.iter_errors(answer)]
            assert not errors, (template, method, answer, errors)
            assert answer, (template, method)
            return dict(answer)

        held = checked("POST", "/api/v1/admin/suspend", "/api/v1/admin/suspend", {"domain": "held.test"})
        assert held["rule"]["kind"] == "suspend"
        assert checked("GET", "/api/v1/admin/suspend", "/api/v1/admin/suspend")["rules"]
        rule = held["rule"]["id"]
        assert checked("DELETE", "/api/v1/admin/suspend/{id}", f"/api/v1/admin/suspend/{rule}")["cancelled"]
        assert "made_due" in checked("POST", "/api/v1/admin/retry", "/api/v1/admin/retry", {"domain": "held.test"})
        # By id: an answer for each, the unknown one's too.
        by_id = {"messages": [spool_id, "00000000000000ff"]}
        retried = checked("POST", "/api/v1/admin/retry", "/api/v1/admin/retry", by_id)
        assert retried["messages"][0]["result"] in ("already_due", "made_due")  # (tried again meanwhile, or not)
        assert retried["messages"][1] == {"id": "00000000000000ff", "result": "not_found"}
        # Queued, but not selected by the selector given with it: said so, not "not found".
        by_id = {"messages": [spool_id], "domain": "other.test"}
        bounced = checked("POST", "/api/v1/admin/bounce", "/api/v1/admin/bounce", by_id)
        assert bounced["messages"] == [{"id": spool_id, "result": "not_selected", "unmatched": ["domain"]}]
        retried = checked("POST", "/api/v1/admin/retry", "/api/v1/admin/retry", by_id)
        assert retried["messages"] == [{"id": spool_id, "result": "not_selected", "unmatched": ["domain"]}]
        # Held by id, then released by id.
        hold = {"messages": [spool_id, "00000000000000ff"], "reason": "look first"}
        held_now = checked("POST", "/api/v1/admin/hold", "/api/v1/admin/hold", hold)
        results = [row["result"] for row in held_now["messages"]]
        assert results in (["held", "not_found"], ["after_attempt", "not_found"])  # (on the wire: once it ends)
        wait_until(lambda: checked("GET", "/api/v1/messages/{id}", f"/api/v1/messages/{spool_id}")["held"])
        held_one = checked("GET", "/api/v1/messages/{id}", f"/api/v1/messages/{spool_id}")
        assert held_one["hold_operator"] == "conformance" and "look first" in held_one["held"]
        listed = checked("GET", "/api/v1/messages", "/api/v1/messages?state=held")
        assert [m["id"] for m in listed["messages"]] == [spool_id] and "look first" in listed["messages"][0]["held"]
        assert checked("POST", "/api/v1/admin/retry", "/api/v1/admin/retry", {"domain": "held.test"})["on_hold"] == 1
        released = checked("POST", "/api/v1/admin/retry", "/api/v1/admin/retry", {"messages": [spool_id]})
        assert released["messages"] == [{"id": spool_id, "result": "made_due"}]
        rebind = {"domain": "held.test", "to_queue": "other@held.test"}
        assert "rebound" in checked("POST", "/api/v1/admin/rebind", "/api/v1/admin/rebind", rebind)
        assert checked("GET", "/api/v1/admin/operations", "/api/v1/admin/operations")["operations"]
        message = checked("GET", "/api/v1/messages/{id}", f"/api/v1/messages/{spool_id}")
        assert message["id"] == spool_id and message["recipients"] == ["a@held.test"]
        checked("GET", "/api/v1/queues", "/api/v1/queues")
        listed = checked("GET", "/api/v1/messages", "/api/v1/messages?domain=held.test&limit=1")
        assert [m["id"] for m in listed["messages"]] == [spool_id] and listed["next"] is not None
        checked("GET", "/api/v1/shaping/effects", "/api/v1/shaping/effects")
        bounce = {"domain": "held.test", "duration": "1h", "reason": "closed"}
        second = injected["recipients"][1]["id"]
        # The retry and the rebind made both due: their attempts (a 451) end before the bounces,
        # whose answers this checks ("after_attempt" for one on the wire: a full suite saw it).
        wait_until(
            lambda: all(
                checked("GET", "/api/v1/messages/{id}", f"/api/v1/messages/{id}")["state"] == "deferred"
                for id in (spool_id, second)
            )
        )
        by_id = {"messages": [second, "00000000000000ff"], "reason": "stuck"}
        bounced = checked("POST", "/api/v1/admin/bounce", "/api/v1/admin/bounce", by_id)
        assert [row["result"] for row in bounced["messages"]] == ["bounced", "not_found"]
        bounced = checked("POST", "/api/v1/admin/bounce", "/api/v1/admin/bounce", bounce)
        assert bounced["bounced"] == 1 and bounced["rule"]["kind"] == "bounce"
        assert checked("GET", "/api/v1/admin/bounce", "/api/v1/admin/bounce")["rules"]
        rule = bounced["rule"]["id"]
        assert checked("DELETE", "/api/v1/admin/bounce/{id}", f"/api/v1/admin/bounce/{rule}")["cancelled"]
