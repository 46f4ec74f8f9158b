"""Admin operations on a live node: bounce, suspend/resume, retry now, inspect; with auth."""

from __future__ import annotations

import json
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
READER = "reader-token-0123456789"
INJECT = "inject-token-0123456789"
TOKENS = [
    {"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]},
    {"name": "dashboard", "token": READER, "scopes": ["read"]},
    {"name": "app", "token": INJECT, "scopes": ["inject"]},
]


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


def _node(root: Path, sink: ScriptedSink, workers: int = 1, **delivery: Any) -> PigeonProcess:
    config = delivery_config(sink.endpoint, **delivery)
    return PigeonProcess(root, node={"workers": workers}, http={"token": TOKENS}, **config)


def _send(pigeon: PigeonProcess, recipients: list[str], count: int = 1) -> list[str]:
    ids = []
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        for n in range(count):
            client.mail("sender@example.org")
            for recipient in recipients:
                client.rcpt(recipient)
            code, text = client.data(f"Subject: {n}\r\n\r\nhello\r\n".encode())
            assert code == 250
            ids += text.decode().split("queued as ")[1].split()
    return ids


def _api(pigeon: PigeonProcess, method: str, path: str, body: Any = None, token: str = ADMIN) -> tuple[int, Any]:
    return pigeon.http_call(method, path, body, token)


def test_bounce_ends_deferred_mail_and_with_a_duration_new_mail_too(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        deferred = _send(pigeon, ["tempfail@example.net"], count=5)
        wait_until(lambda: len({r["id"] for r in pigeon.records("TransientFailure")}) == 5)
        kept = _send(pigeon, ["tempfail@other.test"])  # another domain: not touched
        status, answer = _api(
            pigeon, "POST", "/api/v1/admin/bounce", {"domain": "example.net", "reason": "bad list", "duration": "1h"}
        )
        assert status == 200, answer
        assert answer["bounced"] == 5
        rule = answer["rule"]
        assert rule["selector"] == {"domain": "example.net"} and rule["operator"] == "ops"
        bounces = wait_until(lambda: len(pigeon.records("AdminBounce")) == 5 and pigeon.records("AdminBounce"))
        assert sorted(r["id"] for r in bounces) == sorted(deferred)
        assert all(r["reason"] == "bad list" and r["response"]["code"] == 550 for r in bounces)
        # New mail for the domain is bounced by the standing rule; the sink never sees it.
        (fresh,) = _send(pigeon, ["ok@example.net"])
        wait_until(lambda: any(r["id"] == fresh for r in pigeon.records("AdminBounce")))
        assert _api(pigeon, "GET", "/api/v1/admin/bounce", token=READER) == (200, {"rules": [rule]})
        assert _api(pigeon, "DELETE", f"/api/v1/admin/bounce/{rule['id']}")[1]["cancelled"] is True
        assert _api(pigeon, "GET", "/api/v1/admin/bounce", token=READER) == (200, {"rules": []})
        (after,) = _send(pigeon, ["ok@example.net"])  # the rule is gone: delivered
        wait_until(lambda: any(r["id"] == after for r in pigeon.records("Delivery")))
        assert all(m.recipients != ["ok@example.net"] or b"Subject: 0" in m.data for m in sink.received)
        assert len([m for m in sink.received if m.recipients == ["ok@example.net"]]) == 1
        assert {m["id"] for m in pigeon.spool_messages()} == set(kept)
        # No recipient was both admin-bounced and delivered, and nothing has two outcomes.
        terminal = [r for r in pigeon.records() if r["type"] in ("Delivery", "Bounce", "Expiration", "AdminBounce")]
        assert len({r["id"] for r in terminal}) == len(terminal)


def test_a_bounce_survives_a_restart(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"tenant": "acme", "duration": "1h"})
        assert (status, answer["bounced"]) == (200, 0)
    with _node(tmp_path / "node", sink) as pigeon:
        assert len(_api(pigeon, "GET", "/api/v1/admin/bounce")[1]["rules"]) == 1
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["ok@example.net"], b"X-Tenant: acme\r\nSubject: x\r\n\r\nhi\r\n")
        wait_until(lambda: pigeon.records("AdminBounce"))
        assert sink.received == []


