"""A node paused (SIGSTOP) past its heartbeat while a webhook handoff is in flight: another node
takes the claim over and hands the message over again, as it must for a node that died. The
paused node, once running again, completes its own handoff: it says so with a WARNING and marks
its record, since the application may have got the message twice."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, redis_in_use_for_a_while, webhook_target
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, RedisServer
from tests.support.sinks import wait_until


def _node(tmp_path: Path, name: str, redis_server: RedisServer, app: WebhookApp, dovecot: Dovecot) -> PigeonProcess:
    target = webhook_target(app, headers={"X-Test-Node": name}, timeout="60s")
    return PigeonProcess(tmp_path / name, node={"name": name}, redis={"url": redis_server.url}, target=[target],
                         mailbox=[imap_mailbox(dovecot, "hook")])  # fmt: skip


def test_a_handoff_completed_after_another_node_took_its_claim_over_is_said_and_marked(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    raw = customer_mail(1)
    key = hashlib.sha256(raw).hexdigest()
    redis_in_use_for_a_while(redis_server)
    with WebhookApp() as app:
        app.hold("mx-a")  # node mx-a's request waits in the application ...
        with _node(tmp_path, "mx-a", redis_server, app, dovecot) as paused:
            assert paused.process is not None
            (uid,) = dovecot.append("app", [raw])
            wait_until(lambda: app.started == 1, 20)
            with _node(tmp_path, "mx-b", redis_server, app, dovecot) as taker:
                os.kill(paused.process.pid, signal.SIGSTOP)  # ... while mx-a stops running
                try:
                    app.release("mx-a")  # its answer waits for it in its socket
                    # mx-a's heartbeat runs out (5 s): mx-b takes the claim over, hands over again.
                    wait_until(lambda: app.accepted_from("mx-b") == 1, 30)
                    (again,) = taker.wait_records("InboundDelivery", 1, timeout=10)
                finally:
                    os.kill(paused.process.pid, signal.SIGCONT)
                (late,) = paused.wait_records("InboundDelivery", 1, timeout=15)
                said = paused.wait_stderr("took its claim over", timeout=10)
    assert app.accepted[key] == 2  # what this is about: a paused node counts as dead
    assert late["repeated_by_takeover"] is True, late
    assert (late["uid"], late["dedupe_key"]) == (uid, key)
    assert again.get("repeated_by_takeover") is None, again  # the taker's handoff is an ordinary one
    (line,) = [line for line in said.splitlines() if "took its claim over" in line]
    assert "WARNING" in line and f"UID {uid} (Message-ID <m1@example.com>)" in line, line
    assert "after node mx-b (token h" in line and "may have reached the application twice" in line, line
