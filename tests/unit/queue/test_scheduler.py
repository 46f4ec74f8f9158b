"""The scheduler, on a fake clock: what falls due is read once, routed, made ready or expired."""

from __future__ import annotations

import pytest

from pigeon.delivery.routes import Destination
from pigeon.queue.rules import Selector
from tests.support.queue_world import LATER, OK, Attempted, World, destination
from tests.unit.conftest import MakeWorld

SITES = {"d1.test": "mx1.test", "d2.test": "mx2.test"}


async def test_what_falls_due_is_read_in_due_order_once(make_world: MakeWorld) -> None:
    world = make_world(SITES, connection_limit=1)
    world.routes.cache["d1.test"] = destination("mx1.test")
    now = world.clock()
    late = world.inject(["x@d1.test"], due=now - 10, admit=False)
    early = world.inject(["y@d1.test"], due=now - 20, admit=False)
    world.inject(["z@d1.test"], due=now + 30, admit=False)  # not due yet
    assert world.scheduler.load() is False
    await world.quiesce()
    assert world.scheduler.load() is False  # read once: the watermark is past them
    await world.release_all()
    assert [a.message for a in world.attempted] == [early, late]


async def test_messages_for_one_domain_share_one_lookup(make_world: MakeWorld) -> None:
    world = make_world(SITES)
    first = world.inject(["a@d1.test"])
    second = world.inject(["b@d1.test"])
    await world.quiesce()
    assert [p.domain for p in world.of_kind("lookup")] == ["d1.test"]
    await world.release_all()
    assert sorted(a.message for a in world.attempted) == sorted([first, second])
    assert len([p for p in world.pending if p.kind == "lookup"]) == 0


async def test_a_cached_route_needs_no_lookup(make_world: MakeWorld) -> None:
    world = make_world(SITES)
    world.routes.cache["d2.test"] = destination("mx2.test")
    world.inject(["a@d2.test"])
    await world.quiesce()
    assert [p.kind for p in world.pending] == ["attempt"]


async def test_a_message_past_max_age_expires_when_it_is_read(make_world: MakeWorld) -> None:
    world = make_world(SITES, max_age=3600.0)
    spool_id = world.inject(["a@d1.test", "b@d1.test"], created=world.clock() - 7200, admit=False)
    world.tick()
    await world.release_all()
    assert [type(r).__name__ for r in world.logged() if r.id == f"{spool_id:016x}"] == ["Expiration", "Expiration"]
    assert world.attempted == []
    assert sorted(r for _, r in world.notices) == ["a@d1.test", "b@d1.test"]
    assert not world.spool.rows


async def test_an_unroutable_domain_bounces_with_the_lookups_class_and_a_dsn(make_world: MakeWorld) -> None:
    world = make_world(SITES)
    world.inject(["a@nowhere.test"])
    await world.release_all()
    [bounce] = world.logged("Bounce")
    assert (bounce.response.code, bounce.classification) == (550, "DNSFailure")
    assert world.notices and world.notices[0][1] == "a@nowhere.test"
    assert not world.spool.rows and not len(world.active)


