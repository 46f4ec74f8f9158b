"""A partial answer (503: not every worker answered) names the workers it covers as a sentence
does, in the API's `error` and in the `pigeon` command's lines, whose exit status stays 75.

Found from outside: during a worker restart `pigeon rebind` printed `pigeon: 503: the answer
covers workers none only`, and a partial `pigeon suspend` `... covers workers [0] only` (a
Python list). The node's supervisor is asked through its own `_to_workers`, its workers those
that answer and those whose control socket nobody is at (restarting)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from pigeon.cli.api import TEMPFAIL, fail
from pigeon.config.load import load
from pigeon.node.partial_answer import workers_named
from pigeon.node.supervisor import Supervisor, Worker


class _Answering:
    def __init__(self, index: int) -> None:
        self.index = index

    async def forward(self, request: web.Request, body: bytes, **_: Any) -> web.Response:
        return web.json_response({"rebound": 0, "after_attempt": 0, "inbound_left": 0})

    async def close(self) -> None:
        pass


async def _partial(answering: list[int], count: int, tmp_path: Path) -> tuple[int, Any]:
    supervisor = Supervisor(load(None), None, count)
    workers: list[Any] = [
        _Answering(index) if index in answering else Worker(index, tmp_path / f"worker-{index}.sock")
        for index in range(count)
    ]
    supervisor.workers = workers
    try:
        return await supervisor._to_workers(make_mocked_request("POST", "/api/v1/admin/rebind"), b"{}")
    finally:
        for worker in workers:
            await worker.close()


@pytest.mark.parametrize(
    ("answering", "count", "api", "cli"),
    [
        ([], 2, "no worker answered (worker 0: could not be asked", "pigeon: 503: no worker answered\n"),
        ([0], 2, "; this answer covers worker 0 only", "pigeon: 503: the answer covers worker 0 only\n"),
        (
            [0, 2],
            3,
            "; this answer covers workers 0 and 2 only",
            "pigeon: 503: the answer covers workers 0 and 2 only\n",
        ),
    ],
    ids=["none", "one", "two"],
)
async def test_a_partial_answer_names_the_workers_it_covers_as_a_sentence_does(
    answering: list[int], count: int, api: str, cli: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, answer = await _partial(answering, count, tmp_path)
    assert (status, answer["partial"], answer["answered"]) == (503, True, answering)
    assert api in answer["error"], answer["error"]
    assert "[" not in answer["error"].split(")")[-1] and "none only" not in answer["error"]
    assert fail(status, answer) == TEMPFAIL  # (the exit status stays 75)
    err = capsys.readouterr().err
    assert err.startswith(cli), err
    assert "[" not in err.splitlines()[0] and "none only" not in err


def test_workers_are_named_as_a_sentence_names_them() -> None:
    assert [workers_named(i) for i in ([], [0], [0, 2], [0, 1, 3])] == [
        "",
        "worker 0",
        "workers 0 and 2",
        "workers 0, 1 and 3",
    ]
