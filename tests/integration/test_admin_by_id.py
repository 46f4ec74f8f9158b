"""Bounce and retry of messages named by id (`postsuper -d`, `postqueue -i`): on a live node,
through its API and the `pigeon` command, with a sink that defers until told to take mail."""

from __future__ import annotations

import smtplib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

ADMIN = "admin-token-0123456789"
TOKENS = [{"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]}]
UNKNOWN = "00000000000000ff"
TERMINAL = ("Delivery", "Bounce", "Expiration", "AdminBounce")


class DeferringSink:
    """A scripted sink that answers every RCPT 451 until `take()`, then 250."""

    def __init__(self, sink: ScriptedSink) -> None:
        self.sink = sink
        self._deferring = threading.Event()
        self._deferring.set()
        sink.rcpt_reply = lambda address: "451 4.3.0 try later" if self._deferring.is_set() else None

    def take(self) -> None:
        self._deferring.clear()


@pytest.fixture
def sink() -> Iterator[DeferringSink]:
    with ScriptedSink() as running:
        yield DeferringSink(running)


def _node(root: Path, sink: DeferringSink, workers: int = 1, **delivery: Any) -> PigeonProcess:
    config = delivery_config(sink.sink.endpoint, **delivery)
    return PigeonProcess(root, node={"workers": workers}, http={"token": TOKENS}, **config)


def _send(pigeon: PigeonProcess, recipients: list[str], count: int = 1) -> list[str]:
    """`count` messages, each on a connection of its own (the kernel spreads them over workers)."""
    ids = []
    for n in range(count):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("client.test")
            client.mail("sender@example.org")
            for recipient in recipients:
                client.rcpt(recipient)
            code, text = client.data(f"Subject: {n}\r\n\r\nhello\r\n".encode())
            assert code == 250
            ids += text.decode().split("queued as ")[1].split()
    return ids


def _deferred(pigeon: PigeonProcess, ids: list[str]) -> None:
    wait_until(lambda: {r["id"] for r in pigeon.records("TransientFailure")} >= set(ids))


def _api(pigeon: PigeonProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return pigeon.http_call(method, path, body, ADMIN)


def _one_outcome_each(pigeon: PigeonProcess) -> None:
    terminal = [(r["id"], r["recipient"]) for r in pigeon.records() if r["type"] in TERMINAL]
    assert len(set(terminal)) == len(terminal), terminal


def test_a_bounce_by_id_ends_that_message_alone_and_makes_no_standing_rule(tmp_path: Path, sink: DeferringSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        ids = _send(pigeon, ["ok@example.net", "ok2@example.net"], count=3)
        _deferred(pigeon, ids)
        stuck = ids[1]
        body = {"messages": [stuck, UNKNOWN], "reason": "stuck"}
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", body)
        assert status == 200, answer
        assert (answer["bounced"], answer["after_attempt"], answer["rule"]) == (1, 0, None)
        assert answer["messages"] == [
            {"id": stuck, "result": "bounced", "recipients": 2},
            {"id": UNKNOWN, "result": "not_found"},
        ]
        bounces = pigeon.wait_records("AdminBounce", 2)
        assert {(r["id"], r["reason"], r["operator"]) for r in bounces} == {(stuck, "stuck", "ops")}
        assert _api(pigeon, "GET", "/api/v1/admin/bounce") == (200, {"rules": []})
        # The other two are untouched: once the sink takes mail, they are delivered.
        sink.take()
        delivered = wait_until(lambda: len(pigeon.records("Delivery")) == 4 and pigeon.records("Delivery"))
        assert {r["id"] for r in delivered} == {ids[0], ids[2]}
        assert pigeon.spool_messages() == []
        # No DSN to the sender (as the bulk bounce: the operator's act, not a failure to report).
        time.sleep(1)
        assert [m.recipients for m in sink.sink.received] == [["ok@example.net", "ok2@example.net"]] * 2
        _one_outcome_each(pigeon)
        # Asked again, it is gone: not found, and nothing else is touched.
        status, again = _api(pigeon, "POST", "/api/v1/admin/bounce", {"messages": [stuck]})
        assert (status, again["bounced"], again["messages"]) == (200, 0, [{"id": stuck, "result": "not_found"}])


def test_an_id_bounce_of_mail_for_a_domain_leaves_new_mail_for_it_alone(tmp_path: Path, sink: DeferringSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        (stuck,) = _send(pigeon, ["ok@example.net"])
        _deferred(pigeon, [stuck])
        assert _api(pigeon, "POST", "/api/v1/admin/bounce", {"messages": [stuck]})[1]["bounced"] == 1
        sink.take()
        (fresh,) = _send(pigeon, ["ok@example.net"])
        wait_until(lambda: [r["id"] for r in pigeon.records("Delivery")] == [fresh])
        assert [r["id"] for r in pigeon.records("AdminBounce")] == [stuck]


def test_a_retry_by_id_makes_only_that_message_due(tmp_path: Path, sink: DeferringSink) -> None:
    with _node(tmp_path / "node", sink, retry_interval="1h") as pigeon:
        ids = _send(pigeon, ["ok@example.net"], count=3)
        _deferred(pigeon, ids)
        sink.take()
        status, answer = _api(pigeon, "POST", "/api/v1/admin/retry", {"messages": [ids[0], UNKNOWN]})
        assert status == 200, answer
        assert answer["made_due"] == 1
        assert answer["messages"] == [{"id": ids[0], "result": "made_due"}, {"id": UNKNOWN, "result": "not_found"}]
        wait_until(lambda: [r["id"] for r in pigeon.records("Delivery")] == [ids[0]])
        time.sleep(1.5)  # the others would have gone by now, had they been made due
        assert [r["id"] for r in pigeon.records("Delivery")] == [ids[0]]
        for other in ids[1:]:
            seen = _api(pigeon, "GET", f"/api/v1/messages/{other}")[1]
            assert seen["attempts"] == 1 and seen["next_due"] > time.time() + 3000
        assert {m["id"] for m in pigeon.spool_messages()} == set(ids[1:])


def test_ids_that_are_none_are_refused_and_nothing_is_done(tmp_path: Path, sink: DeferringSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        (queued,) = _send(pigeon, ["ok@example.net"])
        _deferred(pigeon, [queued])
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"messages": [queued, "xyz"]})
        assert (status, answer["field"]) == (400, "$.messages[1]") and "16 hex digits" in answer["error"]
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"messages": [queued], "duration": "1h"})
        assert (status, answer["field"]) == (400, "$.duration") and "no standing rule" in answer["error"]
        status, answer = _api(pigeon, "POST", "/api/v1/admin/retry", {"messages": []})
        assert (status, answer["field"]) == (400, "$.messages")
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"messages": [queued]})
        assert (status, answer["field"]) == (400, "$.messages")
        # One row per id given: an id given twice (in either case) is refused, not merged into one row.
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"messages": [queued, queued.upper()]})
        assert (status, answer["field"]) == (400, "$.messages[1]")
        assert "given already, at messages[0]" in answer["error"]
        assert [m["id"] for m in pigeon.spool_messages()] == [queued]
        assert not pigeon.records("AdminBounce")


