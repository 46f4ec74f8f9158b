"""A Sidekiq push is idempotent: a push that timed out but reached Redis (Redis paused past the
target's timeout, then continued) is not pushed again when the message is retried; and a key of
another type where the queue should be is said by command and key, never with the job (the mail)
in it. Against a private redis-server, whose process the test pauses with SIGSTOP."""

from __future__ import annotations

import json
import os
import signal
import time

import msgspec

from pigeon.config.schema import SidekiqTarget as SidekiqConfig
from pigeon.config.schema import decode_hook
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Verdict
from pigeon.inbound.targets.sidekiq import SidekiqTarget
from tests.support.apps import customer_mail
from tests.support.services import RedisServer
from tests.support.sinks import wait_until

_JOB_KEYS = {"class", "queue", "args", "jid", "retry", "created_at", "enqueued_at"}


def _target(redis_server: RedisServer, *, timeout: float = 5.0) -> SidekiqTarget:
    config = {"name": "jobs", "kind": "sidekiq", "queue": "mail", "job_class": "InboundEmailJob"}
    return SidekiqTarget(msgspec.convert(config, SidekiqConfig, dec_hook=decode_hook), redis_server.url,
                         timeout=timeout)  # fmt: skip


def _message(n: int) -> InboundMessage:
    return InboundMessage.of(customer_mail(n), "smtp", time.time())


async def test_a_push_whose_reply_was_lost_is_not_pushed_again_when_the_message_is_retried(
    redis_server: RedisServer,
) -> None:
    assert redis_server.process is not None
    client = redis_server.client()
    target = _target(redis_server, timeout=0.5)
    first, other = _message(1), _message(2)
    try:
        assert (await target.deliver(other)).accepted  # (connected, the script known to Redis)
        os.kill(redis_server.process.pid, signal.SIGSTOP)
        try:
            lost = await target.deliver(first)  # sent, but Redis answers only after the timeout
        finally:
            os.kill(redis_server.process.pid, signal.SIGCONT)
        wait_until(lambda: client.llen("queue:mail") == 2, 5)  # the push did execute, once resumed
        again = await target.deliver(first)  # the retry of the "failed" handoff
        both = await target.deliver_many([first, _message(3)])
    finally:
        await target.close()
    jobs = [json.loads(job) for job in client.lrange("queue:mail", 0, -1)]
    marker = client.get(f"pigeon:pushed:mail:InboundEmailJob:{first.dedupe_key}")
    ttl = client.ttl(f"pigeon:pushed:mail:InboundEmailJob:{first.dedupe_key}")
    queues = client.smembers("queues")
    client.close()
    assert lost.verdict is Verdict.TRANSIENT and "Timeout" in lost.detail, lost.detail
    assert again.accepted and again.detail == "duplicate: already in queue:mail (same dedupe key)", again.detail
    assert [h.detail for h in both] == ["duplicate: already in queue:mail (same dedupe key)", "pushed to queue:mail"]
    keys = [job["args"][1]["dedupe_key"] for job in jobs]
    assert sorted(keys) == sorted([first.dedupe_key, other.dedupe_key, _message(3).dedupe_key])  # each once
    assert all(set(job) == _JOB_KEYS and job["class"] == "InboundEmailJob" for job in jobs)  # Sidekiq's shape
    pushed = next(job for job in jobs if job["args"][1]["dedupe_key"] == first.dedupe_key)
    assert pushed["args"][0].encode() == first.raw
    assert marker == pushed["jid"].encode()  # the marker names the job that went in
    assert 7 * 86400 <= ttl <= 8 * 86400, ttl  # the default max_age (5 days) and more
    assert queues == {b"mail"}


async def test_a_queue_key_of_another_type_is_said_by_command_and_key_without_the_mail(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    client.set("queue:mail", "someone else's")
    target = _target(redis_server)
    message = _message(1)
    try:
        refused = await target.deliver(message)
        client.delete("queue:mail")  # the operator clears it up: the retry is pushed, not "duplicate"
        retried = await target.deliver(message)
    finally:
        await target.close()
    length = client.llen("queue:mail")
    client.close()
    assert refused.verdict is Verdict.TRANSIENT
    # Nothing was written for the refused push (no marker): its retry is pushed, not taken for a duplicate.
    assert retried.detail == "pushed to queue:mail", retried.detail
    assert length == 1
    assert "WRONGTYPE LPUSH queue:mail: the key holds a string, not a list" in refused.detail, refused.detail
    assert "Received" not in refused.detail and "InboundEmailJob" not in refused.detail, refused.detail
    assert "question 1" not in refused.detail and "{" not in refused.detail, refused.detail
