"""The node's standing rules as the supervisor keeps them (`pigeon.node.standing`), with its real
bookkeeping (`Supervisor._to_workers`, `_hand_rules`, the rules file) and workers that answer as
a test releases them: a hand-over that a write overtakes is not repeated for ever, and a rule
every worker refused is not in the file a worker starting meanwhile reads."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from pigeon.config.load import load
from pigeon.listener.http.admin import rule_change
from pigeon.node.standing import RULES_FILE, decode
from pigeon.node.supervisor import Supervisor

TOKEN = "ops-token-0123456789"


def _supervisor(tmp_path: Path) -> Supervisor:
    config = tmp_path / "pigeon.toml"
    config.write_text(
        f'[spool]\npath = "{tmp_path / "spool"}"\n[http]\nlocal_token = false\n'
        f'[[http.token]]\nname = "ops"\ntoken = "{TOKEN}"\nscopes = ["admin", "read"]\n'
    )
    (tmp_path / "spool").mkdir()
    return Supervisor(load(config), config, 2)


class _Worker:
    """A worker as the supervisor sees it. `answer`: how it answers a write (`took`: it takes
    the rule; `refuses`: 401, as a worker whose config no longer has the token; `away`: not
    listening); `before_answer`: what happens while the write is on its way to it; `gate`: holds
    a hand-over until set."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.behind = 0
        self.handing: asyncio.Task[None] | None = None
        self.answer = "took"
        self.before_answer: Any = None
        self.gate: asyncio.Event | None = None
        self.make_gate: asyncio.Event | None = None
        """Holds its answer to a write that makes a rule until set (it carries it out last)."""
        self.handed: list[bytes] = []
        self.hand_over_reached = asyncio.Event()

    async def forward(
        self,
        request: web.Request,
        body: bytes,
        within: float | None = None,
        generation: int | None = None,
        issued: float | None = None,
    ) -> web.Response:
        if self.before_answer is not None:
            self.before_answer()
        if self.answer == "away":
            raise ConnectionRefusedError(f"worker {self.index} is restarting")
        if self.answer == "refuses":
            return web.json_response({"error": "unknown token"}, status=401)
        change = rule_change(request.method, request.path, body, "ops", time.time())
        assert change is not None
        if change.rule is None:
            return web.json_response({"cancelled": True, "made_due": 0})
        if self.make_gate is not None:
            await self.make_gate.wait()
        return web.json_response({"held": 0, "rule": msgspec.to_builtins(change.rule), "already": False})

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.handed.append(body)
        self.hand_over_reached.set()
        if self.gate is not None:
            await self.gate.wait()
        return 200, b'{"added": [], "ended": []}'


