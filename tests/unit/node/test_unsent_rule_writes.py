"""A rule write made while Redis was away is sent to the cluster once it answers
(`Broadcast.send_unsent`), unless the cluster changed that rule after it: an end does not end a
rule made again since, a rule made is not made again once ended since."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pigeon.config.load import load
from pigeon.listener.http.admin import rule_change
from pigeon.node.broadcast import Broadcast
from pigeon.queue.rules import Rule, Selector
from tests.support.services import RedisServer

RULES = "pigeon:admin:rules"
ENDED = "pigeon:admin:rules:ended"
STREAM = "pigeon:admin:stream"


def _broadcast(tmp_path: Path, redis_server: RedisServer) -> Broadcast:
    config = tmp_path / "pigeon.toml"
    config.write_text(f'[spool]\npath = "{tmp_path / "spool"}"\n[redis]\nurl = "{redis_server.url}"\ntimeout = "1s"\n')
    (tmp_path / "spool").mkdir()
    return Broadcast(load(config))


async def _while_away(broadcast: Broadcast, redis_server: RedisServer, method: str, path: str, body: bytes) -> Any:
    async def local() -> tuple[int, Any]:
        return 200, {}

    redis_server.stop()
    try:
        status, answer = await broadcast.around(method, path, body, "ops", local)
    finally:
        redis_server.start()
    assert status == 200
    return answer


def _rule(rule_id: str, created: float) -> bytes:
    return msgspec.json.encode(Rule(rule_id, "suspend", Selector(domain="other.test"), created))


@pytest.mark.parametrize("made_again", [False, True])
async def test_an_end_made_while_redis_was_away_ends_the_rule_only_if_it_was_not_made_again_since(
    tmp_path: Path, redis_server: RedisServer, made_again: bool
) -> None:
    broadcast = _broadcast(tmp_path, redis_server)
    try:
        answer = await _while_away(broadcast, redis_server, "DELETE", "/api/v1/admin/suspend/abc", b"")
        assert "sent to the other nodes once Redis answers" in answer["cluster"]["error"]
        client = redis_server.client()
        created = time.time() + (10 if made_again else -10)
        client.hset(RULES, "abc", _rule("abc", created))
        await broadcast.send_unsent()
        if made_again:
            assert client.hexists(RULES, "abc") and not client.hexists(ENDED, "abc")
            assert client.xlen(STREAM) == 0
        else:
            assert not client.hexists(RULES, "abc")
            tombstone = json.loads(client.hget(RULES + ":ended", "abc") or b"{}")
            assert tombstone["kind"] == "suspend" and tombstone["at"] < time.time()
            [(_, entry)] = client.xrange(STREAM)
            assert entry[b"method"] == b"DELETE" and entry[b"path"] == b"/api/v1/admin/suspend/abc"
        await broadcast.send_unsent()  # sent (or dropped) once
        assert client.xlen(STREAM) == (0 if made_again else 1)
        client.close()
    finally:
        await broadcast.close()


@pytest.mark.parametrize("ended_since", [False, True])
async def test_a_rule_made_while_redis_was_away_is_sent_unless_ended_since(
    tmp_path: Path, redis_server: RedisServer, ended_since: bool
) -> None:
    broadcast = _broadcast(tmp_path, redis_server)
    try:
        body = json.dumps({"domain": "other.test", "duration": "2h", "id": "b1"}).encode()
        answer = await _while_away(broadcast, redis_server, "POST", "/api/v1/admin/bounce", body)
        assert "unless the rule is ended elsewhere meanwhile" in answer["cluster"]["error"]
        client = redis_server.client()
        at = time.time() + (10 if ended_since else -10)
        client.hset(ENDED, "b1", json.dumps({"kind": "bounce", "until": None, "at": at}))
        await broadcast.send_unsent()
        assert client.hexists(RULES, "b1") is not ended_since
        assert client.xlen(STREAM) == (0 if ended_since else 1)
        client.close()
    finally:
        await broadcast.close()


def _assert_nothing_sent(redis_server: RedisServer, rule: str) -> None:
    """Neither the admin stream nor the cluster's rules hold anything of `rule`."""
    client = redis_server.client()
    try:
        assert client.xlen(STREAM) == 0
        assert not client.hexists(RULES, rule)
    finally:
        client.close()