def test_suspend_holds_mail_untried_until_resumed(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"campaign": "spring"})
        assert status == 200, answer
        rule_id = answer["rule"]["id"]
        # Found from outside: no reason given printed an empty "()" after the selector.
        said = pigeon.wait_stderr("admin suspend by").split("admin suspend by", 1)[1].splitlines()[0]
        assert said.endswith("of campaign=spring") and "()" not in said, said
        assert _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "x.test", "reason": "why"})[0] == 200
        pigeon.wait_stderr(" of domain=x.test (why)")  # a reason given is said
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["ok@example.net"], b"X-Campaign: spring\r\nSubject: x\r\n\r\nhi\r\n")
            client.sendmail("a@example.org", ["ok@example.net"], b"X-Campaign: autumn\r\nSubject: y\r\n\r\nhi\r\n")
        (other,) = sink.wait_for(1)
        assert other.email["Subject"] == "y"  # not suspended: delivered
        time.sleep(1.5)
        assert len(sink.received) == 1
        (held,) = pigeon.spool_messages()
        status, seen = _api(pigeon, "GET", f"/api/v1/messages/{held['id']}", token=READER)
        assert status == 200
        # Its state as `pigeon queue list` says it (it said "scheduled" of any message not in memory).
        assert (seen["queue"], seen["attempts"], seen["state"]) == ("spring:@example.net", 0, "suspended")
        assert seen["suspended_by"] == rule_id
        assert not pigeon.records("TransientFailure")  # held, not tried
        status, answer = _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{rule_id}")
        assert (status, answer["cancelled"], answer["made_due"]) == (200, True, 1)
        assert [m.email["Subject"] for m in sink.wait_for(2)] == ["y", "x"]


def test_suspend_counts_as_held_the_deferred_mail_the_summary_then_shows_suspended(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    # Deferred for an hour: only the spool holds them when the suspension is made. Before,
    # "held": 0 ("0 messages put back"), while the summary said 3 suspended and resume made 3 due.
    with _node(tmp_path / "node", sink, retry_interval="1h") as pigeon:
        _send(pigeon, ["tempfail@held.test"], count=3)
        _send(pigeon, ["tempfail@other.test"])  # not the suspension's
        wait_until(lambda: len(pigeon.records("TransientFailure")) == 4)
        wait_until(
            lambda: (
                not any(r["in_flight"] or r["settling"] for r in _api(pigeon, "GET", "/api/v1/queues")[1]["scheduled"])
            )
        )
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "held.test"})
        assert (status, answer["held"]) == (200, 3), answer
        status, summary = _api(pigeon, "GET", "/api/v1/queues")
        assert [(r["queue"], r["suspended"]) for r in summary["scheduled"]] == [("held.test", 3), ("other.test", 0)]
        status, answer = _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{answer['rule']['id']}")
        assert answer["made_due"] == 3


def test_a_retry_leaves_suspended_mail_held_and_says_so(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "held.test"})
        rule_id = answer["rule"]["id"]
        ids = _send(pigeon, ["ok@held.test"], count=3)
        wait_until(lambda: all(_api(pigeon, "GET", f"/api/v1/messages/{i}")[1]["suspended_by"] for i in ids))
        status, answer = _api(pigeon, "POST", "/api/v1/admin/retry", {"domain": "held.test"})
        # Before: "3 messages due now", which the suspension then held again at once.
        assert (status, answer["made_due"], answer["suspended"]) == (200, 0, 3), answer
        status, seen = _api(pigeon, "GET", f"/api/v1/messages/{ids[0]}")
        assert seen["suspended_by"] == rule_id
        time.sleep(1.0)
        assert not sink.received
        status, answer = _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{rule_id}")
        assert answer["made_due"] == 3
        sink.wait_for(3)
        status, progress = _api(pigeon, "GET", "/api/v1/admin/operations")
        assert [r["kind"] for r in progress["operations"]][-1] == "resume"  # not "retry"


def test_the_same_suspension_asked_twice_is_one_rule_that_one_resume_ends(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        status, first = _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "held.test"})
        status, again = _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "held.test", "reason": "twice"})
        assert status == 200 and (first["already"], again["already"]) == (False, True)
        assert again["rule"]["id"] == first["rule"]["id"]
        status, listed = _api(pigeon, "GET", "/api/v1/admin/suspend")
        assert [r["id"] for r in listed["rules"]] == [first["rule"]["id"]]
        _send(pigeon, ["ok@held.test"])
        time.sleep(0.5)
        assert not sink.received
        status, answer = _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{first['rule']['id']}")
        assert answer["cancelled"]
        sink.wait_for(1)  # one resume was enough
        status, other = _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "held.test", "duration": "1h"})
        assert other["already"] is False  # a suspension for a while is another request


