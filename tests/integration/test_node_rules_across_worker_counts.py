"""A node's standing rules are the node's whatever its worker count: a suspension or a standing
bounce made while it ran with one worker holds on every worker once it runs with more, a rule
ended while it ran with one is not brought back by a run with more, and a resume that one worker
missed is not undone when the node goes back to one worker, which adopts that worker's shard."""

from __future__ import annotations

import asyncio
import os
import signal
import smtplib
import time
from pathlib import Path

import msgspec

from pigeon.message import parse_id, shard_of
from pigeon.queue.rules import Rule, Selector, standing_rule_id
from pigeon.spool.shards import shard_directory
from pigeon.spool.sqlite import SqliteSpool
from tests.support.process import PigeonProcess, to_toml
from tests.support.sinks import ScriptedSink, delivery_config

MESSAGE = b"Subject: hi\r\n\r\nhello\r\n"
HELD = "x.test"  # suspended
BOUNCED = "y.test"  # bounced for an hour


def _node(tmp_path: Path, sink: ScriptedSink, workers: int) -> PigeonProcess:
    return PigeonProcess(
        tmp_path / "node", node={"workers": workers, "worker_timeout": "2s"}, **delivery_config(sink.endpoint)
    )


def _restart_with(pigeon: PigeonProcess, workers: int) -> None:
    """SIGTERM, `[node] workers = N`, started again."""
    assert pigeon.stop() == 0
    pigeon.config["node"]["workers"] = workers
    pigeon.config_path.write_text(to_toml(pigeon.config))
    pigeon.start()


def _to(sink: ScriptedSink, domain: str) -> list[object]:
    return [m for m in sink.received if m.recipients == [f"b@{domain}"]]


def _send_to_every_worker(pigeon: PigeonProcess, domain: str, workers: int) -> list[str]:
    """Mail for `domain`, sent until each worker has taken two (the workers share one listening
    socket: which takes a connection is the kernel's choice). Their ids."""
    ids: list[str] = []
    while True:
        shards = [shard_of(parse_id(spool_id)) for spool_id in ids]
        if all(shards.count(shard) >= 2 for shard in range(workers)):
            return ids
        assert len(ids) < 80, f"shards of the mail sent: {shards}"
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
            client.ehlo()
            client.mail("a@src.test")
            client.rcpt(f"b@{domain}")
            code, reply = client.data(MESSAGE)
        assert code == 250, reply
        ids.append(reply.decode().rsplit(" ", 1)[-1])


def _none_delivered_while_suspended(pigeon: PigeonProcess, sink: ScriptedSink, workers: int) -> int:
    sent = _send_to_every_worker(pigeon, HELD, workers)
    time.sleep(3)
    assert not _to(sink, HELD), f"{len(_to(sink, HELD))} of {len(sent)} delivered to a suspended domain"
    return len(sent)


def _every_one_bounced(pigeon: PigeonProcess, sink: ScriptedSink, workers: int) -> None:
    sent = _send_to_every_worker(pigeon, BOUNCED, workers)
    bounced = pigeon.wait_records("AdminBounce", len(sent), timeout=20)
    assert sorted(r["id"] for r in bounced) == sorted(sent)
    assert not _to(sink, BOUNCED) and not pigeon.records("Delivery")


def _listed_and_held_everywhere(pigeon: PigeonProcess, kind: str, domain: str) -> str:
    """The one rule of `kind` listed, for `domain`, held on every worker; its id."""
    [line] = pigeon.cli(kind, "--list").splitlines()
    assert domain in line and "not held" not in line, line
    return line.split()[0]


def test_rules_made_with_one_worker_hold_on_every_worker_once_the_node_has_two(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink, 1) as pigeon:
        pigeon.cli("suspend", "--domain", HELD)
        pigeon.cli("bounce", "--domain", BOUNCED, "--duration", "1h")
        _restart_with(pigeon, 2)
        suspension = _listed_and_held_everywhere(pigeon, "suspend", HELD)
        _listed_and_held_everywhere(pigeon, "bounce", BOUNCED)
        held = _none_delivered_while_suspended(pigeon, sink, 2)
        _every_one_bounced(pigeon, sink, 2)
        pigeon.kill()  # and after a kill -9 of the whole node
        pigeon.start()
        _listed_and_held_everywhere(pigeon, "bounce", BOUNCED)
        pigeon.cli("resume", suspension)
        sink.wait_for(held, timeout=30)


