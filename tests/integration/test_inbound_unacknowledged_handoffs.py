"""Handoffs the target accepted while the IMAP server was away (their acknowledgement at the
source failed with the session), then Redis lost its data (their done marks with it), then the
server came back: the node that handed them over acknowledges them, and neither it nor another
node hands them over again. The node keeps what it handed over and has not acknowledged across
sessions, and puts its done marks back with its claims when Redis lost them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, redis_in_use_for_a_while, webhook_target
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, RedisServer
from tests.support.sinks import wait_until

_COUNT = 12


def _node(tmp_path: Path, name: str, redis_server: RedisServer, app: WebhookApp, dovecot: Dovecot) -> PigeonProcess:
    target = webhook_target(app, headers={"X-Test-Node": name}, timeout="60s")
    box = imap_mailbox(dovecot, "hook", concurrency=4, batch=8, poll_interval="1s")
    return PigeonProcess(tmp_path / name, node={"name": name}, redis={"url": redis_server.url}, target=[target],
                         mailbox=[box])  # fmt: skip


@contextlib.contextmanager
def _handed_over_while_dovecot_and_redis_were_away(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer, app: WebhookApp, *, others: int
) -> Iterator[PigeonProcess]:
    """Node mx-a's first handoffs are held in the application while Dovecot stops; they are
    accepted then (their acknowledgement fails), Redis loses its data, and Dovecot comes back
    once the pause after the loss is over. `others`: more nodes watching the mailbox."""
    redis_in_use_for_a_while(redis_server)
    app.hold("mx-a")
    # Appended before the node starts: its first search finds them all (one that raced the
    # appends could find three, and hand over only those).
    dovecot.append("app", [customer_mail(i) for i in range(_COUNT)])
    with _node(tmp_path, "mx-a", redis_server, app, dovecot) as node, contextlib.ExitStack() as stack:
        wait_until(lambda: app.started >= 4, 30)  # `concurrency` handoffs under way, held
        for n in range(others):  # (started now: mx-a took the first batch)
            stack.enter_context(_node(tmp_path, f"mx-{n}", redis_server, app, dovecot))
        dovecot.stop()
        node.wait_stderr("reconnecting once the handoffs under way end", timeout=15)
        app.release("mx-a")
        node.wait_records("InboundDelivery", 4, timeout=15)  # recorded; their acknowledgement fails
        time.sleep(1)
        redis_server.restart()  # without its data: the done marks are gone
        node.wait_stderr("lost its data: pausing claims", timeout=15)
        time.sleep(7)  # the pause is over before the mailbox returns (as the tester's 8 s)
        dovecot.start()
        yield node


def _each_once(app: WebhookApp) -> None:
    assert app.wait_distinct(_COUNT, 60) == _COUNT
    time.sleep(3)  # a repeat would have come by now
    repeated = {key: n for key, n in app.accepted.items() if n > 1}
    assert not repeated, f"{len(repeated)} messages handed over more than once"


def test_a_node_does_not_hand_over_again_what_it_handed_over_before_the_session_and_the_done_marks_were_lost(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    with (
        WebhookApp() as app,
        _handed_over_while_dovecot_and_redis_were_away(tmp_path, dovecot, redis_server, app, others=0) as node,
    ):
        _each_once(app)
        wait_until(lambda: not dovecot.unseen("app"), 15)  # the first four acknowledged too
        records = node.wait_records("InboundDelivery", _COUNT, timeout=10)
        logged = node.stderr()
    assert sum(app.accepted.values()) == _COUNT
    uids = [record["uid"] for record in records]
    assert sorted(uids) == sorted(set(uids)), "a message recorded twice"
    assert "acknowledging 4 messages handed over before at the source" in logged, logged


def test_another_node_leaves_alone_what_a_node_handed_over_when_redis_lost_the_done_marks(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    with WebhookApp() as app:
        app.delay = 0.1
        with _handed_over_while_dovecot_and_redis_were_away(tmp_path, dovecot, redis_server, app, others=2) as node:
            _each_once(app)
            wait_until(lambda: not dovecot.unseen("app"), 15)
            time.sleep(1)
            first = node.records("InboundDelivery")
    assert sum(app.accepted.values()) == _COUNT
    assert app.accepted_from("mx-a") >= 4
    assert len(first) >= 4
