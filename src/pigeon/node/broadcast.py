"""Admin broadcast: an admin operation issued on any node of a cluster applies on every node.

Nodes share nothing but Redis, so an operation travels there. The node whose API was asked
(the *origin*: its supervisor, or the node itself when it runs one worker) appends the request
to a Redis stream (`<prefix>:admin:stream`), applies it to its own workers as before, then
collects what the other nodes answered and adds it up (`merge_answers`): a bulk bounce issued
on node A reports the messages bounced on every node, and `GET ...?cluster=1` reads (queues,
operations, standing rules) sum every node's.

Every worker of every node reads the stream (`consume`) and applies each entry another node
appended, through the same code the HTTP API runs (`pigeon.listener.http.admin.perform`), then
pushes its answer to the entry's answer list. The origin knows whom to wait for from a
presence hash (`<prefix>:admin:nodes`: node name, spool id, workers and expiry) every worker
renews (one name, one node: `pigeon.node.presence`); a node that has not answered a write by the
deadline is reported as `pending` (it applies the operation when it gets to it, and its
progress shows in `GET /api/v1/admin/operations?cluster=1`), one that has not answered a read as
`missing` (nothing of it is applied later: its part is not in the answer). A node known but not
running (stopped within `REMEMBERED`) is named at once: `pending` for a one-off write, `at_start`
for a rule made or ended, which it takes from the cluster's rules before it delivers anything. Right after Redis lost
its data, the presence hash holds only the nodes that have renewed since: an operation issued
then waits until every live node has had the time to (`_settled`), and each worker 0 gives back
the other nodes' presence as it last saw it, so a node killed a moment before is named too,
and the nodes forgotten it knows of, so a node forgotten a moment before is not given back
(`pigeon.node.presence.forget`).

Why a stream and not pub/sub: a worker that restarts, or loses Redis for a while, reads on
from where it stopped (its cursor is kept in a file next to its spool), so an operation issued
meanwhile still reaches it; one that starts applies the writes by id it missed before its node
delivers anything, and the walks of the spool it missed as soon as it runs (`join`). One-off
writes older than `[redis] late_operations` (5 minutes; as of the node's return, for what it
missed while away) are not applied late, and a bounce of what is queued now, applied here
seconds after it was issued (this node was cut off from Redis, or restarting), bounces only
mail accepted before it was issued: neither may hit mail accepted since, which its sender was told is queued. Reads
older than a few seconds are dropped, since nobody waits for them any more.

Standing rules (suspensions, bounces with a duration) are cluster state, not events: the
origin also keeps each rule in force in a hash (`<prefix>:admin:rules`, id -> rule, written
with the stream entry in one transaction), and each rule ended (cancelled, resumed) in another
(`<prefix>:admin:rules:ended`, id -> kind, until the rule would have ended by itself). A
worker reads both (`sync`) before its node delivers anything (`join`), and again whenever
Redis answers after an outage, and takes them (`Admin.adopt`, matched by id, so taking one
twice, or also from the stream, changes nothing): a node that joins late, or new, holds what
the others hold, whatever the age of the entry that made it. A rule made or ended while Redis
was away is applied on its node at once, and sent to the cluster once Redis answers, before the
rules are taken again (`send_unsent`; kept in memory only), unless the cluster changed that rule
after it: an end issued at T does not end a rule made again after T, nor is a rule made at T
made again once ended after T (tombstones say when, `at`). Meanwhile a worker does not take
back a rule it ended after the cluster's copy was made (`Admin.adopt`).

A Redis that comes back without its data (restarted with no persistence, or flushed) has
forgotten the rules in force, and a node that joined then would deliver what the others hold.
A marker key (`<prefix>:admin:rules:kept`, a token), looked at with every presence renewal,
tells: the first worker to find it gone sets it again, with a token of its own, and every
worker that finds it gone or changed gives back the rules it holds that the cluster held (when
the worker last looked, or made there since: their stream entries say so, read at once, where
looks come every 2 s), and the ends it knows of (the tombstones Redis kept when it last took the
rules, and the ends it read in the stream since: a node stopped before a resume, started after
the loss, ends its copy rather than hold the suspension again alone; of one rule, the later of
its making and its end stands), then takes the cluster's again at its sync. Every worker, not the first
only: a rule made a moment before the loss may be known to some workers and not yet to others,
and what is given back is all that any of them knew. Only a worker that looked less than
`_FRESH` ago gives back: one that was away longer (or has just started) may hold a rule ended
meanwhile, whose end Redis forgot too, and a standing bounce brought back would bounce mail at
once. HSETNX under WATCH of the ended rules: a rule already back, or ended meanwhile, is not
brought back. A rule the cluster never held stays on its node, as above.

A one-off write still pending on a node (stopped, or not in time) is kept by its origin's node
too, in its spool (`_hold_op`), until every worker of each node named has answered it (worker 0
reads the answer lists at its looks: `_follow_ops`) or it is a day old: Redis losing its data
would lose it with the stream. Worker 0 gives it back to the stream (`_give_ops_back`) when the
rules' marker is not the one it was when the operation was kept (a loss since, seen as it runs
or as it starts), for the nodes named alone (`for`), under its own id: each worker keeps the ids
of the one-off writes it applied (`_applied`, in a file next to its cursor) and applies none
twice. One past `late_operations` is not given back, but named in a WARNING.

One id, one rule: a rule asked for under the id of another the cluster holds (another kind,
selector or duration) is refused at the origin (409, `id_taken`), Redis's hash looked at under
a watch, so two nodes asked at once cannot both send one. Only a rule made on a node while Redis
was away can still meet another under its id: no node replaces the rule it holds (it refuses,
and logs an error), and `send_unsent` does not send it. Each stays under its id where it is.

Redis being away never stops an operation on the node that was asked: it is applied here,
and the answer says, under `cluster`, that the other nodes were not told (for a rule or its
end: that they are told once Redis answers), and does not cover them (`others_unreached`): of a
write by id, a message this node does not hold is `unknown`, not `not_found`, for another node
may hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Final, NamedTuple

import msgspec
import redis.asyncio as aioredis
from aiohttp import web
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, WatchError

from pigeon.config.schema import Config
from pigeon.listener.http.admin import (
    RuleChange,
    operation_of,
    refusal_answer,
    refuse_taken_id,
    refuse_taken_operation,
    rule_change,
)
from pigeon.node.answers import merge_answers
from pigeon.node.presence import (
    PRESENCE,
    REMEMBERED,
    Namesakes,
    forgotten_entries,
    forgotten_key,
    is_forgotten,
    last_seen,
    presence_key,
    spool_identity,
)
from pigeon.queue.admin import NOT_FOUND
from pigeon.queue.rules import Rule, describe_rule, taken_by

_log = logging.getLogger(__name__)

_READ_REPLAY: Final = 5.0  # seconds after which a read is dropped unanswered: nobody waits for it
AT_START: Final = "at_start"
"""A stopped node's state in the answer to a rule write (`cluster.nodes`): it takes the rule, or
its end, from the cluster's rules when it starts, before it delivers anything."""
UNKNOWN: Final = "unknown"
"""A row of a write by id issued while Redis cannot be reached, of a message the node asked does
not hold: the other nodes were not reached, and one of them may hold it (`_unreached_rows`)."""
WRITE_WAIT: Final = 30.0  # seconds the origin waits for other nodes' answers to a write
READ_WAIT: Final = 3.0  # ... and to a read
_NAMESAKE_EVERY: Final = 60.0  # seconds between two errors about another live node of our name
_RENEW: Final = 2.0
_FRESH: Final = 15.0  # seconds within which a worker's view of the rules may be given back
_ANSWERS_KEPT: Final = 600  # seconds an answer list lives (the origin reads it within WRITE_WAIT)
_STREAM_LENGTH: Final = 10_000  # entries kept (approximately) in the stream
_BLOCK_MS: Final = 1000
_WATCH_TRIES: Final = 10  # a write's look at the rules in Redis, changed meanwhile by another: again
_OPS_KEPT: Final = 1_000  # one-off writes kept for nodes that have not applied them (the latest)
_ENDED_KNOWN: Final = 10_000  # rules ended a worker remembers, to give back (the latest)
# Seconds after Redis lost its data within which every live worker has said it is there again:
# it renews every `_RENEW` s, between reads that block up to `_BLOCK_MS`, and a margin for a
# reconnection and a busy machine. An operation issued sooner waits for them (`_settled`).
_SETTLE: Final = _RENEW + _BLOCK_MS / 1000 + 2.0

# KEYS[1] the admin keys' epoch (a hash: `born`, ms of Redis's clock when a worker or origin first
# found it missing: this Redis's first use by the cluster, or its first use since it lost its
# data; `lost`, "1" once one that knew another epoch has asked, so the data was lost). ARGV[1]
# the epoch the caller knew ('' none). Returns {born, now (ms of Redis's clock), lost}.
_EPOCH: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local born = redis.call('HGET', KEYS[1], 'born')
if not born then
  born = tostring(now)
  redis.call('HSET', KEYS[1], 'born', born)