def test_rules_a_one_worker_node_kept_in_its_shard_alone_hold_on_every_worker_once_it_has_two(tmp_path: Path) -> None:
    """As a node of one worker left them before it kept the node's rules: in its shard, no file."""
    root = tmp_path / "node" / "spool"

    async def stored_as_an_older_node_did() -> None:
        spool = SqliteSpool(shard_directory(root, 0), shard=0)
        spool.open(asyncio.get_running_loop())
        try:
            for kind, selector, expires in (
                ("suspend", Selector(domain=HELD), None),
                ("bounce", Selector(domain=BOUNCED), time.time() + 3600),
            ):
                rule_id = standing_rule_id(kind, selector)
                rule = Rule(rule_id, kind, selector, time.time(), expires=expires, operator="local", via="cli")
                await spool.save_rule(rule_id, msgspec.msgpack.encode(rule))
        finally:
            spool.close()

    asyncio.run(stored_as_an_older_node_did())
    with ScriptedSink() as sink, _node(tmp_path, sink, 2) as pigeon:
        _listed_and_held_everywhere(pigeon, "suspend", HELD)
        _listed_and_held_everywhere(pigeon, "bounce", BOUNCED)
        assert "kept by shard 0 only (a Pigeon before this one kept no admin-rules.json)" in pigeon.stderr()
        _none_delivered_while_suspended(pigeon, sink, 2)
        _every_one_bounced(pigeon, sink, 2)


def test_a_rule_ended_with_one_worker_stays_ended_once_the_node_has_two_again(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink, 2) as pigeon:
        pigeon.cli("suspend", "--domain", HELD)
        pigeon.cli("bounce", "--domain", BOUNCED, "--duration", "1h")
        _restart_with(pigeon, 1)
        pigeon.cli("resume", _listed_and_held_everywhere(pigeon, "suspend", HELD))
        pigeon.cli("bounce", "--cancel", _listed_and_held_everywhere(pigeon, "bounce", BOUNCED))
        _restart_with(pigeon, 2)
        assert pigeon.cli("suspend", "--list").strip() == "none"
        assert pigeon.cli("bounce", "--list").strip() == "none"
        sent = [*_send_to_every_worker(pigeon, HELD, 2), *_send_to_every_worker(pigeon, BOUNCED, 2)]
        sink.wait_for(len(sent), timeout=30)
        assert not pigeon.records("AdminBounce")


def test_a_resume_one_worker_missed_is_not_undone_when_the_node_goes_back_to_one_worker(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink, 2) as pigeon:
        rule_id = pigeon.cli("suspend", "--domain", HELD).split("(rule ", 1)[1].split(")", 1)[0]
        held = _none_delivered_while_suspended(pigeon, sink, 2)
        # Worker 0 misses the resume (stopped), and the node is killed before it is handed it.
        os.kill(pigeon.shard_owner(0), signal.SIGSTOP)
        status, answer = pigeon.http_call("DELETE", f"/api/v1/admin/suspend/{rule_id}", token=pigeon.local_token)
        assert status == 503 and answer["answered"] == [1], answer
        pigeon.kill()
        pigeon.config["node"]["workers"] = 1
        pigeon.config_path.write_text(to_toml(pigeon.config))
        pigeon.start()
        assert pigeon.cli("suspend", "--list").strip() == "none"
        sink.wait_for(held, timeout=30)  # shard 0's mail too, within a suspension's hold (60 s)


def test_rules_made_with_two_workers_hold_on_every_worker_once_the_node_has_three(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink, 2) as pigeon:
        pigeon.cli("suspend", "--domain", HELD)
        pigeon.cli("bounce", "--domain", BOUNCED, "--duration", "1h")
        _restart_with(pigeon, 3)
        _listed_and_held_everywhere(pigeon, "suspend", HELD)
        _listed_and_held_everywhere(pigeon, "bounce", BOUNCED)
        _none_delivered_while_suspended(pigeon, sink, 3)
        _every_one_bounced(pigeon, sink, 3)


def test_rules_that_ran_out_while_the_node_was_down_hold_nowhere_once_it_has_two_workers(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _node(tmp_path, sink, 1) as pigeon:
        pigeon.cli("suspend", "--domain", HELD, "--duration", "2s")
        pigeon.cli("bounce", "--domain", BOUNCED, "--duration", "2s")
        assert pigeon.stop() == 0
        time.sleep(2.5)
        _restart_with(pigeon, 2)
        assert pigeon.cli("suspend", "--list").strip() == "none"
        assert pigeon.cli("bounce", "--list").strip() == "none"
        sent = [*_send_to_every_worker(pigeon, HELD, 2), *_send_to_every_worker(pigeon, BOUNCED, 2)]
        sink.wait_for(len(sent), timeout=30)
        assert not pigeon.records("AdminBounce") and "lacked" not in pigeon.stderr()
