"""Sidekiq: a job pushed exactly as Sidekiq's own Ruby client pushes one, and once.

`SADD queues <queue>` (what the Web UI lists) and `LPUSH queue:<queue> <job JSON>`, the job
carrying class, queue, args, jid, retry, created_at and enqueued_at. args are `[raw message,
metadata]`: the raw message as a string (UTF-8; when the bytes are not UTF-8, base64, and
metadata says so with `raw_encoding`), metadata with the dedupe key, the Message-ID and where the
message came from. With `arguments = "raw"` they are `[raw message]` only, as mail_room pushed
them, for a worker written for it (`def perform(raw)`, which two arguments would fail): with no
metadata to say base64, bytes that are not UTF-8 go as Latin-1 characters instead (each byte
the character of its number; nothing is lost, and `raw.encode("ISO-8859-1")` gives the bytes
back), which keeps such a worker working, and each is logged (INFO).

A push is idempotent: a batch is one script (`_PUSH`, EVALSHA: one round trip) that first sets
a marker per job, `SET pigeon:pushed:<queue>:<class>:<dedupe key> <jid> NX EX <ttl>`, and
pushes only the jobs whose marker it set. A push whose reply is lost (a timeout while Redis
was paused, a connection cut after the command went out) may have executed all the same; the
retry of its messages then finds their markers and says them duplicates (accepted, as the
PostgreSQL target says a row already in its table), instead of giving the application a second
job with another jid. The marker lives `marker_ttl` seconds: as long as a message may be retried
(its queue's `max_age`, for SMTP-received mail), and a day more. Its key names the queue and
class as well as the message: the same mail for two targets (two `[[inbound]]` routes) is one
job for each. The script checks the two keys it writes to hold what Sidekiq puts there (or
nothing) before writing anything: a script is not rolled back, and a marker set for a job that
then failed to go in would make its retry a "duplicate", the mail lost. Not for Redis Cluster
(neither is the target: one Redis URL).
"""

from __future__ import annotations

import base64
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pigeon.config.schema import SidekiqTarget as SidekiqConfig
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Handoff, Target, Verdict
from pigeon.redaction import redact, redact_url

_encode = msgspec.json.Encoder().encode
_log = logging.getLogger(__name__)

DAY: Final = 86400.0
MARKER_TTL: Final = 7 * DAY
"""The shortest a push marker lives: the default max_age (5 days) of SMTP-received mail, with
room; mail from a mailbox has no max_age, and is retried within `max_retry_interval` unless
Redis stays away (a week covers that too)."""


def marker_ttl(max_age: float | None) -> int:
    """How long a push marker lives for mail that may be retried until `max_age` (None: no
    such limit known): a day longer, and never less than `MARKER_TTL`."""
    return int(max(MARKER_TTL, (max_age or 0.0) + DAY))


# KEYS: "queues", "queue:<queue>", then one marker key per job. ARGV: the queue, the marker's
# TTL in seconds, then the jid and job JSON of each job, in order. Answers a list with one
# element per job: 1 pushed, 0 its marker was there (a duplicate). Refuses the whole batch,
# before writing anything, when a key Sidekiq's client writes holds another type.
_PUSH: Final = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'set' then
  return redis.error_reply('WRONGTYPE SADD ' .. KEYS[1] .. ': the key holds a ' .. kind .. ', not a set')
end
kind = redis.call('TYPE', KEYS[2])['ok']
if kind ~= 'none' and kind ~= 'list' then
  return redis.error_reply('WRONGTYPE LPUSH ' .. KEYS[2] .. ': the key holds a ' .. kind .. ', not a list')
end
local pushed = {}
local any = false
for i = 3, #KEYS do
  local jid, job = ARGV[2 * i - 3], ARGV[2 * i - 2]
  if redis.call('SET', KEYS[i], jid, 'NX', 'EX', ARGV[2]) then
    redis.call('LPUSH', KEYS[2], job)
    pushed[i - 2] = 1
    any = true
  else
    pushed[i - 2] = 0
  end
end
if any then
  redis.call('SADD', KEYS[1], ARGV[1])
end
return pushed
"""


def _raw_as_text(message: InboundMessage, target: str) -> str:
    """The raw message as the one argument of `arguments = "raw"`: UTF-8, else its bytes as
    Latin-1 characters (lossless; base64 would reach a `perform(raw)` worker as gibberish it
    has no way to tell from mail), said in the log."""
    try:
        return message.raw.decode("utf-8")
    except UnicodeDecodeError as error:
        _log.info(
            'target %s: message %s (dedupe key %s) is not UTF-8 (byte 0x%02x at offset %d): arguments = "raw" '
            "pushes its bytes as Latin-1 characters (raw.encode('ISO-8859-1') gives them back)",
            target, message.message_id or "without Message-ID", message.dedupe_key,
            message.raw[error.start], error.start,
        )  # fmt: skip
        return message.raw.decode("latin-1")


class SidekiqTarget(Target):
    kind = "sidekiq"
    batches = True

    def __init__(
        self, config: SidekiqConfig, redis_url: str, *, timeout: float = 5.0, marker_ttl: int = int(MARKER_TTL)
    ) -> None:
        super().__init__(config.name)
        self._config = config
        self.redis_url = redis_url
        self.marker_ttl = marker_ttl
        self._redis = aioredis.Redis.from_url(redis_url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._push = self._redis.register_script(_PUSH)

    async def close(self) -> None:
        await self._redis.aclose()

    def job(self, message: InboundMessage, now: float) -> bytes:
        """The job JSON for one message."""
        return self._job(message, now, secrets.token_hex(12))

    def _job(self, message: InboundMessage, now: float, jid: str) -> bytes:
        config = self._config
        args: list[Any]
        if config.arguments == "raw":
            args = [_raw_as_text(message, config.name)]
        else:
            meta = message.metadata()
            try:
                raw = message.raw.decode("utf-8")
            except UnicodeDecodeError:
                raw = base64.b64encode(message.raw).decode("ascii")
                meta["raw_encoding"] = "base64"
            args = [raw, meta]
        stamp: float | int = int(now * 1000) if config.timestamps == "milliseconds" else now
        job: dict[str, Any] = {
            "class": config.job_class,
            "queue": config.queue,
            "args": args,
            "jid": jid,
            "retry": config.retry,
            "created_at": stamp,
            "enqueued_at": stamp,
        }
        return _encode(job)

    def marker(self, message: InboundMessage) -> str:
        """The key that says `message` was pushed as a job of this queue and class."""
        return f"pigeon:pushed:{self._config.queue}:{self._config.job_class}:{message.dedupe_key}"

    async def deliver(self, message: InboundMessage) -> Handoff:
        return (await self.deliver_many([message]))[0]

    async def deliver_many(self, messages: Sequence[InboundMessage]) -> list[Handoff]:
        queue = self._config.queue
        now = time.time()
        args: list[str | bytes | int] = [queue, self.marker_ttl]
        for message in messages:
            jid = secrets.token_hex(12)
            args += [jid, self._job(message, now, jid)]
        keys = ["queues", f"queue:{queue}", *(self.marker(m) for m in messages)]
        try:
            pushed = await self._push(keys=keys, args=args)
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
        # A copy whose marker was there: pushed before (a reply lost), or earlier in this batch.
        already = Handoff(Verdict.ACCEPTED, f"duplicate: already in queue:{queue} (same dedupe key)")
        return [done if flag else already for flag in pushed]
