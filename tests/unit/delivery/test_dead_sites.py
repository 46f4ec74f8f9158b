"""A dead site, on a fake clock: backed off as a whole, its mail deferred untried, one probe
per interval, and everything flowing again once a probe connects."""

from __future__ import annotations

import asyncio
import random

from pigeon.delivery.agent import Agent, Unreachable
from pigeon.delivery.routes import Destination
from pigeon.delivery.sites import SiteHealth
from pigeon.message import Message
from pigeon.queue.rules import Selector
from pigeon.queue.scheduler import route_key
from pigeon.shaping.rules import Shaping
from pigeon.smtp.replies import Reply
from tests.support.queue_world import OK, Attempted, FakeClock, World
from tests.unit.conftest import MakeWorld

SITES = {"d1.test": "mx1.test", "d2.test": "mx2.test"}
REFUSED = Reply(451, "4.4.1", ("cannot connect to mx1.test [192.0.2.1]:25: Connection refused",))
NOT_TRIED = "not tried: mx1.test is down"
TRY_LATER = Reply(451, "4.2.0", ("try later",))


class _DeadUntilRevived:
    """Opens connections to every site but mx1.test, which refuses them until `revived`."""

    def __init__(self, world_of: list[World]) -> None:
        self.world_of = world_of
        self.revived = False
        self.tries: list[str] = []

    async def __call__(self, destination: Destination, source: str | None = None) -> Agent:
        self.tries.append(destination.site)
        world = self.world_of[0]
        if destination.site == "mx1.test" and not self.revived:
            raise Unreachable(REFUSED, site_down=True)
        return await world._open(destination, source)


def _dead_world(make_world: MakeWorld, **options: object) -> tuple[World, _DeadUntilRevived]:
    holder: list[World] = []
    opener = _DeadUntilRevived(holder)
    world = make_world(SITES, ["d1.test", "d2.test"], opener=opener, retry_interval=10.0, **options)
    holder.append(world)
    return world, opener


def _attempts(world: World) -> list[int]:
    return sorted(row.attempts for row in world.spool.rows.values())


async def _when_due(world: World) -> None:
    """Let time pass to the next due row, and tick."""
    world.clock.now = min(row.due for row in world.spool.rows.values()) + 0.001
    world.tick()
    await world.quiesce()


async def test_a_dead_site_is_tried_once_then_its_mail_waits_for_a_probe_no_attempt_counted(
    make_world: MakeWorld,
) -> None:
    world, opener = _dead_world(make_world)
    for n in range(10):
        world.inject([f"r{n}@d1.test"])
    await world.release_all()
    assert opener.tries == ["mx1.test"]  # one connection, not one per message
    assert world.dispatcher.site_down("mx1.test")
    failures = world.logged("TransientFailure")
    assert [f.response.text for f in failures].count(REFUSED.text) == 1
    assert [f.response.text for f in failures].count(NOT_TRIED) == 9
    assert {(f.response.code, f.response.enhanced) for f in failures} == {(451, "4.4.1")}
    assert _attempts(world) == [0] * 10  # the outage costs nobody an attempt
    # All due at the probe's time (a minute), not at the retry schedule's (10 s).
    assert all(abs(row.due - (world.clock() + 60)) < 1 for row in world.spool.rows.values())


async def test_one_probe_per_interval_doubling_and_no_attempt_counted_while_down(make_world: MakeWorld) -> None:
    world, opener = _dead_world(make_world)
    for n in range(5):
        world.inject([f"r{n}@d1.test"])
    await world.release_all()
    start = world.clock()
    probes_at = []
    for second in range(1, 500):  # the scheduler ticks through 500 seconds
        world.clock.now = start + second
        world.tick()
        await world.release_all()
        if len(opener.tries) > len(probes_at) + 1:
            probes_at.append(second)
    assert probes_at == [60, 180, 420]  # one probe, after 1m, then 2m, then 4m
    assert _attempts(world) == [0, 0, 0, 0, 0]  # nobody's retry schedule spent on the outage
    assert world.dispatcher.site_down("mx1.test")
    not_tried = [f for f in world.logged("TransientFailure") if f.response.text == NOT_TRIED]
    assert {f.attempt for f in not_tried} == {0}


