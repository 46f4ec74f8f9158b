"""A standing rule's id is its own: a client's `id` asks for that rule again, never takes the id.

An admin request may carry an `id` (the supervisor and the cluster give one to every copy of a
rule). Under the id of a live rule, the same kind, selector and duration is that rule again
(`already: true`, nothing replaced); anything else is refused with 409 naming the rule, and
nothing changes: before, it silently replaced the rule, even a suspension by a standing bounce,
and what the suspension held was delivered at once, with no resume in the log."""

from __future__ import annotations

import smtplib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

ADMIN = "admin-token-0123456789"
TOKENS = [{"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]}]


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


def _api(pigeon: PigeonProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return pigeon.http_call(method, path, body, ADMIN)


def _cli(pigeon: PigeonProcess, *args: str) -> str:
    command = [*args, "-c", str(pigeon.config_path)]
    done = zygote.run(command, text=True, timeout=60)
    assert done.returncode == 0, done
    return done.stdout


def _send(pigeon: PigeonProcess, recipient: str) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail("a@example.org", [recipient], b"Subject: x\r\n\r\nhi\r\n")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_rule_under_another_rules_id_is_refused_and_the_held_mail_stays_held(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    node = PigeonProcess(
        tmp_path / "node", node={"workers": workers}, http={"token": TOKENS}, **delivery_config(sink.endpoint)
    )
    with node as pigeon:
        rule_id = _cli(pigeon, "suspend", "--domain", "e.test").split("(rule ")[1].split(")")[0]
        listed = _cli(pigeon, "suspend", "--list")
        for path, body in [
            ("suspend", {"domain": "zz4.test", "id": rule_id, "duration": "1h"}),
            ("bounce", {"domain": "zz6.test", "id": rule_id, "duration": "1h"}),
            ("suspend", {"domain": "e.test", "id": rule_id, "duration": "1h"}),  # for a while: another rule
        ]:
            status, answer = _api(pigeon, "POST", f"/api/v1/admin/{path}", body)
            assert status == 409, answer
            assert answer["field"] == "$.id"
            assert answer["error"].startswith(f"id {rule_id} names the suspension {rule_id} of domain=e.test")
            assert (answer["rule"]["id"], answer["rule"]["kind"]) == (rule_id, "suspend")
            assert answer["rule"]["selector"] == {"domain": "e.test"}
        assert _cli(pigeon, "suspend", "--list") == listed  # the e.test suspension, as it was
        assert _cli(pigeon, "bounce", "--list").strip() == "none"
        assert f"refused: id {rule_id} names the suspension" in pigeon.stderr()
        _send(pigeon, "user@e.test")
        time.sleep(1.5)
        assert sink.received == []  # still held
        assert _cli(pigeon, "resume", rule_id).startswith("resumed: 1 message")  # resumed by its id
        (delivered,) = sink.wait_for(1)
        assert delivered.recipients == ["user@e.test"]


def test_a_request_sent_again_under_its_id_is_the_same_rule_and_cancels_by_that_id(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    node = PigeonProcess(
        tmp_path / "node", node={"workers": 2}, http={"token": TOKENS}, **delivery_config(sink.endpoint)
    )
    with node as pigeon:
        for kind in ("suspend", "bounce"):
            body = {"domain": f"{kind}.test", "id": f"key-{kind}", "duration": "1h", "reason": "once"}
            status, first = _api(pigeon, "POST", f"/api/v1/admin/{kind}", body)
            assert (status, first["already"], first["rule"]["id"]) == (200, False, f"key-{kind}"), first
            status, again = _api(pigeon, "POST", f"/api/v1/admin/{kind}", {**body, "reason": "twice"})
            assert (status, again["already"]) == (200, True), again
            assert again["rule"] == first["rule"]  # the rule as it was made: nothing replaced
            status, listed = _api(pigeon, "GET", f"/api/v1/admin/{kind}")
            assert listed["rules"] == [first["rule"]]
            status, other = _api(pigeon, "POST", f"/api/v1/admin/{kind}", {**body, "duration": "2h"})
            assert status == 409, other  # another duration: another rule
            assert _api(pigeon, "GET", f"/api/v1/admin/{kind}")[1]["rules"] == [first["rule"]]
        _send(pigeon, "user@bounce.test")
        wait_until(lambda: pigeon.records("AdminBounce"))
        status, answer = _api(pigeon, "DELETE", "/api/v1/admin/bounce/key-bounce")
        assert (status, answer["cancelled"]) == (200, True)
        status, answer = _api(pigeon, "DELETE", "/api/v1/admin/suspend/key-suspend")
        assert (status, answer["cancelled"]) == (200, True)
        # Ended, the id names nothing: it may make a rule again.
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"domain": "x.test", "id": "key-suspend"})
        assert status == 200, answer


def _rules(pigeon: PigeonProcess, kind: str) -> list[tuple[str, str, dict[str, str]]]:
    status, answer = _api(pigeon, "GET", f"/api/v1/admin/{kind}")
    assert status == 200, answer
    return [(rule["id"], rule["kind"], rule["selector"]) for rule in answer["rules"]]


def test_in_a_cluster_another_rule_under_a_rule_id_is_refused_on_every_node(
    tmp_path: Path, sink: ScriptedSink, redis_server: RedisServer
) -> None:
    def node(name: str) -> PigeonProcess:
        return PigeonProcess(
            tmp_path / name,
            node={"name": name, "workers": 1},
            http={"token": TOKENS},
            redis={"url": redis_server.url, "timeout": "1s"},
            **delivery_config(sink.endpoint),
        )

    with node("a") as a, node("b") as b:
        status, made = _api(a, "POST", "/api/v1/admin/suspend", {"domain": "e.test"})
        assert status == 200, made
        rule = made["rule"]
        held = [(rule["id"], "suspend", {"domain": "e.test"})]  # (each node's copy has its own `created`)
        wait_until(lambda: _rules(b, "suspend") == held)
        for asked in (a, b):
            body = {"domain": "zz6.test", "id": rule["id"], "duration": "1h"}
            status, answer = _api(asked, "POST", "/api/v1/admin/bounce", body)
            assert status == 409, answer
            assert (answer["rule"]["id"], answer["rule"]["selector"]) == (rule["id"], rule["selector"])
        time.sleep(1.0)  # what the stream would have carried has reached both nodes by now
        for each in (a, b):
            assert (_rules(each, "suspend"), _rules(each, "bounce")) == (held, [])
        _send(b, "user@e.test")
        time.sleep(1.5)
        assert sink.received == []
        status, answer = _api(b, "DELETE", f"/api/v1/admin/suspend/{rule['id']}")
        assert (status, answer["cancelled"]) == (200, True), answer
        sink.wait_for(1)


def test_the_list_of_rules_aligns_its_columns_by_the_longest_id(tmp_path: Path, sink: ScriptedSink) -> None:
    """A rule made through the API may have a short id of its own ("r1"): its selector, end and
    operator stand in the same columns as those of the 12-character ids the node makes."""
    node = PigeonProcess(tmp_path / "node", http={"token": TOKENS}, **delivery_config(sink.endpoint))
    with node as pigeon:
        assert (
            _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "a.test", "id": "r1", "duration": "1h"})[0] == 200
        )
        made = _cli(pigeon, "suspend", "--domain", "b.test").split("(rule ")[1].split(")")[0]
        lines = _cli(pigeon, "suspend", "--list").splitlines()
        assert sorted(line.split()[0] for line in lines) == sorted(["r1", made])
        assert len({line.index("domain=") for line in lines}) == 1, lines
        assert len({line.index(" by ") for line in lines}) == 1, lines
