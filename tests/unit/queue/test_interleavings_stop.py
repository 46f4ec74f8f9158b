"""Every order of a hold or a bounce by id, then a stop or a crash: the operator's answer holds.

A message of three recipients (or two of two, in random orders) goes through the real queue
engine (tests/support/queue_world.py); an operator holds (`pigeon hold --id`) or bounces
(`pigeon bounce --id`) it at any point, and at any point after that the node stops (SIGTERM:
what it submitted commits, the attempt on the wire is cut before its content went and reports
nothing) or dies (kill -9: what had not landed is lost). It starts again over the same spool,
with a server that now takes every recipient, and runs until nothing but held mail is left.
Then, on what a user sees:

* each recipient ends once: one terminal record, or held in the spool, never both;
* a recipient a server took is never taken twice, and ends as `Delivery`;
* once the operator was answered, the message is not attempted again, before the stop or
  after the start; what its attempt did not deliver is held (its row due at `HELD`, held by
  the operator, with an `AdminHold` record unless the hold's own commit landed unanswered
  when the node died, a loss the README states) or bounced (`AdminBounce`, the row gone).

The window the defect lived in: the mark given while the attempt is on the wire, answered,
then the stop or the crash before that attempt settles. The last test takes the mark's write
out of the engine and shows the explorer finds the message delivered after the restart.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pigeon.message import HELD, SpoolId, format_id
from pigeon.queue.admin import Admin
from pigeon.queue.rules import Selector
from pigeon.queue.settlement import Settlement
from pigeon.queue.state import AdminMark, Entry
from pigeon.smtp.replies import Reply
from tests.support.queue_world import LATER, NO, OK, AdminCall, Attempted, Pending, World
from tests.unit.queue.test_interleavings import Chooser, Explorer, Option, random_orders, touches

SITES = {"d1.test": "mx1.test", "d2.test": "mx2.test"}
RECIPIENTS = [["a1@d1.test", "a2@d1.test", "a3@d1.test"], ["b1@d2.test", "b2@d2.test"]]


def _answer(first: list[Reply]) -> Callable[[World, Attempted], list[Reply]]:
    """`first` to a message's first attempt, 250 to every recipient of a later one (after the
    restart: a mark lost there shows as a delivery)."""

    def answer(world: World, seen: Attempted) -> list[Reply]:
        earlier = False  # (by place, not step: the restarted world counts its steps afresh)
        for other in world.attempted:
            if other is seen:
                break
            earlier = earlier or other.message == seen.message
        return [OK] * len(seen.recipients) if earlier else first[: len(seen.recipients)]

    return answer


ANSWERS = {
    "partial": [OK, LATER, LATER],  # one delivered by the attempt, the rest left to the operator
    "bounce-one": [NO, OK, LATER],  # a failure (its DSN stored with the outcome), a delivery, a deferral
    "all-later": [LATER, LATER, LATER],
    "all-taken": [OK, OK, OK],  # the attempt delivers everything: nothing to hold or bounce
}


@dataclass(frozen=True)
class Operation:
    name: str  # hold, bounce
    end: str  # stop, crash

    def __str__(self) -> str:
        return f"{self.name}-then-{self.end}"

    def call(self, ids: list[SpoolId]) -> Callable[[Admin], Any]:
        if self.name == "hold":
            return lambda admin: admin.hold(Selector(), messages=ids, reason="x", operator="op")
        return lambda admin: admin.bounce(
            Selector(), reason="x", operator="op", duration=None, rule_id=None, messages=ids
        )


OPERATIONS = [Operation(name, end) for name in ("hold", "bounce") for end in ("stop", "crash")]


async def ask_in_turn(
    world: World, names: tuple[str, ...], end: str, call: Callable[[str], Callable[[Admin], Any]], choose: Chooser
) -> list[AdminCall] | None:
    """One order, up to the node's `end` (a stop or a crash): `choose` picks what goes next among
    the world's completions, a tick of its timer while mail is due, and the operator's requests
    `names` (`call` makes each), each once the one before answered; the end is offered once
    every request was made. The requests made, or None for a redundant order."""
    asked: list[AdminCall] = []
    while True:
        actions: list[tuple[Option, Any]] = [
            (Option(repr(p), touches(world, p)), p) for p in sorted(world.pending, key=lambda p: p.order)
        ]
        following = names[len(asked)] if len(asked) < len(names) else None
        if following is not None and (not asked or asked[-1].answered is not None):
            actions.append((Option(f"admin {following}", None), following))
        elif following is None:
            actions.append((Option(end, None), "end"))
        if world.due_waiting():
            actions.append((Option("tick", None), "tick"))
        index = choose([option for option, _ in actions])
        if index is None:
            return None
        _, what = actions[index]
        if isinstance(what, Pending):
            await world.release(what)
        elif what == "tick":
            world.steps += 1
            world.tick()
            await world.quiesce()
        elif what == "end":
            return asked
        else:
            world.steps += 1
            asked.append(world.start_admin(what, call(what)))
            await world.quiesce()


async def run(
    operation: Operation, answers: str, choose: Chooser, messages: int = 1, *, in_memory: bool = False
) -> World | None:
    """One order: `choose` picks what goes next until it picks the stop (or crash), which
    comes at some point after the operator asked; then the node starts again and runs to the
    end. The world after it, checked; None for a redundant order."""
    world = World(answer=_answer(ANSWERS[answers])).build(SITES)
    if in_memory:
        world.admin._settlement = _InMemoryMarks(world.settlement)  # type: ignore[assignment]
    recipients = {world.inject(r): r for r in RECIPIENTS[:messages]}
    await world.quiesce()
    noted: set[int] = set()  # messages whose commit had landed, unanswered, when the node died
    try:
        asked = await ask_in_turn(
            world, (operation.name,), operation.end, lambda _: operation.call(list(recipients)), choose
        )
        if asked is None:
            return None
        (call,) = asked
        if operation.end == "crash":
            noted = {p.message for p in world.pending if p.kind == "answer" and p.message is not None}
        taken = world.accepted()
        world = await world.restarted(SITES, stop=operation.end == "stop")
        before = len(world.attempted)
        # Taken by the server, its outcome not committed when the node went: the window in which
        # a crash (or a stop that could not write a DSN) leaves a recipient to be tried again.
        logged = {(r.id, r.recipient) for r in world.logged("Delivery")}
        doubt = {key for key in taken if (format_id(key[0]), key[1]) not in logged}
        answered = call.answered  # (None: the node went before it answered: nothing promised)
        await _run_to_the_end(world)
        check(world, operation, call, answered, before, recipients, noted, doubt)
    finally:
        await world.close()
    return world


async def _run_to_the_end(world: World) -> None:
    """Load what is due, release everything, let time pass up to the next retry: until the
    spool holds nothing but held mail (time is never let pass up to `HELD`)."""
    for _ in range(50):
        world.tick()
        await world.release_all()
        waiting = [row.due for row in world.spool.rows.values() if row.due < HELD]
        if not waiting:
            return
        world.clock.now = max(world.clock.now, min(waiting) + 0.001)
    raise AssertionError(f"not settled: {world.spool.rows}")


def check(
    world: World,
    operation: Operation,
    call: AdminCall,
    answered: int | None,
    before: int,
    recipients: dict[SpoolId, list[str]],
    noted: set[int],
    doubt: set[tuple[SpoolId, str]],
) -> None:
    records = world.terminal()
    twice = {key: n for key, n in world.accepted().items() if n > 1 and key not in doubt}
    assert not twice, f"accepted twice by the receiving server: {twice}"
    for spool_id, recipient in world.accepted():
        if (spool_id, recipient) in doubt:
            continue  # (ends once all the same: held, bounced, or delivered again)
        kinds = records.get((format_id(spool_id), recipient))
        assert kinds == ["Delivery"], f"{recipient} was accepted by the server but ended as {kinds}"
    for spool_id, addresses in recipients.items():
        row = world.spool.get(spool_id)
        kept = {r.address for r in row.envelope.recipients} if row is not None else set()
        if row is not None:
            assert row.due >= HELD and row.envelope.held is not None, f"{format_id(spool_id)} left {row}"
            assert row.envelope.after_attempt is None, f"{format_id(spool_id)} held, with a mark left: {row}"
        for recipient in addresses:
            kinds = records.get((format_id(spool_id), recipient), [])
            ends = len(kinds) + (recipient in kept)
            assert ends == 1, f"{recipient} of {format_id(spool_id)}: {kinds}, held: {recipient in kept}"
        if answered is None:
            continue
        result = {said["id"]: said["result"] for said in (call.result or {}).get("messages", [])}
        if result.get(format_id(spool_id)) in (None, "not_found"):
            continue  # delivered (or ended) before the operator asked: nothing promised
        late = [a for a in world.attempted[before:] if a.message == spool_id]
        late += [a for a in world.attempted[:before] if a.message == spool_id and a.step > answered]
        assert not late, f"{format_id(spool_id)} attempted after the {operation.name} answered: {late}"
        # What the attempt under way did not deliver (nor refuse for good) is the operator's.
        ended = {"Delivery", "Bounce"} | ({"AdminBounce"} if operation.name == "bounce" else set())
        for recipient in addresses:
            kinds = records.get((format_id(spool_id), recipient), [])
            assert set(kinds) <= ended, f"{recipient} {operation.name}ed by the operator, but ended as {kinds}"
        if operation.name == "bounce":
            assert row is None, f"{format_id(spool_id)} bounced, but left in the spool: {row}"
        elif row is not None:
            assert row.due == HELD and row.envelope.hold_operator == "op", f"{format_id(spool_id)}: {row}"
            held = [r for r in world.logged("AdminHold") if r.id == format_id(spool_id)]
            assert held or spool_id in noted, f"{format_id(spool_id)} held with no AdminHold record"


# --- every order of one message; random orders of two --------------------------------------------------
async def explore(operation: Operation, answers: str, limit: int) -> Explorer:
    explorer = Explorer(limit)
    for choose in explorer.orders():
        if await run(operation, answers, choose) is None:
            explorer.redundant += 1
    return explorer


@pytest.mark.parametrize("answers", sorted(ANSWERS))
@pytest.mark.parametrize("operation", OPERATIONS, ids=str)
async def test_every_order_of_a_hold_or_bounce_by_id_then_a_stop_or_a_crash(operation: Operation, answers: str) -> None:
    explorer = await explore(operation, answers, limit=20_000)
    assert explorer.runs >= 10


@pytest.mark.parametrize("answers", sorted(ANSWERS))
@pytest.mark.parametrize("operation", OPERATIONS, ids=str)
async def test_random_orders_of_two_messages_held_or_bounced_by_id_then_stopped_or_crashed(
    operation: Operation, answers: str
) -> None:
    for choose in random_orders(seed=zlib.crc32(f"{operation}/{answers}".encode()), runs=100):
        assert await run(operation, answers, choose, messages=2) is not None


# --- the explorer finds the defect with the mark kept in memory only --------------------------------------
class _InMemoryMarks:
    """The settlement as the operations saw it before the fix: a mark on the entry alone,
    answered at once. (A stand-in around it: `Settlement` may be compiled, and not patched.)"""

    def __init__(self, settlement: Settlement) -> None:
        self._settlement = settlement

    def __getattr__(self, name: str) -> Any:
        return getattr(self._settlement, name)

    def after_attempt(self, entry: Entry, kind: str, mark: AdminMark) -> asyncio.Future[None]:
        if kind == "bounce":
            entry.admin_bounce = mark
        else:
            entry.admin_hold = mark
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        answered.set_result(None)
        return answered


@pytest.mark.parametrize("operation", OPERATIONS, ids=str)
async def test_a_mark_kept_in_memory_only_is_found_lost_after_the_restart(operation: Operation) -> None:
    """The outside tester's defect: answered "being sent: held/bounced as far as that attempt
    does not deliver it", and after a SIGTERM or a kill -9 the message was delivered."""
    found: list[str] = []
    explorer = Explorer(limit=20_000)
    for choose in explorer.orders():
        try:
            await run(operation, "all-later", choose, in_memory=True)
        except AssertionError as violation:
            found.append(str(violation).splitlines()[0])
    assert any(f"attempted after the {operation.name} answered" in v for v in found), sorted(set(found))
