"""A worker that ended a rule does not take the cluster's copy of it back (`Admin.adopt`): an end
issued while Redis was away is not undone when the worker next takes the cluster's rules, before
its node has sent that end on. A rule made again after the end is taken."""

from __future__ import annotations

from typing import Any

from pigeon.queue.rules import Rule, Selector
from tests.unit.conftest import MakeWorld


async def test_a_rule_ended_here_is_not_taken_back_from_the_cluster_but_one_made_again_since_is(
    make_world: MakeWorld,
) -> None:
    world = make_world({"d1.test": "site-1"})

    async def adopted(rule: Rule) -> list[Any]:
        call = world.start_admin("adopt", lambda admin: _added(admin.adopt([rule], {})))
        await world.release_all()
        assert call.result is not None
        added: list[Any] = call.result["added"]
        return added

    made = Rule("hold", "suspend", Selector(domain="d1.test"), world.clock() - 10)
    assert await adopted(made) == [made]
    world.clock.now += 1
    call = world.resume("hold")
    await world.release_all()
    assert call.result is not None and call.result["cancelled"]
    world.clock.now += 1
    assert await adopted(made) == [], "the cluster's copy, made before the end, was taken back"
    again = Rule("hold", "suspend", Selector(domain="d1.test"), world.clock())
    assert await adopted(again) == [again]


async def _added(adopting: Any) -> dict[str, Any]:
    added, _ = await adopting
    return {"added": added}
