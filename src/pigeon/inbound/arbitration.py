"""Claims on inbound messages, so that of N nodes watching one mailbox one hands each over.

A claim key names the message at its source: mailbox identity, UIDVALIDITY and UID (a
Message-ID is forgeable and may be missing; mail_room keyed on the UID alone, so two
mailboxes collided). Its value says where the message stands:

    c:<token>.<k>:<n>  claimed by the node <token>, whose attempt n+1 this is (lease: PX)
    b:<n>:<due ms>     n attempts failed; nobody may try again before <due> (Redis clock)
    b:<n>:<due>:<tok>  ... of a message taken over from the dead node <tok> (see below)
    d:<token>          the target accepted it; only the source's acknowledgement may be missing
    f:<token>          the target refused it for good

Claiming is `SET key c:... NX PX lease` done in a script, so that a key in backoff whose time
has come can be claimed in the same step and the attempt count survives. Renewing, marking
done, failed or in backoff, and releasing all compare the value with the holder's own first
(compare-and-set), so a holder whose lease expired can never overwrite a new owner. A renewal
that finds the key gone (Redis restarted empty) puts the claim back; so does a holder's done mark
on what it has not acknowledged at the source yet (`restore_done`). Each script takes a
whole batch of keys and decides for each exactly as it would alone: one call per batch, not
one per message, which was most of the CPU a node spent per message.

Liveness. Each node (each process: a restarted node is someone else) keeps a heartbeat in
the hash `inbound:nodes`: its token, and when its heartbeat runs out (Redis clock), renewed
every `BEAT` seconds for `BEAT_TTL`. The claim script looks the holder of a claim up there:
a claim whose holder's heartbeat ran out is taken over at once, in the same atomic step,
instead of waiting out the lease; a live holder, however slow, keeps its claim for the whole
lease, as long as its heartbeat goes on. So a node killed with kill -9 gives its messages up
within `BEAT_TTL` (5 s), and so does one stopped (SIGSTOP) or starved that long: it counts as
dead, and what it had in flight may be handed over again (the taker's records say
`taken_over_from`: `Claim.previous`; the holder, if it was alive after all, finds it taken over
when it settles the claim: `Claim.taken_by`, which the mailbox logs and records). The dead
node's token stays with the message until it is handed over: a failed attempt's backoff, and
a claim given back untried, keep it (`b:...:<tok>`), so whoever tries it next, this node or
another, records `taken_over_from` too (`Claim.carried`: no new takeover to log). A
done mark whose node died is taken over the same way (`Standing.ORPHANED`): that node may
have died between the handoff and the acknowledgement, so the taker acknowledges the message
and records the handoff on its behalf. Tokens start with "h"; a value with another token
(a node of an earlier version, without heartbeat) only expires with its lease.

Names. A token tells an operator nothing, so each heartbeat also writes the node's `[node]
name` to the hash `inbound:names` (same script: no round trip of its own), and the claim
script, when it takes a claim or done mark over, and only then, reads the dead node's name in
the same step. A name is kept `DONE_TTL` past its node's last heartbeat (as long as a done mark
of that node can be found), then forgotten by the sweep that forgets dead heartbeats, or with
the whole hash if no node is left to sweep. A node of an earlier version publishes no name,
and is named by its token.

A holder must never go on handing over a message another node has taken over. Every claim
and renewal is sent behind a heartbeat, in the same pipeline, so the claim is verified while
its holder is known alive; from then on the holder trusts it only while its own heartbeat
cannot have lapsed (`holds`): up to 90% of `BEAT_TTL` after the last heartbeat it sent that
was answered, and only if no heartbeat since found the previous one run out (a pause longer
than that: a stalled event loop, SIGSTOP, a partition from Redis). After a lapse every claim
is verified again (renewed, with compare-and-set) before it is used; a claim taken over
meanwhile is then `lost`. Clocks: expiry is compared in Redis's clock only; a node measures
its own time with its monotonic clock, less 10% for rate differences.

Epoch. When Redis loses its data (a restart without persistence, a failover to a replica that
had not caught up) every claim, done mark and heartbeat is gone. The key `inbound:epoch` holds
when this Redis was first used by Pigeon (its clock): it is set again when missing, so a new
value means the data was lost. Every heartbeat reads (and if need be sets) it, so that first
use is the first heartbeat of any node, idle or not, and not the next mail's claim: the pause
then ends before mail that comes later, instead of starting with it. Every node stops claiming
until `grace` after that time:
long enough for every live holder to find its heartbeat gone (within `BEAT`), to put its
claims back at once, even after two failed attempts (2 timeouts), and a second's margin. So
neither a claim nor a takeover by liveness can grab a message that is in the middle of a
handoff. The rule holds for a node that starts with no epoch known, too: it asks for the epoch
before its first claim and pauses likewise, unless the epoch is older than `grace` (this Redis
has kept its data for longer than it takes holders to put back what it lost: nothing a live
holder had can still be missing). This is the "delayed restart" Redis's own locking guide
recommends, done by the clients.

Arbitration is an efficiency measure: it keeps N nodes from all handing over every message.
Exactly-once as the application sees it also needs the dedupe key (see `message`), because no
lease survives a Redis that loses its data while a handoff is under way.

With no Redis configured, `LocalArbiter` keeps the same states in memory: correct for one
node, and documented as single-node mode. Its done and failed marks are kept in a file of the
spool too (`pigeon.inbound.marks`), so that they outlive the process as Redis's do: a done mark
an earlier run of the node left (it stopped, or was killed, between the handoff and the source's
acknowledgement) is taken over as `Standing.ORPHANED`, as a dead node's is from Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pigeon.inbound.marks import MarkFile
from pigeon.redaction import redact, redact_url

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

_log = logging.getLogger(__name__)

# How long "done" and "failed" marks outlive the handoff, or the last claim that found them:
# a message whose acknowledgement the server refuses (and that it would not flag either) is
# found by every search, and its mark lasts while it does.
DONE_TTL: Final = 24 * 3600.0
BEAT: Final = 1.0  # seconds between a node's heartbeats
# `Claim.taken_by` when the node that took the claim over is not known any more (it failed its
# attempt since, leaving only a backoff): said as is, where a known one is "node <name>".
UNKNOWN_TAKER: Final = "another node"
BEAT_TTL: Final = 5.0  # a node whose heartbeat is this old is dead: its claims are taken over
_SWEEP_EVERY: Final = 60.0  # seconds between sweeps of dead nodes' heartbeats


class ArbitrationUnavailable(Exception):
    """Redis did not answer: claims pause (nothing is handed over without one)."""


class Standing(enum.Enum):
    CLAIMED = "claimed"  # ours now
    HELD = "held"  # another node holds it
    WAITING = "waiting"  # in backoff after a failed attempt
    DONE = "done"  # handed over already: acknowledge at the source if still there
    FAILED = "failed"  # refused for good: apply the failure action if still there
    ORPHANED = "orphaned"  # handed over by a node that died since: ours to acknowledge and record


@dataclass(slots=True)
class Claim:
    key: str
    uid: int
    standing: Standing
    value: str = ""  # what we wrote, for compare-and-set
    attempts: int = 0  # failed attempts before this one
    deadline: float = 0.0  # monotonic: past it, the lease may be someone else's
    lost: bool = False
    retry_in: float = 0.0  # WAITING: seconds until its backoff ends; HELD, DONE: until its node's heartbeat does
    previous: str = ""  # CLAIMED, ORPHANED: the dead node whose claim or done mark this was
    # CLAIMED: `previous` was taken over before, and came with the backoff of a failed attempt
    # (or a claim given back untried) since: its records say so, its takeover was logged then.
    carried: bool = False
    previous_name: str = ""  # ... its `[node] name` ("": it published none, as earlier versions did)
    holder: str = ""  # HELD, DONE: the live node holding or having settled it ("": one without heartbeat)
    lapses: int = 0  # the arbiter's lapse count when this claim was last verified (see `holds`)
    # Settled (done, say) after another node had taken it over, our heartbeat having run out
    # meanwhile: that node, as logs name it (its name with its token, or the token), or
    # UNKNOWN_TAKER.
    taken_by: str = ""
    # Marking it done (or failed, or in backoff) did not reach Redis: whether another node took
    # it over meanwhile cannot be told from here.
    unsettled: bool = False

    @property
    def taken_over_from(self) -> str:
        """CLAIMED: the dead node this claim was taken over from, now or before a backoff ("":
        none), which may have handed the message over already; what its records say."""
        return self.previous if self.standing is Standing.CLAIMED else ""

    @property
    def previous_node(self) -> str:
        """The dead node as logs name it: its name with its token (the name alone may be shared
        by its restarts; the token is what the records' `recovered_from` and `taken_over_from` say), or
        the token."""
        return f"{self.previous_name} (token {self.previous})" if self.previous_name else self.previous


# KEYS[1] the epoch key. Redis's birth time as Pigeon knows it (set when missing: first use, or
# a Redis that lost its data), and Redis's clock.
_EPOCH: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local born = redis.call('GET', KEYS[1])
if not born then redis.call('SET', KEYS[1], now) born = now end
return {tostring(born), tostring(now)}
"""

# KEYS[1] the nodes hash, KEYS[2] the names hash; ARGV: token, ms the heartbeat lasts, the
# node's name ('': none), ms the name is kept past the heartbeat. Returns two numbers: 1 if the
# node's previous heartbeat had run out (or Redis lost it), claims verified before may have been
# taken over (else 0); and how many nodes' heartbeats run (this one's included: `live`). The name
# is written with every heartbeat (no round trip of its own): "<keep until>:<name>".
_BEAT: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local runs_out = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], runs_out)
redis.call('PEXPIRE', KEYS[1], 86400000)
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[1], string.format('%d', runs_out + tonumber(ARGV[4])) .. ':' .. ARGV[3])
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + tonumber(ARGV[4]))
end
local live = 0
local beats = redis.call('HVALS', KEYS[1])
for i = 1, #beats do
  if tonumber(beats[i]) > now then live = live + 1 end
