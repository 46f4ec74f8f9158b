"""A worker the supervisor cannot ask (restarting: its control socket missing, or nobody at
it) is named with a plain reason, in the API's answer, in the CLI's message and in `pigeon
top`: no Python repr of aiohttp's error (an outside tester saw `could not be asked
(UnixClientConnectorError(ConnectionKey(host='worker', ...`, and top cut it mid-word)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from pigeon.cli.api import TEMPFAIL, fail
from pigeon.cli.top import _screen
from pigeon.config.load import load
from pigeon.node.supervisor import Supervisor, Worker


class _Answering:
    index = 0

    async def forward(self, request: web.Request, body: bytes, **_: Any) -> web.Response:
        return web.json_response({"scheduled": [], "ready": []})

    async def close(self) -> None:
        pass


async def _ask_queues(control: Path) -> tuple[int, Any]:
    supervisor = Supervisor(load(None), None, 2)
    worker = Worker(1, control)
    supervisor.workers = [_Answering(), worker]  # type: ignore[list-item]
    try:
        return await supervisor._to_workers(make_mocked_request("GET", "/api/v1/queues"), b"")
    finally:
        await worker.close()


async def test_a_worker_whose_control_socket_is_missing_is_said_to_be_restarting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, answer = await _ask_queues(tmp_path / "worker-1.sock")
    assert status == 503
    why = "could not be asked: it is restarting (its control socket is missing)"
    assert answer["missing"] == [{"worker": 1, "error": why}]
    assert fail(status, answer) == TEMPFAIL
    assert f"pigeon: worker 1 did not answer: {why}\n" in capsys.readouterr().err


async def test_a_worker_not_listening_on_its_control_socket_is_said_to_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    control = tmp_path / "worker-1.sock"
    with socket.socket(socket.AF_UNIX) as bound:  # bound, never listening: ECONNREFUSED
        bound.bind(str(control))
        status, answer = await _ask_queues(control)
    assert status == 503
    assert answer["missing"] == [{"worker": 1, "error": "could not be asked: connection refused; it may be restarting"}]


async def test_top_wraps_the_missing_workers_reason_at_a_word(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, answer = await _ask_queues(tmp_path / "worker-1.sock")
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setenv("LINES", "30")
    shown = {
        "url": "http://127.0.0.1:8025",
        "time": time.time(),
        "rates": {"received": 0.0},
        "smtp_connections": {"in": 0, "out": 0},
        "spool_messages": 0,
        "queues": {**answer["answers"], "missing": answer["missing"]},
    }
    screen = _screen(shown)
    assert all(len(line) <= 60 for line in screen.splitlines())
    said = " ".join(line.strip() for line in screen.splitlines() if line.startswith(("queues of", "  ")))
    assert said == (
        "queues of the other workers only, not every worker answered (worker 1: could not be asked: "
        "it is restarting (its control socket is missing))"
    )
