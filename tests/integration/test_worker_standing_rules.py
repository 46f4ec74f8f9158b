"""Within a node of several workers every worker holds the node's standing rules: one that
missed a suspension or a resume (stopped, killed by the watchdog, started again) takes the
rules in force and drops those ended when it is back, before it delivers; and until a worker
holds a rule, the listings say so (`[not held on worker 0]`), and suspending again says where
it was added rather than "nothing added"."""

from __future__ import annotations

import json
import os
import signal
import smtplib
import socket
import threading
import time
from pathlib import Path
from typing import Any

from pigeon.message import parse_id, shard_of
from pigeon.node.standing import Standing
from pigeon.node.standing import encode as encode_standing
from pigeon.queue.rules import Rule, Selector, standing_rule_id
from tests.integration.test_worker_timeout import _fill
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

MESSAGE = b"Subject: hi\r\n\r\nhello\r\n"
DOMAIN = "dst.test"


def _worker_pid(pigeon: PigeonProcess, index: int) -> int:
    return pigeon.shard_owner(index)


def _send_to_every_shard(pigeon: PigeonProcess, sink: ScriptedSink, at_least: int = 2) -> int:
    """Mail for DOMAIN, sent until each worker's shard holds `at_least` of it (the workers share
    one listening socket: which takes a connection is the kernel's choice, and one worker may
    win every time; after 10 tries the other is stopped for a moment, SIGSTOP, so the one
    whose shard lacks mail takes the connection). How many were sent."""
    sent = 0
    while True:
        shards = [shard_of(parse_id(row["id"])) for row in pigeon.spool_messages()]
        if all(shards.count(shard) >= at_least for shard in (0, 1)):
            return sent
        assert not sink.received, f"{len(sink.received)} of {sent} delivered; held in shards {shards}"
        assert sent < 80, f"shards of the mail sent: {shards}"
        full = 1 if shards.count(0) < at_least else 0
        paused = _worker_pid(pigeon, full) if sent >= 10 else None
        if paused is not None:
            os.kill(paused, signal.SIGSTOP)
        try:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                assert client.sendmail("a@src.test", [f"b@{DOMAIN}"], MESSAGE) == {}
        finally:
            if paused is not None:
                os.kill(paused, signal.SIGCONT)
        sent += 1


def _restarted(pigeon: PigeonProcess, index: int, restarts: int) -> None:
    def ok() -> bool:
        status, body = pigeon.http_get("/healthz")
        worker = json.loads(body)["workers"][index]
        return status == 200 and worker["restarts"] == restarts and worker["status"] == "ok"

    wait_until(ok, 30, 0.2)


def _missed_while_stopped(pigeon: PigeonProcess, method: str, path: str, body: object = None) -> None:
    """`method path` issued while worker 0 is stopped: the watchdog kills it, and only worker 1 applies it."""
    os.kill(_worker_pid(pigeon, 0), signal.SIGSTOP)
    status, answer = pigeon.http_call(method, path, body, token=pigeon.local_token)
    assert status == 503 and answer["answered"] == [1], answer


def _node(tmp_path: Path, sink: ScriptedSink) -> PigeonProcess:
    return PigeonProcess(
        tmp_path / "node", node={"workers": 2, "worker_timeout": "2s"}, **delivery_config(sink.endpoint)
    )