async def test_when_a_probe_connects_the_site_is_up_and_all_its_mail_flows_at_once(make_world: MakeWorld) -> None:
    world, opener = _dead_world(make_world)
    for n in range(6):
        world.inject([f"r{n}@d1.test"])
    await world.release_all()
    opener.revived = True
    world.clock.now += 60  # the probe's time: everything deferred to it is due together
    world.tick()
    await world.release_all()
    assert opener.tries == ["mx1.test"] * 2  # the one that took it down, and the probe
    assert not world.dispatcher.site_down("mx1.test")
    delivered = world.logged("Delivery")
    assert sorted(d.recipient for d in delivered) == sorted(f"r{n}@d1.test" for n in range(6))
    assert not world.spool.rows


async def test_an_operators_retry_probes_a_down_site_now_and_its_mail_flows_once_the_host_is_back(
    make_world: MakeWorld,
) -> None:
    world, opener = _dead_world(make_world, site_retry_interval=600.0)
    for n in range(3):
        world.inject([f"r{n}@d1.test"])
    await world.release_all()
    assert world.dispatcher.site_down("mx1.test")
    opener.revived = True
    world.clock.now += 5  # the host is back, the probe ten minutes off
    retry = world.start_admin("retry", lambda admin: admin.retry(Selector(domain="d1.test")))
    await world.release_all()
    assert retry.result is not None and retry.result["made_due"] == 3
    world.tick()
    await world.release_all()
    assert opener.tries == ["mx1.test"] * 2  # the failure, then the probe the retry made due
    assert not world.dispatcher.site_down("mx1.test")
    assert sorted(d.recipient for d in world.logged("Delivery")) == [f"r{n}@d1.test" for n in range(3)]
    assert not world.spool.rows


async def test_an_operators_retry_while_the_site_is_still_down_opens_one_probe_and_the_backoff_goes_on(
    make_world: MakeWorld,
) -> None:
    world, opener = _dead_world(make_world, site_retry_interval=600.0)
    for n in range(3):
        world.inject([f"r{n}@d1.test"])
    await world.release_all()
    world.clock.now += 5
    world.start_admin("retry", lambda admin: admin.retry(Selector(domain="d1.test")))
    await world.release_all()
    world.tick()
    await world.release_all()
    assert opener.tries == ["mx1.test"] * 2  # one probe for the three messages, not one each
    assert world.dispatcher.site_down("mx1.test")
    not_tried = [f for f in world.logged("TransientFailure") if f.response.text == NOT_TRIED]
    # Deferred when it went down, and again after the failed probe (whose own message was
    # deferred with the probe's error).
    assert len(not_tried) == 2 + 2
    assert _attempts(world) == [0, 0, 0]
    # The failed probe doubled the wait: the next is 20 minutes off, all three due then.
    assert all(abs(row.due - (world.clock() + 1200)) < 1 for row in world.spool.rows.values())


async def test_a_failed_probe_logs_its_connection_error_and_the_mail_keeps_it_as_its_last_response(
    make_world: MakeWorld,
) -> None:
    # A failed probe's message was deferred "not tried: mx1.test is down", as if no connection
    # had been made; and every message's last_response read "not tried", which is all
    # `pigeon inspect` and an expiry's DSN could then say.
    world, opener = _dead_world(make_world)
    for n in range(3):
        world.inject([f"r{n}@d1.test"])
    await world.release_all()
    world.clock.now += 60  # the probe's time
    world.tick()
    await world.release_all()
    assert opener.tries == ["mx1.test"] * 2 and world.dispatcher.site_down("mx1.test")
    probed = world.logged("TransientFailure")[3:]  # the probe's round
    assert sorted(f.response.text for f in probed) == [REFUSED.text, NOT_TRIED, NOT_TRIED]
    last = {world.spool.get(spool_id).envelope.last_response for spool_id in world.spool.rows}  # type: ignore[union-attr]
    assert last == {str(REFUSED)}
    assert _attempts(world) == [0, 0, 0]


async def test_mail_of_a_down_site_expires_naming_the_sites_connection_error_not_not_tried(
    make_world: MakeWorld,
) -> None:
    world, _ = _dead_world(make_world, max_age=100.0)
    for n in range(3):
        world.inject([f"r{n}@d1.test"])
    await world.release_all()
    start = world.clock()
    for second in (60, 101):  # a failed probe, then past max_age (the next probe is at 180 s)
        world.clock.now = start + second
        world.tick()
        await world.release_all()
    expired = world.logged("Expiration")
    assert sorted(e.recipient for e in expired) == [f"r{n}@d1.test" for n in range(3)]
    assert {e.response.text for e in expired} == {
        f"Message expired: not delivered within 1 minute 40 seconds; last attempt: {REFUSED}"
    }