end
return {last <= now and 1 or 0, live}
"""

# KEYS[1] the nodes hash, KEYS[2] the names hash. Forgets the heartbeats that ran out (nodes
# that stopped), and the names kept past theirs for as long as they could be asked for.
_SWEEP: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) <= now then redis.call('HDEL', KEYS[1], all[i]) end
end
local names = redis.call('HGETALL', KEYS[2])
for i = 1, #names, 2 do
  if (tonumber(string.match(names[i + 1], '^(%d+):') or '0')) <= now then redis.call('HDEL', KEYS[2], names[i]) end
end
return 0
"""

# KEYS[1] epoch key, KEYS[2] nodes hash, KEYS[3] names hash, KEYS[4..] the claim keys; ARGV:
# the caller's token, the number of its first claim here (the claim on KEYS[i] is
# <token>.<number + i - 4>), lease ms, the epoch the caller knows ('' for none), ms a done mark
# lasts. For each claim key, six values in a row: the standing, the attempt count, ms (until a
# backoff ends, or until the holder's heartbeat runs out), a node: the dead one a claim or done
# mark was taken from (now, or before a backoff that kept its token), or the live one holding or
# having settled it, the dead one's name ('' if it published none, or when the takeover was
# before the backoff), and '1' when the dead one came with a backoff ('' otherwise). A caller
# that knew another epoch is refused ("paused", for all of them): Redis lost its claims, and
# holders must first have time to put theirs back. A claim or done mark whose node's heartbeat
# ran out is taken over at once; only then is a name looked up. A done or failed mark found
# (its message still searched for) lasts that long again. A backoff that names a dead node
# (`b:<n>:<due>:<token>`) comes back claimed with that node, which the records name.
_CLAIM: Final = """
if ARGV[4] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[4] then return 'paused' end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first = tonumber(ARGV[2])
local function name_of(node)
  local named = redis.call('HGET', KEYS[3], node)
  return named and string.match(named, '^%d+:(.*)$') or ''
end
local function claim(key, nonce)
  local v = redis.call('GET', key)
  local attempts = 0
  local previous = ''
  if v then
    local kind = string.sub(v, 1, 1)
    if kind == 'b' then
      local n, due, was = string.match(v, '^b:(%d+):(%d+):(h%x+)$')
      if not n then
        n, due = string.match(v, '^b:(%d+):(%d+)$')
        was = ''
      end
      if now < tonumber(due) then return 'waiting', n, tostring(tonumber(due) - now), '', '', '' end
      attempts = tonumber(n)
      if was ~= '' then
        redis.call('SET', key, 'c:' .. nonce .. ':' .. attempts, 'PX', ARGV[3])
        return 'claimed', tostring(attempts), '', was, '', '1'
      end
    elseif kind == 'f' then
      redis.call('PEXPIRE', key, ARGV[5])
      return 'failed', '0', '', '', '', ''
    else
      local holder = string.match(v, '^[cd]:(h%x+)')
      local left = ''
      if holder then
        left = tonumber(redis.call('HGET', KEYS[2], holder) or '0') - now
        if left <= 0 then
          if kind == 'd' then
            redis.call('SET', key, 'd:' .. ARGV[1], 'PX', ARGV[5])
            return 'orphaned', '0', '', holder, name_of(holder), ''
          end
          attempts = tonumber(string.match(v, ':(%d+)$')) or 0
          previous = holder
        end
      end
      if previous == '' then
        if kind == 'd' then redis.call('PEXPIRE', key, ARGV[5]) end
        return (kind == 'd' and 'done' or 'held'), '0', tostring(left), holder or '', '', ''
      end
    end
  end
  redis.call('SET', key, 'c:' .. nonce .. ':' .. attempts, 'PX', ARGV[3])
  return 'claimed', tostring(attempts), '', previous, previous ~= '' and name_of(previous) or '', ''
end
local answers = {}
for i = 4, #KEYS do
  local nonce = ARGV[1] .. '.' .. string.format('%d', first + i - 4)
  local standing, attempts, ms, node, name, carried = claim(KEYS[i], nonce)
  answers[#answers + 1] = standing
  answers[#answers + 1] = attempts
  answers[#answers + 1] = ms
  answers[#answers + 1] = node
  answers[#answers + 1] = name
  answers[#answers + 1] = carried
end
return answers
"""

