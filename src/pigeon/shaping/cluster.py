"""Cluster-wide limits: connection leases and GCRA rates in the Redis the nodes share.

Rates. Each limit key has one Redis key, its theoretical arrival time (TAT, µs on Redis's
clock). A worker does not ask per message: it books a block of slots in one round trip
(`_RESERVE`) and hands them out itself, one per message, each at its slot's time. The block is
sized to what this worker sent of the key in the last `BLOCK_TIME` (50 ms), never more than
50 ms of the limit, and at least what is asked for right now; requests for a key that arrive
while its block is being fetched wait for that one fetch. Booked slots are the cluster's
schedule, so messages sent at their slots keep to the limit exactly; a slot not used within
`STALE` (50 ms) of its time is dropped, since sending it later could crowd a later window
(not a slot fetched for a request that waited for it, however late the event loop comes back).
So the batching allows, over any window of W seconds, at most `rate * (W + STALE) + burst`
messages: at 200/s, 10 more than GCRA alone would.

Connections. Each limit key has a sorted set of leases (member: node, worker and connection;
score: expiry, ms on Redis's clock). Opening a connection runs `_ACQUIRE`: drop expired
leases, count, add ours if below the limit, all in one step. A heartbeat every `BEAT` second
renews every lease this worker holds (`_BEAT`) and says the node is alive; the leases of a
node that dies expire `LEASE` seconds later. A connection's end removes its lease, without
waiting for the answer. A connection refused for a full limit sets the limit's demand key
(`want:`, for `WANTED` seconds), which the heartbeat reads for the limits its worker holds:
an idle connection then makes room (`crowded`), as it does when its node holds the whole limit.
Only a refusal one connection's end would let in sets it: a node running a lower limit than
the holders' (a reaction's effect) finds more leases than its limit, and no idle connection
elsewhere that closes would let it in.

Such a refusal also puts the worker in the limit's line (`line:`, worker -> the µs it joined),
and a slot that frees goes to the workers in it, first come first: `_ACQUIRE` lets in a worker
only if fewer stand ahead of it than there are free slots. Else a connection that made room for
another node's waiter (its turn over, `Throttles.keep`) freed a slot that the other worker of
its own node, which its node's table had refused without asking Redis, took first, asking the
moment the table said so: a backlog on another node waited turn after turn. A place lasts
`TICKET` seconds (`ticket:`) unless the worker asks again or its heartbeat says it still waits
(refused since, by Redis or by its node's table), so one that stopped waiting, or died, holds
back a free slot for no longer. Nothing of this costs a round trip: a limit that is not full
has an empty line, read in the lease call.

Data loss. A Redis restarted without its data (or flushed) counts no lease, while every node's
connections are still open: a connection waiting for a lease would take the whole limit at once,
and the heartbeats put back the others' leases on top. So the leases live in an epoch (`_EPOCH`,
a key that Redis keeps as long as its data), whose id each worker learns from its heartbeat. The
first call of a worker that finds it gone (its leases were in an epoch) begins a new one in which
no lease is taken for `SETTLE` seconds, while every node's heartbeat puts back the leases of its
open connections; a worker's own lease is not taken before its heartbeat has put its others back
in the new epoch. A heartbeat puts a lease back only if the limit has room for it (Redis lost
it, and another took the limit meanwhile: a node whose heartbeats stalled past `LEASE`, or one
that noticed after the epoch was ready): that connection ends after its current message (`keep`).
A worker that never saw an epoch (a first start) begins one at once: it holds no lease.

Fallback. The node heartbeat (a hash of node name -> expiry) also counts the nodes seen in the
last `LEASE` seconds. When Redis cannot be reached (an error or a timeout of any call) the
worker falls back: each limit is cut to this node's share (`limit // nodes`, at least one
connection; `rate / nodes`), held across the node's workers by the node's own table. The count
is never below the largest of the last `LEASE` seconds, nor, for `LEASE` seconds after Redis
answers again, below the count known before (`_count`: one back empty, or after a hang, has
seen only the nodes that beat since, and may hang again at once). It says
so once in the log, and in /healthz and /metrics, until a heartbeat succeeds again. That
heartbeat puts back the lease of every connection open meanwhile. For `SETTLE` seconds after
either change no new connection opens, so every node has seen the change (and put its leases
back) before anyone counts again; and a node over its share ends connections after their
current message (`keep`) until it is within it. For `SETTLE` seconds after Redis answers again,
rates too keep to the share of the nodes known before (a Redis back empty has not yet seen the
others beat), and every node goes back to Redis's schedule at one moment: the first worker
back sets it in Redis (`_BACK`), those back within `SETTLE` take it. No slot of the share is
handed out past that moment (a request that would get one waits for it and books in Redis):
Redis does not know them, and would give the same time to the nodes already back. So the
cluster stays within its limits through both changes, as the sum of the shares is within them. A schedule does not
restart from scratch either way: slots a worker booked in one mode are not given again in the
other (`_horizon`). No Redis call on the delivery path is made without a timeout, and no
Redis error fails or holds up a delivery: the answer then comes from the node's share.

Calls given up on. A Redis that hangs (stopped, not gone) runs, when it comes back, every call
it had read meanwhile, those whose worker gave up on them long before too: they would take
leases no connection holds, or put back those of connections closed since, and the limit would
have no room for the connections open. So a lease call or heartbeat carries a deadline on
Redis's clock (`_deadline`, learnt from Redis's answers) past which the script refuses it; and
the first heartbeat after a call was given up on sweeps the leases of this worker that no
connection of it holds (one run just before its deadline, whose answer came too late). A stale
`_RESERVE` only books slots no one sends (the cluster keeps under its rate a moment); a stale
release removes a lease already gone.

Every node's connections are counted in its own table too (`pigeon.shaping.table`), against
the whole limit while Redis answers: that count is what the share is checked against in a
fallback.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from pigeon.redaction import redact, redact_url
from pigeon.shaping.gcra import Rate
from pigeon.shaping.table import Table
from pigeon.shaping.throttles import CLUSTER, FALLBACK, Hold, Throttles

_log = logging.getLogger(__name__)

BEAT: Final = 1.0  # seconds between heartbeats (lease renewals)
LEASE: Final = 5.0  # seconds a lease (and a node's heartbeat) lasts unless renewed
BLOCK_TIME: Final = 0.05  # a block holds what this much time of the worker's demand needs
STALE: Final = 0.05  # a booked slot not used within this many seconds is dropped
SETTLE: Final = 2 * BEAT  # after a change of mode, seconds in which no new connection opens
WANTED: Final = 1.5 * BEAT  # seconds a connection refused for a full limit counts as waiting
# Seconds a worker keeps its place in a full limit's line (`_ACQUIRE`) unless it asks again or
# its heartbeat says it still waits: two heartbeats, so a waiter does not lose its place
# between them, and a worker that stopped waiting (or died) holds back no free slot for long.
TICKET: Final = 2 * BEAT

# KEYS[1] the limit's TAT (µs, Redis's clock). ARGV: interval µs, burst, slots to book, µs from
# now before which none may go. Books the slots; returns the first one's time as µs from now
# (below 0 for the part of a burst that may go at once); slot j is that plus j intervals.
_RESERVE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local start = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now + tonumber(ARGV[4]))
local tat = start + interval * tonumber(ARGV[3])
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.floor((tat - now) / 1000) + 1000)
return string.format('%.0f', start - interval * (tonumber(ARGV[2]) - 1) - now)
"""

