"""Shaping effects between boards: a node's workers share them through the run directory, the
cluster's nodes through a real Redis; one effect per (key, action) however many see the reply
at once; effects end by themselves and say so in records; and a Redis that goes away takes
nothing live away, while new effects then hold for the node alone.

Each `Board` here is one worker: boards on one directory are workers of one node, boards on
different directories but one Redis are nodes of a cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from pigeon.logs.records import Record, ShapingEffect
from pigeon.shaping.effects import CLUSTER, NODE, NODE_LOCAL, POLL, SCAN, Board
from tests.support.services import RedisServer

MakeBoard = Callable[..., Board]
RATE = "421 4.7.0 rate limited"


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[MakeBoard]:
    made: list[Board] = []

    def make(
        node: str = "a",
        redis: RedisServer | None = None,
        records: list[Record] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> Board:
        sink: list[Record] = records if records is not None else []
        board = Board(
            tmp_path / node / "run" / "effects",
            node=node,
            log=sink.append,
            redis_url=redis.url if redis is not None else None,
            prefix="t",
            timeout=0.5,
            clock=clock,
        )
        made.append(board)
        return board

    yield make
    for board in made:
        await board.close()


def suspend(board: Board, key: str = "site:mx", duration: float = 30.0, reply: str = RATE) -> Any:
    return board.trigger(rule="rated", key=key, action="suspend", duration=duration, reply=reply)


async def until(predicate: Callable[[], object], within: float = 2.0) -> float:
    """Seconds until `predicate` holds (fails past `within`)."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > within:
            raise AssertionError(f"not within {within}s")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_a_workers_effect_reaches_its_siblings_within_a_scan(make: MakeBoard) -> None:
    records: list[Record] = []
    one, two = make("n", records=records), make("n")
    await one.start()
    await two.start()
    effect = suspend(one)
    assert one.find(["site:mx"], "suspend") == effect  # at once where the reply came
    took = await until(lambda: two.find(["site:mx"], "suspend"))
    assert took < SCAN + 0.15
    assert one.mode == two.mode == NODE
    [created] = records
    assert isinstance(created, ShapingEffect) and (created.event, created.scope) == ("created", NODE)


async def test_siblings_that_see_the_reply_together_make_one_effect(make: MakeBoard) -> None:
    one, two = make("n"), make("n")
    first, second = suspend(one), suspend(two)  # before either scanned
    assert first == second  # the second found the first's file and took it
    assert suspend(one, reply="421 4.7.0 again") == first  # a repeat: nothing changes


async def test_an_effect_ends_by_itself_with_a_record_from_its_creator(make: MakeBoard) -> None:
    records: list[Record] = []
    one, two = make("n", records=records), make("n")
    await one.start()
    await two.start()
    ended: list[str] = []
    two.on_end = lambda effect: ended.append(effect.id)
    # Long enough for the sibling's scan to see it first, even on a loaded machine.
    effect = suspend(one, duration=1.0)
    await until(lambda: two.find(["site:mx"], "suspend"), within=0.9)
    await until(lambda: not one.live() and not two.live(), within=2.0)
    assert ended == [effect.id]
    assert [r.event for r in records if isinstance(r, ShapingEffect)] == ["created", "expired"]
    assert not list((one.directory).glob("*.json"))  # and its file is gone
    assert suspend(one).id != effect.id  # the next reply begins a new one


async def test_a_nodes_effect_reaches_every_node_through_redis(make: MakeBoard, redis_server: RedisServer) -> None:
    records: list[Record] = []
    a, b, c = make("a", redis_server, records), make("b", redis_server), make("c", redis_server)
    for board in (a, b, c):
        await board.start()
    effect = suspend(a)
    took = await until(lambda: b.find(["site:mx"], "suspend") and c.find(["site:mx"], "suspend"))
    assert took < POLL + 0.2
    assert b.find(["site:mx"], "suspend") == effect and a.mode == CLUSTER
    await until(lambda: records)
    assert [(r.event, r.scope) for r in records if isinstance(r, ShapingEffect)] == [("created", CLUSTER)]


async def test_an_effect_that_ran_out_here_before_redis_dropped_it_is_not_learned_again(
    make: MakeBoard, redis_server: RedisServer
) -> None:
    # b's clock runs ahead of Redis's (by as much as a loaded machine's poll can come late):
    # the effect ends at b while Redis still lists it, and b's next polls must not take it as new.
    b_records: list[Record] = []
    a, b = make("a", redis_server), make("b", redis_server, b_records, clock=lambda: time.time() + 0.6)
    await a.start()
    await b.start()
    effect = suspend(a, duration=1.5)
    await until(lambda: b.find(["site:mx"], "suspend"))
    await until(lambda: not b.live(), within=2.0)
    await asyncio.sleep(0.6 + 2 * POLL)  # polls while Redis still lists it
    events = [(r.event, r.effect) for r in b_records if isinstance(r, ShapingEffect)]
    assert events == [("learned", effect.id), ("expired", effect.id)]
    assert not b.live()


async def test_nodes_that_see_the_reply_together_make_one_effect(make: MakeBoard, redis_server: RedisServer) -> None:
    a_records: list[Record] = []
    b_records: list[Record] = []
    a, b = make("a", redis_server, a_records), make("b", redis_server, b_records)
    await a.start()
    await b.start()
    ours, theirs = suspend(a), suspend(b)  # each its own, for a round trip
    assert ours != theirs
    await until(lambda: len(a.live()) == 1 and len(b.live()) == 1 and a.live() == b.live())
    # Redis took one; the other node took that one instead, without a record of its own.
    [winner] = a.live()
    assert winner in (ours, theirs)
    assert len([r for r in a_records + b_records if isinstance(r, ShapingEffect)]) == 1