def test_a_worker_that_missed_a_suspension_holds_it_once_started_again(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink) as pigeon:
        _missed_while_stopped(pigeon, "POST", "/api/v1/admin/suspend", {"domain": DOMAIN, "reason": "outage"})
        _restarted(pigeon, 0, 1)
        sent = _send_to_every_shard(pigeon, sink)
        assert sink.after(3) == []  # neither worker delivers any of it, worker 0's shard's included
        assert len(pigeon.spool_messages()) == sent
        status, listed = pigeon.http_call("GET", "/api/v1/admin/suspend", token=pigeon.local_token)
        assert status == 200 and [rule["selector"] for rule in listed["rules"]] == [{"domain": DOMAIN}], listed
        assert "not_held" not in listed  # held on both workers: nothing to mark
        shown = pigeon.cli("suspend", "--list")
        assert DOMAIN in shown and "not held" not in shown, shown
        status, summary = pigeon.http_call("GET", "/api/v1/queues", token=pigeon.local_token)
        [row] = summary["scheduled"]
        assert row["suspended"] == sent, row
        again = pigeon.cli("suspend", "--domain", DOMAIN)
        assert again.startswith("already suspended until resumed by rule") and "nothing added" in again, again
        rule_id = listed["rules"][0]["id"]
        pigeon.cli("resume", rule_id)
        assert len(sink.wait_for(sent, timeout=30)) == sent


def test_a_worker_that_missed_a_suspension_holds_it_after_the_whole_node_is_killed_and_started_again(
    tmp_path: Path,
) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink) as pigeon:
        _missed_while_stopped(pigeon, "POST", "/api/v1/admin/suspend", {"domain": DOMAIN})
        pigeon.kill()  # the supervisor too (kill -9), before it starts worker 0 again (1 s later)
        pigeon.start()
        sent = _send_to_every_shard(pigeon, sink)
        assert sink.after(3) == []
        status, listed = pigeon.http_call("GET", "/api/v1/admin/suspend", token=pigeon.local_token)
        assert status == 200 and len(listed["rules"]) == 1 and "not_held" not in listed, listed
        pigeon.cli("resume", listed["rules"][0]["id"])
        assert len(sink.wait_for(sent, timeout=30)) == sent


def test_a_worker_that_could_not_be_asked_takes_a_suspension_as_soon_as_it_answers_again(tmp_path: Path) -> None:
    with (
        ScriptedSink() as sink,
        PigeonProcess(
            tmp_path / "node", node={"workers": 2, "worker_timeout": "20s"}, **delivery_config(sink.endpoint)
        ) as pigeon,
    ):
        control = pigeon.spool_path / "run" / "worker-0.sock"
        away = control.with_name("away.sock")
        control.rename(away)  # worker 0 runs on, but cannot be asked: not stopped, not restarted
        try:
            status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", {"domain": DOMAIN}, pigeon.local_token)
        finally:
            away.rename(control)
        assert status == 503 and answer["answered"] == [1], answer

        def listed_on_both() -> dict[str, Any] | None:
            status, listed = pigeon.http_call("GET", "/api/v1/admin/suspend", token=pigeon.local_token)
            assert status == 200 and len(listed["rules"]) == 1, listed
            return None if "not_held" in listed else listed  # marked until worker 0 holds it: a second or so

        try:
            listed = wait_until(listed_on_both, 10, 0.1)
        except AssertionError:
            raise AssertionError(pigeon.http_call("GET", "/api/v1/admin/suspend", token=pigeon.local_token)) from None
        sent = _send_to_every_shard(pigeon, sink)
        assert sink.after(3) == []
        status, body = pigeon.http_get("/healthz")
        assert json.loads(body)["workers"][0]["restarts"] == 0
        pigeon.cli("resume", listed["rules"][0]["id"])
        assert len(sink.wait_for(sent, timeout=30)) == sent


