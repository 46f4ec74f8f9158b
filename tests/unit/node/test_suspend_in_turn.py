"""The supervisor passes suspensions to its workers one at a time: identical ones asked for at
once are answered as one rule that exactly one of them made, whatever order each worker would
have taken them in."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from pigeon.config.load import load
from pigeon.node.supervisor import Supervisor


class _Worker:
    """A worker as the supervisor sees it: the first suspension it takes makes the rule, the
    others find it `already` there. `slow_for`: a request (by its body) that reaches it late."""

    def __init__(self, index: int, slow_for: bytes | None = None) -> None:
        self.index = index
        self.slow_for = slow_for
        self.made_by: bytes | None = None

    async def forward(
        self,
        request: web.Request,
        body: bytes,
        within: float | None = None,
        generation: int | None = None,
        issued: float | None = None,
    ) -> web.Response:
        if body == self.slow_for:
            await asyncio.sleep(0.05)  # its loop was busy: the other request got in first
        already = self.made_by is not None
        if not already:
            self.made_by = body
        return web.json_response({"rule": {"id": "d1e2"}, "already": already})


async def test_identical_suspensions_reach_every_worker_in_one_order() -> None:
    supervisor = Supervisor(load(None), None, 2)
    first, second = b'{"tenant": "conc1", "id": "a"}', b'{"tenant": "conc1", "id": "b"}'
    workers = [_Worker(0), _Worker(1, slow_for=first)]
    supervisor.workers = workers  # type: ignore[assignment]

    async def suspend(body: bytes) -> Any:
        status, answer = await supervisor._to_workers_in_turn(
            make_mocked_request("POST", "/api/v1/admin/suspend"), body
        )
        assert status == 200
        return answer

    answers = await asyncio.gather(suspend(first), suspend(second))
    # Before: worker 0 made the rule for the first, worker 1 for the second; both were told `already`.
    assert [answer["already"] for answer in answers] == [False, True]
    assert [worker.made_by for worker in workers] == [first, first]