# The leases' epoch: a hash (`id`; `ready`, ms of Redis's clock before which no lease is taken)
# that lives as long as Redis keeps its data. Found gone by a caller whose leases were in an
# epoch (`known`), Redis has lost every lease (restarted without its data, flushed): a new
# epoch begins, in which no lease is taken for `settle` ms, while every holder puts its own back.
# Found gone by a caller that never saw one (a first start), it begins at once.
_EPOCH: Final = """
local function epoch_of(key, known, new, settle, now)
  local found = redis.call('HMGET', key, 'id', 'ready')
  if found[1] then return found[1], tonumber(found[2]) or 0 end
  local ready = now
  if known ~= '' then ready = now + settle end
  redis.call('HSET', key, 'id', new, 'ready', ready)
  return new, ready
end
"""

# KEYS[1] the limit's leases (member -> expiry, ms of Redis's clock), KEYS[2] their epoch,
# KEYS[3] the limit's demand (set while a caller finds it reached, not past), KEYS[4] its line
# of waiting workers (worker -> µs it joined: in ms, workers refused one after another tied,
# and the later was let in before the earlier), KEYS[5] their tickets (worker -> expiry ms).
# ARGV: limit, member, lease ms, the caller's epoch ('' none yet), a new epoch's id, SETTLE ms,
# the deadline (ms of Redis's clock, 0 none), ms a demand lasts, the caller's worker, ms a
# ticket lasts. {1, epoch, 0, now} if the member now holds a lease; {0, epoch, ms left, now}
# while the epoch is not ready, or the caller's own leases are not back in it (it has not
# beaten since); {0, epoch, 0, now} if the limit is reached, or the room left is for workers
# ahead of the caller in the line (which it joins, if one connection's end would let it in);
# {-1, '', 0, now} past the deadline (the caller gave up on it: see `_LATE`).
_ACQUIRE: Final = (
    _EPOCH
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[7])
if deadline > 0 and now > deadline then return {-1, '', 0, now} end
local epoch, ready = epoch_of(KEYS[2], ARGV[4], ARGV[5], tonumber(ARGV[6]), now)
if (ARGV[4] ~= '' and ARGV[4] ~= epoch) or ready > now then return {0, epoch, math.max(1, ready - now), now} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local count, limit, worker = redis.call('ZCARD', KEYS[1]), tonumber(ARGV[1]), ARGV[9]
-- Workers whose ticket ran out (they stopped asking, or died) leave the line.
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)) do redis.call('ZREM', KEYS[4], gone) end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
if count < limit then
  -- A free slot goes to the workers that waited for it first (none, unless the limit is full).
  local joined = redis.call('ZSCORE', KEYS[4], worker)
  local ahead = redis.call('ZCARD', KEYS[4])
  if joined then ahead = redis.call('ZCOUNT', KEYS[4], '-inf', '(' .. joined) end
  if ahead < limit - count then
    redis.call('ZREM', KEYS[4], worker)
    redis.call('ZREM', KEYS[5], worker)
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
    return {1, epoch, 0, now}
  end