# KEYS: claim keys; ARGV[1] lease ms, ARGV[i + 1] our value for KEYS[i]. For each: 1 renewed
# (or put back after Redis lost it), 0 lost.
_RENEW: Final = """
local answers = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  local ours = ARGV[i + 1]
  if v == ours then answers[i] = redis.call('PEXPIRE', key, ARGV[1])
  elseif not v then redis.call('SET', key, ours, 'PX', ARGV[1]) answers[i] = 1
  else answers[i] = 0 end
end
return answers
"""

# KEYS[1] the names hash, KEYS[2..] claim keys; ARGV[1] ttl ms, then for KEYS[i] our value
# and its new value. Replaces each of our claims (or a vanished key). For each claim key, two
# values: '' and '' when it was ours, or, when another node took it over meanwhile, that node's
# token ('?' when its value names none: a backoff) and its name ('' if it published none).
_SETTLE: Final = """
local answers = {}
for i = 2, #KEYS do
  local key, ours, new = KEYS[i], ARGV[2 * i - 2], ARGV[2 * i - 1]
  local v = redis.call('GET', key)
  if v == ours or not v then
    redis.call('SET', key, new, 'PX', ARGV[1])
    answers[#answers + 1] = ''
    answers[#answers + 1] = ''
  else
    local node = string.match(v, '^[cdf]:(h%x+)') or '?'
    local named = redis.call('HGET', KEYS[1], node)
    answers[#answers + 1] = node
    answers[#answers + 1] = named and string.match(named, '^%d+:(.*)$') or ''
  end
end
return answers
"""

