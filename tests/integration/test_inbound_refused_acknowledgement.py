"""A server that refuses to acknowledge a message handed over (a `move_to` it will not take: full,
read-only, a missing label) or to set one aside: the mailbox says so, and the message is never
handed over again, however long the refusal lasts, across restarts, with or without Redis."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, mailbox_health, redis_in_use_for_a_while
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, RedisServer
from tests.support.sinks import wait_until

REFUSED = "L" * 300  # a folder name Dovecot refuses to create or move to


def _handed_over(path: Path) -> list[str]:
    """The dedupe keys a log target holds, one per handoff."""
    if not path.exists():
        return []
    return [json.loads(line)["dedupe_key"] for line in path.read_bytes().splitlines()]


def _errors(node: PigeonProcess) -> float:
    _, body = node.http_get("/metrics")
    found = re.search(rb'^pigeon_inbound_mailbox_errors_total\{mailbox="support"\} (\S+)$', body, re.M)
    return float(found.group(1)) if found else 0.0


def _degraded_by(node: PigeonProcess, words: str) -> dict[str, Any]:
    def said() -> bool:
        health = mailbox_health(node)
        return health["status"] == "degraded" and words in (health["error"] or "")

    wait_until(said, 15)
    return mailbox_health(node)


def test_a_refused_move_degrades_the_mailbox_and_never_hands_the_message_over_again(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    (uid,) = dovecot.append("app", [customer_mail(0)])
    handed = tmp_path / "inbound.jsonl"
    target = {"name": "audit", "kind": "log", "path": str(handed)}

    def node(name: str, move_to: str) -> PigeonProcess:
        box = imap_mailbox(dovecot, "audit", after_delivery="move", move_to=move_to, poll_interval="1s")
        return PigeonProcess(tmp_path / name, target=[target], mailbox=[box])

    with node("p", REFUSED) as first:
        first.wait_records("InboundDelivery", 1, timeout=20)
        health = _degraded_by(first, "cannot acknowledge")
        assert "move to" in health["error"]
        assert _errors(first) >= 1
        time.sleep(4)  # rounds go on: the message stays where it is, handed over once
        assert "$PigeonDone" in dovecot.flags("app", uid)
        assert mailbox_health(first)["status"] == "degraded"
    assert len(_handed_over(handed)) == 1
    # No Redis: nothing but the mailbox remembers the handoff across a restart.
    with node("q", REFUSED) as second:
        _degraded_by(second, "cannot acknowledge")  # tried again at once, and refused again
        time.sleep(3)
    assert len(_handed_over(handed)) == 1
    # A move_to the server takes: the message goes there, and the mailbox is ok again.
    with node("r", "Processed") as third:
        wait_until(lambda: "Processed" in dovecot.folders("app") and dovecot.count("app", "Processed") == 1, 15)
        wait_until(lambda: mailbox_health(third)["status"] == "ok", 10)
        assert mailbox_health(third)["error"] is None
    assert dovecot.count("app") == 0
    assert len(_handed_over(handed)) == 1


def test_a_refused_move_hands_the_message_over_once_after_its_done_mark_lapses(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    redis_in_use_for_a_while(redis_server)
    dovecot.append("app", [customer_mail(0)])
    handed = tmp_path / "inbound.jsonl"
    box = imap_mailbox(dovecot, "audit", after_delivery="move", move_to=REFUSED, poll_interval="1s")
    with PigeonProcess(
        tmp_path / "p",
        redis={"url": redis_server.url},
        target=[{"name": "audit", "kind": "log", "path": str(handed)}],
        mailbox=[box],
    ) as node:
        node.wait_records("InboundDelivery", 1, timeout=20)
        _degraded_by(node, "cannot acknowledge")
        client = redis_server.client()
        marks = [key for key in client.scan_iter("pigeon:inbound:*") if re.search(rb":\d+:\d+$", key)]
        assert marks
        client.delete(*marks)  # its day is over
        time.sleep(4)
    assert len(_handed_over(handed)) == 1


def test_a_refused_set_aside_flags_the_message_failed_and_degrades_the_mailbox(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    (uid,) = dovecot.append("app", [customer_mail(0)])
    with WebhookApp(status=422) as app:
        box = imap_mailbox(dovecot, "hook", failed_folder=REFUSED, poll_interval="1s")
        target = {"name": "hook", "kind": "webhook", "url": app.url, "retry_interval": "200ms"}
        with PigeonProcess(tmp_path / "p", target=[target], mailbox=[box]) as node:
            (failure,) = node.wait_records("InboundFailure", 1, timeout=20)
            health = _degraded_by(node, "cannot set aside")
            assert _errors(node) >= 1
            time.sleep(4)
            assert len(node.records("InboundFailure")) == 1
    assert failure["permanent"] is True
    assert app.refused == 1
    assert {"$PigeonFailed", "\\Seen"} <= dovecot.flags("app", uid)
    assert "move to" in health["error"]
