"""Every order of every async completion: the queue never double-handles or drops a message.

Two messages of two recipients each, in two domains, go through the real queue engine and
dispatcher (tests/support/queue_world.py). Route lookups, delivery attempts, spool commits
(landing, then answered) and DSN stores complete only when the explorer releases them, and one
admin operation (or a reload that moves ready mail between queues, or one that changes a
domain's route) starts at any point in between. The explorer walks *every* order of those
releases (a depth-first enumeration, replaying each order from the start), then lets
everything finish and checks what a user sees:

* each recipient has exactly one terminal record (Delivery, Bounce, Expiration, AdminBounce);
* no recipient is accepted twice by a receiving server (the fake agent is never ambiguous), and
  one it accepted ends as `Delivery`;
* a suspended message is not attempted while its suspension stands;
* nothing is attempted after the bounce that covered it answered;
* a rebound message is never attempted at its old route once the rebind answered, nor a
  message whose route a reload changed once the reload was made;
* every failed recipient gets one DSN;
* the spool ends empty.

The first build's two races live in these windows: a rebind or suspend while the MX lookup is
pending, and an admin operation between a settlement and its commit. The last tests take the
lease check and the settling state out of the engine and show the explorer finds both.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pigeon.delivery.agent import Agent
from pigeon.delivery.routes import Destination
from pigeon.message import format_id
from pigeon.queue import state
from pigeon.queue.admin import Admin
from pigeon.queue.rules import Selector
from pigeon.queue.state import ActiveSet, Entry, Lease
from pigeon.smtp.replies import Reply
from tests.support.queue_world import LATER, NO, OK, AdminCall, Attempted, FakeAgent, Pending, World

SITES = {"d1.test": "mx1.test", "d2.test": "mx2.test", "elsewhere.test": "mx3.test"}
EVERYTHING = Selector(queue="*")


@dataclass(frozen=True)
class OnWorld:
    """A step that needs the world, not only the admin (a reload's new routes)."""

    call: Callable[[World], Any]


@dataclass(frozen=True)
class Operation:
    """An admin operation the explorer starts once, at any point (and, for resume, a second
    one after the first answered)."""

    name: str
    calls: tuple[Callable[[Admin], Any] | OnWorld, ...]
    kind: str  # bounce, suspend, rebind, retry, resume, reload, reroute

    def __str__(self) -> str:
        return self.name


def _suspend(admin: Admin) -> Any:
    return admin.suspend(EVERYTHING, reason="t", operator="op", duration=None, rule_id="hold")


def _bounce(duration: float | None) -> Callable[[Admin], Any]:
    return lambda admin: admin.bounce(EVERYTHING, reason="t", operator="op", duration=duration, rule_id="b")


def _rebind(queue: str | None, routing_domain: str | None) -> Callable[[Admin], Any]:
    return lambda admin: admin.rebind(EVERYTHING, queue=queue, routing_domain=routing_domain, operator="op")


def _reload(owns: Callable[[str], bool]) -> Callable[[Admin], Any]:
    """A SIGHUP's [[shaping]] change: which domains have a ready queue of their own."""

    async def reload(admin: Admin) -> dict[str, Any]:
        return {"moved": admin._ready.rehome(owns)}

    return reload


async def _reroute(world: World) -> dict[str, Any]:
    """A SIGHUP's [[route]] change: d1.test's mail goes to another site (a next hop, a TLS
    policy: another ready queue); what waits for its old route is routed again."""
    return {"moved": world.reroute("d1.test", "mx9.test")}


OPERATIONS = [
    Operation("bounce", (_bounce(None),), "bounce"),
    Operation("bounce-rule", (_bounce(3600),), "bounce"),
    Operation("suspend", (_suspend,), "suspend"),
    Operation("resume", (_suspend, lambda admin: admin.cancel("hold", "suspend")), "resume"),
    Operation("retry", (lambda admin: admin.retry(EVERYTHING),), "retry"),
    Operation("rebind-queue", (_rebind("moved:d1.test", None),), "rebind"),
    Operation("rebind-route", (_rebind(None, "elsewhere.test"),), "rebind"),
    # A block for d1.test added (its waiting mail moves to its own queue), then removed again.
    Operation("reload", (_reload(lambda domain: domain == "d1.test"), _reload(lambda domain: False)), "reload"),
    Operation("reroute", (OnWorld(_reroute),), "reroute"),
]


def _answer(world: World, seen: Attempted, first: list[Reply]) -> list[Reply]:
    """`first` to a message's first attempt, 250 to every recipient of a later one."""
    earlier = any(a.message == seen.message and a.step < seen.step for a in world.attempted)
    return [OK] * len(seen.recipients) if earlier else first[: len(seen.recipients)]


ANSWERS: dict[str, Callable[[World, Attempted], list[Reply]]] = {
    # The first recipient is accepted, the second deferred once (a partial settlement), then accepted.
    "partial": lambda world, seen: _answer(world, seen, [OK, LATER]),
    # The first recipient bounces (a DSN is stored before the settlement commits), the second is accepted.
    "bounce-one": lambda world, seen: _answer(world, seen, [NO, OK]),
    # Everything deferred once.
    "all-later": lambda world, seen: _answer(world, seen, [LATER, LATER]),
}


# --- one run ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """Something that may happen next; `touches` is what it may change (None: anything)."""

    label: str
    touches: frozenset[str] | None


Chooser = Callable[[list[Option]], "int | None"]


class Redundant(Exception):
    """Every option here is asleep: this order is the same as one already checked."""


def touches(world: World, pending: Pending) -> frozenset[str] | None:
    """What releasing `pending` may change. Conservative: anything, for a commit's answer while
    an admin operation runs (it may wake the operation's walk, which then reads every message),
    and for commits that are not a message's (rules, retry's make_due)."""
    if world.admin_running() and pending.kind == "answer":
        return None
    if pending.kind == "lookup":
        waiting = world.scheduler._resolving.get((pending.domain or "", None), [])
        messages = {f"msg:{lease.id}" for lease in waiting}
        return frozenset({f"lookup:{pending.domain}", f"site:{pending.site}", *messages})
    if pending.kind == "attempt":
        return frozenset({f"msg:{pending.message}", f"site:{pending.site}"})
    if pending.message is not None:
        return frozenset({f"msg:{pending.message}"})
    return None


async def run(
    operation: Operation,
    answers: str,
    choose: Chooser,
    messages: int = 2,
    *,
    sites: dict[str, str] = SITES,
    slow_open: bool = False,
) -> World | None:
    """One interleaving: `choose` picks, at every step, which option goes next (None: the
    order is redundant, stop). Returns the world, checked, or None for a redundant order.
    `slow_open`: opening a connection is a completion too, so mail waits, ready, meanwhile."""
    world = World(answer=ANSWERS[answers])
    if slow_open:
        world.opener = functools.partial(_open_when_released, world)
    world.build(sites)
    recipients = [["a1@d1.test", "a2@d1.test"], ["b1@d2.test", "b2@d2.test"]][:messages]
    ids = {world.inject(r): r for r in recipients}
    await world.quiesce()
    calls = list(operation.calls)
    started: list[AdminCall] = []
    try:
        while True:
            actions: list[tuple[Option, Any]] = [
                (Option(repr(p), touches(world, p)), p) for p in sorted(world.pending, key=lambda p: p.order)
            ]
            if calls and (not started or started[-1].answered is not None):
                actions.append((Option(f"admin {operation}", None), calls[0]))
            if world.due_waiting():
                actions.append((Option("tick", None), None))
            if not actions or (not calls and not world.admin_running() and _settled(world, started)):
                break
            index = choose([option for option, _ in actions])
            if index is None:
                return None
            option, what = actions[index]
            if isinstance(what, Pending):
                await world.release(what)
            elif option.label == "tick":
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
        await world.drain()
        check(world, operation, started, ids)
    finally:
        await world.close()
    return world


async def _open_when_released(world: World, destination: Destination, source: str | None = None) -> Agent:
    """A connection that opens when the explorer says (a `FakeAgent` then)."""
    opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    world.add(Pending("open", destination.site, lambda: opened.set_result(None), site=destination.site))
    await opened
    world.opened.append(destination.site)
    return FakeAgent(world, destination.site)


def _settled(world: World, started: list[AdminCall]) -> bool:
    """The operation answered and what was pending when it did has been released."""
    if not started or started[-1].answered is None:
        return False
    answered = started[-1].answered
    return all(p.order > answered for p in world.pending) and not world.due_waiting()


def check(world: World, operation: Operation, calls: list[AdminCall], ids: dict[Any, list[str]]) -> None:
    """The invariants, on what a user sees: log records, what the servers saw, the spool."""
    records = world.terminal()
    for spool_id, recipients in ids.items():
        for recipient in recipients:
            kinds = records.get((format_id(spool_id), recipient), [])
            assert len(kinds) == 1, f"{recipient} of {format_id(spool_id)} has terminal records {kinds}"
    twice = {key: n for key, n in world.accepted().items() if n > 1}
    assert not twice, f"accepted twice by the receiving server: {twice}"
    for spool_id, recipient in world.accepted():
        kinds = records.get((format_id(spool_id), recipient))
        assert kinds == ["Delivery"], f"{recipient} was accepted by the server but ended as {kinds}"
    assert not world.spool.rows, f"left in the spool: {list(world.spool.rows)}"
    assert not len(world.active), f"left in memory: {list(world.active)}"
    failed = collections.Counter(
        (spool_id, recipient)
        for (spool_id, recipient), kinds in records.items()
        for kind in kinds
        if kind in ("Bounce", "Expiration")
    )
    notices = collections.Counter((format_id(spool_id), recipient) for spool_id, recipient in world.notices)
    assert notices == failed, f"DSNs {dict(notices)} for failures {dict(failed)}"
    if not calls:
        return
    first = calls[0]
    assert first.answered is not None
    if operation.kind == "bounce":
        late = [a for a in world.attempted if a.step > first.answered]
        assert not late, f"attempted after the bounce answered at step {first.answered}: {late}"
    if operation.kind == "suspend":
        late = [a for a in world.attempted if a.step > first.answered and a.step <= world.rules_cancelled_at]
        assert not late, f"attempted while suspended (answered at step {first.answered}): {late}"
    if operation.kind == "resume":
        resumed = calls[1].started if len(calls) > 1 else world.steps
        late = [a for a in world.attempted if first.answered < a.step <= resumed]
        assert not late, f"attempted while suspended (steps {first.answered}..{resumed}): {late}"
    if operation.kind == "reroute":
        # Synchronous: from the step it was made in, no d1.test message goes the old way.
        late = [
            a
            for a in world.attempted
            if a.step >= first.answered and a.site == "mx1.test" and a.recipients[0].endswith("@d1.test")
        ]
        assert not late, f"attempted at the old route after the reload at step {first.answered}: {late}"
    if operation.kind == "rebind" and first.result and first.result["rebound"]:
        old = {"mx1.test", "mx2.test"} if "route" in operation.name else set()
        late = [a for a in world.attempted if a.step > first.answered and a.site in old]
        assert not late, f"attempted at the old route after the rebind answered at step {first.answered}: {late}"


# --- the explorer --------------------------------------------------------------------------------------
@dataclass
class _Frame:
    options: list[Option]
    sleep: dict[str, Option]  # asleep on entry: covered by an order explored elsewhere
    explored: list[Option]
    chosen: int


def _independent(a: Option, b: Option) -> bool:
    return a.touches is not None and b.touches is not None and not (a.touches & b.touches)


class Explorer:
    """Every order of the options, depth first, each replayed from the start, with sleep sets
    (Godefroid's partial-order reduction): once the orders that begin with `a` are explored, a
    sibling `b` independent of `a` does not explore `b, ..., a, ...` again, since `a` and `b`
    commute. Options of different messages on different sites are independent; anything that
    may touch every message (starting an admin operation, waking its walk, a tick) depends on
    everything."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._frames: list[_Frame] = []
        self.runs = 0
        self.redundant = 0
        self.longest = 0

    def orders(self) -> Iterator[Chooser]:
        while True:
            self.runs += 1
            assert self.runs <= self._limit, f"more than {self._limit} interleavings: the space grew, look at it"
            replay = _Replay(self._frames)
            yield replay
            self.longest = max(self.longest, replay.depth)
            frames = self._frames
            del frames[replay.depth :]  # a redundant order stopped short
            while frames:
                frame = frames[-1]
                frame.explored.append(frame.options[frame.chosen])
                done = {o.label for o in frame.explored} | set(frame.sleep)
                rest = [i for i, o in enumerate(frame.options) if o.label not in done]
                if rest:
                    frame.chosen = rest[0]
                    break
                frames.pop()
            if not frames:
                return


class _Replay:
    """One run's chooser: the explored path's choices first, then the first awake option."""

    def __init__(self, frames: list[_Frame]) -> None:
        self._frames = frames
        self.depth = 0

    def __call__(self, options: list[Option]) -> int | None:
        frames = self._frames
        labels = [o.label for o in options]
        # Two alike at once would be, say, two settlements of one message in flight.
        assert len(set(labels)) == len(labels), f"two options with one label: {labels}"
        if self.depth < len(frames):
            frame = frames[self.depth]
            assert [o.label for o in frame.options] == labels, "a replay took another path"
        else:
            sleep: dict[str, Option] = {}
            if frames:
                parent = frames[-1]
                taken = parent.options[parent.chosen]
                for other in [*parent.sleep.values(), *parent.explored]:
                    if _independent(other, taken):
                        sleep[other.label] = other
            awake = [i for i, o in enumerate(options) if o.label not in sleep]
            if not awake:
                return None
            frame = _Frame(options, sleep, [], awake[0])
            frames.append(frame)
        self.depth += 1
        return frame.chosen


async def explore(operation: Operation, answers: str, messages: int, limit: int, **options: Any) -> Explorer:
    explorer = Explorer(limit)
    for choose in explorer.orders():
        if await run(operation, answers, choose, messages, **options) is None:
            explorer.redundant += 1
    return explorer


def random_orders(seed: int, runs: int) -> Iterator[Chooser]:
    """`runs` orders picked at random (every option equally likely at every step)."""
    rng = random.Random(seed)
    for _ in range(runs):
        yield lambda options: rng.randrange(len(options))


# --- every order, one message; every order of two in -m slow; random orders of two by default ----------
@pytest.mark.parametrize("answers", sorted(ANSWERS))
@pytest.mark.parametrize("operation", OPERATIONS, ids=str)
async def test_every_order_of_one_message(operation: Operation, answers: str) -> None:
    explorer = await explore(operation, answers, messages=1, limit=20_000)
    # (a reroute is one synchronous step, and no connection is slow to open here: fewer places)
    assert explorer.runs >= (5 if operation.kind == "reroute" else 6)


@pytest.mark.parametrize("answers", sorted(ANSWERS))
@pytest.mark.parametrize("operation", OPERATIONS, ids=str)
async def test_random_orders_of_two_messages(operation: Operation, answers: str) -> None:
    for choose in random_orders(seed=zlib.crc32(f"{operation}/{answers}".encode()), runs=150):
        assert await run(operation, answers, choose) is not None


@pytest.mark.parametrize("operation", [o for o in OPERATIONS if o.name in ("bounce", "suspend")], ids=str)
async def test_every_order_of_two_messages_bounce_and_suspend(operation: Operation) -> None:
    explorer = await explore(operation, "partial", messages=2, limit=20_000)
    assert explorer.runs > 400


EXHAUSTIVE_TWO = [o for o in OPERATIONS if o.kind != "resume"]


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("answers", sorted(ANSWERS))
@pytest.mark.parametrize("operation", EXHAUSTIVE_TWO, ids=str)
async def test_every_order_of_two_messages(operation: Operation, answers: str) -> None:
    explorer = await explore(operation, answers, messages=2, limit=5_000_000)
    runs, redundant, longest = explorer.runs, explorer.redundant, explorer.longest
    print(f"{operation}/{answers}: {runs} orders ({redundant} redundant), up to {longest} steps")


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("answers", sorted(ANSWERS))
async def test_many_random_orders_of_two_messages_suspended_then_resumed(answers: str) -> None:
    """Suspend, then resume at any point, has two operation windows: every order of two
    messages is more than an hour; 20,000 random ones are a few minutes."""
    resume = next(o for o in OPERATIONS if o.kind == "resume")
    for choose in random_orders(seed=zlib.crc32(f"resume/{answers}".encode()), runs=20_000):
        assert await run(resume, answers, choose) is not None


# --- a reload that changes a route, while connections open: what waits ready is routed again ------------
# d1.test and d2.test share a site; the reload gives d1.test another (a TLS policy, a next hop).
SHARED_SITE = {"d1.test": "mx1.test", "d2.test": "mx1.test", "elsewhere.test": "mx3.test"}
REROUTE = next(o for o in OPERATIONS if o.kind == "reroute")


@pytest.mark.parametrize("answers", sorted(ANSWERS))
async def test_every_order_of_a_reroute_while_connections_open(answers: str) -> None:
    explorer = await explore(REROUTE, answers, messages=1, limit=20_000, slow_open=True)
    assert explorer.runs >= 10


@pytest.mark.parametrize("answers", sorted(ANSWERS))
async def test_random_orders_of_a_reroute_of_one_of_two_domains_sharing_a_site(answers: str) -> None:
    moved = 0
    for choose in random_orders(seed=zlib.crc32(f"reroute/{answers}".encode()), runs=300):
        world = await run(REROUTE, answers, choose, sites=SHARED_SITE, slow_open=True)
        assert world is not None
        moved += sum(call.result["moved"] for call in world.admin_calls if call.result and "moved" in call.result)
    assert moved > 0  # some orders had mail waiting, ready, when the reload came


# --- the explorer finds the first build's races when the engine's guards are taken out ------------------
def _operation(name: str) -> Operation:
    return next(o for o in OPERATIONS if o.name == name)


async def _violations(operation: Operation, answers: str) -> list[str]:
    """Every invariant broken, over every order with one message."""
    found: list[str] = []
    explorer = Explorer(limit=20_000)
    for choose in explorer.orders():
        try:
            await run(operation, answers, choose, messages=1)
        except AssertionError as violation:
            found.append(str(violation).splitlines()[0])
    assert found, f"no order of {operation} broke an invariant"
    return found


async def test_without_the_lease_check_a_rebind_during_the_lookup_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Race 1 of the first build: the lookup started before a rebind finishes afterwards and
    makes the message ready at its old route."""

    def current(self: ActiveSet, lease: Lease, step: str) -> Entry | None:
        return self.get(lease.id)  # the id alone, whatever the generation: no lease check

    monkeypatch.setattr(ActiveSet, "current", current)
    found = await _violations(_operation("rebind-route"), "partial")
    assert any("attempted at the old route after the rebind answered" in v for v in found), found


@pytest.mark.parametrize(
    ("operation", "symptom"),
    [("bounce", "was accepted by the server but ended as ['AdminBounce']"), ("rebind-queue", "accepted twice")],
)
async def test_without_the_settling_state_an_admin_step_before_the_commit_is_found(
    monkeypatch: pytest.MonkeyPatch, operation: str, symptom: str
) -> None:
    """Race 2 of the first build: an operator acts on a message between its settlement and the
    commit, from the in-memory envelope (every recipient, the old attempt count)."""
    moves = dict(state._MOVES)
    moves[state.State.SETTLING] = moves[state.State.SETTLING] | {state.State.SETTLING}
    monkeypatch.setattr(state, "_MOVES", moves)
    original = Admin._act

    def act(self: Admin, row: Any, selector: Any, action: Any, *rest: Any) -> Any:
        entry = self._active.get(row.id)
        if entry is not None and entry.state is state.State.SETTLING and selector.matches(entry.message):
            return action(entry)  # no waiting for the commit
        return original(self, row, selector, action, *rest)

    monkeypatch.setattr(Admin, "_act", act)
    found = await _violations(_operation(operation), "partial")
    assert any(symptom in v for v in found), sorted(set(found))


async def test_without_routing_waiting_mail_again_a_reload_of_its_route_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tester's defect: a reload gave a route a new TLS policy (a new ready queue), and the
    mail already waiting went out on the old queue's connections (in plaintext)."""

    def reroute(self: World, domain: str, site: str) -> int:
        self.routes.sites = {**self.routes.sites, domain: site}  # new mail only
        return 0

    monkeypatch.setattr(World, "reroute", reroute)
    found: list[str] = []
    explorer = Explorer(limit=20_000)
    for choose in explorer.orders():
        try:
            await run(REROUTE, "partial", choose, messages=1, slow_open=True)
        except AssertionError as violation:
            found.append(str(violation).splitlines()[0])
    assert any("attempted at the old route after the reload" in v for v in found), found
