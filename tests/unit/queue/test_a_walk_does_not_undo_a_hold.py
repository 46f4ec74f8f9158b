"""A walk that makes mail due does not undo a hold by id that landed while it walked.

A walk (`pigeon retry --domain`, a resume's `retry_deferred_to`, a reload's
`retry_waiting_for_probes`) reads each row, decides on it as it reads it (deferred, not held),
rests after every batch, and writes the rows it chose at the end. Found by a reviewer: a
`pigeon hold --id X` answered `held` while the walk rested, and the walk's write then brought
X's due from `HELD` down to now; the scheduler took "held and due" for an operator's release,
cleared the hold and delivered X. The write now changes a row only if its due is still the one
the walk read (`Spool.make_due`): a row changed since is left as the change left it.
"""

from __future__ import annotations

import asyncio

from pigeon.message import HELD
from pigeon.queue.rules import Selector
from pigeon.queue.scheduler import route_key
from pigeon.smtp.replies import Reply
from tests.support.queue_world import Attempted, World
from tests.unit.conftest import MakeWorld
from tests.unit.delivery.test_dead_sites import SITES, TRY_LATER, _DeadUntilRevived


def _paused(world: World) -> asyncio.Event:
    """Make the admin's walks wait after their (only) batch until the event is set."""
    go_on = asyncio.Event()

    async def pause(seconds: float) -> None:
        await go_on.wait()

    world.admin._pause = pause
    return go_on


async def _hold_meanwhile(world: World, spool_id: int) -> None:
    """`pigeon hold --id` of `spool_id`, answered `held`, while the walk rests."""

    async def no_rest(seconds: float) -> None:
        pass

    world.admin._pause = no_rest
    hold = world.start_admin("hold", lambda a: a.hold(Selector(), messages=[spool_id], reason="x", operator="op"))
    await world.release_all()
    assert hold.result is not None and hold.result["messages"][0]["result"] == "held"
    assert world.spool.rows[spool_id].due >= HELD


async def test_a_hold_by_id_during_the_reload_walk_is_not_undone(make_world: MakeWorld) -> None:
    holder: list[World] = []
    opener = _DeadUntilRevived(holder)
    world = make_world(SITES, list(SITES), opener=opener, retry_interval=10.0)
    holder.append(world)
    spool_id = world.inject(["r0@d1.test"])
    await world.release_all()
    assert world.dispatcher.site_down("mx1.test")
    probe = world.clock() + world.dispatcher.health.until_probe("mx1.test")
    go_on = _paused(world)
    world.clock.now += 5  # a reload: d1 now goes to mx2, which works
    world.routes.sites = {**SITES, "d1.test": "mx2.test"}
    world.routes.cache.clear()
    made_due = asyncio.ensure_future(
        world.admin.retry_waiting_for_probes([probe], lambda message: route_key(message)[0] == "d1.test")
    )
    await world.quiesce()  # the walk has read the row, and rests
    await _hold_meanwhile(world, spool_id)
    go_on.set()
    await world.release_all()
    assert made_due.result() == 0  # the row it chose changed meanwhile: not made due after all
    world.tick()
    await world.release_all()
    assert world.logged("Delivery") == []
    assert world.spool.rows[spool_id].due >= HELD  # still held, by the operator
    assert [h.reason for h in world.logged("AdminHold")] == ["x"]


def _deferred(world: World, seen: Attempted) -> list[Reply]:
    return [TRY_LATER for _ in seen.recipients]


async def test_a_hold_by_id_during_a_retry_by_domain_is_not_undone(make_world: MakeWorld) -> None:
    world = make_world(SITES, list(SITES), answer=_deferred, retry_interval=10.0)
    spool_id = world.inject(["r0@d1.test"])
    await world.release_all()
    row = world.spool.rows[spool_id]
    assert row.attempts == 1 and world.clock() < row.due < HELD  # deferred by its 451
    go_on = _paused(world)
    retry = world.start_admin("retry", lambda a: a.retry(Selector(domain="d1.test")))
    await world.quiesce()  # the walk has read the row, and rests
    await _hold_meanwhile(world, spool_id)
    go_on.set()
    await world.release_all()
    assert retry.result is not None
    world.tick()
    await world.release_all()
    assert world.attempted[1:] == []  # not attempted again: held
    assert world.spool.rows[spool_id].due >= HELD
    row = world.spool.get(spool_id)
    assert row is not None and row.envelope.hold_operator == "op"


async def test_a_retry_by_id_still_releases_an_operators_hold(make_world: MakeWorld) -> None:
    world = make_world(SITES, list(SITES), retry_interval=10.0)
    spool_id = world.inject(["r0@d1.test"], admit=False)  # (in the spool only: the walk writes its row)
    hold = world.start_admin("hold", lambda a: a.hold(Selector(), messages=[spool_id], reason="x", operator="op"))
    await world.release_all()
    assert hold.result is not None and world.spool.rows[spool_id].due >= HELD
    retry = world.start_admin("retry", lambda a: a.retry(Selector(), messages=[spool_id]))
    await world.release_all()
    assert retry.result is not None and retry.result["messages"][0]["result"] == "made_due"
    world.tick()
    await world.release_all()
    assert [d.recipient for d in world.logged("Delivery")] == ["r0@d1.test"]