async def _write(supervisor: Supervisor, method: str, path: str, body: object = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    request = make_mocked_request(method, path, headers=headers)
    return await supervisor._to_workers(request, json.dumps(body).encode() if body is not None else b"")


def _file(tmp_path: Path) -> dict[str, Any]:
    """The rules file as a worker that starts now reads it: rule id -> in force or ended."""
    try:
        standing = decode((tmp_path / "spool" / RULES_FILE).read_bytes())
    except FileNotFoundError:
        return {}
    return {**dict.fromkeys(standing.in_force, "in force"), **dict.fromkeys(standing.ended, "ended")}


async def test_a_hand_over_that_a_write_overtook_is_not_handed_again(tmp_path: Path) -> None:
    supervisor = _supervisor(tmp_path)
    workers = [_Worker(0), _Worker(1)]
    supervisor.workers = workers  # type: ignore[assignment]
    workers[0].answer = "away"
    status, answer = await _write(supervisor, "POST", "/api/v1/admin/suspend", {"domain": "a.test"})
    assert status == 503 and answer["answered"] == [1], answer
    assert workers[0].behind  # it missed the suspension: it is to be handed the node's rules

    workers[0].answer, workers[0].gate = "took", asyncio.Event()
    handing = asyncio.create_task(supervisor._hand_rules(workers[0]))  # as its next heartbeat would
    await workers[0].hand_over_reached.wait()
    # Another write, while the hand-over is on its way: worker 0 takes it itself.
    status, answer = await _write(supervisor, "POST", "/api/v1/admin/suspend", {"domain": "b.test"})
    assert status == 200, answer
    workers[0].gate.set()
    await handing
    # Before: a change had gone to the workers meanwhile, so worker 0 stayed `lacking` and was
    # handed the rules again at every heartbeat for as long as writes kept coming.
    assert workers[0].behind == 0
    assert len(workers[0].handed) == 1


async def test_a_hand_over_is_repeated_for_a_write_the_worker_missed_while_it_was_on_its_way(tmp_path: Path) -> None:
    supervisor = _supervisor(tmp_path)
    workers = [_Worker(0), _Worker(1)]
    supervisor.workers = workers  # type: ignore[assignment]
    workers[0].answer = "away"
    await _write(supervisor, "POST", "/api/v1/admin/suspend", {"domain": "a.test"})
    workers[0].gate = asyncio.Event()
    handing = asyncio.create_task(supervisor._hand_rules(workers[0]))
    await workers[0].hand_over_reached.wait()
    await _write(supervisor, "POST", "/api/v1/admin/suspend", {"domain": "b.test"})  # missed too
    workers[0].gate.set()
    await handing
    assert workers[0].behind  # what it was handed lacks b.test: handed again as it next answers
    handed = decode(workers[0].handed[0])
    assert [rule.selector.domain for rule in handed.in_force.values()] == ["a.test"]


async def test_a_suspension_every_worker_refuses_is_not_in_the_file_while_they_are_asked(tmp_path: Path) -> None:
    supervisor = _supervisor(tmp_path)
    workers = [_Worker(0), _Worker(1)]
    supervisor.workers = workers  # type: ignore[assignment]
    seen: list[dict[str, Any]] = []
    for worker in workers:
        worker.answer = "refuses"
    # What a worker starting while the write is on its way takes (`take_node_rules`).
    workers[1].before_answer = lambda: seen.append(_file(tmp_path))
    status, answer = await _write(supervisor, "POST", "/api/v1/admin/suspend", {"domain": "a.test"})
    assert status == 401, answer  # the operator is told it failed ...
    assert seen == [{}]  # ... and no worker could take it meanwhile (before: it was in the file)
    assert _file(tmp_path) == {}
    assert [worker.behind for worker in workers] == [0, 0]


async def test_a_suspension_no_worker_took_is_not_handed_to_the_one_that_missed_it(tmp_path: Path) -> None:
    supervisor = _supervisor(tmp_path)
    workers = [_Worker(0), _Worker(1)]
    supervisor.workers = workers  # type: ignore[assignment]
    workers[0].answer, workers[1].answer = "away", "refuses"
    status, answer = await _write(supervisor, "POST", "/api/v1/admin/suspend", {"domain": "a.test"})
    assert status == 503 and answer["answers"]["error"] == "unknown token", answer
    assert _file(tmp_path) == {}  # before: kept, and handed to worker 0 once it answered
    assert workers[0].behind == 0


async def test_a_resume_every_worker_refuses_leaves_the_suspension_in_force(tmp_path: Path) -> None:
    supervisor = _supervisor(tmp_path)
    workers = [_Worker(0), _Worker(1)]
    supervisor.workers = workers  # type: ignore[assignment]
    status, answer = await _write(supervisor, "POST", "/api/v1/admin/suspend", {"domain": "a.test"})
    assert status == 200, answer
    rule_id = answer["rule"]["id"]
    seen: list[dict[str, Any]] = []
    for worker in workers:
        worker.answer = "refuses"
    workers[1].before_answer = lambda: seen.append(_file(tmp_path))
    status, answer = await _write(supervisor, "DELETE", f"/api/v1/admin/suspend/{rule_id}")
    assert status == 401, answer
    # Ended in the file while the workers were asked (a worker starting then does not take it),
    # and in force again once none carried it out: every worker is handed the rules again.
    assert seen == [{rule_id: "ended"}]
    assert _file(tmp_path) == {rule_id: "in force"}
    assert all(worker.behind for worker in workers)


async def test_a_worker_that_stored_a_bounce_after_its_cancel_is_handed_the_end(tmp_path: Path) -> None:
    supervisor = _supervisor(tmp_path)
    workers = [_Worker(0), _Worker(1)]
    supervisor.workers = workers  # type: ignore[assignment]
    rule_id = "0123456789ab"  # the client's own id: it can cancel before the bounce is answered
    workers[1].make_gate = asyncio.Event()
    body = {"domain": "a.test", "duration": "1h", "id": rule_id}
    bouncing = asyncio.create_task(_write(supervisor, "POST", "/api/v1/admin/bounce", body))
    await asyncio.sleep(0.01)  # worker 0 holds the bounce; worker 1 is still storing it
    status, answer = await _write(supervisor, "DELETE", f"/api/v1/admin/bounce/{rule_id}")
    assert status == 200, answer
    workers[1].make_gate.set()  # worker 1 stored it after it carried out the cancel (404 there)
    status, answer = await bouncing
    assert status == 200, answer
    assert _file(tmp_path) == {rule_id: "ended"}
    # Worker 1 holds a standing bounce the node ended, and answered both writes: nothing was
    # missed, so (before) nothing handed it the end, and it bounced mail until the hour was over.
    assert workers[1].behind
    await supervisor._hand_rules(workers[1])
    handed = decode(workers[1].handed[0])
    assert rule_id in handed.ended and rule_id not in handed.in_force
    # The bounce was write 1, the cancel write 2: worker 1 noted both, and `Admin.adopt` ends a
    # rule unless a write newer than the one behind the tombstone has reached it.
    assert handed.changed[rule_id] == 2
    assert workers[1].behind == 0
    assert not supervisor._writing and not supervisor._overlapped


async def test_an_end_the_node_cannot_keep_is_refused_and_asked_of_no_worker(tmp_path: Path) -> None:
    supervisor = _supervisor(tmp_path)
    workers = [_Worker(0), _Worker(1)]
    supervisor.workers = workers  # type: ignore[assignment]
    status, answer = await _write(supervisor, "POST", "/api/v1/admin/suspend", {"domain": "a.test"})
    assert status == 200, answer
    rule_id = answer["rule"]["id"]
    assert _file(tmp_path) == {rule_id: "in force"}
    asked: list[int] = []
    for worker in workers:
        worker.before_answer = lambda index=worker.index: asked.append(index)
    # The file cannot be written (a full disk, say): its temporary name is taken by a directory.
    (tmp_path / "spool" / f"{RULES_FILE}.tmp").mkdir()
    with pytest.raises(web.HTTPServiceUnavailable) as refusal:
        await _write(supervisor, "DELETE", f"/api/v1/admin/suspend/{rule_id}")
    assert "nothing was ended" in str(refusal.value.text)
    assert asked == []  # no worker ended it: none holds what the file would give back
    (tmp_path / "spool" / f"{RULES_FILE}.tmp").rmdir()
    status, answer = await _write(supervisor, "DELETE", f"/api/v1/admin/suspend/{rule_id}")
    assert status == 200, answer
    assert _file(tmp_path) == {rule_id: "ended"}
