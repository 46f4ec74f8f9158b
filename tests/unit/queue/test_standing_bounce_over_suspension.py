"""A running standing bounce wins over a suspension of the same mail, whatever the order the two
rules were made in: new mail both cover is bounced on arrival (`AdminBounce`, never attempted),
never held by the suspension to be delivered once the bounce ends and the suspension is resumed.

Each pair of selectors below covers the test's mail with both rules: the same selector, or
two that overlap only in part (one wider than the other, or on different fields).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from pigeon.message import format_id
from pigeon.queue.admin import Admin
from pigeon.queue.rules import HOLD, Rule, Selector
from tests.support.queue_world import World
from tests.unit.conftest import MakeWorld

SITES = {"d1.test": "mx1.test", "d2.test": "mx2.test"}
HOUR = 3600.0

# (the suspension's selector, the standing bounce's): each covers the mail `_send` sends.
PAIRS = {
    "domain": (Selector(domain="d1.test"), Selector(domain="d1.test")),
    "queue": (Selector(queue="*@d1.test"), Selector(queue="*@d1.test")),
    "tenant": (Selector(tenant="acme"), Selector(tenant="acme")),
    "suspension-wider": (Selector(domain="*.test"), Selector(campaign="spring", domain="d1.test")),
    "bounce-wider": (Selector(campaign="spring", tenant="acme"), Selector(domain="d*.test")),
    "tenant-and-domain": (Selector(tenant="acme"), Selector(domain="d1.test")),
}


def _send(world: World, recipient: str = "a@d1.test") -> int:
    return world.inject([recipient], campaign="spring", tenant="acme")


def _ends(world: World, spool_id: int) -> dict[str, list[str]]:
    """Each recipient of `spool_id`: the terminal records it got."""
    return {recipient: kinds for (mid, recipient), kinds in world.terminal().items() if mid == format_id(spool_id)}


async def _rules(world: World, first: str, pair: str, suspend_for: float | None) -> None:
    """The suspension and the standing bounce of `pair`, `first` made first, each answered."""
    suspension, bounce = PAIRS[pair]
    for kind in (first, "bounce" if first == "suspend" else "suspend"):
        if kind == "suspend":
            call = world.suspend(suspension, rule_id="hold", duration=suspend_for)
        else:
            call = world.bounce(bounce, duration=HOUR)
        await world.release_all()
        assert call.result is not None, kind


@pytest.mark.parametrize(
    ("first", "pair", "suspend_for"),
    list(itertools.product(("suspend", "bounce"), PAIRS, (None, HOUR))),
)
async def test_new_mail_both_cover_is_bounced_on_arrival_whichever_rule_came_first(
    make_world: MakeWorld, first: str, pair: str, suspend_for: float | None
) -> None:
    world = make_world(SITES, cached=SITES)
    await _rules(world, first, pair, suspend_for)
    spool_id = _send(world)
    await world.release_all()

    assert world.attempted == []
    assert _ends(world, spool_id) == {"a@d1.test": ["AdminBounce"]}
    assert spool_id not in world.spool.rows
    [record] = world.logged("AdminBounce")
    assert record.response.code == 550


async def test_held_mail_is_bounced_at_once_by_a_standing_bounce_made_later_and_new_mail_on_arrival(
    make_world: MakeWorld,
) -> None:
    world = make_world(SITES, cached=SITES)
    world.suspend(Selector(domain="d1.test"))
    await world.release_all()
    held = _send(world)
    await world.release_all()
    assert world.spool.rows[held].due > world.clock(), "held in the spool by the suspension"

    bounce = world.bounce(Selector(domain="d1.test"), duration=HOUR)
    await world.release_all()
    assert bounce.result is not None and bounce.result["bounced"] == 1
    assert _ends(world, held) == {"a@d1.test": ["AdminBounce"]}

    fresh = _send(world)
    await world.release_all()
    assert _ends(world, fresh) == {"a@d1.test": ["AdminBounce"]}
    other = _send(world, "b@d2.test")  # neither rule covers it: delivered
    await world.release_all()
    assert _ends(world, other) == {"b@d2.test": ["Delivery"]}
    assert [a.recipients for a in world.attempted] == [("b@d2.test",)]


async def test_a_resume_while_the_bounce_runs_has_nothing_left_to_make_due(make_world: MakeWorld) -> None:
    world = make_world(SITES, cached=SITES)
    await _rules(world, "suspend", "domain", None)
    spool_id = _send(world)
    await world.release_all()

    resume = world.resume()
    await world.release_all()
    assert resume.result == {"cancelled": True, "made_due": 0, "bounced": 0}
    await world.drain()
    assert world.attempted == []
    assert _ends(world, spool_id) == {"a@d1.test": ["AdminBounce"]}


async def _held(world: World) -> list[int]:
    """Mail a suspension of every domain holds in the spool: two messages for d1.test, one for d2.test."""
    world.suspend(Selector(domain="*.test"))
    await world.release_all()
    held = [_send(world, "a@d1.test"), _send(world, "b@d1.test"), _send(world, "c@d2.test")]
    await world.release_all()
    assert all(world.spool.rows[i].due > world.clock() for i in held), "held by the suspension"
    return held


def _bounce_of_d1(world: World) -> Rule:
    now = world.clock()
    return Rule("handed", "bounce", Selector(domain="d1.test"), now, expires=now + HOUR, reason="list gone")


async def test_held_mail_a_handed_over_bounce_covers_is_bounced_at_once_not_when_it_falls_due(
    make_world: MakeWorld,
) -> None:
    """A standing bounce this worker takes from a hand-over (a worker or node that missed the
    bounce while it was away) bounces the mail a suspension holds in the spool as it takes it,
    as the bounce did where it was made: not `HOLD` (a minute) later, when that mail falls due."""
    world = make_world(SITES, cached=SITES)
    first, second, other = await _held(world)
    rule = _bounce_of_d1(world)

    async def adopt(admin: Admin) -> dict[str, Any]:
        added, ended = await admin.adopt([rule], {})
        return {"added": added, "ended": ended}

    handed = world.start_admin("adopt", adopt)
    await world.release_all()  # no time passes
    assert handed.result == {"added": [rule], "ended": []}
    assert _ends(world, first) == {"a@d1.test": ["AdminBounce"]}
    assert _ends(world, second) == {"b@d1.test": ["AdminBounce"]}
    assert {r.reason for r in world.logged("AdminBounce")} == {"list gone"}
    assert world.attempted == []
    assert other in world.spool.rows and _ends(world, other) == {}  # held still: the bounce does not cover it

    world.clock.now += HOLD + 1  # falling due later bounces nothing twice
    world.tick()
    await world.release_all()
    assert len(world.logged("AdminBounce")) == 2
    assert other in world.spool.rows and world.attempted == []


async def test_a_handed_over_bounce_leaves_held_mail_due_after_it_ends(make_world: MakeWorld) -> None:
    """Mail the rule would never meet (due again after it ends) is not bounced by taking it."""
    world = make_world(SITES, cached=SITES)
    world.suspend(Selector(domain="*.test"))
    await world.release_all()
    held = _send(world, "a@d1.test")
    await world.release_all()
    now = world.clock()
    rule = Rule("short", "bounce", Selector(domain="d1.test"), now, expires=now + HOLD / 2, reason="brief")

    async def adopt(admin: Admin) -> dict[str, Any]:
        added, ended = await admin.adopt([rule], {})
        return {"added": added, "ended": ended}

    handed = world.start_admin("adopt", adopt)
    await world.release_all()
    assert handed.result == {"added": [rule], "ended": []}
    assert held in world.spool.rows and world.logged("AdminBounce") == []


async def test_a_resume_says_apart_the_held_mail_a_standing_bounce_covers(make_world: MakeWorld) -> None:
    """A standing bounce in force that has not met the held mail yet (its worker stopped after
    storing it, before its walk: read back from the spool at the next start, it is not walked)."""
    world = make_world(SITES, cached=SITES)
    first, second, other = await _held(world)
    stored = asyncio.ensure_future(world.rules.add(_bounce_of_d1(world), world.spool))
    await world.release_all()
    await stored
    assert all(i in world.spool.rows for i in (first, second, other)) and world.logged("AdminBounce") == []

    resume = world.resume()
    await world.release_all()
    assert resume.result == {"cancelled": True, "made_due": 1, "bounced": 2}
    world.tick()
    await world.release_all()
    assert _ends(world, first) == {"a@d1.test": ["AdminBounce"]}
    assert _ends(world, second) == {"b@d1.test": ["AdminBounce"]}
    assert _ends(world, other) == {"c@d2.test": ["Delivery"]}
    assert [a.recipients for a in world.attempted] == [("c@d2.test",)]