async def test_other_sites_keep_flowing_while_one_is_down(make_world: MakeWorld) -> None:
    world, _ = _dead_world(make_world)
    for n in range(4):
        world.inject([f"r{n}@d1.test"])
        world.inject([f"s{n}@d2.test"])
    await world.release_all()
    assert world.dispatcher.site_down("mx1.test") and not world.dispatcher.site_down("mx2.test")
    assert sorted(d.recipient for d in world.logged("Delivery")) == [f"s{n}@d2.test" for n in range(4)]


async def test_a_down_site_listed_in_the_ready_queues_with_down_true(make_world: MakeWorld) -> None:
    world, _ = _dead_world(make_world)
    world.inject(["r@d1.test"])
    await world.release_all()
    summary = await world.admin.summary()
    rows = {row["site"]: row for row in summary["ready"]}
    assert rows["mx1.test"]["down"] is True and rows["mx1.test"]["queued"] == 0


async def test_a_down_sites_empty_ready_queue_stays_listed_past_its_idle_timeout(make_world: MakeWorld) -> None:
    # idle_timeout 0: any time idle is past it, and the sweep forgets every empty queue it may.
    world, _ = _dead_world(make_world, shaping=Shaping(connection_limit=2, idle_timeout=0.0))
    world.inject(["r@d1.test"])
    world.inject(["s@d2.test"])
    await world.release_all()
    world.tick()  # (the sweep: idle queues forgotten)
    await world.quiesce()
    assert world.dispatcher.site_down("mx1.test")
    rows = {row["site"]: row for row in (await world.admin.summary())["ready"]}
    # mx2.test's queue, empty and idle, is gone; the down site's stays, with nothing queued.
    assert list(rows) == ["mx1.test"]
    assert rows["mx1.test"]["down"] is True and rows["mx1.test"]["queued"] == 0


async def test_a_site_suspensions_empty_ready_queue_stays_listed_past_its_idle_timeout(
    make_world: MakeWorld,
) -> None:
    world, _ = _dead_world(make_world, shaping=Shaping(connection_limit=2, idle_timeout=0.0))
    world.inject(["s@d2.test"])
    await world.release_all()
    assert [d.recipient for d in world.logged("Delivery")] == ["s@d2.test"]
    world.suspend(Selector(site="mx2.test"), rule_id="maintenance")
    await world.release_all()
    world.tick()
    await world.quiesce()
    rows = {row["site"]: row for row in (await world.admin.summary())["ready"]}
    assert rows["mx2.test"]["queued"] == 0
    assert [rule["id"] for rule in rows["mx2.test"]["suspended_by"]] == ["maintenance"]
    world.resume("maintenance")
    await world.release_all()
    world.tick()  # the suspension ended: the empty queue is forgotten as any other
    await world.quiesce()
    assert (await world.admin.summary())["ready"] == []


async def test_a_probe_given_up_lets_another_ready_queue_of_the_site_probe(make_world: MakeWorld) -> None:
    """At the probe's time d1.test's own queue launches the probe, and the site's shared
    queue, given mail, waits for its verdict. A reload then moves d1.test's mail to the
    shared queue before the probe's connection is asked for: the probe is given up, and
    the shared queue probes instead; its mail is delivered once the site is back."""
    holder: list[World] = []
    opener = _DeadUntilRevived(holder)
    sites = {"d1.test": "mx1.test", "d2.test": "mx1.test"}
    world = make_world(sites, sites, opener=opener, retry_interval=10.0)
    holder.append(world)
    world.admin._ready.rehome(lambda domain: domain == "d1.test")  # a [[shaping]] block for d1.test
    world.inject(["r@d1.test"])
    world.inject(["s@d2.test"])
    await world.release_all()
    assert world.dispatcher.site_down("mx1.test") and opener.tries == ["mx1.test"]
    paths = sorted(row["path"] for row in (await world.admin.summary())["ready"])
    assert paths == ["default->d1.test@mx1.test (tls disabled)", "default->mx1.test (tls disabled)"]
    opener.revived = True
    world.clock.now = min(row.due for row in world.spool.rows.values()) + 0.001
    world.tick()  # both due: d1.test's queue launches the probe, the shared one waits for it
    moved = world.admin._ready.rehome(lambda domain: False)  # the block removed, in the same step
    assert moved == 1
    await world.release_all()
    assert not world.dispatcher.site_down("mx1.test")
    assert sorted(d.recipient for d in world.logged("Delivery")) == ["r@d1.test", "s@d2.test"]
    assert not world.spool.rows