@pytest.mark.parametrize("workers", [1, 2])
def test_identical_suspensions_asked_at_once_are_one_rule_that_one_resume_ends(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    with _node(tmp_path / "node", sink, workers=workers) as pigeon:
        asked = 8
        start = threading.Barrier(asked)
        answers: list[tuple[int, Any]] = []

        def suspend() -> None:
            start.wait()
            answers.append(_api(pigeon, "POST", "/api/v1/admin/suspend", {"tenant": "conc1"}))

        threads = [threading.Thread(target=suspend) for _ in range(asked)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [status for status, _ in answers] == [200] * asked, answers
        # Before: each client got a rule of its own, and two workers kept different sets of them.
        (rule_id,) = {answer["rule"]["id"] for _, answer in answers}
        assert sorted(answer["already"] for _, answer in answers) == [False] + [True] * (asked - 1)
        config = ["-c", str(pigeon.config_path)]
        listed = _cli("suspend", *config, "--list").stdout.splitlines()
        assert len(listed) == 1 and listed[0].startswith(rule_id), listed
        ids: list[str] = []
        while len(ids) < 3 or (len(ids) < 40 and {int(i, 16) & 63 for i in ids} != set(range(workers))):
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:  # a connection each: both workers get some
                client.ehlo("client.test")
                client.mail("a@example.org")
                client.rcpt("ok@example.net")
                code, text = client.data(b"X-Tenant: conc1\r\nSubject: held\r\n\r\nhi\r\n")
                assert code == 250
                ids += text.decode().split("queued as ")[1].split()
        assert {int(i, 16) & 63 for i in ids} == set(range(workers))  # the shard bits: every worker holds some
        wait_until(lambda: all(_api(pigeon, "GET", f"/api/v1/messages/{i}")[1]["suspended_by"] == rule_id for i in ids))
        assert not sink.received
        resumed = _cli("resume", *config, rule_id)
        assert resumed.stdout.strip() == f"resumed: {len(ids)} messages due now", resumed
        sink.wait_for(len(ids))  # one resume released every worker's share
        assert _cli("suspend", *config, "--list").stdout.strip() == "none"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run([*args], text=True, timeout=60)


def test_a_bounce_tells_apart_the_mail_being_sent_which_it_bounces_only_if_that_attempt_fails(
    tmp_path: Path,
) -> None:
    # slow@ answers RCPT 2 s late: the five messages are all being sent when the bounce comes.
    with ScriptedSink(slow=2.0) as sink, _node(tmp_path / "node", sink) as pigeon:
        ids = _send(pigeon, ["slow@example.net"], count=5)
        wait_until(lambda: len(sink.rcpt_log) >= 1)
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"domain": "example.net", "reason": "stop"})
        assert status == 200, answer
        assert answer["bounced"] == 5 and 1 <= answer["after_attempt"] <= 5, answer
        ended = wait_until(
            lambda: (
                (len(pigeon.records("Delivery")) + len(pigeon.records("AdminBounce")) == 5)
                and (pigeon.records("Delivery"), pigeon.records("AdminBounce"))
            ),
            timeout=30,
        )
        delivered, bounced = ended
        assert sorted(r["id"] for r in delivered + bounced) == sorted(ids)
        # Only what was being sent can have gone out; the rest was bounced at once.
        assert len(delivered) <= answer["after_attempt"]
        status, progress = _api(pigeon, "GET", "/api/v1/admin/operations")
        (row,) = [r for r in progress["operations"] if r["kind"] == "bounce"]
        assert (row["acted_on"], row["after_attempt"]) == (5, answer["after_attempt"])


def test_retry_now_makes_deferred_mail_due(tmp_path: Path) -> None:
    # flaky@ refuses the first try; the next one would be an hour away.
    with (
        ScriptedSink(flaky=1) as sink,
        _node(tmp_path / "node", sink, retry_interval="1h", max_retry_interval="2h") as pigeon,
    ):
        (spool_id,) = _send(pigeon, ["flaky@example.net"])
        wait_until(lambda: pigeon.records("TransientFailure"))
        status, seen = _api(pigeon, "GET", f"/api/v1/messages/{spool_id}")
        assert seen["attempts"] == 1 and seen["next_due"] > time.time() + 3000
        assert seen["last_response"].startswith("451 4.3.0")
        status, answer = _api(pigeon, "POST", "/api/v1/admin/retry", {"domain": "*.net"})
        assert status == 200 and answer["made_due"] == 1 and answer["operation"]
        wait_until(lambda: pigeon.records("Delivery"))