end
if ARGV[1] ~= '' and ARGV[1] ~= born then redis.call('HSET', KEYS[1], 'lost', '1') end
return {born, tostring(now), redis.call('HGET', KEYS[1], 'lost') or '0'}
"""

# apply(method, path, body, operator, issued) -> (HTTP status, JSON answer): one worker's
# part; `issued` is when the origin appended it (time.time() there).
Apply = Callable[[str, str, bytes, str, float], Awaitable[tuple[int, Any]]]
# adopt(rules in force, ended rules: id -> kind) -> (rules added, rules ended): `Admin.adopt`.
Adopt = Callable[[list[Rule], dict[str, str]], Awaitable[tuple[list[Rule], list[Rule]]]]
_RULE: Final = msgspec.json.Decoder(Rule)
_LISTS: Final = ("/api/v1/admin/suspend", "/api/v1/admin/bounce")
# The writes that may name messages (`messages`): a bounce, a hold, a retry by id.
_BY_ID: Final = ("/api/v1/admin/bounce", "/api/v1/admin/hold", "/api/v1/admin/retry")
_ENTRY_ID: Final = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


def _reconnect_once() -> Retry:
    return Retry(ExponentialBackoff(cap=0.05, base=0.01), 1, (RedisConnectionError,))


def origin_of(config: Config) -> str:
    """This node's identity in the stream: its name and its spool, so two nodes given one
    name by mistake still tell their entries apart (every process of a node computes the same)."""
    where = f"{config.node.name}\0{config.spool.path.resolve()}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]


class Broadcast:
    """One process's end of the admin stream: the origin's (`around`) and a worker's (`consume`)."""

    def __init__(
        self, config: Config, *, worker: int = 0, workers: int = 1, held: Callable[[], list[Rule]] = list
    ) -> None:
        """`held`: the standing rules this worker holds, given back to a Redis that lost them."""
        redis = config.redis
        assert redis.url is not None
        self.node = config.node.name
        self.origin = origin_of(config)
        self._worker = worker
        self._workers = workers
        prefix = redis.key_prefix
        self._stream = f"{prefix}:admin:stream"
        self._nodes = presence_key(config)
        self._forgotten_nodes = forgotten_key(config)
        self._answers = f"{prefix}:admin:answers:"
        self._rules = f"{prefix}:admin:rules"
        self._ended = f"{prefix}:admin:rules:ended"
        self._kept = f"{prefix}:admin:rules:kept"
        self._epoch_key = f"{prefix}:admin:epoch"
        self._held = held
        self._spool = spool_identity(config.spool.path)
        # Worker 0 watches for another live node of our name (see `pigeon.node.presence`).
        self._namesakes = Namesakes(self.node, self._spool) if worker == 0 else None
        self._namesake_said: float | None = None  # (monotonic) when it was last said
        self._known: set[str] = set()
        """Ids of the rules in force in Redis when this worker last looked (and of those made
        there since, as the stream told it) ..."""
        self._known_at: float | None = None
        """... and when it looked (monotonic): None, never in this process."""
        self._ended_known: OrderedDict[str, str] = OrderedDict()
        """The rules ended that Redis kept (id -> its tombstone) when this worker last took them
        (`sync`), and those ended since, as the stream told it: given back with the rules, so a
        node that was stopped meanwhile ends its copy of one when it comes back."""
        self._marker: Any = None
        """The marker's value when this worker last looked (None: never): another value means
        Redis lost its data since, and another worker set the marker again."""
        self._late = float(redis.late_operations)
        self._cursor_path = config.spool.path / f"admin-stream-{worker}.cursor"
        timeout = self._timeout = float(redis.timeout)
        # One quick retry on a fresh connection: after a Redis restart the pooled connections
        # are dead, and the first operation would otherwise reach this node only (or list
        # nodes that answered as pending) while Redis answers. Never on a timeout.
        self._redis = aioredis.Redis.from_url(
            redis.url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=_reconnect_once()
        )
        # XREAD BLOCK holds its connection for up to a second: a client of its own, whose
        # socket timeout is longer than the block.
        self._reader = aioredis.Redis.from_url(
            redis.url,
            socket_timeout=timeout + _BLOCK_MS / 1000,
            socket_connect_timeout=timeout,
            retry=_reconnect_once(),
        )
        self._epoch_script = self._redis.register_script(_EPOCH)
        self._epoch: str | None = None
        """The admin keys' epoch as this worker found it at its last renewal (None: not yet): another
        one means Redis lost its data since, presence hash included (`_renew`)."""
        self._asked_epoch: str | None = None
        """... and as this process found it when it last issued an operation (`_settled`)."""
        self._others_present: dict[Any, Any] = {}
        """Worker 0: the presence hash as it was at its last renewal, given back should Redis lose it."""
        self._forgotten: dict[bytes, float] = {}
        """The nodes the cluster forgot (`pigeon cluster forget`) as this worker knows them: presence
        hash field -> when that node was last there. Forgotten through this worker, or (worker 0)
        seen at its renewals. Given back with the presence, and a node's entry it covers is not:
        a snapshot of the hash taken before the forget would give the node back otherwise."""
        self._down_since: float | None = None
        self._cursor: str | None = None  # where `consume` starts (`join` may have found it)
        self._ahead_path = config.spool.path / f"admin-stream-{worker}.ahead"
        self._ahead: set[str] = self._saved_ahead()
        """The entries past the cursor applied already (`join`: the writes by id after a walk it
        left to `consume`), which `consume` skips; kept in a file, as the cursor is."""
        self._ahead_max: tuple[int, int] | None = None  # the last of them (`_ahead_last`)
        self._joined: tuple[float, tuple[int, int]] | None = None
        """When `join` began (this node's return) and the last entry it read: the lateness of
        an entry up to it is judged as of then, however long the walks before it took."""
        self._join_answers: list[tuple[str, str, float]] = []
        """Answers to the writes applied by `join` (answer list, reply, when sent), pushed by
        `consume`: none waits on Redis during the start."""
        self._synced = False  # whether the rules were taken from Redis since it last failed
        self._held_ops_path = config.spool.path / "admin-pending-ops.json"
        """The one-off writes issued through this node still pending on another (`around`), kept
        until each named node has applied them or they are too old: given back to a Redis that
        lost its data (worker 0: `_give_ops_back`)."""
        self._stopped_workers: dict[str, int] = {}  # (`_present`) the workers of each node stopped
        self._applied_path = config.spool.path / f"admin-stream-{worker}.ops"
        self._applied: dict[str, float] = self._saved_applied()
        """The one-off writes this worker applied (op -> when issued), kept as long as one may
        be given back to it: applied once, however often the stream holds it."""
        self._unsent: list[_Unsent] = []
        """Rule writes made here while Redis was away, sent once it answers (`send_unsent`)."""

    async def close(self) -> None:
        for client in (self._redis, self._reader):
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()

    # --- the origin --------------------------------------------------------------------------
    async def around(
        self,
        method: str,
        path: str,
        body: bytes,
        operator: str,
        local: Callable[[], Awaitable[tuple[int, Any]]],
        merge: Callable[[list[tuple[int, Any]]], tuple[int, Any]] = merge_answers,
        *,
        issued: float | None = None,
    ) -> tuple[int, Any]:
        """Run `local` (this node's part) while every other node runs its own; one answer,
        added up by `merge`, with `cluster.nodes` saying which nodes it holds.

        The entry is appended first, so the other nodes work while this one does. `issued`: when
        the request reached this node (None: now), the entry's `time`, from which every node
        dates a standing rule it makes (`perform`), as `local` does: one `created` and `expires`
        everywhere, those of the rule kept in Redis."""
        write = method != "GET"
        op = secrets.token_hex(8)
        expected: dict[str, int] = {}
        stopped: dict[str, float] = {}
        now = time.time() if issued is None else issued
        try:
            expected, stopped = await self._present()
            if not write:
                now = time.time()  # (after any wait for the nodes: a read older than a few seconds is dropped)
            change = rule_change(method, path, body, operator, now) if write else None
            if write and (operation := operation_of(method, path, body)) is not None:
                # An operation that makes no rule, under the id of one the cluster holds: refused.
                try:
                    refuse_taken_operation(operation, _decoded(await self._redis.hget(self._rules, operation[0])), now)
                except web.HTTPConflict as refusal:
                    return refusal_answer(refusal)
            ending: Any = None
            if change is not None and change.rule is None:
                ending = await self._redis.hget(self._rules, change.rule_id)  # when it would end anyway
            # One transaction: a node that starts reads the rules in force, then the stream from
            # its end, and must find this operation in one or the other.
            refused = await self._append(op, method, path, body, operator, now, change, ending)
            if refused is not None:
                return refused
            marker: Any = await self._redis.get(self._kept) if change is None else None
            self._learn(change, now)  # (a node of one worker: before it reads its own entry back)
        except (RedisError, OSError) as error:
            status, answer = await local()
            change = rule_change(method, path, body, operator, now) if write else None
            # A read changed nothing anywhere: it only shows less, and there is nothing to issue again.
            reach = "this node's answer only; the other nodes were not asked"
            if change is not None and status < 400:
                self._unsent.append(_Unsent(method, path, body, operator, time.time(), change))
                unless = "made again" if change.rule is None else "ended"
                reach = (
                    "applied on this node only for now; it is sent to the other nodes once Redis answers, "
                    f"unless the rule is {unless} elsewhere meanwhile"
                )
            elif write:
                reach = "applied on this node only; issue it again on the other nodes, or once Redis is back"
            _log.warning("%s %s: Redis cannot be reached (%s): %s", method, path, error, reach)
            if isinstance(answer, dict):
                _name_holder(answer, self.node)
                # Whether another node holds a message this one does not is not known: not "not
                # found", which says it is nowhere (and a command exits 0 for it).
                _unreached_rows(answer, self.node)
                answer["cluster"] = {
                    "nodes": {self.node: "done"},
                    # The answer does not cover the other nodes, whichever there are: none was
                    # asked (nor is known: their presence is in Redis). The command exits 75.
                    "others_unreached": True,
                    "error": f"Redis cannot be reached ({error}): {reach}",
                }
            return status, answer
        status, answer = await local()
        _name_holder(answer, self.node)
        answers: list[tuple[int, Any]] = [(status, answer)]
        nodes = {self.node: "done"}
        remote, pending = await self._gather(op, expected, WRITE_WAIT if write else READ_WAIT)
        for node, replies in remote.items():
            for _, reply in replies:
                _name_holder(reply, node)
            answers += replies
            nodes[node] = "done"
        for node in pending:
            # A write is applied there when the node gets to it; a read's part of it is lost.
            nodes[node] = "pending" if write else "missing"
        # A node known but stopped gets a write when it starts again (it reads the stream on
        # from where it stopped); a read, never: reads leave it out, as they always did. A rule
        # made or ended (`change`) reaches it for sure: it takes the cluster's rules, which Redis
        # holds now (`_append`), before it delivers anything (`join`), whenever it starts, so it
        # is `at_start`, not left out. A one-off write reaches it only within `late_operations`,
        # and may find there mail it no longer concerns: `pending`, which the command says.
        not_running = {node: at for node, at in stopped.items() if write and node not in remote}
        for node in not_running:
            nodes[node] = AT_START if change is not None else "pending"
        if write and change is None and status < 400:
            # Kept here until applied there: the stream alone would lose it with Redis's data.
            waited = {node: expected[node] - len(remote.get(node, ())) for node in pending}
            waited.update({node: self._stopped_workers.get(node, 1) for node in not_running})
            entry = {"op": op, "origin": self.origin, "node": self.node, "method": method, "path": path,
                     "body": body, "operator": operator, "time": repr(now)}  # fmt: skip
            if waited:
                self._hold_op(entry, waited, marker)
        merged_status, merged = merge(answers)
        if isinstance(merged, dict):
            if write and "already" in merged:
                merged["already"] = _already_everywhere(answers)
            _pending_rows(merged, sorted(node for node, state in nodes.items() if state == "pending"))
            merged["cluster"] = {"nodes": nodes}
            if not_running:
                merged["cluster"]["not_running"] = not_running
            if method == "GET" and path.rstrip("/") in _LISTS:
                merged["cluster"]["held_by"] = _holders({self.node: [(status, answer)], **remote})
        return merged_status, merged

    async def _append(
        self,
        op: str,
        method: str,
        path: str,
        body: bytes,
        operator: str,
        now: float,
        change: RuleChange | None,
        ending: Any,
    ) -> tuple[int, Any] | None:
        """Append a request to the stream, with what it does to the cluster's rules, in one
        transaction; or, for a rule whose id the cluster holds another rule under, nothing: its
        refusal (409, `id_taken`), before any node is told. Watched, so that two rules asked for
        under one id at once on two nodes are not both sent: the second is refused."""
        for _ in range(_WATCH_TRIES):
            async with self._redis.pipeline(transaction=True) as pipe:
                held: Rule | None = None
                if change is not None and change.rule is not None:
                    await pipe.watch(self._rules)
                    held = _decoded(await pipe.hget(self._rules, change.rule_id))
                    try:
                        refuse_taken_id(change, held, now)
                    except web.HTTPConflict as refusal:
                        return refusal_answer(refusal)
                    pipe.multi()  # type: ignore[no-untyped-call]
                pipe.xadd(
                    self._stream,
                    {
                        "op": op,
                        "origin": self.origin,
                        "node": self.node,
                        "method": method,
                        "path": path,
                        "body": body,
                        "operator": operator,
                        "time": repr(now),
                    },
                    maxlen=_STREAM_LENGTH,
                    approximate=True,
                )
                if change is not None and change.rule is not None:
                    # The first one made stands (an identical suspension is `already` in force).
                    _store_rule(pipe, self._rules, change.rule, held, now)
                    pipe.hdel(self._ended, change.rule_id)
                elif change is not None:
                    pipe.hdel(self._rules, change.rule_id)
                    # `at`: a rule made again after this end is not ended by it (`pigeon.node.following`).
                    tombstone = {"kind": change.kind, "until": _end_of(ending), "at": now}
                    pipe.hset(self._ended, change.rule_id, json.dumps(tombstone))
                try:
                    await pipe.execute()
                except WatchError:
                    continue  # a rule was made or ended meanwhile: looked at again
                return None
        raise WatchError(f"the cluster's rules changed {_WATCH_TRIES} times while this was being sent")

    async def send_unsent(self) -> None:
        """Send the cluster the rule writes made here while Redis was away, in their order: an
        end, if the rule Redis holds under its id was made before it (not made again since); a
        rule made, unless Redis ended it after. Raises for Redis's sake (kept, sent next time)."""
        while self._unsent:
            unsent = self._unsent[0]
            change = unsent.change
            if change.rule is not None and (stale := self._stale(unsent)) is not None:
                # The other nodes would make it from the request at once, bouncing (or holding)
                # what they queue, and ending it a whole duration after they read it.
                self._unsent.pop(0)
                _log.warning("admin stream: %s %s, made here while Redis was away, not sent: %s",
                             unsent.method, unsent.path, stale)  # fmt: skip
                continue
            async with self._redis.pipeline(transaction=True) as pipe:
                await pipe.watch(self._rules, self._ended)
                blob: Any = await pipe.hget(self._rules, change.rule_id)
                tombstone: Any = await pipe.hget(self._ended, change.rule_id)
                held = _decoded(blob)
                if change.rule is None:
                    send = held is not None and held.created <= unsent.at  # else not held, or made again since
                else:
                    # A rule that has run out frees its id: this one, made since, is a new rule.
                    send = (held is None or not held.live(time.time())) and not _ended_after(tombstone, unsent.at)
                if send:
                    sent = time.time()
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.xadd(
                        self._stream,
                        {
                            "op": secrets.token_hex(8),
                            "origin": self.origin,
                            "node": self.node,
                            "method": unsent.method,
                            "path": unsent.path,
                            "body": unsent.body,
                            "operator": unsent.operator,
                            # A rule's entry is dated when the rule was made: every node makes it
                            # from the entry (`rule_change`), and so makes this very rule, its
                            # start and its end, the one Redis keeps and a node that took that
                            # copy first holds already, not another under its id (a duration
                            # counted from now would end it late). An end is dated now.
                            "time": repr(change.rule.created if change.rule is not None else sent),
                            "sent": repr(sent),  # sent now: not a late operation
                        },
                        maxlen=_STREAM_LENGTH,
                        approximate=True,
                    )
                    if change.rule is not None:
                        _store_rule(pipe, self._rules, change.rule, held, time.time())
                        pipe.hdel(self._ended, change.rule_id)
                    else:
                        pipe.hdel(self._rules, change.rule_id)
                        ended = {"kind": change.kind, "until": _end_of(blob), "at": unsent.at}
                        pipe.hset(self._ended, change.rule_id, json.dumps(ended))
                    try:
                        await pipe.execute()
                    except WatchError:
                        continue  # changed meanwhile: looked at again
                    self._learn(change, unsent.at)
            self._unsent.pop(0)
            if send:
                outcome = "sent to the other nodes now"
            elif change.rule is None:
                outcome = "not sent: the cluster does not hold that rule, or made it again since"
            elif held is not None and (other := taken_by(held, change.rule, time.time())) is not None:
                # Two rules under one id, made while the nodes could not compare: neither replaces
                # the other. This node keeps its own, the others theirs; each ends by its id where held.
                _log.error("admin stream: %s %s, made here while Redis was away, not sent: the cluster holds "
                           "the %s under its id; this node keeps the %s", unsent.method, unsent.path,
                           describe_rule(other), describe_rule(change.rule))  # fmt: skip
                continue
            else:
                outcome = "not sent: the cluster holds that rule already, or ended it since"
            _log.warning("admin stream: %s %s, made here while Redis was away, %s", unsent.method, unsent.path, outcome)

    def _stale(self, unsent: _Unsent) -> str | None:
        """Why a rule made here while Redis was away is not to be sent, if it is not: ended here
        since (a later unsent end, which then finds nothing to end), or by itself."""
        change = unsent.change
        if any(
            later.change.rule is None and (later.change.rule_id, later.change.kind) == (change.rule_id, change.kind)
            for later in self._unsent[1:]
        ):
            return "ended here since"
        if change.rule is not None and not change.rule.live(time.time()):
            return "it has ended by itself since"
        return None

    async def _present(self) -> tuple[dict[str, int], dict[str, float]]:
        """The other nodes present: node -> its workers (each answers for itself). Right after
        Redis lost its data, once they have all had the time to say so again (`_settled`).

        And the nodes known but not running: node -> when it was last there (stopped, said so
        with `leave`, or killed and its presence run out), for `REMEMBERED` after that. Not
        waited for, but named: it reads the stream from where it stopped when it starts again,
        and applies what was issued meanwhile (a one-off write within `[redis] late_operations`),
        so an answer that left it out would say "not found" of a message it then bounces."""
        nodes: dict[Any, Any] = await self._settled()
        now = time.time()
        present: dict[str, int] = {}
        stopped: dict[str, float] = {}
        forgotten: list[Any] = []
        for origin, value in nodes.items():
            if origin.decode() == self.origin:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                seen = json.loads(value)
                if seen["expires"] > now:
                    # Two nodes of one name (refused at start, but both may have started while
                    # Redis was away): every answer is waited for and counted.
                    present[seen["node"]] = present.get(seen["node"], 0) + int(seen["workers"])
                elif (last := last_seen(seen)) > now - REMEMBERED:
                    stopped[seen["node"]] = max(stopped.get(seen["node"], 0.0), last)
                    self._stopped_workers[seen["node"]] = int(seen.get("workers", 1))
                else:
                    forgotten.append(origin)
        if forgotten:  # (any node may tidy them up: each says the same of them)
            with contextlib.suppress(RedisError, OSError):
                await self._redis.hdel(self._nodes, *forgotten)
        # A node of this name that runs (its spool moved, or this one) is not also one stopped.
        return present, {node: at for node, at in stopped.items() if node not in present and node != self.node}

    async def _settled(self) -> dict[Any, Any]:
        """The presence hash, once it holds every node present: after Redis lost its data it
        holds only those whose workers have renewed since, and an operation issued then would
        wait for those alone, leaving the others out of its answer without a word. So until
        `_SETTLE` after the loss (the admin keys' epoch), an operation waits for every live worker
        to renew (each worker 0 also gives back the others it saw: `_give_presence_back`).

        Lost, not new: a Redis first used by the cluster looks the same, but every worker that
        knew the epoch before says the new one is a loss (`lost`), and so does this node's own
        presence missing (its workers have not renewed since, or it has just started)."""
        known = self._epoch if self._epoch is not None else self._asked_epoch
        born, now, lost = await self._epoch_script(keys=[self._epoch_key], args=[known or ""])
        self._asked_epoch = born = born.decode()
        nodes: dict[Any, Any] = await self._redis.hgetall(self._nodes)
        left = (int(born) - int(now)) / 1000 + _SETTLE
        if left > 0 and (lost == b"1" or self.origin.encode() not in nodes):
            _log.info(
                "admin: the nodes' presence in Redis is %.1fs old (Redis lost its data, or the cluster has just "
                "started): waiting %.1fs for every node to say it is there",
                _SETTLE - left,
                left,
            )
            await asyncio.sleep(left)
            nodes = await self._redis.hgetall(self._nodes)
        return nodes

    async def _gather(
        self, op: str, expected: dict[str, int], wait: float
    ) -> tuple[dict[str, list[tuple[int, Any]]], list[str]]:
        key = self._answers + op
        deadline = time.monotonic() + wait
        got: dict[str, list[tuple[int, Any]]] = {}

        def missing() -> list[str]:
            return [node for node, workers in expected.items() if len(got.get(node, ())) < workers]

        while missing():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                popped: Any = await self._reader.blpop([key], timeout=min(left, 1.0))
            except (RedisError, OSError) as error:
                _log.warning("cannot collect the other nodes' answers: %s", error)
                break
            if popped is None:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                reply = json.loads(popped[1])
                got.setdefault(reply["node"], []).append((int(reply["status"]), reply["answer"]))
        return got, missing()

    # --- every worker ------------------------------------------------------------------------
    async def join(self, adopt: Adopt, apply: Apply | None = None) -> bool:
        """Before this node delivers anything: find where to read the stream from, then take the
        standing rules in force (in that order: what is appended meanwhile is read from the
        stream), then, with `apply`, apply the writes by id the stream holds past this worker's
        cursor: issued through the other nodes while this one was away. False if Redis did not
        answer: the node starts with the rules its spool kept, and `consume` takes the cluster's,
        and applies what was missed, once Redis answers (the node may have delivered meanwhile).

        A bounce, a hold or a retry by id issued while this node was stopped (answered `pending`:
        "applied there when it starts") must be in the spool before the scheduler starts, which
        would otherwise send the message at once (the rules taken may have made it due: a resume
        issued after the hold, a suspension that ran out meanwhile). Every worker does so for its
        own shards before its scheduler starts, and a worker sends only its own shards' mail.
        Each reads its rows by id: quick, and the start stays bounded. A walk of the spool (a bulk
        bounce, retry or rebind; a rule's entry, whose rule `sync` took already) is left to
        `consume`, which reads on from the first one after the start (the cursor stays before it;
        the writes by id applied after it are skipped then: `_ahead`), as `Admin.adopt` leaves its
        walks: a long one would hold up SMTP, /healthz and the start's READY=1. The writes by id
        keep their order among themselves, and come before a walk issued before them, which then
        leaves a message held or bounced by id as the stream's order would (a retry or a rebind
        by selector leaves a hold by id as it is; a bounce by selector bounces held mail too).
        Read whole before any is applied, so that Redis lost midway does not leave a rule the
        stream ends later in force; no answer is pushed meanwhile (`_join_answers`), and an
        entry's lateness is judged as of the start (`_joined`), not of its turn."""
        started = time.time()
        try:
            async with asyncio.timeout(2 * self._timeout + 1):
                self._cursor = self._saved_cursor() or await self._end_cursor()
                await self.sync(adopt)
                missed = await self._missed(self._cursor) if apply is not None else []
        except (RedisError, OSError, TimeoutError) as error:
            self._down_since = time.monotonic()
            _log.warning(
                "admin stream: Redis cannot be reached (%s): starting with the suspensions and standing bounces "
                "this node's spool kept; those of the cluster are taken once Redis answers",
                error,
            )
            if apply is not None:
                _log.warning(
                    "admin stream: the operations issued through other nodes while this node was away could not be "
                    "read before it delivers: a bounce or a hold by id issued through another node while this node "
                    "was away is applied once Redis answers, and this node may deliver the messages it names first"
                )
            return False
        self._joined = (started, _stream_id(missed[-1][0].decode()) if missed else _stream_id(self._cursor))
        applied = 0
        walks = 0  # entries left to `consume`: the cursor stays before the first
        ahead: list[str] = []
        for entry_id, fields in missed:
            assert apply is not None
            key = entry_id.decode()
            if key in self._ahead:
                continue  # (applied by a start before this one)
            if not _by_id(fields):
                walks += 1
                continue
            applied += await self._apply(fields, apply, at=started, answers=self._join_answers)
            if walks:
                ahead.append(key)
            else:
                self._cursor = key
        if ahead:
            self._ahead.update(ahead)
            self._ahead_max = None
            self._save_ahead()  # (first: an entry in it past the cursor is not applied again)
        self._save_cursor(self._cursor)
        if applied:
            _log.info(
                "admin stream: %d operation(s) by id issued through other nodes while this worker was away applied "
                "before this node delivers anything",
                applied,
            )
        if walks:
            _log.info(
                "admin stream: %d operation(s) issued through other nodes while this worker was away (by selector, "
                "or rules taken already) are applied once this node runs",
                walks,
            )
        return True

    async def _missed(self, cursor: str) -> list[tuple[Any, Any]]:
        """The stream's entries past `cursor`, every one (at most the stream's length)."""
        missed: list[tuple[Any, Any]] = []
        while True:
            read: Any = await self._redis.xread({self._stream: cursor}, count=1000)
            entries = [entry for _, part in read or [] for entry in part]
            if not entries:
                return missed
            missed += entries
            cursor = entries[-1][0].decode()

    async def sync(self, adopt: Adopt) -> None:
        """Take the cluster's standing rules as they are now (see the module's docstring)."""
        kept, given = await self._redis.get(self._kept), True
        if self._lost(kept):
            given = await self._give_back()
        else:
            self._marker = kept
        await self._give_ops_back(self._marker)
        rules: dict[Any, Any] = await self._redis.hgetall(self._rules)
        ended: dict[Any, Any] = await self._redis.hgetall(self._ended)
        if given:  # (else what this worker knew is kept, for its next look to give back)
            self._remember(rules)
            self._ended_known = OrderedDict((rule_id.decode(), value.decode()) for rule_id, value in ended.items())
        now = time.time()
        in_force: list[Rule] = []
        endings: dict[str, str] = {}
        over: list[Any] = []  # ended by time: any node may tidy them up
        over_ended: list[Any] = []
        for rule_id, blob in rules.items():
            try:
                rule = _RULE.decode(blob)
            except msgspec.DecodeError:
                _log.warning("admin rules: rule %r in Redis cannot be read: ignored", rule_id)
                continue
            if rule.live(now):
                in_force.append(rule)
            else:
                over.append(rule_id)
        for rule_id, value in ended.items():
            with contextlib.suppress(ValueError, KeyError, TypeError, UnicodeDecodeError):
                tombstone = json.loads(value)
                if tombstone["until"] is not None and tombstone["until"] <= now:
                    over_ended.append(rule_id)  # it would have ended by now anyway
                    continue
                endings[rule_id.decode()] = str(tombstone["kind"])
        with contextlib.suppress(RedisError, OSError):
            if over:
                await self._redis.hdel(self._rules, *over)
            if over_ended:
                await self._redis.hdel(self._ended, *over_ended)
        added, gone = await adopt(in_force, endings)
        self._synced = True
        for rule in added:
            _log.warning(
                "admin rules: %s %s of %s (by %s%s) taken from the cluster",
                "suspension" if rule.kind == "suspend" else "standing bounce",
                rule.id,
                rule.selector.describe(),
                rule.operator,
                f": {rule.reason}" if rule.reason else "",
            )
        for rule in gone:
            _log.warning("admin rules: %s %s was ended on another node meanwhile: ended here too", rule.kind, rule.id)

    def sync_again(self) -> None:
        """Take the cluster's standing rules again at the next turn of `consume` (this worker
        was handed its node's: one the cluster ended meanwhile ends again)."""
        self._synced = False

    async def _give_back(self) -> bool:
        """Redis lost the cluster's rules since this worker last looked: if it looked lately,
        write back those it holds that were there, but any ended since; and mark the rules
        kept (with this worker's token, unless another worker's is there already). False if
        an end written meanwhile left it to the next look."""
        # What it knows may be stale: only a worker that looked lately gives rules back.
        fresh = self._known_at is not None and time.monotonic() - self._known_at <= _FRESH
        async with self._redis.pipeline(transaction=True) as pipe:
            # A rule or an end written meanwhile (by another worker giving back) makes this try again.
            await pipe.watch(self._ended, self._rules)
            ended: dict[Any, Any] = await pipe.hgetall(self._ended)
            in_redis: dict[Any, Any] = await pipe.hgetall(self._rules)
            now = time.time()
            rules = [
                rule
                for rule in (self._held() if fresh else [])
                if rule.live(now) and rule.id in self._known and rule.id.encode() not in ended
            ]
            # The ends too: a node stopped before a resume, and started once Redis had forgotten
            # it, would hold the suspension again, alone. Of one rule, the later word stands: an
            # end after the rule another worker gave back (it had not read the end) ends it; a
            # rule made again after the end is left as it is.
            giving = {rule.id for rule in rules}
            ends: dict[str, str] = {}
            superseded: list[str] = []
            for rule_id, tombstone in self._ended_known.items() if fresh else ():
                if rule_id.encode() in ended or rule_id in giving or not _ends_later(tombstone, now):
                    continue
                back = _decoded(in_redis.get(rule_id.encode()))
                if back is not None and not _ended_after(tombstone, back.created):
                    continue
                if back is not None:
                    superseded.append(rule_id)
                ends[rule_id] = tombstone
            pipe.multi()  # type: ignore[no-untyped-call]
            for rule in rules:
                pipe.hsetnx(self._rules, rule.id, msgspec.json.encode(rule))
            for rule_id, tombstone in ends.items():
                pipe.hsetnx(self._ended, rule_id, tombstone)
            if superseded:
                pipe.hdel(self._rules, *superseded)
            # Not the first worker back only: each gives back what it knew (one may have read
            # the stream entry of a rule that another had not yet seen), so each finds the
            # marker changed and gives back in turn; HSETNX takes each rule once.
            pipe.set(self._kept, secrets.token_hex(8), nx=True)
            pipe.get(self._kept)
            try:
                written = await pipe.execute()
            except WatchError:
                return False  # the next look tries again
        self._marker = written[-1]
        given = sum(1 for done in written[: len(rules)] if done)
        if given:
            _log.warning(
                "admin rules: Redis held none of the cluster's standing rules (restarted without its data?): "
                "%d held here given back",
                given,
            )
        ended_back = sum(1 for done in written[len(rules) : len(rules) + len(ends)] if done)
        if ended_back:
            _log.warning(
                "admin rules: Redis had forgotten the rules ended lately: %d ends known here given back "
                "(a node that comes back ends its copy)",
                ended_back,
            )
        return True

    async def consume(self, apply: Apply, adopt: Adopt | None = None) -> None:
        """Apply what other nodes append, until cancelled; with `adopt`, take the cluster's
        standing rules whenever Redis answers again. Never raises for Redis's sake."""
        cursor = self._cursor or await self._start_cursor()
        renewed = 0.0
        # Not `while True`: a cancel can be lost inside redis-py on Python 3.11 (see
        # RedisArbiter._beat_forever), and the node's stop would wait for this loop for ever.
        while not _cancelling():
            try:
                if self._join_answers:
                    await self._answer_joined()
                if self._unsent:  # (the front of a one-worker node) before the cluster's rules are taken
                    await self.send_unsent()
                if adopt is not None and not self._synced:
                    await self.sync(adopt)
                if time.monotonic() - renewed >= _RENEW:
                    await self._renew()
                    renewed = time.monotonic()
                    if not await self._look() and adopt is not None:
                        self._synced = False  # the cluster's rules were lost: taken again, as given back
                        continue
                read: Any = await self._reader.xread({self._stream: cursor}, count=100, block=_BLOCK_MS)
                if self._down_since is not None:
                    _log.info("admin stream: Redis answers again; reading on from %s", cursor)
                    self._down_since = None
            except (RedisError, OSError) as error:
                self._synced = False  # what was ended or made meanwhile is taken when it answers
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    _log.warning("admin stream: Redis cannot be reached (%s); trying again every second", error)
                await asyncio.sleep(1.0)
                continue
            for _, entries in read or []:
                for entry_id, fields in entries:
                    cursor = entry_id.decode()
                    if cursor not in self._ahead:
                        joined = self._joined
                        at = joined[0] if joined is not None and _stream_id(cursor) <= joined[1] else None
                        await self._apply(fields, apply, at=at)
                    self._save_cursor(cursor)
                    if self._ahead and _stream_id(cursor) >= self._ahead_last():
                        self._ahead.clear()  # (the cursor is past them all)
                        self._save_ahead()
        raise asyncio.CancelledError

    async def _answer_joined(self) -> None:
        """Push the answers to the writes `join` applied that their origin may still wait for
        (it waits `WRITE_WAIT` for a node that was present: one killed a moment before, say)."""
        kept = max(WRITE_WAIT, self._late)  # (the node that keeps an operation for this one learns it was applied)
        waited = [(key, reply) for key, reply, sent in self._join_answers if time.time() - sent < kept]
        if waited:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key, reply in waited:
                    pipe.rpush(key, reply)
                    pipe.expire(key, self._answers_kept())
                await pipe.execute()
        self._join_answers.clear()

    async def _apply(
        self,
        raw: dict[bytes, bytes],
        apply: Apply,
        *,
        at: float | None = None,
        answers: list[tuple[str, str, float]] | None = None,
    ) -> bool:
        """Apply one entry here, unless this node issued it, or it is too old (as of `at`; None:
        now): whether a write was. Its answer is pushed to the origin, or, with `answers`, kept
        there (answer list, reply, when sent) for `consume` to push."""
        fields = {k.decode(): v for k, v in raw.items()}
        try:
            origin = fields["origin"].decode()
            method = fields["method"].decode()
            path = fields["path"].decode()
            issued = float(fields["time"])
            op = fields["op"].decode()
        except (KeyError, ValueError, UnicodeDecodeError):
            _log.warning("admin stream: an entry without its fields was skipped: %r", sorted(fields))
            return False
        change = rule_change(method, path, fields.get("body", b""), "", issued) if method != "GET" else None
        # Whichever node made it, and however old: a rule Redis holds is known at once, not
        # at this worker's next look, which a loss of Redis's data may come before.
        self._learn(change, issued)
        if origin == self.origin:
            return False  # the origin applied it to its workers itself
        if b"for" in raw:  # given back after Redis lost its data (`_give_ops_back`): for the nodes named
            with contextlib.suppress(ValueError, TypeError):
                if self.node not in json.loads(raw[b"for"]):
                    return False
        if change is None and method != "GET" and op in self._applied:
            _log.info(
                "admin stream: %s %s (operation %s) was applied here already: not applied again", method, path, op
            )
            return False
        # How late it comes: since it was sent (a rule made while its node was cut off from
        # Redis is dated when it was made, and sent once Redis answered: `send_unsent`).
        sent = issued
        with contextlib.suppress(KeyError, ValueError):
            sent = float(fields["sent"])
        age = (time.time() if at is None else at) - sent
        if age > (_READ_REPLAY if method == "GET" else self._late):
            if method == "GET":
                return False
            node = fields.get("node", b"?").decode(errors="replace")
            if change is None or (change.kind == "bounce" and change.rule is not None):
                _log.warning(
                    "admin stream: %s %s from node %s is %.0fs old: %s was not applied here (past %.0fs, "
                    "[redis] late_operations)%s",
                    method,
                    path,
                    node,
                    age,
                    "its bounce of what was queued then" if change is not None else "it",
                    self._late,
                    "; its standing bounce, if still in force, was taken from the cluster's rules"
                    if change is not None
                    else "; issue it again if it still stands",
                )
            else:  # a suspension, a cancel, a resume: this node holds what the cluster's rules say
                _log.info(
                    "admin stream: %s %s from node %s is %.0fs old: its rule is as the cluster's rules say",
                    method,
                    path,
                    node,
                    age,
                )
            return False
        operator = fields.get("operator", b"").decode(errors="replace")
        try:
            status, answer = await apply(method, path, fields.get("body", b""), operator, issued)
        except Exception as error:  # one bad entry must not stop the stream for good
            _log.exception("admin stream: %s %s failed here", method, path)
            status, answer = 500, {"error": f"node {self.node} failed to apply it: {error!r}"}
        if change is None and method != "GET":
            self._applied[op] = sent
            self._save_applied()
        if status == 409 and isinstance(answer, dict):
            # Another rule has its id here (made while this node was cut off from Redis): kept, not
            # replaced; the origin's answer is this refusal, naming it.
            node = fields.get("node", b"?").decode(errors="replace")
            _log.error("admin stream: %s %s from node %s refused here: %s", method, path, node, answer.get("error"))
            answer["error"] = f"node {self.node}: {answer.get('error')}"
        reply = json.dumps({"node": self.node, "worker": self._worker, "status": status, "answer": answer})
        key = self._answers + op
        if answers is not None:
            # (else its origin stopped waiting for it, and no longer keeps it for this node)
            if time.time() - sent < max(WRITE_WAIT, self._late):
                answers.append((key, reply, sent))
            return method != "GET"
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.rpush(key, reply)
                pipe.expire(key, self._answers_kept())
                await pipe.execute()
        except (RedisError, OSError) as error:
            _log.warning("admin stream: applied %s %s, but could not answer: %s", method, path, error)
        return method != "GET"  # (a read changed nothing)

    async def leave(self) -> None:
        """Say this node is gone (on a graceful stop, once this worker reads no more): an
        operation issued meanwhile then waits for the nodes still there, not 30 s for this one.
        Every worker of the node says it after its own last renewal, so the last one to stop wins."""
        # Not forgotten: known, not running, since now (`_present`), so the writes issued until
        # it starts again name it as the node that applies them then.
        now = time.time()
        gone = {"node": self.node, "spool": self._spool, "workers": self._workers, "expires": now, "left": now}
        # At most a second: a stop must not wait out an unreachable Redis's timeouts for this.
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(1.0):
                await self._redis.hset(self._nodes, self.origin, json.dumps(gone))

    async def _look(self) -> bool:
        """Whether Redis still holds the cluster's rules; if not, give back those this worker
        knew there. A restart can pass unseen between two reads (the client reconnects once
        by itself): the marker tells."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self._kept)
            pipe.hkeys(self._rules)
            kept, ids = await pipe.execute()
        if not self._lost(kept):
            self._marker = kept
            self._remember(dict.fromkeys(ids))
            await self._follow_ops()
            await self._give_ops_back(kept)
            return True
        if await self._give_back():
            await self._give_ops_back(self._marker)
        return False

    def _lost(self, kept: Any) -> bool:
        """Whether Redis lost the cluster's rules since this worker last looked, its marker
        being `kept` now: gone, or set again by another worker that found it gone."""
        return kept is None or (self._marker is not None and kept != self._marker)

    def _remember(self, rules: dict[Any, Any]) -> None:
        self._known = {rule_id.decode() for rule_id in rules}
        self._known_at = time.monotonic()

    def _learn(self, change: RuleChange | None, at: float) -> None:
        """A change to the cluster's rules that Redis took (the stream holds it), made `at`: a
        rule made there, or ended, is one to give back should Redis lose it before this worker
        next looks (an end with the tombstone Redis keeps for it, near enough)."""
        if change is None:
            return
        self._ended_known.pop(change.rule_id, None)
        if change.rule is not None:
            self._known.add(change.rule_id)
            return
        self._known.discard(change.rule_id)
        # Until the rule would have ended anyway, as far as this worker knows it (it holds it still).
        until = next((rule.expires for rule in self._held() if rule.id == change.rule_id), None)
        self._ended_known[change.rule_id] = json.dumps({"kind": change.kind, "until": until, "at": at})
        while len(self._ended_known) > _ENDED_KNOWN:
            self._ended_known.popitem(last=False)

    async def _renew(self) -> None:
        born, redis_now, _ = await self._epoch_script(keys=[self._epoch_key], args=[self._epoch or ""])
        if self._epoch is not None and born.decode() != self._epoch:
            await self._give_presence_back((int(redis_now) - int(born)) / 1000)
        self._epoch = born.decode()
        presence = {
            "node": self.node,
            "spool": self._spool,
            "workers": self._workers,
            "expires": time.time() + PRESENCE,
        }
        await self._redis.hset(self._nodes, self.origin, json.dumps(presence))
        if self._namesakes is None:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._nodes)
            pipe.hgetall(self._forgotten_nodes)
            self._others_present, forgotten = await pipe.execute()
        self._learn_forgotten(forgotten_entries(forgotten, time.time()))
        renewed = self._namesakes.look(self._others_present, time.time())
        said = self._namesake_said
        if renewed and (said is None or time.monotonic() - said >= _NAMESAKE_EVERY):
            self._namesake_said = time.monotonic()
            _log.error(
                'another node named "%s", as this one is, runs now (%s): the cluster counts it and this one as one '
                "node, so cluster reads and bulk operations leave out one of the two's mail, and limits shared "
                "through Redis are overrun while Redis is away; give one of them another [node] name",
                self.node,
                renewed[0],
            )

    def forgot(self, entries: dict[str, float]) -> None:
        """The cluster forgot these presence entries (hash field -> when the node was last there),
        asked through this worker: said again should Redis lose its data before every worker 0
        has seen it (`pigeon.node.presence.forget`)."""
        self._learn_forgotten({field.encode(): at for field, at in entries.items()})

    def _learn_forgotten(self, forgotten: dict[bytes, float]) -> None:
        for field, at in forgotten.items():
            self._forgotten[field] = max(at, self._forgotten.get(field, at))
        past = time.time() - REMEMBERED  # (its entry would be forgotten by now anyway)
        for field in [field for field, at in self._forgotten.items() if at <= past]:
            del self._forgotten[field]

    async def _give_presence_back(self, since: float) -> None:
        """Redis lost its data since this worker last renewed (its epoch was born `since` s ago, by
        Redis's clock): write back the other nodes' presence as it was then, each until it would
        have run out anyway, or the wait after the loss is over if later. An operation issued
        meanwhile then waits for the nodes that were there, and names those that do not answer,
        rather than leaving out a node that was killed a moment before the loss (its workers say
        nothing more)."""
        now = time.time()
        lost = now - since  # (this node's clock: presence is dated by the nodes, not by Redis)
        # What this worker last saw of a node killed just before the loss is up to two renewals
        # old, and could run out during the wait (`_SETTLE`) of an operation issued right after
        # it, which would then leave the node out without a word. So it lasts until that wait is
        # over, plus a renewal's time for the issuer's read of presence just after it (a busy
        # machine); no longer, so a node killed is named only as long as it would have been.
        settled = lost + _SETTLE + _RENEW
        self._learn_forgotten({})  # (those past `REMEMBERED` dropped)
        back: dict[bytes, Any] = {}
        for origin, value in self._others_present.items():
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                seen = json.loads(value)
                expires = float(seen["expires"])
                if origin == self.origin.encode() or is_forgotten(self._forgotten, bytes(origin), value):
                    continue  # (a node forgotten after this worker last looked: not given back)
                if expires <= lost or max(expires, settled) <= now:
                    # Gone before the loss (or since, and the wait is over): known still, as it was.
                    if last_seen(seen) > now - REMEMBERED:
                        back[bytes(origin)] = value
                    continue
                seen["renewed"] = last_seen(seen)  # (when it was last there: not moved by the longer stay)
                seen["expires"] = max(expires, settled)
                back[bytes(origin)] = json.dumps(seen)
        if not back and not self._forgotten:
            return
        given, removed = await self._put_presence_back(back)
        if given:
            _log.info("admin stream: Redis lost its data: the presence of %d other node(s) given back", given)
        if removed:
            _log.info("admin stream: Redis lost its data: %d node(s) forgotten before were given back by another "
                      "node, and are forgotten again", removed)  # fmt: skip

    async def _put_presence_back(self, back: dict[bytes, Any]) -> tuple[int, int]:
        """Give `back` the presence entries, and the nodes forgotten this worker knows, in one
        transaction, whatever other workers gave back before (watched): an entry a forget covers
        is not given back (another worker may know of a forget this one does not), and one another
        worker gave back is removed. Each entry given back only where there is none (one that
        renewed meanwhile says more). How many entries it gave back, and how many it removed."""
        for _ in range(_WATCH_TRIES):
            async with self._redis.pipeline(transaction=True) as pipe:
                await pipe.watch(self._nodes, self._forgotten_nodes)
                there: dict[Any, Any] = await pipe.hgetall(self._nodes)
                said = forgotten_entries(await pipe.hgetall(self._forgotten_nodes), time.time())
                forgotten = dict(said)
                for field, at in self._forgotten.items():
                    forgotten[field] = max(at, forgotten.get(field, at))
                given = [
                    (origin, value)
                    for origin, value in back.items()
                    if origin not in there and not is_forgotten(forgotten, origin, value)
                ]
                removed = [origin for origin, value in there.items() if is_forgotten(forgotten, bytes(origin), value)]
                untold = {field: repr(at) for field, at in forgotten.items() if said.get(field) != at}
                if not given and not removed and not untold:
                    return 0, 0
                pipe.multi()  # type: ignore[no-untyped-call]
                for origin, value in given:
                    pipe.hset(self._nodes, origin, value)
                if removed:
                    pipe.hdel(self._nodes, *removed)
                if untold:
                    pipe.hset(self._forgotten_nodes, mapping=untold)  # type: ignore[arg-type]
                    pipe.expire(self._forgotten_nodes, int(REMEMBERED))
                try:
                    await pipe.execute()
                except WatchError:
                    continue  # another worker gave back, or renewed, meanwhile: looked at again
                return len(given), len(removed)
        raise WatchError(f"the nodes' presence changed {_WATCH_TRIES} times while it was being given back")

    # --- one-off writes pending on another node, kept for Redis's sake -------------------------
    def _hold_op(self, entry: dict[str, Any], waited: dict[str, int], marker: Any) -> None:
        """Keep `entry` (a one-off write issued here) for the nodes that have not applied it yet
        (node -> its workers still to answer), in this node's spool: the stream alone would lose
        it with Redis's data, and the node would never apply what it was told it would. `marker`:
        the rules' marker then (`_kept`), another one later says Redis lost its data since."""
        kept = {field: value.decode("latin-1") if isinstance(value, bytes) else value for field, value in entry.items()}
        said = marker.decode(errors="replace") if isinstance(marker, bytes) else None

        def add(held: dict[str, Any]) -> None:
            held[str(entry["op"])] = {"entry": kept, "for": waited, "marker": said}

        self._edit_held_ops(add)

    def _edit_held_ops(self, edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Read the operations this node keeps, let `edit` change them, and write them back if it
        did, under a lock: the origin (the supervisor) adds, worker 0 drops. What they are after."""
        try:
            with open(self._held_ops_path.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                held: dict[str, Any] = {}
                with contextlib.suppress(OSError, ValueError):
                    read = json.loads(self._held_ops_path.read_bytes())
                    held = read if isinstance(read, dict) else {}
                before = json.dumps(held, sort_keys=True)
                now = time.time()
                for op in [op for op, kept in held.items() if _op_time(kept) < now - REMEMBERED]:
                    del held[op]  # (too old to say anything of, even after a loss)
                edit(held)
                while len(held) > _OPS_KEPT:
                    del held[min(held, key=lambda op: _op_time(held[op]))]
                if not held:
                    self._held_ops_path.unlink(missing_ok=True)  # (worker 0 then reads nothing at its looks)
                elif json.dumps(held, sort_keys=True) != before:
                    temporary = self._held_ops_path.with_name(self._held_ops_path.name + ".tmp")
                    temporary.write_text(json.dumps(held))
                    os.replace(temporary, self._held_ops_path)
                return held
        except OSError as error:
            _log.warning("admin stream: cannot keep the operations pending on other nodes %s: %s",
                         self._held_ops_path, error)  # fmt: skip
            return {}

    async def _follow_ops(self) -> None:
        """Worker 0: drop the operations kept here (`_hold_op`) once every node named has applied
        them (each of its workers has answered)."""
        if self._worker != 0 or not self._held_ops_path.exists():
            return
        held = self._edit_held_ops(lambda held: None)
        if not held:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for op in held:
                pipe.lrange(self._answers + op, 0, -1)
            said: list[Any] = await pipe.execute()
        answered: dict[str, dict[str, int]] = {}
        for op, replies in zip(held, said, strict=True):
            for reply in replies:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    node = str(json.loads(reply)["node"])
                    answered.setdefault(op, {})[node] = answered.get(op, {}).get(node, 0) + 1

        def drop(held: dict[str, Any]) -> None:
            for op, counts in answered.items():
                kept = held.get(op)
                if not isinstance(kept, dict) or not isinstance(kept.get("for"), dict):
                    continue
                kept["for"] = {node: n for node, n in kept["for"].items() if counts.get(node, 0) < n}
                if not kept["for"]:
                    del held[op]

        if answered:
            self._edit_held_ops(drop)

    async def _give_ops_back(self, marker: Any) -> None:
        """Worker 0: append again to the stream the operations kept here for nodes that have not
        applied them, if Redis lost its data since they were kept (the rules' marker, now `marker`,
        is another: this worker may have been stopped meanwhile), each for those nodes alone
        (`for`), under its own id (a node applies an operation once: `_applied`); one too old to
        be applied late ([redis] late_operations) cannot be, and a WARNING names it and the nodes
        that missed it."""
        if self._worker != 0 or marker is None or not self._held_ops_path.exists():
            return
        now = time.time()
        said = marker.decode(errors="replace") if isinstance(marker, bytes) else str(marker)
        late: dict[str, Any] = {}
        held: dict[str, Any] = {}

        def lost(kept: dict[str, Any]) -> None:
            for op, one in list(kept.items()):
                if not isinstance(one, dict) or one.get("marker") == said:
                    continue
                if now - _op_time(one) > self._late:
                    late[op] = kept.pop(op)
                else:
                    held[op] = one

        self._edit_held_ops(lost)
        for op, kept in late.items():
            with contextlib.suppress(KeyError, TypeError, AttributeError):
                entry = kept["entry"]
                _log.warning(
                    "admin stream: Redis lost its data: operation %s (%s %s by %s, issued through node %s %.0fs ago) "
                    "was not applied yet on node(s) %s, and is past [redis] late_operations (%.0fs): not given back; "
                    "issue it again there if it still stands",
                    op, entry["method"], entry["path"], entry["operator"], entry["node"], now - _op_time(kept),
                    ", ".join(sorted(kept["for"])), self._late,
                )  # fmt: skip
        given: list[str] = []
        sent: list[str] = []
        for op, kept in held.items():
            with contextlib.suppress(KeyError, TypeError, AttributeError):
                fields = {field: str(value).encode("latin-1") for field, value in kept["entry"].items()}
                fields["for"] = json.dumps(sorted(kept["for"])).encode()
                await self._redis.xadd(self._stream, fields, maxlen=_STREAM_LENGTH, approximate=True)  # type: ignore[arg-type]
                sent.append(op)
                given.append(
                    f"{op} ({kept['entry']['method']} {kept['entry']['path']} for {', '.join(sorted(kept['for']))})"
                )

        def mark(kept: dict[str, Any]) -> None:
            for op in sent:
                if isinstance(kept.get(op), dict):
                    kept[op]["marker"] = said  # (given back once for this loss)

        if sent:
            self._edit_held_ops(mark)
        if given:
            _log.warning(
                "admin stream: Redis lost its data: %d operation(s) issued through this node and not yet applied on "
                "the nodes named given back: %s",
                len(given),
                "; ".join(given),
            )

    def _answers_kept(self) -> int:
        """Seconds an answer list lives: long enough for the origin to read it, and for the node
        that keeps an operation pending on this one to learn it was applied (`_follow_ops`)."""
        return max(_ANSWERS_KEPT, int(self._late) + 60)

    def _saved_applied(self) -> dict[str, float]:
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            read = json.loads(self._applied_path.read_bytes())
            return {str(op): float(at) for op, at in read.items()}
        return {}

    def _save_applied(self) -> None:
        # Kept while an operation may still be applied late, and a while longer: a clock's margin.
        past = time.time() - 2 * self._late - 60
        self._applied = {op: at for op, at in self._applied.items() if at > past}
        temporary = self._applied_path.with_name(self._applied_path.name + ".tmp")
        try:
            temporary.write_text(json.dumps(self._applied))
            os.replace(temporary, self._applied_path)
        except OSError as error:
            _log.warning("admin stream: cannot save the operations applied %s: %s", self._applied_path, error)

    def _saved_cursor(self) -> str | None:
        with contextlib.suppress(OSError):
            return self._cursor_path.read_text().strip() or None
        return None

    async def _end_cursor(self) -> str:
        last: Any = await self._redis.xrevrange(self._stream, count=1)
        cursor: str = last[0][0].decode() if last else "0-0"
        self._save_cursor(cursor)
        return cursor

    async def _start_cursor(self) -> str:
        """Where this worker reads on from: its saved cursor, or (first start) the stream's end."""
        saved = self._saved_cursor()
        if saved:
            return saved
        while True:
            try:
                return await self._end_cursor()
            except (RedisError, OSError) as error:
                if _cancelling():
                    raise asyncio.CancelledError from error  # (lost by redis-py: see `consume`)
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    _log.warning("admin stream: Redis cannot be reached (%s); trying again every second", error)
                await asyncio.sleep(1.0)

    def _ahead_last(self) -> tuple[int, int]:
        if self._ahead_max is None:
            self._ahead_max = max(map(_stream_id, self._ahead))
        return self._ahead_max

    def _saved_ahead(self) -> set[str]:
        with contextlib.suppress(OSError):
            # (a line that is no entry's id, written by no Pigeon, is left out)
            return {entry for entry in self._ahead_path.read_text().split() if _ENTRY_ID.fullmatch(entry)}
        return set()

    def _save_ahead(self) -> None:
        try:
            if not self._ahead:
                self._ahead_path.unlink(missing_ok=True)
                return
            temporary = self._ahead_path.with_name(self._ahead_path.name + ".tmp")
            temporary.write_text("\n".join(sorted(self._ahead, key=_stream_id)) + "\n")
            os.replace(temporary, self._ahead_path)
        except OSError as error:
            _log.warning("admin stream: cannot save the entries applied ahead %s: %s", self._ahead_path, error)

    def _save_cursor(self, cursor: str) -> None:
        # Not fsynced: after a crash an entry may be applied twice, and every admin operation
        # is idempotent (a rule keeps its id; bounced mail is gone; a retry is due already).
        temporary = self._cursor_path.with_name(self._cursor_path.name + ".tmp")
        try:
            temporary.write_text(cursor)
            os.replace(temporary, self._cursor_path)
        except OSError as error:
            _log.warning("admin stream: cannot save the cursor %s: %s", self._cursor_path, error)


def _op_time(kept: Any) -> float:
    """When an operation kept for another node (`Broadcast._hold_op`) was issued (0: not known)."""
    with contextlib.suppress(KeyError, TypeError, ValueError):
        return float(kept["entry"]["time"])
    return 0.0


def _stream_id(entry: str) -> tuple[int, int]:
    """A stream entry's id (`ms-seq`), in the stream's order."""
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq or 0)


def _by_id(raw: dict[bytes, bytes]) -> bool:
    """Whether a stream entry is a write by id (`messages`): rows read by id, not a walk."""
    if raw.get(b"method") != b"POST" or raw.get(b"path", b"").decode(errors="replace").rstrip("/") not in _BY_ID:
        return False
    try:
        body = json.loads(raw.get(b"body", b""))
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("messages"), list) and bool(body["messages"])