async def test_deferring_a_down_sites_mail_races_no_operator_every_recipient_ends_once(
    make_world: MakeWorld,
) -> None:
    """Operators bounce and suspend while the site is down and mail is deferred to probes:
    every recipient still ends with exactly one terminal record, nothing stuck or doubled."""
    for seed in range(12):
        rng = random.Random(seed)
        world, opener = _dead_world(make_world, clock=FakeClock())
        for n in range(12):
            world.inject([f"r{n}@d1.test"], campaign=f"c{n % 4}")
        await world.release_all()
        for step in range(8):
            campaign = f"c{rng.randrange(4)}"
            if rng.random() < 0.3:
                world.bounce(Selector(campaign=campaign), reason=f"b{step}")
            elif rng.random() < 0.5:
                world.suspend(Selector(campaign=campaign), rule_id=f"s{step}", duration=rng.choice([5, 50, 500]))
            if step == 5:
                opener.revived = True
            if world.spool.rows and rng.random() < 0.7:
                await _when_due(world)
            await world.release_all()
        await world.drain()
        ends = ("Delivery", "Bounce", "AdminBounce", "Expiration")
        terminal = [r for r in world.logged() if type(r).__name__ in ends]
        assert sorted(r.recipient for r in terminal) == sorted(f"r{n}@d1.test" for n in range(12)), seed
        assert not world.spool.rows and not len(world.active)


def test_site_health_probes_once_per_interval_doubling_up_to_the_ceiling() -> None:
    clock = FakeClock(0.0)
    health = SiteHealth(60, 300, clock=clock)
    assert health.failed("mx", REFUSED) and health.is_down("mx")
    assert not health.failed("mx", REFUSED)  # already down: nothing new to say
    assert not health.probe("mx")
    waits = []
    for _ in range(5):
        clock.now += health.until_probe("mx")
        assert health.probe("mx") and not health.probe("mx")  # one at a time
        health.failed("mx", REFUSED, probe=True)
        waits.append(round(health.until_probe("mx")))
    assert waits == [120, 240, 300, 300, 300]
    assert health.connected("mx") is not None and not health.is_down("mx")
    assert dict(health.states()) == {"mx": False}


async def test_a_probe_a_host_answers_with_421_brings_the_site_up_and_its_mail_is_not_left_waiting(
    make_world: MakeWorld,
) -> None:
    """The probe's host takes the connection and answers 421 (starting up): no host refused
    it, so the site is not dead. It used to stay "probing" for ever: every ready queue of the
    site held its mail for a verdict that never came, untried until max_age expired it."""
    opens = ["down", "busy"]  # then every connection opens
    tries: list[str] = []
    holder: list[World] = []

    async def opener(dest: Destination, source: str | None = None) -> Agent:
        tries.append(dest.site)
        step = opens.pop(0) if opens else "up"
        if step == "down":
            raise Unreachable(REFUSED, site_down=True)
        if step == "busy":
            raise Unreachable(Reply(421, "4.3.2", ("mx1.test: service not available, starting up",)))
        return await holder[0]._open(dest, source)

    sites = {"d1.test": "mx1.test", "d2.test": "mx1.test"}
    world = make_world(sites, sites, opener=opener, retry_interval=10.0, max_age=3600.0)
    holder.append(world)
    for n in range(3):
        world.inject([f"r{n}@d1.test"])
    world.inject(["s@d2.test"])
    await world.release_all()
    assert world.dispatcher.site_down("mx1.test")
    start = world.clock()
    for second in range(5, 600, 5):  # ten minutes, ticking every 5 s
        world.clock.now = start + second
        world.tick()
        await world.release_all()
    assert tries[:2] == ["mx1.test", "mx1.test"]  # taken down, then the probe the host answered 421
    assert not world.dispatcher.site_down("mx1.test")
    delivered = sorted(d.recipient for d in world.logged("Delivery"))
    assert delivered == ["r0@d1.test", "r1@d1.test", "r2@d1.test", "s@d2.test"]
    assert not world.spool.rows