def test_inspect_answers_404_for_an_unknown_id_and_400_for_a_malformed_one(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        assert _api(pigeon, "GET", "/api/v1/messages/00000000000000ff")[0] == 404
        status, answer = _api(pigeon, "GET", "/api/v1/messages/xyz")
        assert status == 400 and "16 hex digits" in answer["error"]


def test_admin_operations_need_an_admin_token_and_a_selector(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        deferred = _send(pigeon, ["tempfail@example.net"])
        body = {"domain": "example.net"}
        assert _api(pigeon, "POST", "/api/v1/admin/bounce", body, token="no-such-token-0123456")[0] == 401
        assert _api(pigeon, "POST", "/api/v1/admin/bounce", body, token=READER)[0] == 403
        assert _api(pigeon, "POST", "/api/v1/admin/bounce", body, token=INJECT)[0] == 403
        assert _api(pigeon, "GET", "/api/v1/admin/bounce", token=INJECT)[0] == 403
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"reason": "everything?"})
        assert status == 400 and "at least one of" in answer["error"]
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"domain": "x", "duration": "soon"})
        assert status == 400 and answer["field"] == "$.duration"
        assert [m["id"] for m in pigeon.spool_messages()] == deferred  # nothing changed
        assert not pigeon.records("AdminBounce")


def test_with_two_workers_admin_operations_reach_every_shard(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink, workers=2) as pigeon:
        ids: list[str] = []
        while len(ids) < 40 and {int(i, 16) & 63 for i in ids} != {0, 1}:
            ids += _send(pigeon, ["tempfail@example.net"])  # a connection each: the kernel spreads them
        assert {int(i, 16) & 63 for i in ids} == {0, 1}  # the shard bits: both workers hold some
        wait_until(lambda: len({r["id"] for r in pigeon.records("TransientFailure")}) == len(ids))
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"domain": "example.net", "duration": 600})
        assert (status, answer["bounced"]) == (200, len(ids))
        rules = _api(pigeon, "GET", "/api/v1/admin/bounce")[1]["rules"]
        assert [r["id"] for r in rules] == [answer["rule"]["id"]]  # one rule, the same id on both workers
        (operation,) = _api(pigeon, "GET", "/api/v1/admin/operations", token=READER)[1]["operations"]
        assert operation["operation"] == answer["rule"]["id"] and operation["kind"] == "bounce"
        assert (operation["acted_on"], operation["running"]) == (len(ids), 0)  # both workers, both done
        wait_until(lambda: pigeon.spool_messages() == [])
        assert _api(pigeon, "DELETE", f"/api/v1/admin/bounce/{rules[0]['id']}")[1]["cancelled"] is True


def test_queue_summary_counts_each_scheduled_queue_across_workers(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink, workers=2, retry_interval="1h") as pigeon:
        ids: list[str] = []
        while len(ids) < 40 and {int(i, 16) & 63 for i in ids} != {0, 1}:
            ids += _send(pigeon, ["tempfail@example.net"])
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["tempfail@other.test"], b"X-Tenant: acme\r\nSubject: x\r\n\r\nhi\r\n")
        wait_until(lambda: len({r["id"] for r in pigeon.records("TransientFailure")}) == len(ids) + 1)
        status, summary = _api(pigeon, "GET", "/api/v1/queues", token=READER)
        assert status == 200
        rows = {row["queue"]: row for row in summary["scheduled"]}
        assert set(rows) == {"example.net", "acme@other.test"}  # one row per queue, both workers added up
        assert rows["example.net"]["messages"] == len(ids)
        assert rows["example.net"]["due"] == 0  # all deferred for an hour
        # every count is there, zero or not: a client needs no defaults
        assert {k: rows["example.net"][k] for k in ("held", "ready", "in_flight", "settling")} == dict.fromkeys(
            ("held", "ready", "in_flight", "settling"), 0
        )
        assert rows["acme@other.test"]["messages"] == 1
        assert rows["example.net"]["oldest"] <= time.time()
        assert _api(pigeon, "GET", "/api/v1/queues", token=INJECT)[0] == 403