async def test_a_standing_bounce_made_and_cancelled_while_redis_was_away_is_not_sent(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Sent in order, the bounce would reach every other node before its cancel, and each would
    bounce what it holds at once: neither goes, the cluster never held the rule."""
    broadcast = _broadcast(tmp_path, redis_server)
    try:
        body = json.dumps({"domain": "other.test", "duration": "2h", "id": "b2"}).encode()
        await _while_away(broadcast, redis_server, "POST", "/api/v1/admin/bounce", body)
        await _while_away(broadcast, redis_server, "DELETE", "/api/v1/admin/bounce/b2", b"")
        await broadcast.send_unsent()
        _assert_nothing_sent(redis_server, "b2")
    finally:
        await broadcast.close()


async def test_a_standing_bounce_that_ended_by_itself_while_redis_was_away_is_not_sent(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other nodes would make it again from the request, ending a duration after they read
    it: a bounce over long ago would bounce their mail for that long."""
    broadcast = _broadcast(tmp_path, redis_server)
    try:
        body = json.dumps({"domain": "other.test", "duration": "1m", "id": "b3"}).encode()
        await _while_away(broadcast, redis_server, "POST", "/api/v1/admin/bounce", body)
        later = time.time() + 120
        monkeypatch.setattr(time, "time", lambda: later)
        await broadcast.send_unsent()
        _assert_nothing_sent(redis_server, "b3")
    finally:
        await broadcast.close()


async def test_a_standing_bounce_sent_late_is_made_on_the_other_nodes_as_it_was_made_here(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other nodes make it from its entry: sent 30 minutes late, a 2-hour bounce is dated when
    it was made, so it ends when it ends here and in Redis (not 30 minutes past it), and a node
    that took Redis's copy first finds that very rule, not another under its id (before, a
    duration cut to what was left was refused as one, with an error on every worker)."""
    broadcast = _broadcast(tmp_path, redis_server)
    try:
        body = json.dumps({"domain": "other.test", "duration": "2h", "id": "b4"}).encode()
        await _while_away(broadcast, redis_server, "POST", "/api/v1/admin/bounce", body)
        later = time.time() + 1800
        monkeypatch.setattr(time, "time", lambda: later)
        await broadcast.send_unsent()
        client = redis_server.client()
        ((_, entries),) = client.xread({STREAM: "0"})
        ((_, fields),) = entries
        made = rule_change("POST", "/api/v1/admin/bounce", fields[b"body"], "", float(fields[b"time"]))
        kept = msgspec.json.decode(client.hget(RULES, "b4"), type=Rule)
        assert made is not None and made.rule is not None
        assert (made.rule.created, made.rule.expires) == (kept.created, kept.expires), (made.rule, kept)
        assert float(fields[b"sent"]) == later  # not a late operation: sent now
        client.close()
    finally:
        await broadcast.close()


async def test_a_rule_sent_late_ends_on_the_other_nodes_exactly_when_it_ends_here(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The others make it from the entry's time plus the duration left (`rule_change`): that is
    the end this node and Redis hold, to the last digit, not an end a rounding moved by up to half
    a millisecond (nor one counted from another reading of the clock than the entry's time)."""
    broadcast = _broadcast(tmp_path, redis_server)
    try:
        issued = 1796466730.7778733
        body = json.dumps({"domain": "other.test", "duration": "2h", "id": "b5"}).encode()

        async def local() -> tuple[int, Any]:
            return 200, {}

        redis_server.stop()
        try:
            await broadcast.around("POST", "/api/v1/admin/bounce", body, "ops", local, issued=issued)
        finally:
            redis_server.start()
        readings = itertools.count()  # each reading of the clock 0.4 ms after the one before
        monkeypatch.setattr(time, "time", lambda: issued + 1800.0123457 + next(readings) * 0.0004)
        await broadcast.send_unsent()
        client = redis_server.client()
        ((_, entries),) = client.xread({STREAM: "0"})
        ((_, fields),) = entries
        made = rule_change("POST", "/api/v1/admin/bounce", fields[b"body"], "", float(fields[b"time"]))
        kept = msgspec.json.decode(client.hget(RULES, "b5"), type=Rule)
        assert made is not None and made.rule is not None and kept.expires is not None
        assert (made.rule.expires, kept.expires) == (issued + 7200, issued + 7200)
        client.close()
    finally:
        await broadcast.close()