def _cancelling() -> bool:
    """Whether this task was asked to stop, even if the CancelledError was lost on the way
    (the task still says so: nothing here uncancels it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _Unsent(NamedTuple):
    """A rule write made here while Redis was away (`Broadcast.send_unsent`), made `at`."""

    method: str
    path: str
    body: bytes
    operator: str
    at: float
    change: RuleChange


def _decoded(blob: Any) -> Rule | None:
    with contextlib.suppress(msgspec.DecodeError, TypeError):
        return _RULE.decode(blob) if blob is not None else None
    return None


def _store_rule(pipe: Any, key: str, rule: Rule, held: Rule | None, now: float) -> None:
    """Queue on `pipe` (watching `key`) the storing of `rule` in the cluster's rules: it does
    not replace a live rule under its id (the first made stands), but does one that has run out
    and not been tidied yet (`sync`): an id reused after its rule ended names the new rule, and a
    node that joins later must take that one, not the old one, which it would pass over."""
    if held is not None and held.live(now):
        pipe.hsetnx(key, rule.id, msgspec.json.encode(rule))
    else:
        pipe.hset(key, rule.id, msgspec.json.encode(rule))


def _ended_after(tombstone: Any, when: float) -> bool:
    """Whether a tombstone kept in Redis says its rule was ended after `when`."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        at = json.loads(tombstone).get("at") if tombstone is not None else None
        return at is not None and float(at) > when
    return False