def test_with_two_workers_an_id_is_found_on_whichever_worker_holds_it(tmp_path: Path, sink: DeferringSink) -> None:
    with _node(tmp_path / "node", sink, workers=2, retry_interval="1h") as pigeon:
        ids: list[str] = []
        while len(ids) < 40 and {int(i, 16) & 63 for i in ids} != {0, 1}:
            ids += _send(pigeon, ["ok@example.net"])
        by_shard = {int(i, 16) & 63: i for i in ids}
        assert set(by_shard) == {0, 1}  # the shard bits: both workers hold some
        _deferred(pigeon, ids)
        for shard, spool_id in by_shard.items():
            status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"messages": [spool_id]})
            assert status == 200, answer
            assert answer["messages"] == [{"id": spool_id, "result": "bounced", "recipients": 1}], shard
            assert answer["bounced"] == 1
        rest = [i for i in ids if i not in by_shard.values()]
        wait_until(lambda: {r["id"] for r in pigeon.records("AdminBounce")} == set(by_shard.values()))
        if rest:
            sink.take()
            status, answer = _api(pigeon, "POST", "/api/v1/admin/retry", {"messages": rest})
            assert answer["messages"] == [{"id": i, "result": "made_due"} for i in rest]
            wait_until(lambda: {r["id"] for r in pigeon.records("Delivery")} == set(rest))
        _one_outcome_each(pigeon)


