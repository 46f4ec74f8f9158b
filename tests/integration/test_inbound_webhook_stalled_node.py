"""A node that was not running (SIGSTOP, a stalled event loop) while its webhook answered: the
answer waiting for it is read when it runs again, not called "no answer" by a timeout that
fired meanwhile, and the message counts as delivered, once. A webhook that did not answer is
still "no answer" after its timeout, and says so when the node was stalled meanwhile."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import msgspec

from pigeon.config.schema import WebhookTarget as WebhookConfig
from pigeon.config.schema import decode_hook
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Verdict
from pigeon.inbound.targets.webhook import WebhookTarget
from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, mailbox_health, webhook_target
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot
from tests.support.sinks import wait_until


def test_a_webhook_answer_that_came_while_the_node_was_stopped_counts_as_delivered(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    box = imap_mailbox(dovecot, "hook")
    with (
        WebhookApp() as app,
        PigeonProcess(tmp_path / "p", target=[webhook_target(app, timeout="1s")], mailbox=[box]) as node,
    ):
        assert node.process is not None
        app.delay = 0.3  # answered well within the timeout ...
        wait_until(lambda: mailbox_health(node)["status"] == "ok", 20)
        dovecot.append("app", [customer_mail(1)])
        wait_until(lambda: app.started == 1, 20)
        os.kill(node.process.pid, signal.SIGSTOP)  # ... while the node is not running
        try:
            assert app.wait_distinct(1, 5) == 1
            time.sleep(2)  # past the node's 1 s timeout
        finally:
            os.kill(node.process.pid, signal.SIGCONT)
        (delivery,) = node.wait_records("InboundDelivery", 1, timeout=10)
        time.sleep(1)  # a retry, had the handoff been called a failure, would have come by now
        failures = node.records("InboundFailure")
    assert failures == [], failures
    assert delivery["detail"].startswith("202"), delivery
    assert sum(app.accepted.values()) == 1


def _webhook(app: WebhookApp) -> WebhookTarget:
    config = {"name": "hook", "kind": "webhook", "url": app.url, "timeout": "1s"}
    return WebhookTarget(msgspec.convert(config, WebhookConfig, dec_hook=decode_hook))


def _message() -> InboundMessage:
    return InboundMessage.of(customer_mail(1), "imap:support", time.time())


async def test_a_webhook_that_does_not_answer_is_still_no_answer_after_its_timeout() -> None:
    with WebhookApp() as app:
        app.hold("")
        target = _webhook(app)
        try:
            started = time.monotonic()
            answer = await target.deliver(_message())
            took = time.monotonic() - started
        finally:
            app.release("")
            await target.close()
    assert (answer.verdict, answer.detail) == (Verdict.TRANSIENT, f"no answer from {app.url} within 1s")
    assert 1 <= took < 1.5


async def test_a_stalled_node_whose_webhook_does_not_answer_says_it_was_stalled() -> None:
    with WebhookApp() as app:
        app.hold("")
        target = _webhook(app)
        try:
            handoff = asyncio.create_task(target.deliver(_message()))
            await asyncio.to_thread(wait_until, lambda: app.started == 1, 5)
            time.sleep(2)  # noqa: ASYNC251 (on purpose: the loop does not run, as under SIGSTOP)
            answer = await handoff
        finally:
            app.release("")
            await target.close()
    assert answer.verdict is Verdict.TRANSIENT
    stalled = r"\(not counting \d\.\ds this node was not running\)"
    assert re.fullmatch(rf"no answer from {re.escape(app.url)} within 1s {stalled}", answer.detail), answer.detail