# KEYS: claim keys; ARGV: for KEYS[i] our value, the attempts made, and the dead node it was
# taken over from ('' for none). Gives the messages back untried, keeping the dead node's token
# (the next to try one records it: see the module).
_RELEASE: Final = """
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[3 * i - 2] then
    local attempts, was = ARGV[3 * i - 1], ARGV[3 * i]
    if attempts == '0' and was == '' then redis.call('DEL', key)
    elseif was == '' then redis.call('SET', key, 'b:' .. attempts .. ':0', 'PX', 86400000)
    else redis.call('SET', key, 'b:' .. attempts .. ':0:' .. was, 'PX', 86400000) end
  end
end
return 0
"""


class Arbiter:
    """Claims and their outcomes; `RedisArbiter` for a cluster, `LocalArbiter` for one node."""

    shared = False  # whether other nodes see these claims
    # Nodes whose heartbeats run (this one included), as the last heartbeat found them: what a
    # mailbox shares a backlog among (`MailboxWatcher._share`). One without shared claims.
    live = 1

    def __init__(self) -> None:
        # This process: a restarted node is someone else. "h": it keeps a heartbeat.
        self.token = "h" + secrets.token_hex(8)
        self._next_claim = 0
        self._lapse = asyncio.Event()
        self._down = asyncio.Event()

    def _numbers(self, count: int) -> int:
        """The first of `count` claim numbers: <token>.<number> is a token for one claim, so
        even this process's next claim on the same key differs, and a compare-and-set by a
        holder whose lease ran out cannot match it."""
        first, self._next_claim = self._next_claim, self._next_claim + count
        return first

    def nonce(self) -> str:
        """A token for one claim (see `_numbers`)."""
        return f"{self.token}.{self._numbers(1)}"

    def holds(self, claim: Claim) -> bool:
        """Whether `claim` is still ours: neither lost nor past its lease (nor, in a cluster,
        possibly taken over since because our heartbeat lapsed)."""
        return not claim.lost and claim.deadline > time.monotonic()

    def lapse_signal(self) -> asyncio.Event:
        """Set when our heartbeat was found to have lapsed: every claim in hand must be
        verified again (`renew`) before it is used."""
        return self._lapse

    def _lapsed(self) -> None:
        signal, self._lapse = self._lapse, asyncio.Event()
        signal.set()

    def outage(self) -> tuple[float, str] | None:
        """Since when (monotonic) and why the shared store has not answered, while it does
        not; None while it answers (or there is none to answer)."""
        return None

    def outage_signal(self) -> asyncio.Event:
        """Set when the shared store stops answering (a heartbeat found it gone, say): an
        idle mailbox wakes to say its claims are paused, not at its next poll."""
        return self._down

    def _went_down(self) -> None:
        signal, self._down = self._down, asyncio.Event()
        signal.set()

    async def ping(self) -> None:
        """Ask the shared store for an answer, as a claim would: raises ArbitrationUnavailable
        when it gives none. What an idle mailbox does to know claims would work."""

    def paused_for(self) -> float:
        """Seconds claims stay paused after the shared store lost its data (0 when not paused)."""
        return 0.0

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

    async def restore_done(self, claims: Sequence[Claim]) -> None:
        """Put back this node's done marks on `claims` (handed over, not yet acknowledged at
        the source) where the shared store lost them; one another node holds now is left to it.
        Nothing to do in memory (`LocalArbiter`), which loses nothing this process does not."""

    def acknowledged(self, keys: Sequence[str]) -> None:
        """The source has the acknowledgement of the messages of `keys` (or a keyword that keeps
        every search from them): their done marks need not outlive this process any more. (In
        Redis they serve the other nodes, whose searches may be older, until they expire.)"""

    def marks_lost(self) -> str | None:
        """Why this node's done marks would not outlive its process, so that the next start
        would hand over again what it handed over and did not acknowledge; None when they do."""
        return None

    async def close(self) -> None:
        pass

    def _claimed(self, key: str, uid: int, nonce: str, attempts: int, lease: float, started: float) -> Claim:
        value = f"c:{nonce}:{attempts}"
        # The lease started no later than our request did: count from there, less a margin
        # for clock rate differences.
        return Claim(key, uid, Standing.CLAIMED, value, attempts, started + lease * 0.9)