end
if count <= limit then
  if count == limit then redis.call('SET', KEYS[3], '1', 'PX', tonumber(ARGV[8])) end
  local ticket = tonumber(ARGV[10])
  redis.call('ZADD', KEYS[4], 'NX', tonumber(t[1]) * 1000000 + tonumber(t[2]), worker)
  redis.call('ZADD', KEYS[5], now + ticket, worker)
  redis.call('PEXPIRE', KEYS[4], ticket)
  redis.call('PEXPIRE', KEYS[5], ticket)
else
  -- Past its limit (a lower one than the holders': a reaction's), it would stand first in
  -- a line it cannot leave, and hold back workers that one end lets in.
  redis.call('ZREM', KEYS[4], worker)
  redis.call('ZREM', KEYS[5], worker)
end
return {0, epoch, 0, now}
"""
)

# KEYS[1] the moment the cluster went back to Redis (ms, Redis's clock). ARGV: SETTLE in ms.
# Ms left until the cluster's rates are shared through Redis again: the first worker back
# after an outage sets the moment, those back within SETTLE of it take the same.
_BACK: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local settle = tonumber(ARGV[1])
local back = tonumber(redis.call('GET', KEYS[1]) or '0')
if back + settle <= now then
  back = now
  redis.call('SET', KEYS[1], tostring(back), 'PX', 2 * settle)
end
return back + settle - now
"""