def test_a_worker_that_missed_a_standing_bounce_bounces_the_mail_a_suspension_holds_once_started_again(
    tmp_path: Path,
) -> None:
    # Both workers hold mail a suspension keeps in their shards; a standing bounce of it reaches
    # worker 1 alone (worker 0 is stopped: the watchdog kills it), and worker 0 is handed it as it
    # starts again. Its held mail is bounced then, as worker 1's was by the bounce itself: before,
    # it met the bounce only when the suspension's hold ended (`HOLD`, a minute after it came).
    with ScriptedSink() as sink, _node(tmp_path, sink) as pigeon:
        status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", {"domain": DOMAIN}, pigeon.local_token)
        assert status == 200, answer
        sent = _send_to_every_shard(pigeon, sink)
        ids = sorted(row["id"] for row in pigeon.spool_messages())
        assert len(ids) == sent
        asked = time.monotonic()
        bounce = {"domain": DOMAIN, "duration": "1h", "reason": "list gone"}
        _missed_while_stopped(pigeon, "POST", "/api/v1/admin/bounce", bounce)
        _restarted(pigeon, 0, 1)

        def ended() -> list[dict[str, Any]] | None:
            ends = [r for r in pigeon.records() if r["type"] in ("Delivery", "Bounce", "Expiration", "AdminBounce")]
            return ends if len(ends) >= sent else None

        ends = wait_until(ended, 30, 0.1)
        assert time.monotonic() - asked < 20, "bounced when the hold ended, not when the bounce was taken"
        # One terminal record each, an operator's bounce, with its reason; nothing delivered.
        assert sorted(r["id"] for r in ends) == ids
        assert {(r["type"], r["recipient"], r["reason"]) for r in ends} == {("AdminBounce", f"b@{DOMAIN}", "list gone")}
        assert pigeon.spool_messages() == []
        assert sink.after(1) == []
        assert "admin rules: standing bounce" in pigeon.stderr()


def test_a_worker_that_missed_a_resume_releases_its_mail_once_started_again(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink) as pigeon:
        status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", {"domain": DOMAIN}, pigeon.local_token)
        assert status == 200, answer
        sent = _send_to_every_shard(pigeon, sink)
        assert sink.after(2) == []
        _missed_while_stopped(pigeon, "DELETE", f"/api/v1/admin/suspend/{answer['rule']['id']}")
        _restarted(pigeon, 0, 1)
        # Worker 0's shard's mail too, within a suspension's hold (60 s) had it held on.
        assert len(sink.wait_for(sent, timeout=30)) == sent
        assert pigeon.cli("suspend", "--list").strip() == "none"


def _on_worker_1_only(pigeon: PigeonProcess) -> str:
    """A suspension of DOMAIN that worker 1 holds and worker 0 lacks, the node's rules knowing
    nothing of it (as a node before this was fixed could leave it): handed to worker 1 alone."""
    selector = Selector(domain=DOMAIN)
    rule_id = standing_rule_id("suspend", selector)
    rule = Rule(rule_id, "suspend", selector, time.time(), operator="local", via="cli")
    handed = encode_standing(Standing(in_force={rule_id: rule}))
    status, taken = pigeon.worker_call(1, "POST", "/internal/rules", handed)
    assert status == 200 and taken == {"added": 1, "ended": 0}, taken
    return rule_id


def test_a_rule_a_worker_lacks_is_marked_in_the_listing_and_suspending_again_adds_it_there(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink) as pigeon:
        rule_id = _on_worker_1_only(pigeon)
        status, listed = pigeon.http_call("GET", "/api/v1/admin/suspend", token=pigeon.local_token)
        assert status == 200 and listed["not_held"] == {rule_id: [0]}, listed
        [line] = pigeon.cli("suspend", "--list").splitlines()
        assert line.startswith(rule_id) and line.endswith("[not held on worker 0]"), line
        again = pigeon.cli("suspend", "--domain", DOMAIN)
        assert f"(rule {rule_id}) on worker(s) 0, which lacked it (the others held it already)" in again, again
        assert "nothing added" not in again
        [line] = pigeon.cli("suspend", "--list").splitlines()
        assert line.startswith(rule_id) and "not held" not in line, line
        sent = _send_to_every_shard(pigeon, sink, at_least=1)
        assert sink.after(2) == []
        pigeon.cli("resume", rule_id)
        assert len(sink.wait_for(sent, timeout=30)) == sent