async def test_without_redis_effects_hold_for_the_node_and_come_back_to_the_cluster(
    make: MakeBoard, redis_server: RedisServer
) -> None:
    records: list[Record] = []
    a, a2, b = make("a", redis_server, records), make("a", redis_server), make("b", redis_server)
    for board in (a, a2, b):
        await board.start()
    before = suspend(a, key="site:before")
    await until(lambda: b.find(["site:before"], "suspend"))
    redis_server.stop()
    await until(lambda: a.mode == NODE_LOCAL, within=3.0)
    assert b.find(["site:before"], "suspend") == before  # what lives stays
    during = suspend(a, key="site:during")
    await until(lambda: a2.find(["site:during"], "suspend"))  # the node's workers have it ...
    assert b.find(["site:during"], "suspend") is None  # ... the other node cannot
    await until(lambda: any(isinstance(r, ShapingEffect) and r.key == "site:during" for r in records))
    assert [r.scope for r in records if isinstance(r, ShapingEffect) and r.key == "site:during"] == [NODE]
    redis_server.start()
    await until(lambda: a.mode == CLUSTER, within=5.0)
    # Back: what began meanwhile and still lives reaches the other nodes.
    await until(lambda: b.find(["site:during"], "suspend") == during, within=3.0)


async def test_an_effect_ended_by_an_operator_ends_on_every_worker_and_says_who_ended_it(make: MakeBoard) -> None:
    records: list[Record] = []
    one, two = make("n", records=records), make("n")
    await one.start()
    await two.start()
    ended_on_one: list[str] = []
    one.on_end = lambda effect: ended_on_one.append(effect.id)
    effect = suspend(one)  # 30 s
    await until(lambda: two.find(["site:mx"], "suspend"))
    ended = await two.end(effect.id, by="ops")  # asked of a worker that did not create it
    assert ended is not None and ended.id == effect.id and ended.ended_by == "ops"
    assert two.find(["site:mx"], "suspend") is None  # at once where it was asked
    took = await until(lambda: one.find(["site:mx"], "suspend") is None)
    assert took < SCAN + 0.15
    assert ended_on_one == [effect.id]  # what it held is started
    # The creator records the end, once, with who ended it.
    effect_records = [r for r in records if isinstance(r, ShapingEffect)]
    assert [(r.event, r.ended_by) for r in effect_records] == [("created", None), ("ended", "ops")]
    assert await two.end(effect.id, by="ops") is None  # not live any more
    # A later scan does not bring it back, and the next matching reply begins a new one.
    await asyncio.sleep(2 * SCAN)
    assert not one.live() and not two.live()
    again = suspend(two)
    assert again.id != effect.id
    await until(lambda: one.find(["site:mx"], "suspend") == again)


async def test_an_effect_ended_on_one_node_ends_on_every_node_through_redis(
    make: MakeBoard, redis_server: RedisServer
) -> None:
    a_records: list[Record] = []
    c_records: list[Record] = []
    a, b, c = make("a", redis_server, a_records), make("b", redis_server), make("c", redis_server, c_records)
    for board in (a, b, c):
        await board.start()
    effect = suspend(a)
    await until(lambda: b.find(["site:mx"], "suspend") and c.find(["site:mx"], "suspend"))
    assert await b.end(effect.id, by="ops") is not None
    took = await until(lambda: not a.live() and not c.live())
    assert took < POLL + 0.3
    assert [r.event for r in a_records if isinstance(r, ShapingEffect)] == ["created", "ended"]
    assert [r.event for r in c_records if isinstance(r, ShapingEffect)] == ["learned", "ended"]
    # Its guard went with it: a new reply on another node begins a new effect for everyone.
    again = suspend(c)
    assert again.id != effect.id
    await until(lambda: a.find(["site:mx"], "suspend") == again and b.find(["site:mx"], "suspend") == again)


async def test_an_effect_ended_while_redis_is_away_ends_on_the_other_nodes_when_it_answers(
    make: MakeBoard, redis_server: RedisServer
) -> None:
    a, b = make("a", redis_server), make("b", redis_server)
    await a.start()
    await b.start()
    effect = suspend(a)
    await until(lambda: b.find(["site:mx"], "suspend"))
    redis_server.stop()
    ended = await a.end(effect.id, by="ops")
    assert ended is not None and a.mode == NODE_LOCAL and not a.live()
    await asyncio.sleep(3 * POLL)
    assert b.find(["site:mx"], "suspend") == effect  # the other node cannot know yet
    redis_server.start()
    await until(lambda: not b.live(), within=5.0)


async def test_an_ended_effect_that_redis_still_lists_is_not_taken_back(make: MakeBoard) -> None:
    # Found from outside: an end made while Redis did not answer left the effect live there;
    # when Redis answered, the node that ended it adopted it again from the list, rewriting its
    # tombstone as live, and a worker that started then applied it again.
    other = make("a")
    effect = suspend(other)  # another node's effect, as Redis would list it
    one, two = make("b"), make("b")
    one._add(effect)
    two._add(effect)
    assert await one.end(effect.id, by="ops") is not None
    assert not one._adopt_file(effect)  # what a poll does with a listed effect it did not know
    await two.start()
    await until(lambda: not two.live())
    restarted = make("b")
    await restarted.start()
    assert not restarted.live()
