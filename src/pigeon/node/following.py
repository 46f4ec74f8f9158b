"""The node's standing rules follow the cluster's: a supervisor's file learns what other nodes did.

A multi-worker node's supervisor keeps the rules made and ended through it (`pigeon.node.standing`),
and a worker that starts takes them before it delivers. A rule ended through another node reaches
the workers by the admin stream (`pigeon.node.broadcast`), never the supervisor: its file went on
holding the rule in force, and a worker that started once Redis had lost its data took it back (a
standing bounce bounced new mail at once). So the supervisor follows the cluster's rules too, for
its file only (it answers nothing on the stream, applies nothing to a worker):

- when it starts, and whenever Redis answers again after an outage, it notes where the stream ends,
  then reads the rules in force and those ended (`<prefix>:admin:rules`, `...:ended`): what the
  entries up to there did (written in one transaction with each of them);
- then it reads the stream on from there, and learns each rule another node made or ended.

What it reads of the rules is numbered as the node's rules were when it asked (`NodeRules.learn`): a
write through this node numbered meanwhile is the later word about its rule. An entry is learnt in
the stream's order, as the workers apply it; an end issued before the rule the file holds was made
does not end it (made again since, through this node or another).
A rule the cluster never held (made while Redis was away) is left as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pigeon.config.schema import Config
from pigeon.listener.http.admin import rule_change
from pigeon.node.broadcast import origin_of
from pigeon.node.standing import NodeRules, Tombstone
from pigeon.queue.rules import Rule

_log = logging.getLogger(__name__)

_BLOCK_MS: Final = 1000
_RULE: Final = msgspec.json.Decoder(Rule)


class Follower:
    """The supervisor's reader of the cluster's rule changes, for `rules` (its file)."""

    def __init__(self, config: Config, rules: NodeRules, send: Callable[[], Awaitable[None]] | None = None) -> None:
        """`send`: the writes made here while Redis was away sent to the cluster first (before the
        rules in Redis are read, which would give back a rule ended here meanwhile)."""
        redis = config.redis
        assert redis.url is not None
        self._rules = rules
        self._send = send
        self._origin = origin_of(config)
        prefix = redis.key_prefix
        self._stream = f"{prefix}:admin:stream"
        self._in_force = f"{prefix}:admin:rules"
        self._ended = f"{prefix}:admin:rules:ended"
        timeout = float(redis.timeout)
        self._redis = aioredis.Redis.from_url(
            redis.url, socket_timeout=timeout + _BLOCK_MS / 1000, socket_connect_timeout=timeout
        )

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self._redis.aclose()

    async def run(self) -> None:
        """Follow until cancelled; never raises for Redis's sake."""
        cursor: str | None = None  # None: to be read from the rules as they are now
        down = False
        while True:
            try:
                if self._send is not None:
                    await self._send()
                if cursor is None:
                    cursor = await self._catch_up()
                read: Any = await self._redis.xread({self._stream: cursor}, count=100, block=_BLOCK_MS)
            except (RedisError, OSError) as error:
                cursor = None  # what changed meanwhile is read from the rules when it answers
                if not down:
                    _log.info("admin rules: the node's rules cannot follow the cluster's (%s): again once Redis "
                              "answers", error)  # fmt: skip
                down = True
                await asyncio.sleep(1.0)
                continue
            down = False
            learnt = False
            for _, entries in read or []:
                for entry_id, fields in entries:
                    learnt = self._entry(fields) or learnt
                    cursor = entry_id.decode()
            if learnt:
                _log.info("admin rules: the node's rules learnt what another node made or ended")
                self._rules.save(time.time())

    async def _catch_up(self) -> str:
        """The rules as they are now, learnt; where the stream ended just before they were read."""
        last: Any = await self._redis.xrevrange(self._stream, count=1)
        cursor: str = last[0][0].decode() if last else "0-0"
        as_of = self._rules.standing.generation
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(self._in_force)
            pipe.hgetall(self._ended)
            rules, ended = await pipe.execute()
        in_force: list[Rule] = []
        for blob in rules.values():
            with contextlib.suppress(msgspec.DecodeError):
                in_force.append(_RULE.decode(blob))
        tombstones: dict[str, tuple[Tombstone, float | None]] = {}
        for rule_id, value in ended.items():
            with contextlib.suppress(ValueError, KeyError, TypeError, UnicodeDecodeError):
                tombstone = json.loads(value)
                until, at = tombstone.get("until"), tombstone.get("at")
                tombstones[rule_id.decode()] = (
                    Tombstone(str(tombstone["kind"]), float(until) if until is not None else None),
                    float(at) if at is not None else None,
                )
        if self._rules.learn(in_force, tombstones, as_of, time.time()):
            self._rules.save(time.time())
        return cursor

    def _entry(self, raw: dict[bytes, bytes]) -> bool:
        """Learn the rule an entry of another node made or ended; whether the file changed. (Read
        in the stream's order: the writes through this node numbered so far are older or concurrent,
        and an end issued before the rule held was made does not end it.)"""
        try:
            if raw[b"origin"].decode() == self._origin:
                return False  # a write through this node: kept as its workers took it
            method = raw[b"method"].decode()
            path = raw[b"path"].decode()
            issued = float(raw[b"time"])
            operator = raw.get(b"operator", b"").decode(errors="replace")
        except (KeyError, ValueError, UnicodeDecodeError):
            return False
        if method == "GET":
            return False
        change = rule_change(method, path, raw.get(b"body", b""), operator, issued)
        if change is None:
            return False
        as_of = self._rules.standing.generation
        if change.rule is not None:
            return self._rules.learn([change.rule], {}, as_of, time.time())
        return self._rules.learn([], {change.rule_id: (Tombstone(change.kind), issued)}, as_of, time.time())
