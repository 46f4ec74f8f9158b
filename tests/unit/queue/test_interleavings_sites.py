"""Every order of every completion, with a site that goes down and comes back.

The explorer of `test_interleavings` with connections that open only when released: d1.test
and d2.test share one site (mx1.test), whose connections fail or open as a script says (no
host takes one: the site is down; a host answers 421; it opens). Time passes at any point
(the clock moves to the next due row, a few times), so the dead site's probe comes due and
races an operator: a retry (which makes every down site's probe due now), a bounce, a
suspension of the mail (until resumed, or for 30 s) or of the site, a rebind to another
queue or route, a reload that gives d1.test a ready queue of its own (two lanes of one down
site, one probe between them) and takes it away again, or one that routes d1.test to
another site. Spool writes land and are answered in the order the group committer gives
them (`_releasable`).

On top of `test_interleavings.check` (one terminal record each, no recipient accepted
twice, nothing left in the spool or in memory), liveness: with `max_age` a day the script's
site comes back long before, so no recipient may end expired (mail of a site that came back
is never left behind); with `max_age` 100 s it expires while the site is down, on time. A
bulk operation also walks ten messages in batches of three, completions landing between.
"""

from __future__ import annotations

import asyncio
import functools
import zlib
from typing import Any

import pytest

from pigeon.delivery.agent import Agent, Unreachable
from pigeon.delivery.routes import Destination
from pigeon.queue import admin as admin_module
from pigeon.queue.admin import Admin
from pigeon.queue.rules import Selector
from pigeon.smtp.replies import Reply
from tests.support.queue_world import AdminCall, Pending, World, destination
from tests.unit.queue.test_interleavings import (
    ANSWERS,
    EVERYTHING,
    Chooser,
    Explorer,
    OnWorld,
    Operation,
    Option,
    _bounce,
    _rebind,
    _reload,
    _settled,
    _suspend,
    check,
    random_orders,
    touches,
)

SITES = {"d1.test": "mx1.test", "d2.test": "mx1.test", "elsewhere.test": "mx3.test"}
REFUSED = Reply(451, "4.4.1", ("cannot connect to mx1.test [192.0.2.1]:25: Connection refused",))
BUSY = Reply(421, "4.3.2", ("mx1.test: service not available, starting up",))
HOPS = 2  # how often time may pass (to the next due row) while an order is explored
LONG = 86_400.0  # max_age: the site is back long before
SHORT = 100.0  # max_age: expired while the site is down (probes at 60 s, then 180 s)


def _site_suspend(admin: Admin) -> Any:
    return admin.suspend(Selector(site="mx1.test"), reason="t", operator="op", duration=None, rule_id="site")


def _retry(admin: Admin) -> Any:
    return admin.retry(EVERYTHING)


def _suspend_for(admin: Admin) -> Any:
    return admin.suspend(EVERYTHING, reason="t", operator="op", duration=30.0, rule_id="for")


async def _reroute(world: World) -> dict[str, Any]:
    """A SIGHUP's [[route]] change: d1.test's mail goes to mx3.test (up) now, off the down site."""
    return {"moved": world.reroute("d1.test", "mx3.test")}


OPERATIONS = [
    Operation("retry", (_retry,), "retry"),
    Operation("bounce", (_bounce(None),), "bounce"),
    Operation("suspend", (_suspend,), "suspend"),
    Operation("rebind-queue", (_rebind("moved:d1.test", None),), "rebind"),
    Operation("reload", (_reload(lambda domain: domain == "d1.test"), _reload(lambda domain: False)), "reload"),
    Operation("site-suspend", (_site_suspend, lambda admin: admin.cancel("site", "suspend")), "site"),
    Operation("rebind-route", (_rebind(None, "elsewhere.test"),), "rebind"),
    Operation("retry-twice", (_retry, _retry), "retry"),
    # A suspension for 30 s: what it held comes back when it ends, or expires meanwhile.
    Operation("suspend-for", (_suspend_for,), "suspend-for"),
    Operation("reroute", (OnWorld(_reroute),), "reroute"),
]

# What mx1.test's connections do, in order; every one after the script opens.
SCRIPTS: dict[str, tuple[str, ...]] = {
    "down-then-up": ("down", "up"),
    "down-twice": ("down", "down", "up"),
    "down-then-busy": ("down", "busy", "up"),
}


