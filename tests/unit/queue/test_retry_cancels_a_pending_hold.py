"""A retry by id of a message held while its attempt is on the wire: the hold is cancelled.

`pigeon hold --id X` of a message being sent answers `after_attempt`: the hold is kept on the
entry and written into the row (`Envelope.after_attempt`), and applied by the attempt's outcome.
Found from outside: a `pigeon retry --id X` then answered `already_due` ("being sent"), and
when the attempt ended undelivered the message was held all the same (`AdminHold`), silently,
until a second retry. A retry by id now cancels that pending hold, in memory and in the row
(durably, before its answer), and answers `hold_cancelled`: the attempt's outcome leaves the
message deferred or due as any outcome does, and a stop or a crash leaves a row that is not held.

Every order of hold, retry (each once the one before answered, with a rebind between them or
not) and a stop or a crash goes through the real queue engine (tests/support/queue_world.py);
the node starts again over the same spool with a server that takes everything and runs until
nothing but held mail is left. Once the retry was answered, the message is not held. Then one
order of each case, said outright: the attempt ends with a 4xx; a token bound to tenants cannot
cancel the operator's hold (answered `held`, as of an applied hold); a bounce asked mid-attempt
is not taken back by a retry (answered `bounced`); a retry by selector leaves the hold
(`on_hold`); a rebind asked too still applies.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pigeon.listener.http import tenancy
from pigeon.message import HELD, SpoolId, format_id
from pigeon.queue.admin import Admin
from pigeon.queue.rules import Selector
from tests.support.queue_world import Attempted, World
from tests.unit.queue.test_interleavings import Chooser, Explorer, random_orders
from tests.unit.queue.test_interleavings_stop import ANSWERS, RECIPIENTS, _answer, _run_to_the_end, ask_in_turn

SITES = {"d1.test": "mx1.test", "d2.test": "mx2.test", "elsewhere.test": "mx3.test"}
NEW_SITE, NEW_QUEUE, NEW_ROUTE = "mx3.test", "parked", "elsewhere.test"


@dataclass(frozen=True)
class Operations:
    names: tuple[str, ...]  # hold, rebind, retry: each once the one before answered
    end: str  # stop (SIGTERM), crash (kill -9)

    def __str__(self) -> str:
        return f"{'+'.join(self.names)}-then-{self.end}"

    def call(self, name: str, ids: list[SpoolId]) -> Callable[[Admin], Any]:
        if name == "hold":
            return lambda admin: admin.hold(Selector(), messages=ids, reason="x", operator="op")
        if name == "rebind":
            everything = Selector(queue="*")
            return lambda admin: admin.rebind(everything, queue=NEW_QUEUE, routing_domain=NEW_ROUTE, operator="op")
        return lambda admin: admin.retry(Selector(), messages=ids)


COMBINATIONS = [("hold", "retry"), ("hold", "rebind", "retry")]
OPERATIONS = [Operations(names, end) for names in COMBINATIONS for end in ("stop", "crash")]


async def run(operations: Operations, answers: str, choose: Chooser, messages: int = 1) -> World | None:
    """One order, then the restart and the run to the end, checked; None for a redundant order."""
    world = World(answer=_answer(ANSWERS[answers])).build(SITES)
    recipients = {world.inject(r): r for r in RECIPIENTS[:messages]}
    await world.quiesce()
    try:
        asked = await ask_in_turn(
            world, operations.names, operations.end, lambda name: operations.call(name, list(recipients)), choose
        )
        if asked is None:
            return None
        world = await world.restarted(SITES, stop=operations.end == "stop")
        before = len(world.attempted)
        answered = {call.name: call.result for call in asked if call.answered is not None}
        await _run_to_the_end(world)
        check(world, answered, before, recipients)
    finally:
        await world.close()
    return world


def check(
    world: World, answered: dict[str, dict[str, Any] | None], before: int, recipients: dict[SpoolId, list[str]]
) -> None:
    records = world.terminal()
    for spool_id, addresses in recipients.items():
        shown = format_id(spool_id)
        row = world.spool.get(spool_id)
        kept = {r.address for r in row.envelope.recipients} if row is not None else set()
        for recipient in addresses:
            kinds = records.get((shown, recipient), [])
            assert len(kinds) + (recipient in kept) == 1, f"{recipient} of {shown}: {kinds}, held: {recipient in kept}"
        said = {
            name: {row["id"]: row["result"] for row in (result or {}).get("messages", [])}.get(shown)
            for name, result in answered.items()
        }
        if said.get("retry") not in (None, "not_found"):
            # Released by its id once the operator had held it: nothing holds it any more.
            assert said["retry"] in ("hold_cancelled", "made_due"), f"{shown}: the retry said {said['retry']}"
            assert row is None, f"{shown} held after the retry answered {said['retry']!r}: {row}"
        if "rebind" in answered:
            late = [a for a in world.attempted[before:] if a.message == spool_id and a.site != NEW_SITE]
            assert not late, f"{shown} attempted at its old route after the rebind answered: {late}"


async def explore(operations: Operations, answers: str, limit: int) -> Explorer:
    explorer = Explorer(limit)
    for choose in explorer.orders():
        if await run(operations, answers, choose) is None:
            explorer.redundant += 1
    return explorer


@pytest.mark.parametrize("answers", ["partial", "all-later", "all-taken"])
@pytest.mark.parametrize("operations", [o for o in OPERATIONS if o.names == ("hold", "retry")], ids=str)
async def test_every_order_of_a_hold_then_a_retry_by_id_then_a_stop_or_a_crash(
    operations: Operations, answers: str
) -> None:
    explorer = await explore(operations, answers, limit=20_000)
    assert explorer.runs >= 10


@pytest.mark.parametrize("operations", OPERATIONS, ids=str)
async def test_random_orders_of_one_and_two_messages_held_then_retried_by_id(operations: Operations) -> None:
    for choose in random_orders(seed=zlib.crc32(str(operations).encode()), runs=60):
        assert await run(operations, "all-later", choose, messages=2) is not None
    for choose in random_orders(seed=zlib.crc32(f"{operations}/1".encode()), runs=200):
        assert await run(operations, "partial", choose) is not None


# --- one order of each case, said outright ----------------------------------------------------------------
def _later_once(world: World, seen: Attempted) -> list[Any]:
    return _answer(ANSWERS["all-later"])(world, seen)


async def _on_the_wire(tenant: str | None = None) -> tuple[World, SpoolId]:
    world = World(answer=_later_once).build(SITES)
    spool_id = world.inject(["a1@d1.test", "a2@d1.test"], tenant=tenant)
    await world.release_all(but="attempt")
    assert [a.site for a in world.attempted] == ["mx1.test"]  # on the wire, its 451s not yet back
    return world, spool_id


async def _ask(world: World, name: str, call: Callable[[Admin], Any]) -> dict[str, Any]:
    asked = world.start_admin(name, call)
    await world.release_all(but="attempt")
    assert asked.result is not None, f"{name} not answered"
    return asked.result


def _hold(spool_id: SpoolId, operator: str = "op", bound_to: list[str] | None = None) -> Callable[[Admin], Any]:
    return lambda admin: admin.hold(Selector(), messages=[spool_id], reason="x", operator=operator, bound_to=bound_to)


def _rows(answer: dict[str, Any]) -> list[str]:
    return [row["result"] for row in answer["messages"]]


async def test_a_retry_by_id_of_a_message_held_mid_attempt_cancels_the_hold_and_the_4xx_defers_it() -> None:
    world, spool_id = await _on_the_wire()
    try:
        hold = await _ask(world, "hold", _hold(spool_id))
        assert (hold["after_attempt"], _rows(hold)) == (1, ["after_attempt"])
        retry = await _ask(world, "retry", lambda admin: admin.retry(Selector(), messages=[spool_id]))
        assert _rows(retry) == ["hold_cancelled"]
        assert world.spool.get(spool_id).envelope.after_attempt is None  # (durable before the answer)
        await world.release_all()  # the attempt's 451s come back
        row = world.spool.get(spool_id)
        assert row is not None and row.envelope.held is None and row.envelope.hold_operator is None
        assert world.clock() < row.due < HELD  # deferred, as any 4xx leaves it
        assert world.logged("AdminHold") == []
        assert [t.next_attempt for t in world.logged("TransientFailure")] == [row.due, row.due]
        # Its next turn delivers it.
        world.clock.now = row.due + 0.001
        world.tick()
        await world.release_all()
        assert sorted(r.recipient for r in world.logged("Delivery")) == ["a1@d1.test", "a2@d1.test"]
        assert world.spool.get(spool_id) is None
    finally:
        await world.close()


@pytest.mark.parametrize("end", ["stop", "crash"])
async def test_a_hold_cancelled_by_a_retry_stays_cancelled_through_a_stop_or_a_crash(end: str) -> None:
    world, spool_id = await _on_the_wire()
    await _ask(world, "hold", _hold(spool_id))
    await _ask(world, "retry", lambda admin: admin.retry(Selector(), messages=[spool_id]))
    world = await world.restarted(SITES, stop=end == "stop")
    try:
        world.tick()
        await world.release_all()
        assert world.logged("AdminHold") == []
        assert sorted(r.recipient for r in world.logged("Delivery")) == ["a1@d1.test", "a2@d1.test"]
        assert world.spool.get(spool_id) is None
    finally:
        await world.close()


async def test_a_token_bound_to_tenants_cannot_cancel_the_operators_hold_asked_mid_attempt() -> None:
    world, spool_id = await _on_the_wire(tenant="acme")
    try:
        await _ask(world, "hold", _hold(spool_id))
        kept = lambda bound: not tenancy.releases(["acme"], bound)  # noqa: E731 (as the API passes it)
        retry = await _ask(
            world, "retry", lambda admin: admin.retry(Selector(), messages=[spool_id], bound_to=["acme"], kept=kept)
        )
        assert (_rows(retry), retry.get("on_hold")) == (["held"], 1)
        await world.release_all()
        row = world.spool.get(spool_id)
        assert row is not None and row.due == HELD and row.envelope.hold_operator == "op"
        # Its own hold, the tenant's token releases.
        world2, other = await _on_the_wire(tenant="acme")
        try:
            await _ask(world2, "hold", _hold(other, "acme-ops", ["acme"]))
            retry = await _ask(
                world2,
                "retry",
                lambda admin: admin.retry(Selector(), messages=[other], bound_to=["acme"], kept=kept),
            )
            assert _rows(retry) == ["hold_cancelled"]
            await world2.release_all()
            row = world2.spool.get(other)
            assert row is not None and row.envelope.held is None and row.due < HELD
        finally:
            await world2.close()
    finally:
        await world.close()


async def test_a_retry_does_not_take_back_a_bounce_asked_mid_attempt_and_says_so() -> None:
    world, spool_id = await _on_the_wire()
    try:
        bounce = lambda admin: admin.bounce(  # noqa: E731
            Selector(), reason="x", operator="op", duration=None, rule_id=None, messages=[spool_id]
        )
        await _ask(world, "bounce", bounce)
        await _ask(world, "hold", _hold(spool_id))
        retry = await _ask(world, "retry", lambda admin: admin.retry(Selector(), messages=[spool_id]))
        assert (_rows(retry), retry["bounced"], retry["made_due"]) == (["bounced"], 1, 0)
        await world.release_all()
        assert sorted(r.recipient for r in world.logged("AdminBounce")) == ["a1@d1.test", "a2@d1.test"]
        assert world.spool.get(spool_id) is None
    finally:
        await world.close()


async def test_a_retry_by_selector_leaves_a_hold_asked_mid_attempt_and_counts_it_on_hold() -> None:
    world, spool_id = await _on_the_wire()
    try:
        await _ask(world, "hold", _hold(spool_id))
        retry = await _ask(world, "retry", lambda admin: admin.retry(Selector(queue="*")))
        assert (retry["made_due"], retry.get("on_hold")) == (0, 1)
        await world.release_all()
        row = world.spool.get(spool_id)
        assert row is not None and row.due == HELD and row.envelope.hold_operator == "op"
    finally:
        await world.close()


async def test_a_rebind_asked_mid_attempt_still_applies_when_a_retry_cancels_the_hold() -> None:
    world, spool_id = await _on_the_wire()
    try:
        await _ask(world, "hold", _hold(spool_id))
        rebind = lambda admin: admin.rebind(  # noqa: E731
            Selector(queue="*"), queue=NEW_QUEUE, routing_domain=NEW_ROUTE, operator="op"
        )
        assert (await _ask(world, "rebind", rebind))["after_attempt"] == 1
        retry = await _ask(world, "retry", lambda admin: admin.retry(Selector(), messages=[spool_id]))
        assert _rows(retry) == ["hold_cancelled"]
        assert world.spool.get(spool_id).envelope.rebind_after_attempt is not None  # (kept in the row)
        await world.release_all()
        row = world.spool.get(spool_id)
        assert row is not None and row.envelope.held is None and row.due == world.clock()  # moved, due at once
        assert (row.queue, row.envelope.routing_domain) == (NEW_QUEUE, NEW_ROUTE)
        assert len(world.logged("Rebind")) == 1 and world.logged("AdminHold") == []
        world.tick()
        await world.release_all()
        assert {r.site for r in world.logged("Delivery")} == {NEW_SITE}
        assert world.spool.get(spool_id) is None
    finally:
        await world.close()