def test_suspending_a_site_stops_its_deliveries_until_resumed_or_expired(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"site": sink.endpoint})
        assert status == 200, answer
        _send(pigeon, ["ok@example.net"])
        time.sleep(1.0)
        assert sink.received == []
        ready = _api(pigeon, "GET", "/api/v1/queues", token=READER)[1]["ready"]
        assert [(r["site"], r["queued"], r["connections"]) for r in ready] == [(sink.endpoint, 1, 0)]
        assert _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{answer['rule']['id']}")[0] == 200
        sink.wait_for(1)
        # With a duration it lifts by itself.
        assert _api(pigeon, "POST", "/api/v1/admin/suspend", {"site": "127.0.0.1:*", "duration": "1s"})[0] == 200
        _send(pigeon, ["ok@example.net"])
        assert len(sink.wait_for(2, timeout=10)) == 2
        assert not pigeon.records("TransientFailure")  # held back, never tried and failed
        status, answer = _api(pigeon, "POST", "/api/v1/admin/bounce", {"site": sink.endpoint})
        assert status == 400 and answer["field"] == "$.site"


def test_a_site_named_without_its_port_is_suspended_on_whatever_port_it_is_reached(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    with _node(tmp_path / "node", sink) as pigeon:
        # The sink's site is "127.0.0.1:<port>" (delivery on a port other than 25).
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"site": "127.0.0.1"})
        assert status == 200, answer
        _send(pigeon, ["ok@example.net"])
        time.sleep(1.0)
        assert sink.received == [], "a site suspension without a port did not hold the site on its port"
        ready = _api(pigeon, "GET", "/api/v1/queues", token=READER)[1]["ready"]
        assert [(r["site"], [s["id"] for s in r["suspended_by"]]) for r in ready] == [
            (sink.endpoint, [answer["rule"]["id"]])
        ]
        status, resumed = _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{answer['rule']['id']}")
        assert (status, resumed["made_due"]) == (200, 1), resumed
        sink.wait_for(1)
        # With a port, that port only: port 25 is not the sink's.
        assert _api(pigeon, "POST", "/api/v1/admin/suspend", {"site": "127.0.0.1:25"})[0] == 200
        _send(pigeon, ["ok@example.net"])
        sink.wait_for(2)


def test_rebind_moves_deferred_mail_to_another_queue_and_route(tmp_path: Path) -> None:
    with ScriptedSink(flaky=5) as first, ScriptedSink(flaky=0) as second:
        config = delivery_config(first.endpoint, retry_interval="1h", max_retry_interval="2h")
        config["route"].insert(0, {"domain": "detour.test", "next_hop": second.endpoint, "tls": "disabled"})
        config["queue"] = [{"name": "parked", "dsn": False}]
        with PigeonProcess(tmp_path / "node", http={"token": TOKENS}, **config) as pigeon:
            ids = _send(pigeon, ["flaky@example.net"], count=3)
            wait_until(lambda: len(pigeon.records("TransientFailure")) == 3)
            body = {"domain": "example.net", "to_queue": "parked", "routing_domain": "detour.test"}
            status, answer = _api(pigeon, "POST", "/api/v1/admin/rebind", body)
            assert status == 200 and (answer["rebound"], answer["after_attempt"]) == (3, 0), answer
            received = second.wait_for(3)
            assert sorted(m.recipients[0] for m in received) == ["flaky@example.net"] * 3
            deliveries = wait_until(lambda: len(pigeon.records("Delivery")) == 3 and pigeon.records("Delivery"))
            assert {r["id"] for r in deliveries} == set(ids)
            assert {r["queue"] for r in deliveries} == {"parked"}
            assert {r["site"] for r in deliveries} == {second.endpoint}
            status, answer = _api(pigeon, "POST", "/api/v1/admin/rebind", {"domain": "example.net"})
            assert status == 400 and "to_queue" in answer["error"]