# KEYS[1] the nodes hash (node -> expiry ms), KEYS[2] the leases' epoch, KEYS[3..2+n] the
# lease sets of the caller's n connections, then w demand keys (of `_ACQUIRE`), then q pairs of
# a line and its tickets (of `_ACQUIRE`) the caller waits in, then the lease sets to sweep.
# ARGV: node, lease ms, the caller's epoch ('' none yet), a new epoch's id, SETTLE ms, the
# deadline (ms of Redis's clock, 0 none), the prefix of the caller's members ('' for no sweep),
# the highest number of a member the caller had named (its members are the prefix and a
# number), n, w, q, the caller's worker (in the lines), ms a ticket lasts, then the member in
# each lease set and that set's limit, then members of lease calls on their way. First drops
# from the sets to sweep every member of the caller's numbered up to that highest that is not
# one of those (what a call it gave up on left behind; one named since is a lease call that may
# have run before this one, on another connection to Redis). Renews the node's heartbeat, the
# caller's tickets that have not run out, and every lease Redis has; puts back one it lost (or
# never had) only if the limit has room: {nodes with a heartbeat that has not run out, the
# epoch, ms before leases are taken in it, now, {1 or 0: whether each demand key is set}, then
# each member not put back};
# {-1, '', 0, now} past the deadline.
_BEAT: Final = (
    _EPOCH
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[6])
if deadline > 0 and now > deadline then return {-1, '', 0, now} end
local n, w, q, mine, named = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), ARGV[7], tonumber(ARGV[8])
if mine ~= '' then
  local held = {}
  for i = 1, n do held[ARGV[12 + 2 * i]] = true end
  for i = 14 + 2 * n, #ARGV do held[ARGV[i]] = true end
  for k = 3 + n + w + 2 * q, #KEYS do
    for _, member in ipairs(redis.call('ZRANGE', KEYS[k], 0, -1)) do
      if string.sub(member, 1, #mine) == mine and not held[member]
        and (tonumber(string.sub(member, #mine + 1)) or 0) <= named then
        redis.call('ZREM', KEYS[k], member)
      end
    end
  end
end
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], now + ttl)
redis.call('PEXPIRE', KEYS[1], 86400000)
local alive = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) <= now then redis.call('HDEL', KEYS[1], all[i]) else alive = alive + 1 end
end
local epoch, ready = epoch_of(KEYS[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), now)
local wanted = {}
for k = 3 + n, 2 + n + w do wanted[#wanted + 1] = redis.call('EXISTS', KEYS[k]) end
-- The caller still waits in these lines (refused of late): its tickets hold another while.
local worker, ticket = ARGV[12], tonumber(ARGV[13])
for k = 3 + n + w, 2 + n + w + 2 * q, 2 do
  if tonumber(redis.call('ZSCORE', KEYS[k + 1], worker) or '0') > now and redis.call('ZSCORE', KEYS[k], worker) then
    redis.call('ZADD', KEYS[k + 1], now + ticket, worker)
    redis.call('PEXPIRE', KEYS[k], ticket)
    redis.call('PEXPIRE', KEYS[k + 1], ticket)
  end
end
local over = {}
local answer = {alive, epoch, math.max(0, ready - now), now, wanted, over}
for i = 3, 2 + n do
  local member, limit = ARGV[2 * i + 8], tonumber(ARGV[2 * i + 9])
  local held = tonumber(redis.call('ZSCORE', KEYS[i], member) or '0') > now
  if not held then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    held = redis.call('ZCARD', KEYS[i]) < limit
  end
  if held then
    redis.call('ZADD', KEYS[i], now + ttl, member)
    redis.call('PEXPIRE', KEYS[i], ttl)
    -- A limit lowered under the leases open (a reaction, a reload): the members beyond it,
    -- in the order of their names, end. Every node ranks alike, so just the excess ends.
    if redis.call('ZCARD', KEYS[i]) > limit then
      redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
      local members = redis.call('ZRANGE', KEYS[i], 0, -1)
      if #members > limit then
        table.sort(members)
        for rank = limit + 1, #members do
          if members[rank] == member then over[#over + 1] = member end
        end
      end
    end
  else
    answer[#answer + 1] = member
  end
end
return answer
"""
)


@dataclass(slots=True)
class _Block:
    """Slots of one key booked in Redis, handed out here: slot j is at `first + j * interval`
    (local clock), but never before `received`."""

    received: float
    first: float
    interval: float
    count: int
    taken: int = 0

    def take(self, now: float, wanted: int, *, fetched: bool = False) -> tuple[int, float]:
        """Up to `wanted` slots: how many, and the time of the last (0.0 for none). `fetched`:
        for a request that waited for this block, whose slots are not stale to it however
        long the event loop took to come back to it."""
        if not fetched and self.received < now - STALE:  # drop what is too old to use (see the module)
            fresh = math.ceil((now - STALE - self.first) / self.interval)
            self.taken = max(self.taken, min(self.count, fresh))
        got = min(wanted, self.count - self.taken)
        if not got:
            return 0, 0.0
        self.taken += got
        return got, max(self.received, self.first + (self.taken - 1) * self.interval)


def _recall(path: Path | None) -> int:
    """The number of nodes an earlier run last saw (1: none kept, or unreadable)."""
    try:
        return max(1, int(path.read_text())) if path is not None else 1
    except (OSError, ValueError):
        return 1


def _remember(path: Path | None, nodes: int) -> None:
    """Keep the number of nodes seen (a hint, not durable: a lost write only means 1 at start)."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}")
        temporary.write_text(f"{nodes}\n")
        temporary.replace(path)
    except OSError as error:
        _log.debug("cannot keep the node count in %s: %s", path, error)


class ClusterThrottles(Throttles):
    """Limits shared by every node through Redis (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        table: Table,
        node: str,
        worker: int = 0,
        prefix: str = "pigeon",
        timeout: float = 2.0,
        lease: float = LEASE,
        remembered: Path | None = None,
    ) -> None:
        """`lease`: seconds a lease and a heartbeat last (renewed every `BEAT`). `remembered`:
        a file keeping the number of nodes last seen, for a start while Redis is away."""
        super().__init__(table)
        self._remembered = remembered
        self._lease_ms = int(lease * 1000)
        self._timeout = timeout
        self.where = redact_url(url)
        self._node = node
        self._me = f"{node}:{worker}:{secrets.token_hex(4)}"  # this process: a restart is someone else
        self._prefix = f"{prefix}:throttle:" if prefix else "throttle:"
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            # One quick retry on a fresh connection (after a Redis restart the pooled ones are
            # dead); never on a timeout, which would double the wait of a delivery.
            retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 1, (RedisConnectionError,)),
        )
        self._reserve = self._redis.register_script(_RESERVE)
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._beat = self._redis.register_script(_BEAT)
        self._back = self._redis.register_script(_BACK)
        self._shared = True  # until Redis fails to answer
        self._settled_at = 0.0  # (table's clock) no new connection before, after a change of mode
        self.error = ""  # why not, while falling back
        # Nodes with a live heartbeat, as last seen: by an earlier run of this node when it
        # starts while Redis is away, or a node restarted then would take the whole limit.
        self.nodes = _recall(remembered)
        # (table's clock) until when `nodes` may not drop: a count Redis gives is only a floor
        # once every live node has had a full lease to beat, since the largest count and since
        # Redis answered again (one back empty, or after a hang, counts only those beaten since).
        self._nodes_until = 0.0
        self._returning_nodes = 1  # the share rates keep to just after Redis answers again ...
        self._rates_settled_at = 0.0  # ... until then (table's clock): the same moment on every node
        self.calls = 0  # Redis round trips
        self.errors = 0  # of which failed
        self._named = 0  # the number of the last member named (members: `_me`, then the number)
        self._holds: dict[str, Hold] = {}  # member: every connection open, shared or not
        self._epoch = ""  # of the leases in Redis this worker's are in ("": none seen yet)
        self._limits: dict[str, int] = {}  # key: the connection limit last asked with
        self._unleased: set[str] = set()  # members whose lease Redis lost and had no room for again
        self._blocks: dict[str, _Block] = {}
        self._fetching: dict[str, asyncio.Task[None]] = {}
        # key: (since when, slots taken since, slots a second in the window before)
        self._demand: dict[str, tuple[float, int, float]] = {}
        self._horizon: dict[str, float] = {}  # key: the last slot handed out (table's clock)
        self._over: set[str] = set()  # members the last heartbeat found over a lowered limit
        self._beating: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Task[Any]] = set()
        self._closing = False
        # Redis's clock (s) less the local monotonic one, at least: the largest of what answers
        # of the last minute said (each is behind by the time it took; None before the first).
        self._offset: float | None = None
        self._offsets: collections.deque[tuple[float, float]] = collections.deque()  # (when, offset)
        self._acquiring: set[str] = set()  # members of lease calls on their way
        self._wanted: dict[str, float] = {}  # key: until when (table's clock) another waits for it
        self._waiting: dict[str, float] = {}  # key: until when (table's clock) this worker waits for it
        self._gave_up = 0  # calls given up on (a timeout, an error, a cancel) ...
        self._swept = 0  # ... of which a heartbeat has since swept what they may have left

    @property
    def mode(self) -> str:
        return CLUSTER if self._shared else FALLBACK

    # --- life ------------------------------------------------------------------------------------
    async def start(self) -> None:
        """One heartbeat (to learn how many nodes share the limits), then one every `BEAT`."""
        # (The count an earlier run saw holds for a lease: a Redis just back counts only some.)
        self._nodes_until = self.table.now() + self._lease_ms / 1000
        await self._heartbeat()
        self._beating = asyncio.create_task(self._beat_forever(), name="throttle heartbeat")

    async def close(self) -> None:
        self._closing = True
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(BaseException):
                await self._beating
        for task in list(self._fetching.values()):
            task.cancel()
        if self._releases:
            await asyncio.wait(self._releases, timeout=1.0)
        await self._redis.aclose()
        await super().close()

    async def _beat_forever(self) -> None:
        # Not `while True`: see RedisArbiter._beat_forever (a cancel redis-py may swallow).
        while not self._closing:
            await asyncio.sleep(BEAT)
            try:
                await self._heartbeat()
            except Exception:  # a bug here must not stop the heartbeat for good
                _log.exception("throttle heartbeat to Redis at %s", self.where)

    async def _heartbeat(self) -> None:
        for _ in range(2):  # (once more if Redis's clock moved: see `_deadline`)
            holds = list(self._holds.values())
            gave_up = self._gave_up
            # After a call given up on (it may still run, as Redis runs what it had read when it
            # hung), sweep what it may have left: leases of this worker no connection holds.
            sweep = sorted(self._limits) if self._swept < gave_up else []
            wants = sorted({hold.key for hold in holds})  # (is another waiting for one of these limits?)
            now = self.table.now()
            waiting = sorted(key for key, until in self._waiting.items() if until > now)  # (a place in their line)
            self._waiting = {key: self._waiting[key] for key in waiting}
            keys = [self._key("nodes"), self._key("epoch"), *(self._key("conn:" + hold.key) for hold in holds)]
            keys += [self._key("want:" + key) for key in wants]
            for key in waiting:
                keys += [self._key("line:" + key), self._key("ticket:" + key)]
            keys += [self._key("conn:" + key) for key in sweep]
            args: list[str | int] = [self._node, self._lease_ms, self._epoch, secrets.token_hex(8), int(SETTLE * 1000)]
            # A lease call sent after these are built may run first, on another of the pool's
            # connections: the sweep spares members named after them.
            args += [self._deadline(), f"{self._me}:" if sweep else "", self._named, len(holds), len(wants)]
            args += [len(waiting), self._me, int(TICKET * 1000)]
            for hold in holds:
                args += [hold.member, self._limits.get(hold.key, 1)]
            if sweep:
                args += sorted(self._acquiring)  # (spared by the sweep, not renewed)
            try:
                answer: Any = await self._call(self._beat(keys=keys, args=args))
            except _Unavailable as error:
                self._fall_back(str(error))
                return
            if int(answer[0]) >= 0:
                break
            self._sync(answer[3], late=True)
        else:
            # Late twice, the clock learnt again in between: not a clock that jumped but a way
            # to Redis slower than the deadline allows, on which every lease call would be
            # refused too (no connection could open). Counted as a Redis that does not answer:
            # this node keeps to its share until a heartbeat comes back in time.
            self._fall_back(
                f"too slow: its answers come later than 3/4 of [redis] timeout ({0.75 * self._timeout:g} s), "
                "when a lease call is refused; raise [redis] timeout"
            )
            return
        nodes, epoch, left, redis_now, wanted, over, *lost = answer
        self._sync(redis_now)
        until = self.table.now() + WANTED
        self._wanted = {key: until for key, flag in zip(wants, wanted, strict=True) if int(flag)}
        self._swept = max(self._swept, gave_up)
        self._over = {member.decode() for member in over}
        for hold in holds:
            if hold.member not in self._holds:
                # Closed while the heartbeat was on its way (which put its lease back): release.
                self._send_release(hold)
        self._put_back(epoch.decode(), int(left), [member.decode() for member in lost])
        seen = max(1, int(nodes))
        before = self.nodes
        if not self._shared:
            # Back from a fallback: until every node has seen Redis again (SETTLE), rates keep
            # to the share of the nodes known before, as the others may still keep to theirs
            # (a Redis that came back empty counts only those that have beaten since). Every
            # node goes back to Redis's schedule at one moment, the first one back's + SETTLE:
            # one back later, still on its share while the others took the whole rate from
            # Redis, would add its share to the rate.
            try:
                left = await self._call(self._back(keys=[self._key("back")], args=[int(SETTLE * 1000)]))
            except _Unavailable as error:
                self._fall_back(str(error))
                return
            self._rates_settled_at = self.table.now() + int(left) / 1000  # type: ignore[call-overload]
            self._returning_nodes = max(self.nodes, seen)
        self._count(seen, returning=not self._shared)
        if not self._shared:
            if seen >= self.nodes:
                known = f"{seen} node{'' if seen == 1 else 's'} seen"
            else:  # (Redis back empty, or after a hang, has seen only those that beat since)
                known = (f"{seen} node{' has' if seen == 1 else 's have'} beaten since, of {before} seen before; "
                         f"a share counts {self.nodes} nodes until the others have had {self._lease_ms / 1000:g} s "
                         "to beat")  # fmt: skip
            _log.warning("Redis at %s answers again: limits are shared by the cluster again (%s)", self.where, known)
            self._shared, self.error = True, ""
            self._settled_at = self.table.now() + SETTLE

    def _count(self, seen: int, *, returning: bool) -> None:
        """`nodes`, the divisor of a share, from `seen`, the nodes whose heartbeat Redis has now:
        never below the largest count of the last lease, nor below the count known before an
        outage until a lease after Redis answers again. A node that hangs again (Redis back for
        a moment) keeps to the share of every node that may still hold its own, not of those
        an empty Redis has seen since: the sum of the shares stays within each limit."""
        now = self.table.now()
        lease = self._lease_ms / 1000
        if returning:
            self._nodes_until = max(self._nodes_until, now + lease)
        if seen >= self.nodes:
            self._nodes_until = max(self._nodes_until, now + lease)
        elif now < self._nodes_until:
            return  # fewer seen: the others may not have beaten yet
        else:
            self._nodes_until = now + lease
        if seen != self.nodes:
            _remember(self._remembered, seen)
        self.nodes = seen

    def _put_back(self, epoch: str, left: int, lost: list[str]) -> None:
        """After a heartbeat: the leases' epoch (another than this worker's: Redis lost every
        lease since, and no new connection opens for `left` ms, while every node puts its own
        back), and the connections whose lease Redis lost and had no room for again."""
        if self._epoch and epoch != self._epoch:
            _log.warning("Redis at %s lost the connection leases (restarted without its data?): no new connection "
                         "opens for %.1f s while every node puts back those of its open connections",
                         self.where, left / 1000)  # fmt: skip
        self._epoch = epoch
        if left > 0:
            self._settled_at = max(self._settled_at, self.table.now() + left / 1000)
        for member in lost:
            if self._holds.pop(member, None) is not None:
                # Others took the limit meanwhile (a node that noticed the loss late): this
                # connection ends after its message, as one over the share does in a fallback.
                self._unleased.add(member)
        if lost:
            _log.warning("Redis at %s had lost the lease of %d open connection%s, and the limit has no room for %s "
                         "again: %s after %s message", self.where, len(lost), "" if len(lost) == 1 else "s",
                         "it" if len(lost) == 1 else "them", "it ends" if len(lost) == 1 else "they end",
                         "its" if len(lost) == 1 else "their")  # fmt: skip

    def _fall_back(self, error: str) -> None:
        if self._shared:
            _log.warning("Redis at %s does not answer (%s): this node keeps to its share (1/%d) of every limit",
                         self.where, error, self.nodes)  # fmt: skip
            self._shared = False
            self._blocks.clear()  # their slots stay booked (`_horizon`); new ones come from the share
            self._settled_at = self.table.now() + SETTLE
        self.error = error

    async def _call(self, call: Any) -> object:
        self.calls += 1
        try:
            return await call
        except (RedisError, OSError) as error:
            self.errors += 1
            self._gave_up += 1
            raise _Unavailable(redact(str(error)) or type(error).__name__) from error

    def _deadline(self) -> int:
        """The moment (ms of Redis's clock) past which a lease or heartbeat call sent now is
        refused: a Redis that hangs runs, when it comes back, every call it had read, those this
        worker gave up on long before too, and they would take leases no connection holds (or
        put back those of connections closed since). Three quarters of the timeout from now, so
        that an answer is back before this worker gives up; 0 (none) before Redis's clock is known.
        Redis's clock is learnt from its answers, so a clock that differs between the machines
        does not matter; one that jumps ahead has a call refused once, and learnt again."""
        if self._offset is None:
            return 0
        return int((time.monotonic() + self._offset + 0.75 * self._timeout) * 1000)

    def _sync(self, redis_now: object, *, late: bool = False) -> None:
        """Learn Redis's clock from an answer (its `now`, ms). The largest offset of the last
        minute is the closest (each answer is behind by its way back; and the clocks drift); a
        refusal for lateness says Redis's clock jumped ahead: it is taken as it is."""
        local = time.monotonic()
        offset = int(redis_now) / 1000 - local  # type: ignore[call-overload]
        offsets = self._offsets
        if late:
            offsets.clear()
        while offsets and (offsets[-1][1] <= offset or offsets[0][0] < local - 60):
            if offsets[-1][1] <= offset:
                offsets.pop()  # (never the largest again: a newer one is as large)
            else:
                offsets.popleft()
        offsets.append((local, offset))
        self._offset = offsets[0][1]

    def _key(self, name: str) -> str:
        return self._prefix + name

    # --- connections -------------------------------------------------------------------------------
    def share(self, limit: int) -> int:
        """This node's share of a connection limit while Redis does not answer."""
        return max(1, limit // self.nodes)

    async def connect(self, key: str, limit: int) -> Hold | None:
        if self._settled_at and self.table.now() < self._settled_at:
            # Just after a change of mode, other nodes may not have seen it yet: a node still
            # counting in Redis, or one just back whose peers' leases are not yet put back,
            # would count wrong. Open connections go on; new ones wait for the others.
            return None
        self._limits[key] = limit
        if not self._shared:
            if self.table.acquire(key, self.share(limit)):
                return self._hold(key)
            self._refused(key)
            return None
        if not self.table.acquire(key, limit):
            self._refused(key)  # (the node holds the whole limit: Redis is not asked)
            return None
        hold = Hold(key, self._name(), self.table.now())
        keys = [self._key("conn:" + key), self._key("epoch"), self._key("want:" + key)]
        keys += [self._key("line:" + key), self._key("ticket:" + key)]
        # (The member names a new epoch, should Redis have none: it is unique.)
        args: list[str | int] = [limit, hold.member, self._lease_ms, self._epoch, hold.member, int(SETTLE * 1000)]
        args += [self._deadline(), int(WANTED * 1000), self._me, int(TICKET * 1000)]
        self._acquiring.add(hold.member)
        try:
            answer: Any = await self._call(self._acquire(keys=keys, args=args))
        except _Unavailable as error:
            # Fallen back just now: settling like any change of mode (another node may hold
            # more than its share until it notices, too).
            self._fall_back(str(error))
            self.table.release(key)
            return None
        except BaseException:  # cancelled (a stop): the next heartbeat sweeps a lease it may have got
            self._gave_up += 1
            self.table.release(key)
            raise
        finally:
            self._acquiring.discard(hold.member)
        leased, epoch, left, redis_now = answer
        self._sync(redis_now, late=leased == -1)
        if leased == -1:  # (Redis's clock moved: `_deadline`)
            self.table.release(key)
            return None
        if not self._epoch:
            self._epoch = epoch.decode()  # (no heartbeat yet: it holds no lease of an earlier epoch)
        if leased != 1:
            self.table.release(key)
            if left:
                # Redis lost the leases: none is taken until every node has put its own back
                # (this worker's heartbeat puts back its own, and says the epoch's ready time).
                self._settled_at = max(self._settled_at, self.table.now() + int(left) / 1000)
            else:
                self._waiting[key] = self.table.now() + WANTED  # (in the limit's line: `_heartbeat`)
            return None
        self._waiting.pop(key, None)  # (Redis took it out of the line)
        self._holds[hold.member] = hold
        return hold

    def _refused(self, key: str) -> None:
        """Also: this worker still waits, and keeps its place in the key's line in Redis (the
        heartbeat renews its ticket) while the node's own connections hold the whole limit
        and Redis is not asked: a worker refused by its node's table keeps the place it took
        when Redis refused it, and is let in before those that came after."""
        super()._refused(key)
        self._waiting[key] = self.table.now() + WANTED

    def crowded(self, key: str, limit: int) -> bool:
        """Also when another worker or node was refused a connection for `key` since the last
        heartbeat but one (`_ACQUIRE` notes it, the heartbeat reads it): the limit is full
        cluster-wide, and an idle connection here makes room for it. While Redis is away, full
        is at this node's share."""
        if not self._shared:
            return self.table.held(key) >= self.share(limit)
        return self.table.held(key) >= limit or self._wanted.get(key, 0.0) > self.table.now()

    def _name(self) -> str:
        self._named += 1
        return f"{self._me}:{self._named}"

    def _hold(self, key: str) -> Hold:
        hold = Hold(key, self._name(), self.table.now())
        self._holds[hold.member] = hold
        return hold

    def keep(self, hold: Hold, limit: int) -> bool:
        """Also false for a connection the heartbeat found over a limit lowered cluster-wide
        (`_BEAT` names the members beyond it, the same ones whichever node asks), and, while
        Redis does not answer, for one over this node's share."""
        self._limits[hold.key] = limit
        if hold.member in self._unleased:
            return False  # its lease was lost, and others hold the whole limit now (`_put_back`)
        if self._shared:
            if hold.member in self._over:
                return False
            # Another worker or node was refused for the full limit (Redis says, at the
            # heartbeat), or a lane of this node was (`_yields` asks the table).
            return not self._yields(hold, self._wanted.get(hold.key, 0.0) > self.table.now())
        # Fallen back with more connections than this node's share: as many as it must end
        # after their message (they count until closed: no new one opens meanwhile).
        return self._within(hold, self.share(limit)) and not self._yields(hold)

    def disconnect(self, hold: Hold) -> None:
        super().disconnect(hold)
        self._unleased.discard(hold.member)
        if self._holds.pop(hold.member, None) is None or not self._shared:
            return  # (a lease Redis may still have runs out by itself, or the heartbeat sweeps)
        self._send_release(hold)

    def _send_release(self, hold: Hold) -> None:
        task = asyncio.create_task(self._release(hold), name="throttle release")
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, hold: Hold) -> None:
        with contextlib.suppress(_Unavailable):
            await self._call(self._redis.zrem(self._key("conn:" + hold.key), hold.member))

    # --- rates -------------------------------------------------------------------------------------
    async def admit(self, key: str, rate: Rate, count: int) -> float:
        table = self.table
        last = 0.0  # the time (table's clock) of the last slot handed out for this request
        fetched = False  # whether this request waited for a block
        while True:
            switch = self._rates_settled_at
            returning = self._shared and table.now() < switch
            if not self._shared or returning:
                nodes = self._returning_nodes if returning else self.nodes
                share = Rate(rate.per_second / nodes, max(1, rate.burst // nodes))
                # Not before one of the share's intervals after the last slot handed out, Redis's
                # included: else the share's first slot went at once, on top of those (found from
                # outside: 15 in the second a Redis outage began, for 10/s over three nodes).
                horizon = self._horizon.get(key)
                not_before = horizon + share.interval if horizon is not None else 0.0
                wait = table.reserve(key, share, count, not_before)
                now = table.now()
                if returning and now + wait > switch:
                    # A slot of the share after the switch back to Redis, which does not know
                    # it, would go with the whole rate other nodes take from Redis then: the
                    # request waits for the switch and books there (the slot is left unused).
                    await asyncio.sleep(switch - now)
                    continue
                last = max(last, now + wait)
                self._horizon[key] = max(self._horizon.get(key, 0.0), now + wait)
                return max(0.0, last - now)
            block = self._blocks.get(key)
            if block is not None:
                got, at = block.take(table.now(), count, fetched=fetched)
                if got:
                    count -= got
                    last = max(last, at)
                    since, taken, before = self._demand.get(key, (table.now(), 0, 0.0))
                    self._demand[key] = (since, taken + got, before)
                    if not count:
                        self._horizon[key] = max(self._horizon.get(key, 0.0), last)
                        return max(0.0, last - table.now())
            fetching = self._fetching.get(key)
            # (A fetch done but not yet forgotten would be awaited without a pause, for ever.)
            if fetching is None or fetching.done():
                fetching = asyncio.create_task(self._fetch(key, rate, count), name="throttle reserve")
                self._fetching[key] = fetching
                fetching.add_done_callback(lambda done: self._forget_fetch(key, done))
            await asyncio.shield(fetching)
            fetched = True

    def _forget_fetch(self, key: str, done: asyncio.Task[None]) -> None:
        if self._fetching.get(key) is done:
            del self._fetching[key]

    async def _fetch(self, key: str, rate: Rate, wanted: int) -> None:
        """Book the next block of `key`'s slots in Redis (see the module)."""
        table = self.table
        now = table.now()
        # Demand: slots a second handed out since the window began (at least 1 ms ago, at most
        # 4 blocks' time, then a new window), or in the window before if more: a worker that
        # starts sending fast gets big blocks at once, and a new window does not start small.
        since, taken, before = self._demand.get(key, (now, 0, 0.0))
        demand = max(taken / max(now - since, 0.001), before)
        if now - since >= 4 * BLOCK_TIME:  # a new window, remembering this one's rate
            self._demand[key] = (now, 0, taken / (now - since))
        size = max(wanted, min(math.ceil(demand * BLOCK_TIME), math.ceil(rate.per_second * BLOCK_TIME)))
        interval_us = rate.interval * 1e6
        after_us = max(0.0, self._horizon.get(key, 0.0) - now) * 1e6
        args: list[str | int] = [f"{interval_us:.3f}", rate.burst, size, f"{after_us:.0f}"]
        try:
            first = await self._call(self._reserve(keys=[self._key("rate:" + key)], args=args))
        except _Unavailable as error:
            self._fall_back(str(error))
            return
        received = table.now()
        offset = int(first) / 1e6  # type: ignore[call-overload]
        self._blocks[key] = _Block(received, received + offset, rate.interval, size)

    def health(self) -> dict[str, Any]:
        health: dict[str, Any] = {"status": "ok" if self._shared else "degraded", "mode": self.mode,
                                  "nodes": self.nodes}  # fmt: skip
        if not self._shared:
            health["error"] = f"Redis at {self.where}: {self.error}; each limit is cut to this node's share"
        return health


class _Unavailable(Exception):
    """Redis did not answer (in time)."""
