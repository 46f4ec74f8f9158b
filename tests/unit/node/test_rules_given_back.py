"""A Redis back without its data gets the cluster's standing rules back from the workers that
held them (`Broadcast._look`, `Broadcast._give_back`), against a real Redis restarted empty:
every rule any worker knew Redis had, not only those the first worker to notice knew of."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from pigeon.config.load import load
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
