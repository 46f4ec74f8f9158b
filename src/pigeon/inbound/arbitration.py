"""Claims on inbound messages, so that of N nodes watching one mailbox one hands each over.

A claim key names the message at its source: mailbox identity, UIDVALIDITY and UID (a
Message-ID is forgeable and may be missing; mail_room keyed on the UID alone, so two
mailboxes collided). Its value says where the message stands:

    c:<token>:<n>    claimed by the holder of <token>, whose attempt n+1 this is (lease: PX)
    b:<n>:<due ms>   n attempts failed; nobody may try again before <due> (Redis clock)
    d:<token>        the target accepted it; only the source's acknowledgement may be missing
    f:<token>        the target refused it for good

Claiming is `SET key c:... NX PX lease` done in a script, so that a key in backoff whose time
has come can be claimed in the same step and the attempt count survives. Renewing, marking
done, failed or in backoff, and releasing all compare the value with the holder's own first
(compare-and-set), so a holder whose lease expired can never overwrite a new owner. A renewal
that finds the key gone (Redis restarted empty) puts the claim back, which closes most of the
window in which another node could take a message being handed over.

Arbitration is an efficiency measure: it keeps N nodes from all handing over every message.
Exactly-once as the application sees it also needs the dedupe key (see `message`), because no
lease survives a Redis that loses its data while a handoff is under way.

With no Redis configured, `LocalArbiter` keeps the same states in memory: correct for one
node, and documented as single-node mode.
"""

from __future__ import annotations

import enum
import itertools
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

_log = logging.getLogger(__name__)

DONE_TTL: Final = 24 * 3600.0  # how long "done" and "failed" marks outlive the handoff


class ArbitrationUnavailable(Exception):
    """Redis did not answer: claims pause (nothing is handed over without one)."""


class Standing(enum.Enum):
    CLAIMED = "claimed"  # ours now
    HELD = "held"  # another node holds it
    WAITING = "waiting"  # in backoff after a failed attempt
    DONE = "done"  # handed over already: acknowledge at the source if still there
    FAILED = "failed"  # refused for good: apply the failure action if still there


@dataclass(slots=True)
class Claim:
    key: str
    uid: int
    standing: Standing
    value: str = ""  # what we wrote, for compare-and-set
    attempts: int = 0  # failed attempts before this one
    deadline: float = 0.0  # monotonic: past it, the lease may be someone else's
    lost: bool = False
    retry_in: float = 0.0  # WAITING: seconds until its backoff ends


# KEYS[1] the epoch key. Redis's birth time as Pigeon knows it (set when missing: first use, or
# a Redis that lost its data), and Redis's clock.
_EPOCH: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local born = redis.call('GET', KEYS[1])
if not born then redis.call('SET', KEYS[1], now) born = now end
return {tostring(born), tostring(now)}
"""

# KEYS[1] claim key, KEYS[2] epoch key; ARGV: token, lease ms, the epoch the caller knows ('' for
# none). Returns the standing and the attempt count. A caller that knew another epoch is
# refused ("paused"): Redis lost its claims, and holders must first have time to put theirs back.
_CLAIM: Final = """
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[3] then return {'paused', '0'} end
local v = redis.call('GET', KEYS[1])
local attempts = 0
if v then
  local kind = string.sub(v, 1, 1)
  if kind == 'b' then
    local n, due = string.match(v, '^b:(%d+):(%d+)$')
    local now = redis.call('TIME')
    local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    if now_ms < tonumber(due) then return {'waiting', n, tostring(tonumber(due) - now_ms)} end
    attempts = tonumber(n)
  elseif kind == 'c' then return {'held', '0'}
  elseif kind == 'd' then return {'done', '0'}
  else return {'failed', '0'} end
end
redis.call('SET', KEYS[1], 'c:' .. ARGV[1] .. ':' .. attempts, 'PX', ARGV[2])
return {'claimed', tostring(attempts)}
"""

# KEYS[1]; ARGV: our value, lease ms. 1: renewed (or put back after Redis lost it), 0: lost.
_RENEW: Final = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""

# KEYS[1]; ARGV: our value, new value, ttl ms. Replaces our claim (or a vanished key).
_SETTLE: Final = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or not v then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end
return 0
"""