async def test_a_lookup_that_breaks_is_a_transient_failure_not_a_stuck_message(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world(SITES)

    async def broken(domain: str, target: str | None = None) -> Destination:
        raise RuntimeError("resolver bug")

    monkeypatch.setattr(world.routes, "destination", broken)
    spool_id = world.inject(["a@d1.test"])
    await world.release_all()
    [failure] = world.logged("TransientFailure")
    assert (failure.response.code, failure.response.enhanced) == (451, "4.4.3")
    assert not len(world.active), "nothing waits in memory for an answer that will not come"
    assert world.spool.rows[spool_id].due > world.clock()


async def test_a_message_let_go_already_due_is_read_again_though_the_watermark_passed_it(
    make_world: MakeWorld,
) -> None:
    """Retried with no delay: its row is due at once, behind the watermark of a later message."""
    world = make_world(SITES, retry_interval=0.0, answer=_later_then_ok)
    world.routes.cache["d1.test"] = destination("mx1.test")
    now = world.clock()
    first = world.inject(["a@d1.test"], due=now, admit=False)
    world.inject(["b@d1.test"], due=now, admit=False)
    world.tick()
    await world.release_all()
    world.tick()
    await world.release_all()
    assert [a.message for a in world.attempted].count(first) == 2
    assert not world.spool.rows


def _later_then_ok(world: World, seen: Attempted) -> list[object]:
    earlier = [a for a in world.attempted if a.message == seen.message and a.step < seen.step]
    return [OK] if earlier else [LATER]


async def test_what_is_loaded_stays_within_the_room_in_memory(make_world: MakeWorld) -> None:
    world = make_world(SITES, max_active=2)
    world.routes.cache["d1.test"] = destination("mx1.test")
    ids = [world.inject([f"r{n}@d1.test"], admit=False) for n in range(5)]
    assert world.scheduler.load() is True  # more is waiting
    assert len(world.active) == 2
    await world.release_all()
    while world.spool.rows:
        world.tick()
        assert len(world.active) <= 2
        await world.release_all()
    assert sorted(a.message for a in world.attempted) == sorted(ids)


async def test_fresh_mail_past_the_room_is_read_later(make_world: MakeWorld) -> None:
    world = make_world(SITES, max_active=1)
    world.routes.cache["d1.test"] = destination("mx1.test")
    ids = [world.inject([f"r{n}@d1.test"]) for n in range(3)]
    assert len(world.active) == 1
    await world.release_all()
    for _ in range(3):
        world.tick()
        await world.release_all()
    assert sorted(a.message for a in world.attempted) == sorted(ids)


async def test_a_ready_message_past_max_age_expires_in_the_sweep(make_world: MakeWorld) -> None:
    world = make_world(SITES, max_age=600.0)
    world.routes.cache["d1.test"] = destination("mx1.test")
    held = world.suspend(Selector(site="mx1.test"))
    await world.release_all()
    assert held.answered is not None
    spool_id = world.inject(["a@d1.test"])
    await world.quiesce()
    assert world.active.get(spool_id).state.value == "ready"  # type: ignore[union-attr]
    world.clock.now += 601
    world.scheduler.sweep()
    await world.release_all()
    assert [type(r).__name__ for r in world.logged()] == ["Expiration"]
    assert world.attempted == []


async def test_a_queue_policy_chooses_the_retry_schedule(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [LATER], retry_interval=60.0)
    spool_id = world.inject(["a@d1.test"])
    await world.release_all()
    [failure] = world.logged("TransientFailure")
    assert failure.next_attempt == pytest.approx(world.clock() + 60.0)
    assert world.spool.rows[spool_id].due == pytest.approx(world.clock() + 60.0)


async def test_a_reload_routes_again_the_waiting_and_taken_mail_of_a_changed_route_and_nothing_else(
    make_world: MakeWorld,
) -> None:
    """The tester's case: a site suspended, mail waiting in its ready queue, a reload gives one
    domain another route (a TLS policy, a next hop: another ready queue). Its mail, waiting or
    taken by a connection and not begun, goes to the new route only, each message once."""
    world = make_world({"d1.test": "mx1.test", "d2.test": "mx1.test"})
    world.suspend(Selector(site="mx1.test"))
    await world.release_all()
    taken_id, waiting_id, other_id = (world.inject([r]) for r in ("a@d1.test", "b@d1.test", "c@d2.test"))
    await world.release_all()
    old = world.ready.get("default->mx1.test (tls disabled)")
    assert old is not None and [e.id for e in old] == [taken_id, waiting_id, other_id]
    lease = old.take_nowait()  # a connection took it (waiting for a rate slot, say)
    assert lease is not None and lease.id == taken_id
    generations = {i: world.active.get(i).generation for i in (waiting_id, other_id)}  # type: ignore[union-attr]

    assert world.reroute("d1.test", "mx9.test") == 2
    # Routed again, from scratch; the other domain's mail stays where it waits, untouched.
    assert {i: world.active.get(i).state.value for i in (taken_id, waiting_id)} == {  # type: ignore[union-attr]
        taken_id: "scheduled",
        waiting_id: "scheduled",
    }
    assert [e.id for e in old] == [other_id]
    assert world.active.get(other_id).generation == generations[other_id]  # type: ignore[union-attr]
    # The connection's lease is stale: it does not send the message, nor give it back.
    assert world.active.begin(lease) is None
    old.give_back(lease)
    assert [e.id for e in old] == [other_id]

    await world.drain()  # the lookups answer mx9.test; the suspension ends at last
    sites = {a.message: a.site for a in world.attempted}
    assert sites == {taken_id: "mx9.test", waiting_id: "mx9.test", other_id: "mx1.test"}
    assert len(world.attempted) == 3
    assert sorted(type(r).__name__ for r in world.logged() if type(r).__name__ == "Delivery") == ["Delivery"] * 3
    assert not world.spool.rows