if TYPE_CHECKING:
    _Call = tuple[AsyncScript, str | list[str], list[str]]


class RedisArbiter(Arbiter):
    """Claims in one Redis, with node liveness and the epoch pause described above."""

    shared = True

    def __init__(self, url: str, *, prefix: str = "pigeon", timeout: float = 2.0, node: str = "") -> None:
        super().__init__()
        self.url = url
        self.node = node  # our `[node] name`, published with the heartbeat ("": none)
        self.where = redact_url(url)  # the URL as errors and logs show it: no password
        self.prefix = f"{prefix}:" if prefix else ""
        self._epoch_key = "inbound:epoch"
        self._nodes_key = "inbound:nodes"
        self._names_key = "inbound:names"
        self._epoch: str | None = None
        self._paused_until = 0.0  # monotonic
        self._timeout = timeout
        # Long enough for every live holder to put back what Redis lost (see the module).
        self.grace = BEAT + 2 * timeout + 1.0
        self._alive_until = 0.0  # monotonic: our heartbeat cannot have run out before this
        self._lapses = 0  # heartbeats that found the previous one run out
        self._beating: asyncio.Task[None] | None = None
        self._closing = False
        self._outage: tuple[float, str] | None = None  # (since, why) while Redis does not answer
        # Imported here, not with the module: a node without Redis arbitrates in memory
        # (`LocalArbiter`) and need not spend a tenth of a second on the Redis client.
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisError

        # What a call raises when Redis does not answer.
        self._unavailable: tuple[type[Exception], ...] = (RedisError, OSError)
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
        self._beat = self._redis.register_script(_BEAT)
        self._sweep = self._redis.register_script(_SWEEP)
        self._claim = self._redis.register_script(_CLAIM)
        self._renew = self._redis.register_script(_RENEW)
        self._settle = self._redis.register_script(_SETTLE)
        self._release = self._redis.register_script(_RELEASE)

    async def close(self) -> None:
        self._closing = True
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(BaseException):
                await self._beating
        # A node that stops says so: whatever claim it failed to give back is free at once.
        # (Its name stays, for whoever takes them over to log; the sweep forgets it later.)
        with contextlib.suppress(*self._unavailable):
            await self._redis.hdel(self.prefix + self._nodes_key, self.token)
        await self._redis.aclose()

    # --- liveness ----------------------------------------------------------------------------
    def holds(self, claim: Claim) -> bool:
        return super().holds(claim) and claim.lapses == self._lapses and time.monotonic() < self._alive_until

    def paused_for(self) -> float:
        return max(0.0, self._paused_until - time.monotonic())

    def _beat_calls(self) -> list[_Call]:
        """A heartbeat, with the epoch: the first use of a Redis that lost its data is whichever
        call reaches it first, most often a heartbeat of an idle node, and the pause must run
        from then (holders put their claims back from then), not from the next mail's claim."""
        args = [self.token, str(int(BEAT_TTL * 1000)), self.node, str(int(DONE_TTL * 1000))]
        return [(self._beat, [self._nodes_key, self._names_key], args), (self._epoch_script, [self._epoch_key], [])]

    def _beaten(self, answers: Sequence[object], sent: float) -> None:
        """A heartbeat sent at `sent` (monotonic) was answered (`answers`: those of `_beat_calls`)."""
        beat, epoch = answers
        assert isinstance(beat, list)
        lapsed, self.live = int(beat[0]), max(1, int(beat[1]))
        # Our first heartbeat finds none before it, and no claim was verified before it: not
        # a lapse (which would have every claim of the first batch renewed for nothing).
        if lapsed and self._alive_until:
            self._lapses += 1
            self._lapsed()
        self._alive_until = max(self._alive_until, sent + BEAT_TTL * 0.9)
        self._learn_epoch(epoch, sent)

    def _start_beating(self) -> None:
        if self._beating is None:
            self._beating = asyncio.create_task(self._beat_forever(), name="inbound heartbeat")

    async def _beat_forever(self) -> None:
        next_sweep = time.monotonic() + _SWEEP_EVERY
        # Not `while True`: a cancel can be lost inside redis-py on Python 3.11, whose
        # asyncio.wait_for returns the result instead of raising when the awaited write
        # finished just as the cancel came; close() would then wait for this loop forever.
        while not self._closing:
            await asyncio.sleep(BEAT)
            sent = time.monotonic()
            calls = self._beat_calls()
            if sent >= next_sweep:
                calls.append((self._sweep, [self._nodes_key, self._names_key], []))
                next_sweep = sent + _SWEEP_EVERY
            try:
                answers = await self._run(calls)
            except ArbitrationUnavailable:
                continue  # claims stop being ours (`holds`) when it runs out; then we verify them
            except Exception:  # a bug here must not stop the heartbeat for good
                _log.exception("inbound heartbeat to Redis at %s", self.where)
                continue
            self._beaten(answers[:2], sent)

    def outage(self) -> tuple[float, str] | None:
        return self._outage

    async def ping(self) -> None:
        """A heartbeat, now: an answer proves claims would be answered too. It also starts the
        heartbeats, which from then on notice an outage within a second."""
        self._start_beating()
        sent = time.monotonic()
        self._beaten(await self._run(self._beat_calls()), sent)

    # --- claims ------------------------------------------------------------------------------
    async def _run(self, calls: Sequence[_Call]) -> list[object]:
        if not calls:
            return []
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for script, key, args in calls:
                    keys = [key] if isinstance(key, str) else key
                    await script(keys=[self.prefix + k for k in keys], args=args, client=pipe)
                answers = list(await pipe.execute())
        except self._unavailable as error:
            why = f"Redis at {self.where}: {redact(str(error)) or type(error).__name__}"
            if self._outage is None:
                self._outage = (time.monotonic(), why)
                self._went_down()
            else:
                self._outage = (self._outage[0], why)
            raise ArbitrationUnavailable(why) from error
        self._outage = None
        return answers

    def _learn_epoch(self, answer: object, started: float) -> None:
        """Redis's epoch as the epoch script gave it: a new one (or the first this node sees)
        pauses claims until `grace` after it (nothing, when that is past)."""
        assert isinstance(answer, list)
        born, now = _text(answer[0]), int(_text(answer[1]))
        if born != self._epoch:
            pause = (int(born) + self.grace * 1000 - now) / 1000
            if pause > 0:
                self._paused_until = started + pause
                # A node that knew no epoch cannot tell a fresh Redis from one that lost its data.
                what = "lost its data" if self._epoch is not None else "may have lost its data"
                _log.warning("Redis at %s %s: pausing claims %.1fs so holders can put theirs back", self.where, what,
                             pause)  # fmt: skip
        self._epoch = born

    def _paused(self, keys: Sequence[tuple[str, int]]) -> list[Claim]:
        left = self.paused_for()
        return [Claim(key, uid, Standing.WAITING, retry_in=left) for key, uid in keys]

    async def claim(self, keys: Sequence[tuple[str, int]], lease: float) -> list[Claim]:
        self._start_beating()
        started = time.monotonic()
        if self._epoch is None:
            # Knowing no epoch, this node cannot tell whether Redis lost claims a moment ago:
            # it learns the epoch before it claims anything.
            (epoch,) = await self._run([(self._epoch_script, [self._epoch_key], [])])
            self._learn_epoch(epoch, started)
        if time.monotonic() < self._paused_until:
            return self._paused(keys)
        if not keys:
            return []
        lease_ms = str(max(1, int(lease * 1000)))
        first = self._numbers(len(keys))
        args = [self.token, str(first), lease_ms, self._epoch or "", str(int(DONE_TTL * 1000))]
        *beat, answer = await self._run(
            [
                *self._beat_calls(),
                (self._claim, [self._epoch_key, self._nodes_key, self._names_key, *(key for key, _ in keys)], args),
            ]
        )
        self._beaten(beat, started)
        if not isinstance(answer, list):  # "paused": we knew another epoch
            return self._paused(keys)
        parts = [_text(part) for part in answer]
        claims = []
        for number, (key, uid) in enumerate(keys):
            text, attempts, ms, previous, name, carried = parts[6 * number : 6 * number + 6]
            standing = Standing(text)
            if standing is Standing.CLAIMED:
                nonce = f"{self.token}.{first + number}"
                claim = self._claimed(key, uid, nonce, int(attempts), lease, started)
                claim.previous, claim.previous_name, claim.lapses = previous, name, self._lapses
                claim.carried = carried == "1"
            elif standing is Standing.ORPHANED:
                claim = Claim(key, uid, standing, f"d:{self.token}", previous=previous, previous_name=name)
            else:
                claim = Claim(key, uid, standing, attempts=int(attempts), retry_in=int(ms or 0) / 1000)
                if standing in (Standing.HELD, Standing.DONE):
                    claim.holder = previous
            claims.append(claim)
        return claims

    async def renew(self, claims: Sequence[Claim], lease: float) -> None:
        started = time.monotonic()
        lease_ms = str(max(1, int(lease * 1000)))
        calls = self._beat_calls()
        if claims:
            calls.append((self._renew, [c.key for c in claims], [lease_ms, *(c.value for c in claims)]))
        answered = await self._run(calls)
        self._beaten(answered[:2], started)
        answers = answered[2] if claims else []
        assert isinstance(answers, list)
        for claim, answer in zip(claims, answers, strict=True):
            if answer == 1:
                claim.deadline = started + lease * 0.9
                claim.lapses = self._lapses
            else:
                claim.lost = True

    async def _settle_all(self, changes: Sequence[tuple[Claim, str]]) -> None:
        """Each claim replaced by its new value, if it is still ours (or vanished); one another
        node took over meanwhile (our heartbeat ran out: see `Claim.taken_by`) is marked `lost`."""
        if not changes:
            return
        args = [str(int(DONE_TTL * 1000))]
        for claim, value in changes:
            args += (claim.value, value)
        (answer,) = await self._run([(self._settle, [self._names_key, *(c.key for c, _ in changes)], args)])
        assert isinstance(answer, list)
        parts = [_text(part) for part in answer]
        for number, (claim, _) in enumerate(changes):
            node, name = parts[2 * number : 2 * number + 2]
            if node:
                claim.lost = True
                claim.taken_by = f"{name} (token {node})" if name else node
                if node == "?":  # it failed its attempt since, and left only a backoff
                    claim.taken_by = UNKNOWN_TAKER

    async def _mark(self, claims: Sequence[Claim], kind: str) -> None:
        await self._settle_all([(c, f"{kind}:{self.token}") for c in claims])

    async def done(self, claims: Sequence[Claim]) -> None:
        await self._mark(claims, "d")

    async def failed(self, claims: Sequence[Claim]) -> None:
        await self._mark(claims, "f")

    async def backoff(self, claims: Sequence[tuple[Claim, float]]) -> None:
        # The due time is in the Redis clock's terms: TIME is read by the claim script, so it
        # is computed there from our clock only as an offset. Close enough for a retry delay;
        # clocks agreeing to a second is all it needs.
        now = time.time()
        await self._settle_all([(c, _backoff(c, now + delay)) for c, delay in claims])

    async def restore_done(self, claims: Sequence[Claim]) -> None:
        if not claims:
            return
        # The renewal script does it: a mark still ours lasts `DONE_TTL` again, a vanished one
        # is put back, another node's is left alone.
        args = [str(int(DONE_TTL * 1000)), *(f"d:{self.token}" for _ in claims)]
        await self._run([(self._renew, [c.key for c in claims], args)])

    async def release(self, claims: Sequence[Claim]) -> None:
        if not claims:
            return
        args: list[str] = []
        for claim in claims:
            args += (claim.value, str(claim.attempts), claim.taken_over_from)
        await self._run([(self._release, [c.key for c in claims], args)])