# KEYS[1]; ARGV: our value, attempts. Gives the message back untried.
_RELEASE: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then return redis.call('DEL', KEYS[1]) end
redis.call('SET', KEYS[1], 'b:' .. ARGV[2] .. ':0', 'PX', 86400000)
return 1
"""


class Arbiter:
    """Claims and their outcomes; `RedisArbiter` for a cluster, `LocalArbiter` for one node."""

    shared = False  # whether other nodes see these claims

    def __init__(self) -> None:
        self.token = secrets.token_hex(8)  # this process: a restarted node is someone else
        self._claims = itertools.count()

    def nonce(self) -> str:
        """A token for one claim: even this process's next claim on the same key differs, so
        a compare-and-set by a holder whose lease ran out cannot match it."""
        return f"{self.token}.{next(self._claims)}"

    async def claim(self, keys: Sequence[tuple[str, int]], lease: float) -> list[Claim]:
        raise NotImplementedError

    async def renew(self, claims: Sequence[Claim], lease: float) -> None:
        """Extend leases; a claim someone else took meanwhile is marked `lost`."""
        raise NotImplementedError

    async def done(self, claims: Sequence[Claim]) -> None:
        raise NotImplementedError

    async def failed(self, claims: Sequence[Claim]) -> None:
        raise NotImplementedError

    async def backoff(self, claims: Sequence[tuple[Claim, float]]) -> None:
        """Each claim given back with a time (seconds from now) before anyone tries again."""
        raise NotImplementedError

    async def release(self, claims: Sequence[Claim]) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        pass

    def _claimed(self, key: str, uid: int, nonce: str, attempts: int, lease: float, started: float) -> Claim:
        value = f"c:{nonce}:{attempts}"
        # The lease started no later than our request did: count from there, less a margin
        # for clock rate differences.
        return Claim(key, uid, Standing.CLAIMED, value, attempts, started + lease * 0.9)


class RedisArbiter(Arbiter):
    """Claims in one Redis. After Redis lost its data (a restart without persistence, a failover
    to a replica that had not caught up), nodes that were claiming stop for a third of a lease
    and a little more: long enough for every holder's next renewal to put its claims back, so
    a message in the middle of a handoff is not taken by another node. This is the "delayed
    restart" Redis's own locking guide recommends, done by the clients."""

    shared = True

    def __init__(self, url: str, *, prefix: str = "pigeon", timeout: float = 2.0) -> None:
        super().__init__()
        self.url = url
        self.prefix = f"{prefix}:" if prefix else ""
        self._epoch_key = "inbound:epoch"
        self._epoch: str | None = None
        self._paused_until = 0.0  # monotonic
        self._timeout = timeout
        # One quick retry on a fresh connection: after a Redis restart the pooled connections
        # are dead, and the first command on each would otherwise fail for nothing.
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 1),
            retry_on_error=[RedisConnectionError],
        )
        self._epoch_script = self._redis.register_script(_EPOCH)
        self._claim = self._redis.register_script(_CLAIM)
        self._renew = self._redis.register_script(_RENEW)
        self._settle = self._redis.register_script(_SETTLE)
        self._release = self._redis.register_script(_RELEASE)

    async def close(self) -> None:
        await self._redis.aclose()

    async def _run(self, calls: Sequence[tuple[AsyncScript, str | list[str], list[str]]]) -> list[object]:
        if not calls:
            return []
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for script, key, args in calls:
                    keys = [key] if isinstance(key, str) else key
                    await script(keys=[self.prefix + k for k in keys], args=args, client=pipe)
                return list(await pipe.execute())
        except (RedisError, OSError) as error:
            raise ArbitrationUnavailable(f"Redis at {self.url}: {error or type(error).__name__}") from error

    async def claim(self, keys: Sequence[tuple[str, int]], lease: float) -> list[Claim]:
        started = time.monotonic()
        if started < self._paused_until:
            return [Claim(key, uid, Standing.WAITING) for key, uid in keys]
        lease_ms = str(max(1, int(lease * 1000)))
        nonces = [self.nonce() for _ in keys]
        known = self._epoch or ""
        calls: list[tuple[AsyncScript, str | list[str], list[str]]] = [(self._epoch_script, [self._epoch_key], [])]
        calls += [
            (self._claim, [key, self._epoch_key], [n, lease_ms, known])
            for (key, _), n in zip(keys, nonces, strict=True)
        ]
        epoch, *answers = await self._run(calls)
        assert isinstance(epoch, list)
        born, now = _text(epoch[0]), int(_text(epoch[1]))
        if self._epoch is not None and born != self._epoch:
            # Long enough for every holder's next renewal, even one that first had to wait
            # out a failed attempt (two timeouts) on the dead connection.
            grace_ms = (lease / 3 + 2 * self._timeout + 1) * 1000
            pause = (int(born) + grace_ms - now) / 1000
            self._paused_until = started + max(0.0, pause)
            _log.warning("Redis at %s lost its data: pausing claims %.1fs so holders can renew theirs", self.url,
                         max(0.0, pause))  # fmt: skip
        self._epoch = born
        claims = []
        for (key, uid), nonce, answer in zip(keys, nonces, answers, strict=True):
            assert isinstance(answer, list)
            text = _text(answer[0])
            standing = Standing.WAITING if text == "paused" else Standing(text)
            attempts = int(_text(answer[1]))
            if standing is Standing.CLAIMED:
                claims.append(self._claimed(key, uid, nonce, attempts, lease, started))
            else:
                retry_in = int(_text(answer[2])) / 1000 if len(answer) > 2 else 0.0
                claims.append(Claim(key, uid, standing, attempts=attempts, retry_in=retry_in))
        return claims

    async def renew(self, claims: Sequence[Claim], lease: float) -> None:
        started = time.monotonic()
        lease_ms = str(max(1, int(lease * 1000)))
        answers = await self._run([(self._renew, c.key, [c.value, lease_ms]) for c in claims])
        for claim, answer in zip(claims, answers, strict=True):
            if answer == 1:
                claim.deadline = started + lease * 0.9
            else:
                claim.lost = True

    async def _mark(self, claims: Sequence[Claim], kind: str) -> None:
        ttl = str(int(DONE_TTL * 1000))
        await self._run([(self._settle, c.key, [c.value, f"{kind}:{self.token}", ttl]) for c in claims])

    async def done(self, claims: Sequence[Claim]) -> None:
        await self._mark(claims, "d")

    async def failed(self, claims: Sequence[Claim]) -> None:
        await self._mark(claims, "f")

    async def backoff(self, claims: Sequence[tuple[Claim, float]]) -> None:
        ttl = str(int(DONE_TTL * 1000))
        calls = []
        for claim, delay in claims:
            # The due time is in the Redis clock's terms: TIME is read by the claim script,
            # so it is computed there from our clock only as an offset. Close enough for a
            # retry delay; clocks agreeing to a second is all it needs.
            due = int((time.time() + delay) * 1000)
            calls.append((self._settle, claim.key, [claim.value, f"b:{claim.attempts + 1}:{due}", ttl]))
        await self._run(calls)

    async def release(self, claims: Sequence[Claim]) -> None:
        await self._run([(self._release, c.key, [c.value, str(c.attempts)]) for c in claims])


