"""Shaping effects: what a reaction decided (suspend, limit, bounce a key) for a while, made
live on every worker of the node and, with `[redis]`, on every node of the cluster.

An `Effect` names its rule, the key it applies to (`site:...`, `path:...`, `provider:...`),
the action, when it ends (`expires_at`, Unix time), the reply that triggered it and the node
that saw it. Effects end on their own at `expires_at`; nothing renews them. There is one live
effect per (key, action): a match while one lives is a repeat and changes nothing, so an
effect ends when its rule said, and the next reply after it decides whether another begins.

How an effect reaches everyone (each worker runs one `Board`):

* The worker that saw the reply applies it at once, then writes it, under a lock, as a file
  in the node's run directory (`<spool>/run/effects/<action>.<hash of key>.json`); a live
  file there already means a sibling worker was first, and its effect is taken instead.
  Every worker scans that directory every `SCAN` (0.2 s): the node's workers agree within
  that, with or without Redis.
* With `[redis] url`, it is also created in Redis, atomically and only if no live one exists
  for its (key, action) (`_CREATE`: a guard key that expires with it, and a sorted set of the
  live effects scored by their end); a node that loses that race takes the winner's effect.
  Every worker polls the set every `POLL` (0.2 s; one round trip, `_POLL`), so every worker
  of every node has it well within a second.
* Effects are only ever added by what is read; they leave when they end. A Redis that goes
  away (an error or a timeout of any call) takes nothing live away: the board says so in the
  log and in `mode` ("node-local"), and new effects apply to this node's workers alone until
  Redis answers again; then those still live are created in Redis too.
* An operator may end an effect early (`Board.end`, `DELETE /api/v1/shaping/effects/{id}`).
  The end is a tombstone that lives as long as the effect would have: its file is rewritten
  with `ended_at` (siblings end it at their next scan), and in Redis it leaves the set of
  live effects (and its guard) for a set of ended ones, which every poll returns too (other
  nodes end it at their next poll). A board never takes an effect it knows ended. With Redis
  away, the end reaches the other nodes when it answers again.

Records: the worker that created an effect writes `ShapingEffect` (`event` "created"), and
"expired" when it ends ("ended", with `ended_by`, when an operator ended it); on each other
node, the first worker to learn of it from Redis writes "learned" (and "expired" or "ended"),
so every node's log says why its deliveries to a site stopped. A worker that dies in between
leaves the "expired" unwritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from pigeon.config.patterns import current_site
from pigeon.flock import Flocked
from pigeon.logs.records import Record, ShapingEffect
from pigeon.redaction import redact, redact_url

if TYPE_CHECKING:
    import redis.asyncio as aioredis

_log = logging.getLogger(__name__)

SCAN: Final = 0.2  # seconds between scans of the node's effects directory
POLL: Final = 0.2  # seconds between polls of Redis
CLUSTER: Final = "cluster"  # effects are shared with every node through Redis
NODE: Final = "node"  # no [redis]: effects hold for this node's workers
NODE_LOCAL: Final = "node-local"  # [redis] does not answer: new effects hold for this node alone

# KEYS[1] the guard of (action, key), KEYS[2] the set of live effects. ARGV: the effect
# (JSON), its life in ms. {1, effect} if created; {0, the live one} if one already lives.
_CREATE: Final = """
local old = redis.call('GET', KEYS[1])
if old then return {0, old} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local life = tonumber(ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', life)
redis.call('ZADD', KEYS[2], now + life, ARGV[1])
if redis.call('PTTL', KEYS[2]) < life then redis.call('PEXPIRE', KEYS[2], life + 1000) end
return {1, ARGV[1]}
"""

# KEYS[1] the set of live effects, KEYS[2] the set of those ended early: drop those whose
# time is over, return {live ones, ended ones}.
_POLL: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return {redis.call('ZRANGE', KEYS[1], 0, -1), redis.call('ZRANGE', KEYS[2], 0, -1)}
"""

# KEYS[1] the guard of (action, key), KEYS[2] the set of live effects, KEYS[3] the set of
# those ended early. ARGV: the effect's id, the ended effect (JSON), when it would have ended
# (ms). Its guard and live entry go (a new one may begin); its tombstone stays until then.
_END: Final = """
local guard = redis.call('GET', KEYS[1])
if guard and cjson.decode(guard)['id'] == ARGV[1] then redis.call('DEL', KEYS[1]) end
for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if cjson.decode(member)['id'] == ARGV[1] then redis.call('ZREM', KEYS[2], member) end
end
redis.call('ZADD', KEYS[3], tonumber(ARGV[3]), ARGV[2])
local life = tonumber(ARGV[3]) - tonumber(redis.call('TIME')[1]) * 1000
if redis.call('PTTL', KEYS[3]) < life then redis.call('PEXPIRE', KEYS[3], life + 1000) end
return 1
"""


class Effect(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """One live effect of a reaction."""

    id: str
    rule: str
    key: str
    action: str  # "suspend" | "limit" | "bounce"
    created: float
    expires_at: float
    reply: str  # the reply that triggered it, as one line
    node: str  # the node that saw it
    connection_limit: int | None = None
    max_message_rate: str | None = None
    ended_at: float | None = None  # ended early, by an operator: a tombstone until expires_at
    ended_by: str | None = None  # ... the API token that did

    def remaining(self, now: float) -> float:
        return max(0.0, self.expires_at - now)


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Effect)
_TIMES: Final = msgspec.json.Decoder(list[float])


class Board:
    """The live effects one worker knows, and how it shares the ones it creates."""

    def __init__(
        self,
        directory: Path,
        *,
        node: str,
        log: Callable[[Record], object] = lambda record: None,
        redis_url: str | None = None,
        prefix: str = "pigeon",
        timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        # The node's workers take turns at the directory under a flock on this file.
        self._lock = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        self._node = node
        self._log = log
        self._clock = clock
        self.on_end: Callable[[Effect], None] = lambda effect: None
        """Called when an effect ends (the dispatcher starts what it held); with `ended_at` set
        when an operator ended it early."""
        self._effects: dict[str, Effect] = {}
        self._by_key: dict[str, list[Effect]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._mine: set[str] = set()  # effects this worker created (and records the end of)
        self._unshared: list[Effect] = []  # created while Redis did not answer
        self._unshared_ends: list[Effect] = []  # ended while Redis did not answer
        self._ended: dict[str, float] = {}  # id: expires_at, of effects ended early (never taken again)
        self._files: dict[str, tuple[int, int]] = {}  # file name: (mtime ns, size) last read
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self.where = redact_url(redis_url) if redis_url else ""
        self._redis: aioredis.Redis | None = None
        self._shared = redis_url is not None
        self.error = ""  # why not shared, while Redis does not answer
        # What a Redis call may raise when Redis does not answer (`_call`).
        self._unavailable: tuple[type[Exception], ...] = (OSError,)
        if redis_url is not None:
            # Imported here, not with the module: every node has a board, and a node without
            # Redis need not spend a tenth of a second on its client.
            import redis.asyncio as aioredis
            from redis.exceptions import RedisError

            self._unavailable = (RedisError, OSError)
            self._redis = aioredis.Redis.from_url(redis_url, socket_timeout=timeout, socket_connect_timeout=timeout)
            self._create = self._redis.register_script(_CREATE)
            self._poll = self._redis.register_script(_POLL)
            self._end_script = self._redis.register_script(_END)
            self._set_key = f"{prefix}:shaping:effects" if prefix else "shaping:effects"
            self._ended_key = f"{self._set_key}:ended"
            self._guard_prefix = f"{prefix}:shaping:effect:" if prefix else "shaping:effect:"

    @property
    def mode(self) -> str:
        """`CLUSTER`, `NODE` or `NODE_LOCAL` (see the module docstring)."""
        if self._redis is None:
            return NODE
        return CLUSTER if self._shared else NODE_LOCAL

    # --- life -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Read what lives already (a restart during an effect), then keep watching."""
        self._scan()
        if self._redis is not None:
            await self._poll_redis()
            self._spawn(self._poll_forever(), "shaping effects: redis")
        self._spawn(self._scan_forever(), "shaping effects: node")

    async def close(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1.0)
        for timer in self._timers.values():
            timer.cancel()
        if self._redis is not None:
            await self._redis.aclose()
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1

    def _spawn(self, work: Any, name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- questions (the dispatcher's, on every batch: no I/O) ---------------------------------------
    def now(self) -> float:
        """The clock effects end by (Unix time)."""
        return self._clock()

    def __len__(self) -> int:
        return len(self._effects)

    def find(self, keys: Iterable[str], action: str) -> Effect | None:
        """A live effect of `action` on any of `keys`."""
        if not self._by_key:
            return None
        for key in keys:
            for effect in self._by_key.get(key, ()):
                if effect.action == action:
                    return effect
        return None

    def of(self, keys: Iterable[str]) -> list[Effect]:
        """Every live effect on any of `keys`."""
        if not self._by_key:
            return []
        return [effect for key in keys for effect in self._by_key.get(key, ())]

    def live(self) -> list[Effect]:
        """Every live effect, the soonest to end first."""
        return sorted(self._effects.values(), key=lambda e: (e.expires_at, e.id))

    # --- creating -------------------------------------------------------------------------------------
    def trigger(
        self,
        *,
        rule: str,
        key: str,
        action: str,
        duration: float,
        reply: str,
        connection_limit: int | None = None,
        max_message_rate: str | None = None,
    ) -> Effect:
        """The live effect of `action` on `key`: the one that lives already (a repeat: nothing
        changes), or a new one, applied here at once and shared (see the module docstring)."""
        existing = self.find((key,), action)
        if existing is not None:
            return existing
        now = self._clock()
        effect = Effect(
            id=secrets.token_hex(6),
            rule=rule,
            key=key,
            action=action,
            created=now,
            expires_at=now + duration,
            reply=reply,
            node=self._node,
            connection_limit=connection_limit,
            max_message_rate=max_message_rate,
        )
        winner = self._claim_file(effect)
        self._add(winner)
        if winner is not effect:
            return winner  # a sibling worker was first: its effect, and its records
        self._mine.add(effect.id)
        if self._redis is None:
            self._record("created", effect, shared=False)
        else:
            self._spawn(self._share(effect), f"shaping effect {effect.id}")
        return effect

    async def _share(self, effect: Effect) -> None:
        """Create `effect` in Redis unless another node's lives there for its (key, action)."""
        life = max(1, int(effect.remaining(self._clock()) * 1000))
        try:
            created, stored = await self._call(
                self._create(keys=[self._guard(effect), self._set_key], args=[_ENCODER.encode(effect), life])
            )
        except _Unavailable as error:
            self._fall_back(str(error))
            self._unshared.append(effect)
            self._record("created", effect, shared=False)
            return
        if int(created) == 1:
            self._record("created", effect, shared=True)
            return
        theirs = _DECODER.decode(stored)
        # Another node was first (a race within one round trip): its effect stands for both.
        self._mine.discard(effect.id)
        self._remove(effect.id)
        self._replace_file(effect, theirs)
        self._add(theirs)

    def _guard(self, effect: Effect) -> str:
        return f"{self._guard_prefix}{effect.action}:{effect.key}"

    # --- thresholds -------------------------------------------------------------------------------------
    def count(self, rule: str, key: str, needed: int, within: float) -> bool:
        """One more matching reply of `rule` for `key`: whether `needed` of them came within the
        last `within` seconds (then the count starts over). Counted for the node's workers
        together, in a file of the node's directory (under its lock): a rule's threshold is the
        node's, however its mail is spread over workers."""
        if needed <= 1:
            return True
        now = self._clock()
        digest = hashlib.blake2b(f"{rule}\0{key}".encode(), digest_size=10).hexdigest()
        path = self.directory / f"count.{digest}.times"
        with Flocked(self._lock):
            try:
                seen = _TIMES.decode(path.read_bytes())
            except (OSError, msgspec.DecodeError):
                seen = []
            recent = [at for at in seen if at > now - within][-(needed - 1) :]
            seen = [*recent, now]
            reached = len(seen) >= needed
            if reached:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            else:
                temporary = path.with_suffix(".new")
                temporary.write_bytes(_ENCODER.encode(seen))
                os.replace(temporary, path)
        if not reached:
            _log.info("shaping reaction %s: %d of %d matching replies for %s within %gs", rule, len(seen), needed,
                      key, within)  # fmt: skip
        return reached

    # --- ending early -----------------------------------------------------------------------------------
    async def end(self, effect_id: str, *, by: str) -> Effect | None:
        """End a live effect now (an operator's decision): here at once, on the node's other
        workers at their next scan, and on the other nodes at their next poll (or when Redis
        answers again). The ended effect, or None if none with that id lives here."""
        effect = self._effects.get(effect_id)
        if effect is None:
            return None
        ended = msgspec.structs.replace(effect, ended_at=self._clock(), ended_by=by)
        self._ended[effect.id] = effect.expires_at
        self._replace_file(ended, ended)  # its file says it ended
        if self._redis is not None:
            await self._share_end(ended)
        _log.warning("shaping effect %s ended early by %s: %s %s (rule %s)", effect.id, by, effect.action,
                     effect.key, effect.rule)  # fmt: skip
        self._end(effect.id, ended=ended)
        return ended

    async def _share_end(self, ended: Effect) -> None:
        until = max(1, int(ended.expires_at * 1000))
        try:
            await self._call(
                self._end_script(
                    keys=[self._guard(ended), self._set_key, self._ended_key],
                    args=[ended.id, _ENCODER.encode(ended), until],
                )
            )
        except _Unavailable as error:
            self._fall_back(str(error))
            self._unshared_ends.append(ended)

    def _learned_end(self, ended: Effect) -> None:
        """A tombstone read from the node's directory or from Redis."""
        self._ended.setdefault(ended.id, ended.expires_at)
        if ended.id in self._effects:
            self._end(ended.id, ended=ended)

    # --- the node's directory -------------------------------------------------------------------------
    def _file(self, effect: Effect) -> Path:
        digest = hashlib.blake2b(effect.key.encode(), digest_size=10).hexdigest()
        return self.directory / f"{effect.action}.{digest}.json"

    def _claim_file(self, effect: Effect) -> Effect:
        """Write `effect` for the node's workers, unless a live one for its (key, action) is
        there: that one, then."""
        path = self._file(effect)
        with Flocked(self._lock):
            with contextlib.suppress(OSError, msgspec.DecodeError):
                there = _DECODER.decode(path.read_bytes())
                if there.key == effect.key and there.expires_at > self._clock() and there.ended_at is None:
                    return there
            self._write(path, effect)
        return effect

    def _adopt_file(self, effect: Effect) -> bool:
        """Write another node's `effect` for this node's workers, unless one for its (key,
        action) lives there already. Whether this worker wrote it."""
        path = self._file(effect)
        with Flocked(self._lock):
            with contextlib.suppress(OSError, msgspec.DecodeError):
                there = _DECODER.decode(path.read_bytes())
                if there.id == effect.id and there.ended_at is not None:
                    return False  # ended by an operator (before Redis heard of it): it stays ended
                if there.key == effect.key and there.expires_at > self._clock() and there.ended_at is None:
                    return False
            self._write(path, effect)
        return True

    def _replace_file(self, ours: Effect, theirs: Effect) -> None:
        """Write `theirs` where `ours` is (or nothing is): not over another effect begun since."""
        path = self._file(ours)
        with Flocked(self._lock):
            with contextlib.suppress(OSError, msgspec.DecodeError):
                if _DECODER.decode(path.read_bytes()).id != ours.id:
                    return
            self._write(path, theirs)

    @staticmethod
    def _write(path: Path, effect: Effect) -> None:
        temporary = path.with_suffix(".new")
        temporary.write_bytes(_ENCODER.encode(effect))
        os.replace(temporary, path)  # a reader sees the old one or this, whole

    def _scan(self) -> None:
        """Take what the node's other workers created; remove files of effects that ended."""
        now = self._clock()
        try:
            entries = list(os.scandir(self.directory))
        except OSError as error:
            _log.error("cannot read the shaping effects in %s: %s", self.directory, error)
            return
        for entry in entries:
            if not entry.name.endswith(".json"):
                continue
            try:
                stat = entry.stat()
                if self._files.get(entry.name) == (stat.st_mtime_ns, stat.st_size):
                    continue
                effect = _DECODER.decode(Path(entry.path).read_bytes())
            except (OSError, msgspec.DecodeError):
                continue  # (being replaced, or not ours to read: the next scan)
            self._files[entry.name] = (stat.st_mtime_ns, stat.st_size)
            if effect.ended_at is not None:
                self._learned_end(effect)
            if effect.expires_at <= now:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                self._files.pop(entry.name, None)
                continue
            if effect.ended_at is None:
                self._add(effect)
        # Tombstones are kept as long as their effects would have lived (a little longer).
        self._ended = {id_: until for id_, until in self._ended.items() if until > now - 60}

    async def _scan_forever(self) -> None:
        while not self._closing:
            await asyncio.sleep(SCAN)
            try:
                self._scan()
            except Exception:  # a bug here must not stop the watching for good
                _log.exception("scanning the shaping effects in %s", self.directory)

    # --- Redis --------------------------------------------------------------------------------------
    async def _poll_forever(self) -> None:
        while not self._closing:
            await asyncio.sleep(POLL)
            try:
                await self._poll_redis()
            except Exception:
                _log.exception("polling the shaping effects in Redis at %s", self.where)

    async def _poll_redis(self) -> None:
        try:
            members, ended = await self._call(self._poll(keys=[self._set_key, self._ended_key]))
        except _Unavailable as error:
            self._fall_back(str(error))
            return
        for member in ended:
            with contextlib.suppress(msgspec.DecodeError):
                tombstone = _DECODER.decode(member)
                if tombstone.id in self._effects or tombstone.id not in self._ended:
                    self._replace_file(tombstone, tombstone)  # for this node's workers, if not yet
                self._learned_end(tombstone)
        for member in members:
            try:
                effect = _DECODER.decode(member)
            except msgspec.DecodeError:
                continue
            if effect.id in self._ended:
                continue  # ended here while Redis did not answer: its end is on its way there
            if effect.expires_at <= self._clock():
                # Ran out here already, while Redis (its clock, or a poll answered late) still
                # lists it: taken again, it would be "learned" a second time after its "expired".
                continue
            if effect.id not in self._effects and effect.node != self._node and self._adopt_file(effect):
                # The first of this node's workers to learn of another node's effect records
                # it (and its end): this node's log says why its deliveries there stopped.
                self._mine.add(effect.id)
                self._record("learned", effect, shared=True)
            self._add(effect)
        if not self._shared:
            _log.warning("Redis at %s answers again: shaping effects are shared by the cluster again", self.where)
            self._shared, self.error = True, ""
            unshared, self._unshared = self._unshared, []
            for effect in unshared:  # what began meanwhile reaches the other nodes now
                if effect.id in self._effects:
                    self._spawn(self._share(effect), f"shaping effect {effect.id}")
            ends, self._unshared_ends = self._unshared_ends, []
            for ended in ends:  # ... and what ended meanwhile
                self._spawn(self._share_end(ended), f"shaping effect {ended.id} ended")

    async def _call(self, call: Any) -> Any:
        try:
            return await call
        except self._unavailable as error:
            raise _Unavailable(redact(str(error)) or type(error).__name__) from error

    def _fall_back(self, error: str) -> None:
        if self._shared:
            _log.warning("Redis at %s does not answer (%s): new shaping effects apply to this node alone",
                         self.where, error)  # fmt: skip
            self._shared = False
        self.error = error

    # --- the live set -----------------------------------------------------------------------------------
    def _add(self, effect: Effect) -> None:
        if effect.id in self._effects or effect.id in self._ended:
            return
        delay = effect.expires_at - self._clock()
        if delay <= 0:
            return
        self._effects[effect.id] = effect
        # (An effect kept before IPv6 next hops' sites were bracketed is found under the new form.)
        self._by_key.setdefault(current_site(effect.key), []).append(effect)
        with contextlib.suppress(RuntimeError):  # (no loop: a test of the pure parts)
            loop = asyncio.get_running_loop()
            self._timers[effect.id] = loop.call_later(delay, self._end, effect.id)
        until = time.strftime("%H:%M:%S", time.gmtime(effect.expires_at))
        _log.info("shaping effect %s: %s %s until %s UTC (rule %s, from %s: %s)",
                  effect.id, effect.action, effect.key, until, effect.rule, effect.node, effect.reply)  # fmt: skip

    def _remove(self, effect_id: str) -> Effect | None:
        effect = self._effects.pop(effect_id, None)
        if effect is None:
            return None
        timer = self._timers.pop(effect_id, None)
        if timer is not None:
            timer.cancel()
        key = current_site(effect.key)
        same = [e for e in self._by_key.get(key, ()) if e.id != effect_id]
        if same:
            self._by_key[key] = same
        else:
            self._by_key.pop(key, None)
        return effect

    def _end(self, effect_id: str, *, ended: Effect | None = None) -> None:
        """`effect_id` is over: at its time, or `ended` early (whose file is its tombstone)."""
        effect = self._remove(effect_id)
        if effect is None:
            return
        if effect_id in self._mine:
            self._mine.discard(effect_id)
            shared = self._redis is not None and effect not in self._unshared
            if ended is not None:
                self._record("ended", ended, shared=shared)
            else:
                self._record("expired", effect, shared=shared)
                with contextlib.suppress(OSError):  # (the others' scans would, too)
                    path = self._file(effect)
                    if _DECODER.decode(path.read_bytes()).id == effect_id:
                        path.unlink()
        _log.info("shaping effect %s ended: %s %s (rule %s)", effect.id, effect.action, effect.key, effect.rule)
        self.on_end(effect if ended is None else ended)

    def _record(self, event: str, effect: Effect, *, shared: bool) -> None:
        self._log(
            ShapingEffect(
                timestamp=self._clock(),
                event=event,
                effect=effect.id,
                rule=effect.rule,
                key=effect.key,
                action=effect.action,
                expires_at=effect.expires_at,
                reply=effect.reply,
                origin=effect.node,
                scope=CLUSTER if shared else NODE,
                connection_limit=effect.connection_limit,
                max_message_rate=effect.max_message_rate,
                ended_by=effect.ended_by,
            )
        )


class _Unavailable(Exception):
    """Redis did not answer (an error, or a timeout)."""