def test_a_hand_over_that_an_end_of_the_rule_overtook_does_not_bounce_again(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink) as pigeon:
        status, answer = pigeon.http_call(
            "POST", "/api/v1/admin/bounce", {"domain": DOMAIN, "duration": "1h", "reason": "gone"}, pigeon.local_token
        )
        assert status == 200, answer
        bounce = answer["rule"]["id"]
        # What a hand-over to worker 0 carries if the supervisor takes it now (its rules file) ...
        snapshot = (pigeon.spool_path / "admin-rules.json").read_bytes()
        assert bounce.encode() in snapshot
        # ... and the operator ends the bounce: the end reaches worker 0 first, on its own connection.
        status, answer = pigeon.http_call("DELETE", f"/api/v1/admin/bounce/{bounce}", token=pigeon.local_token)
        assert status == 200 and answer["cancelled"], answer
        status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", {"domain": DOMAIN}, pigeon.local_token)
        assert status == 200, answer
        sent = _send_to_every_shard(pigeon, sink, at_least=1)
        # The hand-over arrives last. Before, worker 0 took the bounce again and bounced its mail.
        status, taken = pigeon.worker_call(0, "POST", "/internal/rules", snapshot)
        assert status == 200 and taken == {"added": 0, "ended": 0}, taken
        status, listed = pigeon.http_call("GET", "/api/v1/admin/bounce", token=pigeon.local_token)
        assert status == 200 and listed["rules"] == [], listed
        pigeon.cli("resume", answer["rule"]["id"])
        wait_until(lambda: len([m for m in sink.received if m.recipients == [f"b@{DOMAIN}"]]) == sent, 30)
        assert not [m for m in sink.received if m.recipients != [f"b@{DOMAIN}"]]  # no bounce report either


def test_the_queue_summary_marks_a_suspension_a_worker_lacks(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink) as pigeon:
        rule_id = _on_worker_1_only(pigeon)

        def held_on_worker_1() -> bool:  # worker 0's share goes out: it lacks the suspension
            if not any(shard_of(parse_id(row["id"])) == 1 for row in pigeon.spool_messages()):
                with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                    client.sendmail("a@src.test", [f"b@{DOMAIN}"], MESSAGE)
                return False
            return True

        wait_until(held_on_worker_1, 30, 0)
        status, summary = pigeon.http_call("GET", "/api/v1/queues", token=pigeon.local_token)
        [row] = [row for row in summary["scheduled"] if row["suspended_by"]]
        assert [rule["id"] for rule in row["suspended_by"]] == [rule_id], row
        assert status == 200 and summary["not_held"] == {rule_id: [0]}, summary
        assert "suspensions_held" not in summary
        [line] = [line for line in pigeon.cli("queue", "summary").splitlines() if f"(rule {rule_id})" in line]
        assert line.endswith(f"(rule {rule_id}) [not held on worker 0]"), line
        pigeon.cli("suspend", "--domain", DOMAIN)  # added on worker 0: marked no more
        status, summary = pigeon.http_call("GET", "/api/v1/queues", token=pigeon.local_token)
        assert status == 200 and "not_held" not in summary, summary
        assert "not held" not in pigeon.cli("queue", "summary")


def test_a_hand_over_that_a_suspension_made_again_overtook_does_not_resume_it(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink) as pigeon:
        status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", {"domain": DOMAIN}, pigeon.local_token)
        assert status == 200, answer
        rule_id = answer["rule"]["id"]
        pigeon.cli("resume", rule_id)
        snapshot = (pigeon.spool_path / "admin-rules.json").read_bytes()  # the resume's tombstone
        # Suspended again (the same rule id: named by what it holds), then the stale hand-over.
        status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", {"domain": DOMAIN}, pigeon.local_token)
        assert status == 200 and answer["rule"]["id"] == rule_id, answer
        status, taken = pigeon.worker_call(0, "POST", "/internal/rules", snapshot)
        assert status == 200 and taken == {"added": 0, "ended": 0}, taken  # before: ended 1
        sent = _send_to_every_shard(pigeon, sink)
        assert sink.after(2) == []
        status, listed = pigeon.http_call("GET", "/api/v1/admin/suspend", token=pigeon.local_token)
        assert status == 200 and [r["id"] for r in listed["rules"]] == [rule_id] and "not_held" not in listed, listed
        pigeon.cli("resume", rule_id)
        assert len(sink.wait_for(sent, timeout=30)) == sent