class LocalArbiter(Arbiter):
    """Single-node mode: the same states, in this process's memory. With `marks` (a file of
    the spool: `pigeon.inbound.marks`), done and failed marks are kept there too, and those an
    earlier run of this node left are found there: a done mark of such a run is taken over as
    `Standing.ORPHANED`, since that run handed the message over and stopped before the source
    took its acknowledgement (the mailbox acknowledges and records it, and hands nothing over)."""

    def __init__(self, marks: Path | None = None, *, node: str = "") -> None:
        super().__init__()
        self._values: dict[str, tuple[str, float]] = {}  # key: (value, expires, time.time())
        self._next_sweep = 0.0
        self._file: MarkFile | None = None
        self._lost: str | None = "they are kept in memory only"  # see `marks_lost`
        if marks is not None:
            try:
                self._file = MarkFile.open(marks, node)
            except OSError as error:
                self._lost = f"{marks} cannot be read or written: {error}"
                _log.error("inbound: %s; done marks are kept in memory only: a restart would hand over again what "
                           "was handed over and not acknowledged at the source", self._lost)  # fmt: skip
            else:
                self._lost = None
                self._values = {key: (value, until) for key, (value, until, _) in self._file.marks.items()}

    def marks_lost(self) -> str | None:
        if self._file is not None and self._file.error is not None:
            return f"{self._file.path} cannot be written: {self._file.error}"
        return self._lost

    def _get(self, key: str) -> str | None:
        hit = self._values.get(key)
        if hit is None:
            return None
        if hit[1] <= time.time():
            del self._values[key]
            return None
        return hit[0]

    def _set(self, key: str, value: str, ttl: float) -> float:
        """Set `key` for `ttl` seconds; returns when it expires (time.time())."""
        now = time.time()
        # Expired entries are swept once a minute, not on every write: a day of done marks
        # can be a million entries.
        if now >= self._next_sweep:
            self._values = {k: v for k, v in self._values.items() if v[1] > now}
            self._next_sweep = now + 60
        self._values[key] = (value, now + ttl)
        return now + ttl

    def _keep(self, changes: list[tuple[str, str, float]]) -> None:
        """Done and failed marks set (key, value, expiry), in the file too: one write."""
        if self._file is not None and changes:
            self._file.put(changes)

    async def claim(self, keys: Sequence[tuple[str, int]], lease: float) -> list[Claim]:
        started = time.monotonic()
        claims = []
        kept: list[tuple[str, str, float]] = []
        for key, uid in keys:
            value = self._get(key)
            attempts = 0
            previous = ""
            if value is not None:
                kind = value[0]
                if kind == "b":
                    _, n, due, *was = value.split(":")
                    remaining = int(due) / 1000 - time.time()
                    if remaining > 0:
                        claims.append(Claim(key, uid, Standing.WAITING, attempts=int(n), retry_in=remaining))
                        continue
                    attempts = int(n)
                    previous = was[0] if was else ""
                elif kind == "d" and value != f"d:{self.token}":
                    # Left by an earlier run of this node (in the file), which handed the message
                    # over and stopped before the source took the acknowledgement: ours now, to
                    # acknowledge and record, as a dead node's from Redis.
                    mark = self._file.marks.get(key) if self._file is not None else None
                    ours = f"d:{self.token}"
                    kept.append((key, ours, self._set(key, ours, DONE_TTL)))
                    claims.append(Claim(key, uid, Standing.ORPHANED, ours, previous=value[2:],
                                        previous_name=mark[2] if mark is not None else ""))  # fmt: skip
                    continue
                else:
                    standing = {"c": Standing.HELD, "d": Standing.DONE}.get(kind, Standing.FAILED)
                    if standing is not Standing.HELD:  # still there: kept as long again (see `DONE_TTL`)
                        until = self._set(key, value, DONE_TTL)
                        if self._file is not None and key in self._file.marks:
                            kept.append((key, value, until))
                    claims.append(Claim(key, uid, standing))
                    continue
            claim = self._claimed(key, uid, self.nonce(), attempts, lease, started)
            claim.previous, claim.carried = previous, bool(previous)
            self._set(key, claim.value, lease)
            claims.append(claim)
        self._keep(kept)
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

    def _replace(self, claim: Claim, value: str, ttl: float) -> float | None:
        """`claim`'s key set to `value` if it is still ours (or gone); when it expires, if set."""
        if self._get(claim.key) in (None, claim.value):
            return self._set(claim.key, value, ttl)
        return None

    def _mark(self, claims: Sequence[Claim], value: str) -> None:
        kept = []
        for claim in claims:
            until = self._replace(claim, value, DONE_TTL)
            if until is not None:
                kept.append((claim.key, value, until))
        self._keep(kept)

    async def done(self, claims: Sequence[Claim]) -> None:
        self._mark(claims, f"d:{self.token}")

    async def failed(self, claims: Sequence[Claim]) -> None:
        self._mark(claims, f"f:{self.token}")

    async def backoff(self, claims: Sequence[tuple[Claim, float]]) -> None:
        for claim, delay in claims:
            self._replace(claim, _backoff(claim, time.time() + delay), DONE_TTL)

    async def release(self, claims: Sequence[Claim]) -> None:
        for claim in claims:
            if self._get(claim.key) == claim.value:
                if claim.attempts or claim.taken_over_from:
                    was = f":{claim.taken_over_from}" if claim.taken_over_from else ""
                    self._set(claim.key, f"b:{claim.attempts}:0{was}", DONE_TTL)
                else:
                    del self._values[claim.key]

    def acknowledged(self, keys: Sequence[str]) -> None:
        # In memory the marks stay (a search from before the acknowledgement may still list
        # the message); the file, which only the next start reads, need not keep them.
        if self._file is not None:
            self._file.forget(keys)

    async def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _backoff(claim: Claim, due: float) -> str:
    """The value of `claim`'s key once its attempt failed: no try before `due` (time.time()),
    with the dead node it was taken over from, if any, for the records of the tries to come."""
    value = f"b:{claim.attempts + 1}:{int(due * 1000)}"
    return f"{value}:{claim.taken_over_from}" if claim.taken_over_from else value


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