class LocalArbiter(Arbiter):
    """Single-node mode: the same states, in this process's memory."""

    def __init__(self) -> None:
        super().__init__()
        self._values: dict[str, tuple[str, float]] = {}  # key: (value, expires, time.time())
        self._next_sweep = 0.0

    def _get(self, key: str) -> str | None:
        hit = self._values.get(key)
        if hit is None:
            return None
        if hit[1] <= time.time():
            del self._values[key]
            return None
        return hit[0]

    def _set(self, key: str, value: str, ttl: float) -> None:
        now = time.time()
        # Expired entries are swept once a minute, not on every write: a day of done marks
        # can be a million entries.
        if now >= self._next_sweep:
            self._values = {k: v for k, v in self._values.items() if v[1] > now}
            self._next_sweep = now + 60
        self._values[key] = (value, now + ttl)

    async def claim(self, keys: Sequence[tuple[str, int]], lease: float) -> list[Claim]:
        started = time.monotonic()
        claims = []
        for key, uid in keys:
            value = self._get(key)
            attempts = 0
            if value is not None:
                kind = value[0]
                if kind == "b":
                    _, n, due = value.split(":")
                    remaining = int(due) / 1000 - time.time()
                    if remaining > 0:
                        claims.append(Claim(key, uid, Standing.WAITING, attempts=int(n), retry_in=remaining))
                        continue
                    attempts = int(n)
                else:
                    standing = {"c": Standing.HELD, "d": Standing.DONE}.get(kind, Standing.FAILED)
                    claims.append(Claim(key, uid, standing))
                    continue
            claim = self._claimed(key, uid, self.nonce(), attempts, lease, started)
            self._set(key, claim.value, lease)
            claims.append(claim)
        return claims

    async def renew(self, claims: Sequence[Claim], lease: float) -> None:
        started = time.monotonic()
        for claim in claims:
            value = self._get(claim.key)
            if value in (None, claim.value):
                self._set(claim.key, claim.value, lease)
                claim.deadline = started + lease * 0.9
            else:
                claim.lost = True

    def _replace(self, claim: Claim, value: str, ttl: float) -> None:
        if self._get(claim.key) in (None, claim.value):
            self._set(claim.key, value, ttl)

    async def done(self, claims: Sequence[Claim]) -> None:
        for claim in claims:
            self._replace(claim, f"d:{self.token}", DONE_TTL)

    async def failed(self, claims: Sequence[Claim]) -> None:
        for claim in claims:
            self._replace(claim, f"f:{self.token}", DONE_TTL)

    async def backoff(self, claims: Sequence[tuple[Claim, float]]) -> None:
        for claim, delay in claims:
            self._replace(claim, f"b:{claim.attempts + 1}:{int((time.time() + delay) * 1000)}", DONE_TTL)

    async def release(self, claims: Sequence[Claim]) -> None:
        for claim in claims:
            if self._get(claim.key) == claim.value:
                if claim.attempts:
                    self._set(claim.key, f"b:{claim.attempts}:0", DONE_TTL)
                else:
                    del self._values[claim.key]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
