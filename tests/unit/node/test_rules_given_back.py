"""A Redis back without its data gets the cluster's standing rules back from the workers that
held them (`Broadcast._look`, `Broadcast._give_back`), against a real Redis restarted empty:
every rule any worker knew Redis had, not only those the first worker to notice knew of."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec
import pytest

from pigeon.config.load import load
from pigeon.listener.http.admin import RuleChange
from pigeon.node.broadcast import Broadcast
from pigeon.queue.rules import Rule, Selector
from tests.support.services import RedisServer

RULES = "pigeon:admin:rules"


def _rule(rule_id: str) -> Rule:
    return Rule(rule_id, "suspend", Selector(domain=f"{rule_id}.test"), time.time())


def _worker(tmp_path: Path, redis_server: RedisServer, worker: int, held: list[Rule]) -> Broadcast:
    config = tmp_path / "pigeon.toml"
    config.write_text(f'[spool]\npath = "{tmp_path / "spool"}"\n[redis]\nurl = "{redis_server.url}"\ntimeout = "1s"\n')
    (tmp_path / "spool").mkdir(exist_ok=True)
    return Broadcast(load(config), worker=worker, workers=2, held=lambda: held)


async def test_every_worker_gives_back_what_it_knew_not_only_the_first_to_find_the_rules_lost(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The first worker to find the marker gone had not seen the newest rule (made just before
    the loss, between two of its looks); another had. The marker it set again must not stop
    the other from giving that rule back: it never came back, and a node that joined later
    delivered what the rule held."""
    old, new = _rule("old"), _rule("new")
    client = redis_server.client()
    first = _worker(tmp_path, redis_server, 0, [old, new])
    second = _worker(tmp_path, redis_server, 1, [old, new])
    try:
        client.hset(RULES, old.id, msgspec.json.encode(old))
        client.set(RULES + ":kept", b"1")
        assert await first._look() and await second._look()
        client.hset(RULES, new.id, msgspec.json.encode(new))
        assert await second._look()  # it sees the new rule there; the first has not looked since
        redis_server.kill()
        redis_server.start()
        assert not await first._look()  # it finds the rules lost, gives back what it knew of
        assert {rule_id.decode() for rule_id in client.hkeys(RULES)} == {old.id}
        assert not await second._look()  # the marker is back, but not the one it saw
        assert {rule_id.decode() for rule_id in client.hkeys(RULES)} == {old.id, new.id}
        assert await first._look() and await second._look()  # both know the rules are kept now
    finally:
        client.close()
        await first.close()
        await second.close()


@pytest.mark.parametrize("first_back", ["holder", "ender"])
async def test_a_rule_ended_just_before_the_loss_stays_ended_whichever_worker_gives_back_first(
    tmp_path: Path, redis_server: RedisServer, first_back: str
) -> None:
    """One worker had read the resume of a suspension, another not yet, when Redis lost its data:
    the end is the later word, whichever of the two gives back first. (Before, only rules were
    given back: the end was forgotten, and a node stopped before it held the suspension again.)"""
    rule = _rule("gone")
    client = redis_server.client()
    holder = _worker(tmp_path, redis_server, 0, [rule])
    ender = _worker(tmp_path, redis_server, 1, [])
    try:
        client.hset(RULES, rule.id, msgspec.json.encode(rule))
        client.set(RULES + ":kept", b"1")
        assert await holder._look() and await ender._look()
        ender._learn(RuleChange(rule.id, "suspend", None), time.time())  # it read the resume
        redis_server.kill()
        redis_server.start()
        for worker in (holder, ender) if first_back == "holder" else (ender, holder):
            assert not await worker._look()
        assert not client.hexists(RULES, rule.id)
        tombstone = json.loads(client.hget(RULES + ":ended", rule.id) or b"{}")
        assert tombstone["kind"] == "suspend" and tombstone["at"] > rule.created, tombstone
    finally:
        client.close()
        await holder.close()
        await ender.close()
