"""The first build's two races, each replayed step by step: now each message is delivered once,
at the route the operator chose, and each recipient ends with one terminal record.

1. A rebind or suspend while the MX lookup is pending: the old lookup finished afterwards and
   queued the message a second time (rebind: delivered twice; suspend: "held: 1", then sent).
2. An admin operation between a settlement and its commit: it wrote back the in-memory
   envelope (rebind: delivered recipients delivered again) or bounced recipients the attempt
   had delivered (bounce: `Delivery` and `AdminBounce` for one recipient).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pigeon.message import SpoolId, format_id
from pigeon.queue.rules import Selector
from pigeon.smtp.replies import Reply
from tests.support.queue_world import LATER, OK, Attempted, Pending, World

SITES = {"d1.test": "mx1.test", "elsewhere.test": "mx3.test"}
D1 = Selector(domain="d1.test")


def first_partial(world: World, seen: Attempted) -> list[Reply]:
    """The first attempt delivers a1 and defers a2; later attempts deliver everything."""
    earlier = [a for a in world.attempted if a.message == seen.message and a.step < seen.step]
    return [OK, LATER] if not earlier else [OK] * len(seen.recipients)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    world = World(answer=first_partial).build(SITES)
    yield world
    await world.close()


def terminal_of(world: World, spool_id: int) -> dict[str, list[str]]:
    return {recipient: kinds for (mid, recipient), kinds in world.terminal().items() if mid == format_id(spool_id)}


# --- race 1: an operator acts while the route lookup is pending -------------------------------------------
async def looking_up(world: World) -> tuple[int, Pending]:
    """A message whose route lookup has started and not answered."""
    spool_id = world.inject(["a1@d1.test", "a2@d1.test"])
    await world.quiesce()
    [lookup] = world.of_kind("lookup")
    return spool_id, lookup


async def test_a_rebind_during_the_mx_lookup_delivers_once_at_the_new_route(world: World) -> None:
    spool_id, old_lookup = await looking_up(world)

    rebind = world.rebind(D1, routing_domain="elsewhere.test")
    await world.release_all(but="lookup")
    assert rebind.result == {"rebound": 1, "after_attempt": 0, "inbound_left": 0}
    world.tick()  # the rebound message is due now: read again, its new route looked up
    await world.quiesce()
    assert [p.domain for p in world.of_kind("lookup")] == ["d1.test", "elsewhere.test"]

    await world.release(old_lookup)  # the lookup that started before the rebind answers last
    assert world.attempted == []
    assert world.active.stale_results == {"route": 1}
    await world.drain()
    assert [(a.site, a.recipients) for a in world.attempted] == [
        ("mx3.test", ("a1@d1.test", "a2@d1.test")),
        ("mx3.test", ("a2@d1.test",)),
    ]
    assert terminal_of(world, spool_id) == {"a1@d1.test": ["Delivery"], "a2@d1.test": ["Delivery"]}


async def test_a_suspend_during_the_mx_lookup_holds_the_message_until_resumed(world: World) -> None:
    spool_id, old_lookup = await looking_up(world)

    suspend = world.suspend(D1, rule_id="s")
    await world.release_all(but="lookup")
    assert suspend.result is not None and suspend.result["held"] == 1
    await world.release(old_lookup)
    assert world.attempted == [], "a held message was sent"
    assert world.active.stale_results == {"route": 1}
    assert world.spool.rows[spool_id].due > world.clock(), "held in the spool, due later"

    for _ in range(3):  # each time it falls due the rule holds it again
        world.clock.now += 61
        world.tick()
        await world.release_all()
    assert world.attempted == []

    resume = world.resume("s")
    await world.release_all()
    assert resume.result == {"cancelled": True, "made_due": 1, "bounced": 0}
    await world.drain()
    assert len([a for a in world.attempted if a.message == spool_id]) == 2  # a1+a2, then a2
    assert terminal_of(world, spool_id) == {"a1@d1.test": ["Delivery"], "a2@d1.test": ["Delivery"]}


# --- race 2: an operator acts between a settlement and its commit ------------------------------------------
async def settling(world: World) -> int:
    """A message whose first attempt delivered a1 and deferred a2, the outcome not yet committed."""
    spool_id = world.inject(["a1@d1.test", "a2@d1.test"])
    await world.quiesce()
    await world.release_all("lookup")
    await world.release_all("attempt")
    assert [p.kind for p in world.pending] == ["land"]
    assert world.active.get(spool_id).state.value == "settling"  # type: ignore[union-attr]
    return spool_id


async def test_a_rebind_before_the_commit_moves_only_the_recipient_left(world: World) -> None:
    spool_id = await settling(world)
    rebind = world.rebind(D1, queue="moved")
    await world.quiesce()
    assert rebind.answered is None, "the rebind waits for the commit"
    await world.release_all()
    assert rebind.result == {"rebound": 1, "after_attempt": 0, "inbound_left": 0}
    row = world.spool.get(spool_id)
    assert row is not None
    assert (row.queue, [r.address for r in row.envelope.recipients], row.attempts) == ("moved", ["a2@d1.test"], 1)
    await world.drain()
    assert world.accepted()[(SpoolId(spool_id), "a1@d1.test")] == 1
    assert terminal_of(world, spool_id) == {"a1@d1.test": ["Delivery"], "a2@d1.test": ["Delivery"]}


async def test_a_bounce_before_the_commit_bounces_only_the_recipient_left(world: World) -> None:
    spool_id = await settling(world)
    bounce = world.bounce(D1)
    await world.quiesce()
    assert bounce.answered is None, "the bounce waits for the commit"
    await world.release_all()
    assert bounce.result == {"bounced": 1, "after_attempt": 0, "rule": None}
    await world.drain()
    assert terminal_of(world, spool_id) == {"a1@d1.test": ["Delivery"], "a2@d1.test": ["AdminBounce"]}
    assert len(world.attempted) == 1
    assert world.notices == [], "no DSN for an operator's bounce"


async def test_a_bounce_after_the_commit_landed_but_before_its_answer_reads_the_committed_row(world: World) -> None:
    """The row is committed (readers see a2 only) but the settlement has not heard yet."""
    spool_id = await settling(world)
    await world.release_all("land")
    bounce = world.bounce(D1)
    await world.quiesce()
    assert bounce.answered is None
    await world.release_all()
    await world.drain()
    assert terminal_of(world, spool_id) == {"a1@d1.test": ["Delivery"], "a2@d1.test": ["AdminBounce"]}