def test_a_suspension_refused_by_every_worker_that_answered_is_not_taken_by_one_starting(tmp_path: Path) -> None:
    token = "ops-token-0123456789"
    with (
        ScriptedSink() as sink,
        PigeonProcess(
            tmp_path / "node",
            node={"workers": 2, "worker_timeout": "2s"},
            http={"token": [{"name": "ops", "token": token, "scopes": ["admin", "read"]}]},
            **delivery_config(sink.endpoint),
        ) as pigeon,
    ):
        # The local token is made again while the node runs; worker 1, started again, reads the
        # new one (the supervisor does not: it knows the old one). A config file edited instead
        # would not do: a worker started again runs the node's configuration, tokens and all.
        local = pigeon.spool_path / "api-token"
        old = pigeon.local_token
        local.write_text("a-new-local-token-0123456789\n")
        os.kill(_worker_pid(pigeon, 1), signal.SIGKILL)
        _restarted(pigeon, 1, 1)
        local.write_text(old + "\n")  # (worker 0 starts again on it: only worker 1 refuses)
        # Worker 0 is starting again (a second from now) when the suspension comes.
        os.kill(_worker_pid(pigeon, 0), signal.SIGKILL)
        control = pigeon.spool_path / "run" / "worker-0.sock"

        def gone() -> bool:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(str(control))
                except OSError:
                    return True
            return False

        wait_until(gone, 10, 0.01)
        status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", {"domain": DOMAIN}, old)
        assert status == 503 and answer["answered"] == [1], answer
        assert "token" in answer["answers"]["error"], answer  # worker 1 refused it: 401
        _restarted(pigeon, 0, 1)
        # The operator was told it failed: no worker holds it (before: worker 0 took it as it started).
        status, listed = pigeon.http_call("GET", "/api/v1/admin/suspend", token=token)
        assert status == 200 and listed["rules"] == [], listed
        kept = pigeon.spool_path / "admin-rules.json"
        assert not kept.exists() or DOMAIN.encode() not in kept.read_bytes()


def test_two_resumes_of_one_suspension_at_once_raise_no_alarm_of_a_missed_change(tmp_path: Path) -> None:
    # Both ends leave the suspension ended whatever order each worker carries them out in. The
    # supervisor warned "written again while this write was on its way", and handed every worker
    # the node's rules ("which missed a change ... holds the node's again"), though none missed one.
    root = tmp_path / "node"
    _fill(root / "spool", shards=2, count=10_000)  # the resume's walk takes a while: the two overlap
    with PigeonProcess(root, node={"workers": 2}, delivery={"enabled": True}) as pigeon:
        token = pigeon.local_token
        status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", {"domain": "big.example"}, token=token)
        assert status == 200 and answer["held"] == 20_000, answer
        rule_id = answer["rule"]["id"]
        start = threading.Barrier(2)
        statuses: list[int] = []

        def resume() -> None:
            start.wait()
            statuses.append(pigeon.http_call("DELETE", f"/api/v1/admin/suspend/{rule_id}", token=token)[0])

        resuming = [threading.Thread(target=resume) for _ in range(2)]
        for thread in resuming:
            thread.start()
        for thread in resuming:
            thread.join(60)
        assert 200 in statuses and set(statuses) <= {200, 404}, statuses
        assert pigeon.http_call("GET", "/api/v1/admin/suspend", token=token) == (200, {"rules": []})
        said = pigeon.stderr()
        assert "written again while this write was on its way" not in said
        assert "missed a change to the standing rules" not in said