class ScriptedOpener:
    """Opens a connection only when the explorer releases it; mx1.test's follow the script."""

    def __init__(self, world: World, script: tuple[str, ...]) -> None:
        self.world = world
        self.script = list(script)
        self.opened = 0

    async def __call__(self, dest: Destination, source: str | None = None) -> Agent:
        world = self.world
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def release() -> None:
            step = (self.script.pop(0) if self.script else "up") if dest.site == "mx1.test" else "up"
            future.set_result(step)

        self.opened += 1  # (a label of its own: two connections to one site may be opening)
        world.add(Pending("open", f"{dest.site}#{self.opened}", release, site=dest.site))
        step = await future
        if step == "down":
            raise Unreachable(REFUSED, site_down=True)
        if step == "busy":
            raise Unreachable(BUSY)
        return await world._open(dest, source)


def _touches(world: World, pending: Pending) -> frozenset[str] | None:
    # A connection's verdict may defer or start everything waiting for its site.
    return None if pending.kind == "open" else touches(world, pending)


def _recipients(n: int) -> list[str]:
    """Message n's two recipients: d1.test, d2.test (both mx1.test), then elsewhere.test too."""
    domain = ("d1.test", "d2.test", "elsewhere.test")[n % 3]
    return [f"{'ab'[n] if n < 2 else f'm{n}-'}{i}@{domain}" for i in (1, 2)]


def _releasable(world: World) -> list[Pending]:
    """What may complete next. The spool's group committer lands its writes in the order they
    were submitted and answers them in the order they landed (`pigeon.spool.commit`): only the
    oldest write waiting to land, and the oldest landed one waiting for its answer, may go
    next. (`MemorySpool` alone would also answer a later commit before an earlier one, which
    the committer never does: then a retry's `make_due` that lands after a settlement could
    be answered first, and the row it made due be passed by the scheduler for good.)"""
    pending = sorted(world.pending, key=lambda p: p.order)
    oldest = {kind: next((p for p in pending if p.kind == kind), None) for kind in ("land", "answer")}
    return [p for p in pending if p.kind not in oldest or p is oldest[p.kind]]


def _later(world: World) -> float | None:
    """When the next row not in memory falls due, if one is not due yet."""
    now = world.clock()
    waiting = [row.due for spool_id, row in world.spool.rows.items() if spool_id not in world.active]
    return min(waiting) + 0.001 if waiting and min(waiting) > now else None


async def run(
    operation: Operation,
    script: str,
    answers: str,
    choose: Chooser,
    messages: int = 2,
    *,
    max_age: float = LONG,
    hops: int = HOPS,
) -> World | None:
    """One order (see `test_interleavings.run`); time passes at most `hops` times before the
    drain. With `max_age` LONG the site always comes back in time: nothing may expire; a
    short one expires what waits (down, held, suspended), on time."""
    world = World(answer=ANSWERS[answers], site_retry_interval=60.0, max_age=max_age)
    world.opener = ScriptedOpener(world, SCRIPTS[script])
    world.build(SITES)
    for domain, site in SITES.items():
        world.routes.cache[domain] = destination(site)
    recipients = [_recipients(n) for n in range(messages)]
    ids = {world.inject(r): r for r in recipients}
    await world.quiesce()
    calls = list(operation.calls)
    started: list[AdminCall] = []
    last = ""
    try:
        while True:
            actions: list[tuple[Option, Any]] = [(Option(repr(p), _touches(world, p)), p) for p in _releasable(world)]
            if calls and (not started or started[-1].answered is not None):
                actions.append((Option(f"admin {operation}", None), calls[0]))
            if world.due_waiting() and last != "tick":  # (a tick right after a tick finds nothing new)
                actions.append((Option("tick", None), None))
            elif hops and (when := _later(world)) is not None:
                actions.append((Option("later", None), when))
            if not actions or (not calls and not world.admin_running() and _settled(world, started)):
                break
            index = choose([option for option, _ in actions])
            if index is None:
                return None
            option, what = actions[index]
            last = option.label
            if isinstance(what, Pending):
                await world.release(what)
            elif option.label in ("tick", "later"):
                if option.label == "later":
                    hops -= 1
                    world.clock.now = what
                world.steps += 1
                world.tick()
                await world.quiesce()
            else:
                calls.pop(0)
                world.steps += 1
                if isinstance(what, OnWorld):
                    what = functools.partial(lambda step, _admin: step(world), what.call)
                started.append(world.start_admin(operation.name, what))
                await world.quiesce()
        await world.drain(max_steps=400)
        check(world, operation, started, ids)
        _check_sites(world, operation, started, max_age)
    finally:
        await world.close()
    return world