async def test_an_operators_retry_probes_a_down_site_even_if_the_scheduler_reads_the_mail_before_the_retry_answers(
    make_world: MakeWorld,
) -> None:
    """The retry's rows are readable once their commit lands; the scheduler may route them
    before the retry hears that it did. They found the probe not due yet and were deferred
    again, untried, for ten minutes: "made_due: 3", and no probe."""
    world, opener = _dead_world(make_world, site_retry_interval=600.0)
    for n in range(3):
        world.inject([f"r{n}@d1.test"])
    await world.release_all()
    opener.revived = True
    world.clock.now += 5
    retry = world.start_admin("retry", lambda admin: admin.retry(Selector(domain="d1.test")))
    await world.quiesce()
    [made_due] = world.of_kind("land")
    await world.release(made_due)  # the rows are due now (not yet answered)
    world.tick()  # the scheduler reads them first
    await world.release_all()
    assert retry.result is not None and retry.result["made_due"] == 3
    assert opener.tries == ["mx1.test"] * 2  # the failure, then the probe the retry made due
    assert sorted(d.recipient for d in world.logged("Delivery")) == [f"r{n}@d1.test" for n in range(3)]
    assert not world.spool.rows


def _by_recipient(world: World) -> dict[str, Message]:
    """The spool's messages, by their (one) recipient."""
    messages = [world.spool.get(spool_id) for spool_id in world.spool.rows]
    return {m.envelope.recipients[0].address: m for m in messages if m is not None}


async def test_a_reload_makes_due_the_mail_of_a_changed_route_waiting_for_a_down_sites_probe_and_no_other(
    make_world: MakeWorld,
) -> None:
    holder: list[World] = []
    opener = _DeadUntilRevived(holder)
    sites = {**SITES, "d4.test": "mx1.test"}  # (d4's route does not change: it still goes to mx1, down)

    def answer(world: World, seen: Attempted) -> list[Reply]:
        return [TRY_LATER if r.startswith("tried") else OK for r in seen.recipients]

    world = make_world(sites, list(sites), opener=opener, retry_interval=10.0, answer=answer)
    holder.append(world)
    for recipient in ["r0@d1.test", "r1@d1.test", "s@d4.test", "tried@d2.test"]:
        world.inject([recipient])
    await world.release_all()
    assert world.dispatcher.site_down("mx1.test")
    own_retry = {address: message.due for address, message in _by_recipient(world).items()}
    probe = world.clock() + world.dispatcher.health.until_probe("mx1.test")
    assert own_retry["tried@d2.test"] < probe  # its own retry, 10 s on; the others wait for the probe

    world.clock.now += 5  # a reload: d1 and d2 now go elsewhere (mx2, which works)
    world.routes.sites = {**sites, "d1.test": "mx2.test"}
    world.routes.cache.clear()
    moved = {"d1.test", "d2.test"}
    made_due = asyncio.ensure_future(
        world.admin.retry_waiting_for_probes([probe], lambda message: route_key(message)[0] in moved)
    )
    await world.release_all()
    assert made_due.result() == 2
    world.tick()
    await world.release_all()

    delivered = world.logged("Delivery")
    assert sorted((d.recipient, d.site, d.attempt) for d in delivered) == [
        ("r0@d1.test", "mx2.test", 1),
        ("r1@d1.test", "mx2.test", 1),
    ]
    # d4's mail still waits for mx1's probe; the message a real attempt deferred, for its own retry.
    left = {address: (message.due, message.attempts) for address, message in _by_recipient(world).items()}
    assert left == {"s@d4.test": (own_retry["s@d4.test"], 0), "tried@d2.test": (own_retry["tried@d2.test"], 1)}
    assert opener.tries.count("mx1.test") == 1  # no probe made early by the reload


def test_a_down_site_no_route_leads_to_is_forgotten_unless_its_probe_is_under_way() -> None:
    clock = FakeClock(0.0)
    health = SiteHealth(60.0, 600.0, clock=clock)
    health.failed("gone.test", REFUSED)
    health.failed("probing.test", REFUSED)
    clock.now = 60.0
    assert health.probe("probing.test")
    assert health.forget("gone.test") and not health.is_down("gone.test")
    assert not health.forget("probing.test") and health.is_down("probing.test")
    assert not health.forget("never-down.test")
    assert ("gone.test", False) in list(health.states())  # (the gauge reads 0, as for a site back up)
