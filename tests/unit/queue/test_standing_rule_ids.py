"""A suspension until resumed is one rule under one id on every worker and node, whatever order
identical requests (each given its own id where it was issued) reach them in."""

from __future__ import annotations

import json
from typing import Any

from pigeon.listener.http.admin import perform
from pigeon.queue.admin import Admin
from tests.support.queue_world import World
from tests.unit.conftest import MakeWorld


async def _ask(world: World, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    async def call(admin: Admin) -> dict[str, Any]:
        status, answer = await perform(admin, method, path, json.dumps(body).encode() if body else b"", "op")
        return {"status": status, **answer}

    asked = world.start_admin(method, call)
    await world.release_all()
    return asked.result


async def test_identical_suspensions_reaching_two_workers_in_opposite_orders_make_one_rule_under_one_id(
    make_world: MakeWorld,
) -> None:
    first, second = make_world({}), make_world({})  # two workers (or nodes)
    one, other = {"tenant": "conc1", "id": "one"}, {"tenant": "conc1", "id": "other"}
    answers = [await _ask(first, "POST", "/api/v1/admin/suspend", body) for body in (one, other)]
    answers += [await _ask(second, "POST", "/api/v1/admin/suspend", body) for body in (other, one)]
    # Before: worker 1 kept "one", worker 2 "other"; a resume of either left the other worker's mail held.
    (rule_id,) = {answer["rule"]["id"] for answer in answers}
    assert [rule.id for rule in first.rules] == [rule.id for rule in second.rules] == [rule_id]
    for world in (first, second):
        resumed = await _ask(world, "DELETE", f"/api/v1/admin/suspend/{rule_id}")
        assert (resumed["status"], resumed["cancelled"]) == (200, True)
        assert list(world.rules) == []
    # A suspension for a while is a request of its own: under the id it was given.
    timed = await _ask(first, "POST", "/api/v1/admin/suspend", {**one, "duration": "1h"})
    assert (timed["rule"]["id"], timed["already"]) == ("one", False)