def _check_sites(world: World, operation: Operation, calls: list[AdminCall], max_age: float) -> None:
    if max_age >= LONG:
        expired = [key for key, kinds in world.terminal().items() if "Expiration" in kinds]
        assert not expired, f"expired though the site came back within max_age: {expired}"
    late = [
        (r.recipient, r.timestamp - r.created)
        for r in world.logged("Expiration")
        if r.timestamp > r.created + max_age + 1
    ]
    assert not late, f"expired past max_age ({max_age}s): {late}"
    if operation.kind == "site" and calls:
        held_from = calls[0].answered or world.steps
        resumed = calls[1].started if len(calls) > 1 else world.steps
        late = [a for a in world.attempted if a.site == "mx1.test" and held_from < a.step <= resumed]
        assert not late, f"attempted at mx1.test while its deliveries were suspended: {late}"


async def explore(
    operation: Operation, script: str, answers: str, messages: int, limit: int, **options: Any
) -> Explorer:
    explorer = Explorer(limit)
    for choose in explorer.orders():
        if await run(operation, script, answers, choose, messages, **options) is None:
            explorer.redundant += 1
    return explorer


@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("operation", OPERATIONS, ids=str)
async def test_every_order_of_one_message_to_a_site_that_goes_down_and_comes_back(
    operation: Operation, script: str
) -> None:
    explorer = await explore(operation, script, "partial", messages=1, limit=50_000)
    assert explorer.runs >= 6


@pytest.mark.parametrize("script", ["down-twice", "down-then-busy"])
@pytest.mark.parametrize("operation", OPERATIONS, ids=str)
async def test_every_order_of_one_message_expiring_while_its_site_is_down(operation: Operation, script: str) -> None:
    """max_age runs out before the site is back: what waits (deferred to a probe, held by a
    suspension of the mail or of the site) expires once, on time, and is never stuck."""
    explorer = await explore(operation, script, "partial", messages=1, limit=50_000, max_age=SHORT, hops=3)
    assert explorer.runs >= 6


@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("operation", OPERATIONS, ids=str)
async def test_random_orders_of_two_domains_sharing_a_site_that_goes_down(operation: Operation, script: str) -> None:
    for answers in sorted(ANSWERS):
        for choose in random_orders(seed=zlib.crc32(f"{operation}/{script}/{answers}".encode()), runs=100):
            assert await run(operation, script, answers, choose) is not None


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("operation", OPERATIONS, ids=str)
async def test_many_random_orders_of_two_domains_sharing_a_site_that_goes_down(operation: Operation) -> None:
    """Every order of two messages is hours; 4,000 random ones per script and answer are minutes."""
    for script in sorted(SCRIPTS):
        for answers in sorted(ANSWERS):
            for choose in random_orders(seed=zlib.crc32(f"many/{operation}/{script}/{answers}".encode()), runs=4000):
                assert await run(operation, script, answers, choose) is not None


@pytest.mark.parametrize("operation", OPERATIONS, ids=str)
async def test_random_orders_of_a_bulk_operation_walking_the_spool_in_many_batches(
    operation: Operation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bulk operation on a big queue walks it in batches, resting in between (an API
    request then outlives `worker_timeout`): ten messages in three domains, batches of three,
    so deliveries, settlements, probes and ticks land between its batches and between its
    acting and its commits."""
    monkeypatch.setattr(admin_module, "_BATCH", 3)
    for script in ("down-then-up", "down-then-busy"):
        for choose in random_orders(seed=zlib.crc32(f"bulk/{operation}/{script}".encode()), runs=30):
            assert await run(operation, script, "partial", choose, messages=10) is not None


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", sorted(SCRIPTS))
async def test_every_order_of_two_domains_one_rerouted_off_a_site_that_goes_down(script: str) -> None:
    """Every order, two messages (10,000 to 26,000 orders a script: tens of seconds)."""
    reroute = next(o for o in OPERATIONS if o.kind == "reroute")
    explorer = await explore(reroute, script, "partial", messages=2, limit=200_000)
    assert explorer.runs > 5_000
