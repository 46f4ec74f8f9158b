"""A write some workers of the node did not answer (503, `partial: true`) is told as the same
sentence a whole answer would be, for the counts the answering workers gave, after which
workers those are: an outside tester saw `workers [0] only: bounced 44 messages` while the node
logged `44 messages, 6 of them once their attempt ends`, because the CLI looked for "6 being
sent now" (and retry's, resume's, rebind's, suspend's qualifiers) at the top of the answer, not
under `answers`, where a partial answer holds them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from pigeon.cli import admin
from pigeon.cli.api import TEMPFAIL
from pigeon.config.load import load
from pigeon.node.supervisor import Supervisor, Worker


class _Answering:
    """Worker 0: answers every request with `said`."""

    index = 0

    def __init__(self, said: dict[str, Any]) -> None:
        self.said = said

    async def forward(self, request: web.Request, body: bytes, **_: Any) -> web.Response:
        return web.json_response(self.said)

    async def close(self) -> None:
        pass


async def _node_answer(method: str, path: str, said: dict[str, Any], missing: Path | None) -> tuple[int, Any]:
    """The node's answer, merged by its supervisor as the API gives it: worker 0 says `said`;
    with `missing` (a control socket nobody is at), worker 1 cannot be asked: a partial answer."""
    supervisor = Supervisor(load(None), None, 2)
    workers: list[Any] = [_Answering(said)]
    if missing is not None:
        workers.append(Worker(1, missing))
    supervisor.workers = workers
    try:
        return await supervisor._to_workers(make_mocked_request(method, path), b"")
    finally:
        for worker in workers:
            await worker.close()


def _args(**more: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"json": False, "cluster": False, "list": False, "cancel": None, "reason": "",
                                 "duration": None, "to_queue": None, "routing_domain": None, **more})  # fmt: skip


_RULE = {"id": "3f9a1c2b7d4e", "kind": "suspend", "selector": {"domain": "slow.test"}, "created": 1.0,
         "expires": 1.9e9, "reason": "r", "operator": "ops", "via": "api"}  # fmt: skip

CASES: list[tuple[Callable[[argparse.Namespace], int], dict[str, Any], str, str, dict[str, Any], str]] = [
    (admin._bounce, {"domain": "slow.test", "tenant": "ta"}, "POST", "/api/v1/admin/bounce",
     {"bounced": 44, "after_attempt": 6, "rule": None, "operation": "op1"},
     "bounced 38 messages now; 6 being sent: bounced only if that attempt does not deliver them"),
    (admin._retry, {"domain": "slow.test"}, "POST", "/api/v1/admin/retry",
     {"made_due": 3, "suspended": 2, "bounced": 1, "operation": "op2"},
     "3 messages due now; 2 left held by a suspension (`pigeon suspend --list`, then `pigeon resume ID`); "
     "1 message bounced instead (a standing bounce covers them, `pigeon bounce --list`, or an operator bounced "
     "them while they were being sent)"),
    (admin._resume, {"id": "3f9a1c2b7d4e"}, "DELETE", "/api/v1/admin/suspend/3f9a1c2b7d4e",
     {"cancelled": True, "made_due": 3, "bounced": 2},
     "resumed: 3 messages due now; 2 messages bounced instead"),
    (admin._rebind, {"domain": "slow.test", "to_queue": "parked"}, "POST", "/api/v1/admin/rebind",
     {"rebound": 5, "after_attempt": 1, "inbound_left": 2, "operation": "op3"},
     "rebound 5 messages (1 once their attempt under way ends); 2 messages of [[inbound]] routes left as they are"),
    (admin._suspend, {"domain": "slow.test"}, "POST", "/api/v1/admin/suspend",
     {"held": 0, "rule": _RULE, "already": True},
     "already suspended until 2030-03-17 17:46:40 UTC by rule 3f9a1c2b7d4e; nothing added"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "given", "method", "path", "said", "qualified"), CASES,
                         ids=["bounce", "retry", "resume", "rebind", "suspend"])  # fmt: skip
async def test_a_partial_answer_is_told_with_the_qualifiers_of_a_whole_one(
    command: Callable[[argparse.Namespace], int],
    given: dict[str, Any],
    method: str,
    path: str,
    said: dict[str, Any],
    qualified: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    whole = await _node_answer(method, path, said, None)
    partial = await _node_answer(method, path, said, tmp_path / "worker-1.sock")
    assert whole[0] == 200, whole
    assert partial[0] == 503 and partial[1]["partial"] is True and partial[1]["answered"] == [0], partial

    def told(answer: tuple[int, Any]) -> tuple[int, str, str]:
        class Api:
            def __init__(self, args: argparse.Namespace) -> None:
                pass

            def request(self, method: str, path: str, body: Any = None, **_: Any) -> tuple[int, Any]:
                return answer

        monkeypatch.setattr(admin, "ApiClient", Api)
        code = command(_args(**given))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = told(whole)
    assert code == 0
    assert qualified in out, out
    code, partly, err = told(partial)
    assert code == TEMPFAIL
    assert partly == f"worker 0 only: {out}"  # the same sentence, for what worker 0 did
    assert "pigeon: 503: the answer covers worker 0 only" in err
    assert "pigeon: worker 1 did not answer: could not be asked" in err
