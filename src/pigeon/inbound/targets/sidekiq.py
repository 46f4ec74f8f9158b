"""Sidekiq: a job pushed exactly as Sidekiq's own Ruby client pushes one.

`SADD queues <queue>` (what the Web UI lists) and `LPUSH queue:<queue> <job JSON>` in one
MULTI, the job carrying class, queue, args, jid, retry, created_at and enqueued_at. A batch of
messages is one MULTI, one round trip. args are `[raw message, metadata]`: the raw message as
a string (UTF-8; when the bytes are not UTF-8, base64, and metadata says so with
`raw_encoding`), metadata with the dedupe key, the Message-ID and where the message came from.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pigeon.config.schema import SidekiqTarget as SidekiqConfig
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Handoff, Target, Verdict
from pigeon.redaction import redact, redact_url

_encode = msgspec.json.Encoder().encode


class SidekiqTarget(Target):
    kind = "sidekiq"
    batches = True

    def __init__(self, config: SidekiqConfig, redis_url: str, *, timeout: float = 5.0) -> None:
        super().__init__(config.name)
        self._config = config
        self.redis_url = redis_url
        self._redis = aioredis.Redis.from_url(redis_url, socket_timeout=timeout, socket_connect_timeout=timeout)

    async def close(self) -> None:
        await self._redis.aclose()

    def job(self, message: InboundMessage, now: float) -> bytes:
        """The job JSON for one message."""
        config = self._config
        meta = message.metadata()
        try:
            raw = message.raw.decode("utf-8")
        except UnicodeDecodeError:
            raw = base64.b64encode(message.raw).decode("ascii")
            meta["raw_encoding"] = "base64"
        stamp: float | int = int(now * 1000) if config.timestamps == "milliseconds" else now
        job: dict[str, Any] = {
            "class": config.job_class,
            "queue": config.queue,
            "args": [raw, meta],
            "jid": secrets.token_hex(12),
            "retry": config.retry,
            "created_at": stamp,
            "enqueued_at": stamp,
        }
        return _encode(job)

    async def deliver(self, message: InboundMessage) -> Handoff:
        return (await self.deliver_many([message]))[0]

    async def deliver_many(self, messages: Sequence[InboundMessage]) -> list[Handoff]:
        queue = self._config.queue
        now = time.time()
        jobs = [self.job(m, now) for m in messages]
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.sadd("queues", queue)
                pipe.lpush(f"queue:{queue}", *jobs)
                await pipe.execute()
        except (RedisError, OSError) as error:
            failed = Handoff(
                Verdict.TRANSIENT,
                f"Sidekiq's Redis ({redact_url(self.redis_url)}): {redact(str(error)) or type(error).__name__}",
            )
            return [failed] * len(messages)
        except Exception as error:  # never raise: the caller would strand the batch
            failed = Handoff(Verdict.TRANSIENT, f"Sidekiq: {type(error).__name__}: {redact(str(error))}")
            return [failed] * len(messages)
        done = Handoff(Verdict.ACCEPTED, f"pushed to queue:{queue}")
        return [done] * len(messages)