def test_mail_in_a_suspended_queue_still_expires_at_its_max_age_with_a_dsn(tmp_path: Path, sink: ScriptedSink) -> None:
    # A suspension until resumed used to look at held mail again only every 60 s, and never
    # ended it: mail a forgotten suspension held outlived its max_age by as long as it stood.
    with _node(tmp_path / "node", sink, max_age="3s") as pigeon:
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "held.test", "reason": "check"})
        assert status == 200, answer
        (spool_id,) = _send(pigeon, ["ann@held.test"])
        (expired,) = pigeon.wait_records("Expiration", timeout=10)
        assert (expired["id"], expired["recipient"]) == (spool_id, "ann@held.test")
        assert expired["response"]["code"] == 554
        assert "not delivered within 3 seconds" in expired["response"]["text"]  # (max_age, in words)
        (dsn,) = sink.wait_for(1)  # the usual expiry DSN, to the sender; the recipient's mail never left
        assert dsn.recipients == ["sender@example.org"] and "ann@held.test" in dsn.data.decode()
        assert not pigeon.records("TransientFailure")
        # The DSN leaves the spool once its delivery is settled, just after the sink took it.
        wait_until(lambda: pigeon.spool_messages() == [])
        # Still suspended: the rule is there until resumed.
        assert [r["id"] for r in _api(pigeon, "GET", "/api/v1/admin/suspend")[1]["rules"]] == [answer["rule"]["id"]]


def test_queue_rows_say_which_suspension_holds_them_who_asked_and_why(tmp_path: Path, sink: ScriptedSink) -> None:
    with _node(tmp_path / "node", sink, workers=2, retry_interval="1h") as pigeon:
        body = {"tenant": "acme", "reason": "complaints spike"}
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", body)
        assert status == 200, answer
        rule = answer["rule"]
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            for _ in range(3):
                client.sendmail("a@example.org", ["ok@example.net"], b"X-Tenant: acme\r\nSubject: x\r\n\r\nhi\r\n")
            client.sendmail("a@example.org", ["tempfail@example.net"], b"Subject: other\r\n\r\nhi\r\n")
        wait_until(lambda: pigeon.records("TransientFailure"))
        status, summary = _api(pigeon, "GET", "/api/v1/queues", token=READER)
        rows = {row["queue"]: row for row in summary["scheduled"]}
        # Both workers' rows added up, the suspension listed once: its id, the token that asked, the reason.
        assert rows["acme@example.net"]["messages"] == 3
        (held_by,) = rows["acme@example.net"]["suspended_by"]
        assert (held_by["id"], held_by["operator"], held_by["reason"]) == (rule["id"], "ops", "complaints spike")
        assert held_by["selector"] == {"tenant": "acme"} and "expires" not in held_by  # until resumed
        assert held_by["via"] == "api"  # not the pigeon command
        assert rows["example.net"]["suspended_by"] == []  # every row has it, empty when nothing holds it
        assert _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{rule['id']}")[0] == 200
        rows = {row["queue"]: row for row in _api(pigeon, "GET", "/api/v1/queues")[1]["scheduled"]}
        assert rows.get("acme@example.net", {"suspended_by": []})["suspended_by"] == []
        # A site's suspension shows on its ready queue's row.
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"site": sink.endpoint, "reason": "maintenance"})
        _send(pigeon, ["ok@example.net"])
        wait_until(lambda: _api(pigeon, "GET", "/api/v1/queues")[1]["ready"])
        (ready,) = _api(pigeon, "GET", "/api/v1/queues")[1]["ready"]
        assert [(r["id"], r["operator"], r["reason"]) for r in ready["suspended_by"]] == [
            (answer["rule"]["id"], "ops", "maintenance")
        ]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_scheduled_queue_held_by_a_site_suspension_names_it_in_suspended_by(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    # The row counted the mail ("suspended 2") but said no one held it ("suspended_by []", "-").
    with _node(tmp_path / "node", sink, workers=workers) as pigeon:
        body = {"site": sink.endpoint, "reason": "maintenance"}
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", body)
        assert status == 200, answer
        _send(pigeon, ["ok@example.net"], count=2)

        def row() -> Any:
            rows = {r["queue"]: r for r in _api(pigeon, "GET", "/api/v1/queues", token=READER)[1]["scheduled"]}
            found = rows.get("example.net")
            return found if found is not None and found["suspended"] == 2 else None

        held = wait_until(row)
        assert [(r["id"], r["operator"], r["reason"]) for r in held["suspended_by"]] == [
            (answer["rule"]["id"], "ops", "maintenance")
        ]
        assert sink.received == []


@pytest.mark.parametrize("workers", [1, 2])
def test_inspect_of_a_message_held_by_a_site_suspension_names_that_suspension(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    # `queue summary` named the site's rule; `inspect` of the message it holds said "suspended_by: null".
    with _node(tmp_path / "node", sink, workers=workers) as pigeon:
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"site": sink.endpoint})
        assert status == 200, answer
        rule_id = answer["rule"]["id"]
        (spool_id,) = _send(pigeon, ["ok@example.net"])
        # In the site's ready queue, held there: "suspended", as `pigeon queue list` says it.
        ready = {"state": "suspended", "in_memory": True}
        path = f"/api/v1/messages/{spool_id}"
        wait_until(lambda: _api(pigeon, "GET", path, token=READER)[1].items() >= ready.items())
        config = ("-c", str(pigeon.config_path), "--token", READER)
        shown = _cli("inspect", *config, spool_id)
        assert shown.returncode == 0, shown.stderr
        assert f"suspended_by   {rule_id}" in shown.stdout.splitlines(), shown.stdout
        as_json = _cli("inspect", *config, spool_id, "--json")
        assert json.loads(as_json.stdout)["suspended_by"] == rule_id
        assert sink.received == []
        # Resumed, it goes, and nothing holds it any more.
        assert _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{rule_id}")[0] == 200
        sink.wait_for(1)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_suspension_or_standing_bounce_that_runs_out_is_logged_once_for_the_node(
    tmp_path: Path, sink: ScriptedSink, workers: int
) -> None:
    # Their making and their end by resume or cancel were logged; their end by itself was not.
    with _node(tmp_path / "node", sink, workers=workers) as pigeon:
        ids = []
        for kind, selector in (("suspend", {"domain": "x.test"}), ("bounce", {"tenant": "acme"})):
            status, answer = _api(pigeon, "POST", f"/api/v1/admin/{kind}", {**selector, "duration": "1s"})
            assert status == 200, answer
            ids.append(answer["rule"]["id"])
        suspension, bounce = ids
        said = pigeon.wait_stderr(" ran out at ", count=2)
        assert f"admin rules: suspension {suspension} of domain=x.test (for 1s) by ops ran out at " in said
        assert f"admin rules: standing bounce {bounce} of tenant=acme (for 1s) by ops ran out at " in said
        time.sleep(2)  # each worker held both: said once all the same
        assert pigeon.stderr().count(" ran out at ") == 2
        pigeon.stop()
        pigeon.start()  # (and not again by the next run of the node)
        time.sleep(1.5)
        assert " ran out at " not in pigeon.stderr()


