"""A worker never lets one rule replace another under one id: what another node sends it through
the admin stream (`perform`, as `Node._apply` runs it) and what it takes from the cluster's rules
(`Admin.adopt`) meet the same check as a request to its own API."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from aiohttp import web

from pigeon.listener.http.admin import perform, refusal_answer
from pigeon.queue.admin import Admin
from pigeon.queue.rules import Rule, Selector, same_rule
from tests.support.queue_world import World
from tests.unit.conftest import MakeWorld


async def _ask(world: World, body: dict[str, Any], kind: str = "suspend") -> tuple[int, Any]:
    async def call(admin: Admin) -> dict[str, Any]:
        try:
            status, answer = await perform(admin, "POST", f"/api/v1/admin/{kind}", json.dumps(body).encode(), "op")
        except web.HTTPException as refusal:
            status, answer = refusal_answer(refusal)
        return {"status": status, "answer": answer}

    asked = world.start_admin(kind, call)
    await world.release_all()
    assert asked.result is not None
    return asked.result["status"], asked.result["answer"]


async def test_a_worker_refuses_another_rule_under_a_rule_id_and_keeps_the_one_it_holds(make_world: MakeWorld) -> None:
    world = make_world({"e.test": "site-1"})
    status, made = await _ask(world, {"domain": "e.test", "id": "x1", "duration": "1h"})
    assert status == 200
    for kind, body in [
        ("bounce", {"domain": "zz6.test", "id": "x1", "duration": "1h"}),
        ("suspend", {"domain": "zz4.test", "id": "x1", "duration": "1h"}),
        ("suspend", {"domain": "e.test", "id": "x1", "duration": "2h"}),
    ]:
        status, answer = await _ask(world, body, kind)
        assert (status, answer["rule"]) == (409, made["rule"]), answer
    status, again = await _ask(world, {"domain": "e.test", "id": "x1", "duration": "1h"})
    assert (status, again["already"], again["rule"]) == (200, True, made["rule"])
    assert [(r.id, r.kind, r.selector) for r in world.rules] == [("x1", "suspend", Selector(domain="e.test"))]


async def test_a_rule_of_the_cluster_under_a_held_rule_id_is_not_taken_and_is_said(
    make_world: MakeWorld, caplog: pytest.LogCaptureFixture
) -> None:
    world = make_world({"e.test": "site-1"})
    assert (await _ask(world, {"domain": "e.test", "id": "x1", "duration": "1h"}))[0] == 200
    other = Rule("x1", "bounce", Selector(domain="zz6.test"), world.clock(), expires=world.clock() + 3600)
    adopting = world.start_admin("adopt", lambda admin: _added(admin.adopt([other], {})))
    with caplog.at_level(logging.ERROR):
        await world.release_all()
    assert adopting.result == {"added": []}
    assert [(r.id, r.kind) for r in world.rules] == [("x1", "suspend")]
    assert "standing bounce x1 of domain=zz6.test (for 3600s) is not taken here" in caplog.text


async def _added(adopting: Any) -> dict[str, Any]:
    added, _ = await adopting
    return {"added": added}


def test_a_rule_that_ends_when_the_rule_held_ends_is_that_rule_whatever_duration_it_says() -> None:
    # A node of an earlier Pigeon sends a rule made while it was cut off from Redis with what was
    # left of its duration: every worker that took the cluster's copy first refused it, with an error.
    held = Rule("x1", "bounce", Selector(domain="e.test"), 1000.0, expires=1900.0)
    assert same_rule(held, Rule("x1", "bounce", Selector(domain="e.test"), 1300.0, expires=1900.5))
    assert same_rule(held, Rule("x1", "bounce", Selector(domain="e.test"), 1300.0, expires=2200.0))  # 900 s
    assert not same_rule(held, Rule("x1", "bounce", Selector(domain="e.test"), 1300.0, expires=2000.0))