def test_a_message_being_sent_when_its_id_is_bounced_ends_once(tmp_path: Path) -> None:
    # slow@ answers RCPT 2 s late: the message is on the wire when the bounce comes.
    with (
        ScriptedSink(slow=2.0) as sink,
        PigeonProcess(tmp_path / "node", http={"token": TOKENS}, **delivery_config(sink.endpoint)) as pigeon,
    ):
        (sending,) = _send(pigeon, ["slow@example.net"])
        wait_until(lambda: len(sink.rcpt_log) >= 1)
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"messages": [sending], "reason": "stop"})
        assert status == 200, answer
        assert answer["messages"] == [{"id": sending, "result": "after_attempt", "recipients": 1}]
        # The attempt under way delivers it: that is its one outcome, and no AdminBounce follows.
        wait_until(lambda: pigeon.records("Delivery"), timeout=30)
        time.sleep(0.5)
        assert [r["type"] for r in pigeon.records() if r["type"] in TERMINAL] == ["Delivery"]


def _cli(pigeon: PigeonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run(
        [*args, "-c", str(pigeon.config_path), "--token", ADMIN],
        text=True,
        timeout=60,
    )


def test_pigeon_bounce_and_retry_by_id_say_what_became_of_each(tmp_path: Path, sink: DeferringSink) -> None:
    with _node(tmp_path / "node", sink, retry_interval="1h") as pigeon:
        ids = _send(pigeon, ["ok@example.net"], count=3)
        _deferred(pigeon, ids)
        bounced = _cli(pigeon, "bounce", "--id", ids[0], "--id", UNKNOWN.upper(), "--reason", "stuck")
        assert bounced.returncode == 0, bounced.stderr  # an id not found is no failure of the rest
        assert bounced.stdout.splitlines() == [
            "bounced 1 message",
            f"  {ids[0]}  bounced (1 recipient)",
            f"  {UNKNOWN}  not found: delivered, bounced or expired already, or no such message",
        ]
        sink.take()
        retried = _cli(pigeon, "retry", "--id", ids[1])
        assert retried.returncode == 0, retried.stderr
        assert retried.stdout.splitlines() == ["1 message due now", f"  {ids[1]}  due now"]
        wait_until(lambda: [r["id"] for r in pigeon.records("Delivery")] == [ids[1]])
        refused = _cli(pigeon, "bounce", "--id", "xyz")
        assert refused.returncode == 2 and "16 hex digits" in refused.stderr
        refused = _cli(pigeon, "bounce", "--id", ids[2], "--duration", "1h")
        assert refused.returncode == 2 and "no standing rule" in refused.stderr
        listed = _cli(pigeon, "bounce", "--list", "--id", ids[2])
        assert listed.returncode == 2 and "--list takes no --id" in listed.stderr
        assert {m["id"] for m in pigeon.spool_messages()} == {ids[2]}


def test_an_id_the_selector_given_with_it_does_not_select_is_said_to_be_queued_not_missing(
    tmp_path: Path, sink: DeferringSink
) -> None:
    with _node(tmp_path / "node", sink, retry_interval="1h") as pigeon:
        (queued,) = _send(pigeon, ["ok@example.net"])
        _deferred(pigeon, [queued])
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"messages": [queued], "domain": "other.example"})
        assert status == 200, answer
        assert (answer["bounced"], answer["messages"]) == (
            0,
            [{"id": queued, "result": "not_selected", "unmatched": ["domain"]}],
        )
        done = _cli(pigeon, "bounce", "--id", queued, "--domain", "other.example", "--campaign", "x")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "bounced 0 messages",
            f"  {queued}  queued, but not selected by --campaign x --domain other.example: left as it is",
        ]
        done = _cli(pigeon, "retry", "--id", queued, "--tenant", "acme")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[1:] == [f"  {queued}  queued, but not selected by --tenant acme: left as it is"]
        # Left as it was: queued, never bounced.
        assert pigeon.records("AdminBounce") == []
        assert [m["id"] for m in pigeon.spool_messages()] == [queued]