def test_a_rebind_names_its_queue_as_messages_carry_it_domain_in_lower_case(tmp_path: Path) -> None:
    # `[[queue]] name` globs are read with their domain part in lower case (as scheduled_queue
    # writes it): a rebind to "slow@Example.NET." must land where that policy finds it.
    with ScriptedSink(flaky=5) as sink:
        config = delivery_config(sink.endpoint, retry_interval="1h", max_retry_interval="2h")
        with PigeonProcess(tmp_path / "node", http={"token": TOKENS}, **config) as pigeon:
            ids = _send(pigeon, ["flaky@example.net"], count=2)
            wait_until(lambda: len(pigeon.records("TransientFailure")) == 2)
            body = {"domain": "example.net", "to_queue": "slow@Example.NET."}
            status, answer = _api(pigeon, "POST", "/api/v1/admin/rebind", body)
            assert status == 200 and answer["rebound"] == 2, answer
            for spool_id in ids:
                status, found = _api(pigeon, "GET", f"/api/v1/messages/{spool_id}", token=READER)
                assert status == 200 and found["queue"] == "slow@example.net", found


def test_a_selector_is_read_as_the_config_reads_its_globs_lower_case_without_final_dot(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    # Sites and domains are matched as written in the queues: in lower case, no final dot.
    with _node(tmp_path / "node", sink) as pigeon:
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"site": "MX.Example.NET."})
        assert status == 200 and answer["rule"]["selector"] == {"site": "mx.example.net"}, answer
        status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "Held.TEST."})
        assert status == 200 and answer["rule"]["selector"] == {"domain": "held.test"}, answer
        (spool_id,) = _send(pigeon, ["ann@held.test"])
        _send(pigeon, ["ok@example.net"])
        sink.wait_for(1)
        status, found = _api(pigeon, "GET", f"/api/v1/messages/{spool_id}", token=READER)
        assert status == 200 and found["suspended_by"], found  # the suspension holds it
