"""Holding one message by id (Postfix's `postsuper -h`), and releasing it (`postsuper -H`: here
`pigeon retry --id`): on a live node, through its API and the `pigeon` command, with a sink that
defers until told to take mail."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_admin_by_id import ADMIN, TOKENS, UNKNOWN, DeferringSink, _one_outcome_each, _send
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until


@pytest.fixture
def sink() -> Iterator[DeferringSink]:
    with ScriptedSink() as running:
        yield DeferringSink(running)


def _node(root: Path, sink: ScriptedSink, workers: int = 1, **delivery: Any) -> PigeonProcess:
    config = delivery_config(sink.endpoint, **delivery)
    return PigeonProcess(root, node={"workers": workers}, http={"token": TOKENS}, **config)


def _api(pigeon: PigeonProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return pigeon.http_call(method, path, body, ADMIN)


def _deferred(pigeon: PigeonProcess, ids: list[str]) -> None:
    wait_until(lambda: {r["id"] for r in pigeon.records("TransientFailure")} >= set(ids))


def _delivered(pigeon: PigeonProcess) -> set[str]:
    return {r["id"] for r in pigeon.records("Delivery")}


def test_a_held_message_waits_while_the_others_go_and_a_restart_keeps_it_held_until_its_id_is_retried(
    tmp_path: Path, sink: DeferringSink
) -> None:
    pigeon = _node(tmp_path / "node", sink.sink)
    with pigeon:
        ids = _send(pigeon, ["ok@example.net"], count=3)
        _deferred(pigeon, ids)
        held = ids[1]
        status, answer = _api(pigeon, "POST", "/api/v1/admin/hold", {"messages": [held, UNKNOWN], "reason": "a loop?"})
        assert status == 200, answer
        assert (answer["held"], answer["after_attempt"]) == (1, 0)
        assert answer["messages"] == [
            {"id": held, "result": "held", "recipients": 1},
            {"id": UNKNOWN, "result": "not_found"},
        ]
        (record,) = pigeon.wait_records("AdminHold")
        assert (record["id"], record["reason"], record["operator"], record["recipients"]) == (
            held,
            "a loop?",
            "ops",
            ["ok@example.net"],
        )
        # The sink comes back: the other two go, the held one does not (retried every second).
        sink.take()
        wait_until(lambda: _delivered(pigeon) == {ids[0], ids[2]})
        time.sleep(3)
        assert _delivered(pigeon) == {ids[0], ids[2]}
        # Shown held, with who held it and why.
        seen = _api(pigeon, "GET", f"/api/v1/messages/{held}")[1]
        why = "held by operator 'ops': a loop?"
        assert (seen["held"], seen["hold_operator"], seen["next_due"]) == (why, "ops", None)
        listed = pigeon.cli("queue", "list", "--state", "held")
        assert held in listed and "held by operator 'ops': a loop?" in listed, listed
        # A retry of its domain (postqueue -f) leaves it held: only its id releases it.
        status, answer = _api(pigeon, "POST", "/api/v1/admin/retry", {"domain": "example.net"})
        assert (status, answer["made_due"], answer["on_hold"]) == (200, 0, 1), answer
        time.sleep(1.5)
        assert held not in _delivered(pigeon)
    # A restart keeps it held.
    with pigeon:
        time.sleep(3)
        assert held not in _delivered(pigeon)
        assert _api(pigeon, "GET", f"/api/v1/messages/{held}")[1]["hold_operator"] == "ops"
        released = pigeon.cli("retry", "--id", held)
        assert f"{held}  due now" in released, released
        wait_until(lambda: held in _delivered(pigeon))
        assert pigeon.spool_messages() == []
        _one_outcome_each(pigeon)


def test_a_message_being_sent_when_held_is_held_as_far_as_that_attempt_leaves_it(tmp_path: Path) -> None:
    # slow@ answers RCPT 2 s late (and is taken), tempfail@ is deferred: the message is on the
    # wire when the hold comes, and that attempt delivers one recipient and leaves the other.
    with ScriptedSink(slow=2.0) as sink, _node(tmp_path / "node", sink) as pigeon:
        (sending,) = _send(pigeon, ["slow@example.net", "tempfail@example.net"])
        wait_until(lambda: len(sink.rcpt_log) >= 1)
        status, answer = _api(pigeon, "POST", "/api/v1/admin/hold", {"messages": [sending], "reason": "wait"})
        assert status == 200, answer
        assert answer["messages"] == [{"id": sending, "result": "after_attempt", "recipients": 2}]
        (record,) = pigeon.wait_records("AdminHold", timeout=30)
        assert (record["id"], record["reason"], record["recipients"]) == (sending, "wait", ["tempfail@example.net"])
        assert [r["recipient"] for r in pigeon.records("Delivery")] == ["slow@example.net"]
        # That attempt's deferral is said, with no next attempt (0): what it left is held.
        (deferral,) = pigeon.records("TransientFailure")
        assert (deferral["recipient"], deferral["next_attempt"]) == ("tempfail@example.net", 0)
        tries = sink.rcpt_log.count("tempfail@example.net")
        time.sleep(3)  # (retried every second, were it not held)
        assert sink.rcpt_log.count("tempfail@example.net") == tries
        seen = _api(pigeon, "GET", f"/api/v1/messages/{sending}")[1]
        assert (seen["hold_operator"], seen["recipients"]) == ("ops", ["tempfail@example.net"])
        # Released, it is tried again (and retried as before).
        assert _api(pigeon, "POST", "/api/v1/admin/retry", {"messages": [sending]})[1]["made_due"] == 1
        wait_until(lambda: [r.get("next_attempt") for r in pigeon.records("TransientFailure")][1:], timeout=30)
        _one_outcome_each(pigeon)


def test_with_two_workers_a_hold_finds_the_id_on_the_other_worker(tmp_path: Path, sink: DeferringSink) -> None:
    with _node(tmp_path / "node", sink.sink, workers=2) as pigeon:
        ids: list[str] = []
        while len(ids) < 40 and {int(i, 16) & 63 for i in ids} != {0, 1}:
            ids += _send(pigeon, ["ok@example.net"])
        by_shard = {int(i, 16) & 63: i for i in ids}
        assert set(by_shard) == {0, 1}  # the shard bits: both workers hold some
        _deferred(pigeon, ids)
        held = sorted(by_shard.values())
        status, answer = _api(pigeon, "POST", "/api/v1/admin/hold", {"messages": held})
        assert status == 200, answer
        assert answer["held"] == 2
        assert answer["messages"] == [{"id": i, "result": "held", "recipients": 1} for i in held]
        # Asked again: held already, left as it is.
        again = _api(pigeon, "POST", "/api/v1/admin/hold", {"messages": held})[1]
        assert (again["held"], [r["result"] for r in again["messages"]]) == (0, ["already_held"] * 2)
        sink.take()
        rest = set(ids) - set(held)
        wait_until(lambda: _delivered(pigeon) == rest)
        time.sleep(2)
        assert _delivered(pigeon) == rest
        answer = _api(pigeon, "POST", "/api/v1/admin/retry", {"messages": held})[1]
        assert answer["messages"] == [{"id": i, "result": "made_due"} for i in held]
        wait_until(lambda: _delivered(pigeon) == set(ids))
        _one_outcome_each(pigeon)


def test_held_mail_does_not_expire_while_held_and_expires_with_a_dsn_once_released_past_max_age(
    tmp_path: Path, sink: DeferringSink
) -> None:
    with _node(tmp_path / "node", sink.sink, max_age="4s") as pigeon:
        (held,) = _send(pigeon, ["ok@example.net"])
        _deferred(pigeon, [held])
        assert _api(pigeon, "POST", "/api/v1/admin/hold", {"messages": [held]})[1]["held"] == 1
        time.sleep(6)  # past max_age
        assert not pigeon.records("Expiration")
        assert [m["id"] for m in pigeon.spool_messages()] == [held]
        # Released, it is as old as it is: it expires at its next turn, with the usual DSN.
        tried = len([r for r in pigeon.records("TransientFailure") if r["id"] == held])
        assert _api(pigeon, "POST", "/api/v1/admin/retry", {"messages": [held]})[1]["made_due"] == 1
        (expired,) = pigeon.wait_records("Expiration")
        assert expired["id"] == held and expired["response"]["enhanced"] == "5.4.7"
        # Before another attempt (not tried again for a max_age counted afresh from the release).
        deferrals = [r for r in pigeon.records("TransientFailure") if r["id"] == held]
        assert (expired["attempt"], len(deferrals)) == (tried, tried)
        dsn = wait_until(lambda: [r for r in pigeon.records("Reception") if r.get("reports_on") == held])
        assert dsn[0]["recipients"] == ["sender@example.org"]


def test_a_hold_names_messages_by_id(tmp_path: Path, sink: DeferringSink) -> None:
    with _node(tmp_path / "node", sink.sink) as pigeon:
        (queued,) = _send(pigeon, ["ok@example.net"])
        _deferred(pigeon, [queued])
        status, answer = _api(pigeon, "POST", "/api/v1/admin/hold", {"domain": "example.net"})
        assert (status, answer["field"]) == (400, "$.messages") and "suspend" in answer["error"]
        status, answer = _api(pigeon, "POST", "/api/v1/admin/hold", {"messages": [queued], "duration": "1h"})
        assert (status, answer["field"]) == (400, "$.duration")
        # With a selector too: only those of the ids it selects.
        status, answer = _api(pigeon, "POST", "/api/v1/admin/hold", {"messages": [queued], "domain": "other.test"})
        assert answer["messages"] == [{"id": queued, "result": "not_selected", "unmatched": ["domain"]}]
        assert not pigeon.records("AdminHold")
        said = pigeon.cli("hold", "--id", queued, "--reason", "look")
        assert said.startswith("held 1 message") and f"{queued}  held (1 recipient)" in said, said
        assert "look" in pigeon.cli("inspect", queued)


def test_a_retry_by_id_of_a_message_held_while_being_sent_cancels_the_hold_and_it_is_retried_as_usual(
    tmp_path: Path,
) -> None:
    # Found from outside: the retry answered `already_due`, and when the attempt ended with its
    # 451 the message sat held by the operator, silently (held mail does not expire), until a
    # second retry. The sink takes 4 s to answer the end of data, with a 451.
    with ScriptedSink(slow=4.0) as sink, _node(tmp_path / "node", sink) as pigeon:
        (sending,) = _send(pigeon, ["slowtemp@example.net"])

        def on_the_wire(attempt: int) -> bool:
            # Listed in flight, and its RCPT seen by the sink: the attempt has begun.
            listed = _api(pigeon, "GET", "/api/v1/messages?state=in_flight")[1]["messages"]
            return [m["id"] for m in listed] == [sending] and len(sink.rcpt_log) >= attempt

        wait_until(lambda: on_the_wire(1))
        status, answer = _api(pigeon, "POST", "/api/v1/admin/hold", {"messages": [sending], "reason": "wait"})
        assert answer["messages"] == [{"id": sending, "result": "after_attempt", "recipients": 1}], (status, answer)
        said = pigeon.cli("retry", "--id", sending)
        assert f"{sending}  being sent: the hold asked meanwhile is cancelled" in said, said
        # The attempt ends (451): deferred as usual, not held, and tried again at its turn.
        (deferral,) = pigeon.wait_records("TransientFailure", timeout=30)
        assert deferral["id"] == sending and deferral["next_attempt"] > 0
        wait_until(lambda: sink.rcpt_log.count("slowtemp@example.net") >= 2, timeout=30)
        assert not pigeon.records("AdminHold")
        seen = _api(pigeon, "GET", f"/api/v1/messages/{sending}")[1]
        assert (seen.get("held"), seen.get("hold_operator")) == (None, None), seen
        assert "held" not in pigeon.cli("queue", "list")
        # Asked through the API, of an attempt under way again: the row says so.
        wait_until(lambda: on_the_wire(3), timeout=30)
        answer = _api(pigeon, "POST", "/api/v1/admin/hold", {"messages": [sending]})[1]
        assert answer["after_attempt"] == 1, answer
        answer = _api(pigeon, "POST", "/api/v1/admin/retry", {"messages": [sending]})[1]
        assert answer["messages"] == [{"id": sending, "result": "hold_cancelled"}], answer
        wait_until(lambda: len(pigeon.records("TransientFailure")) >= 2, timeout=30)
        assert not pigeon.records("AdminHold")