def _ends_later(tombstone: Any, now: float) -> bool:
    """Whether a tombstone still says something at `now`: its rule would not have ended by itself."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        until = json.loads(tombstone).get("until")
        return until is None or float(until) > now
    return False


def _end_of(blob: Any) -> float | None:
    """When a rule kept in Redis would end by itself (None: until cancelled, or not known)."""
    with contextlib.suppress(msgspec.DecodeError, TypeError):
        return _RULE.decode(blob).expires if blob is not None else None
    return None


def _already_everywhere(answers: list[tuple[int, Any]]) -> bool:
    """Whether a rule write found its rule in force on every worker of every node that answered
    (`already`: nothing added anywhere). Not whether one worker did: a worker that took the rule
    from its node's rules, or from the cluster's, before it read the request (it was restarting,
    or back from a Redis outage) holds it already, though this very request made it."""
    said = [
        answer["already"]
        for status, answer in answers
        if status < 400 and isinstance(answer, dict) and "already" in answer
    ]
    return bool(said) and all(said)


def _name_holder(answer: Any, node: str) -> None:
    """Name `node` in each row of a write by id (`messages`) of a message it holds: an operator
    who asked one node learns which node the message is on (its `pigeon inspect`)."""
    said = answer.get("answers", answer) if isinstance(answer, dict) else None
    for row in said.get("messages", []) if isinstance(said, dict) else []:
        if isinstance(row, dict) and row.get("result") != NOT_FOUND:
            row["node"] = node


def _pending_rows(merged: dict[str, Any], pending: list[str]) -> None:
    """A row of a write by id that no node which answered holds is `pending` rather than
    `not_found` while a node has not answered (`pending_on` names them): the message may be on
    one of those, which applies the write when it gets to it (or starts again)."""
    if not pending:
        return
    for row in merged.get("messages", []):
        if isinstance(row, dict) and row.get("result") == NOT_FOUND:
            row["result"] = "pending"
            row["pending_on"] = pending


def _unreached_rows(answer: Any, node: str) -> None:
    """A row of a write by id that `node`, the only one asked (Redis cannot be reached), does not
    hold is `unknown`, `not_found_on` naming it: the message may be on another node, which was
    not told (`cluster.others_unreached`), so it is not said to be nowhere."""
    said = answer.get("answers", answer) if isinstance(answer, dict) else None
    for row in said.get("messages", []) if isinstance(said, dict) else []:
        if isinstance(row, dict) and row.get("result") == NOT_FOUND:
            row["result"] = UNKNOWN
            row["not_found_on"] = [node]


def _holders(answers: dict[str, list[tuple[int, Any]]]) -> dict[str, list[str]]:
    """Which nodes hold each rule listed (node -> its workers' answers): a node holds a rule
    that every one of its answers lists, so a list adding up the nodes does not pass off one
    node's rule as every node's."""
    held: dict[str, list[str]] = {}
    for node, replies in sorted(answers.items()):
        listed = [
            {rule.get("id") for rule in answer.get("rules", []) if isinstance(rule, dict)}
            for status, answer in replies
            if status == 200 and isinstance(answer, dict)
        ]
        for rule_id in set.intersection(*listed) if listed else set():
            held.setdefault(str(rule_id), []).append(node)
    return held
