"""What a worker missed while its node was away, as it starts (`Broadcast.join`): the writes by
id (a bounce or a hold of a message it may hold) are applied before it delivers anything, within
a bounded start, their lateness judged as of the node's return; the walks of the spool (a bulk
bounce, retry or rebind, a rule's entry) run after the start, as `consume` reads on."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pigeon.config.load import load
from pigeon.node import broadcast as broadcast_module
from pigeon.node.broadcast import Broadcast
from pigeon.queue.rules import Rule
from tests.support.services import RedisServer

STREAM = "pigeon:admin:stream"
HOLD = "/api/v1/admin/hold"
RETRY = "/api/v1/admin/retry"


def _worker(tmp_path: Path, redis_server: RedisServer) -> Broadcast:
    config = tmp_path / "pigeon.toml"
    config.write_text(f'[spool]\npath = "{tmp_path / "spool"}"\n[redis]\nurl = "{redis_server.url}"\ntimeout = "1s"\n')
    (tmp_path / "spool").mkdir(exist_ok=True)
    return Broadcast(load(config), worker=0, workers=1)


async def _adopt(rules: list[Rule], ended: dict[str, str]) -> tuple[list[Rule], list[Rule]]:
    return [], []


def _entry(client: Any, path: str, body: dict[str, Any], issued: float, op: str) -> None:
    """An entry another node (b) appended: a write issued through it at `issued`."""
    client.xadd(
        STREAM,
        {
            "origin": "other-node",
            "node": "b",
            "method": "POST",
            "path": path,
            "body": json.dumps(body),
            "operator": "ops",
            "time": repr(issued),
            "op": op,
        },
    )


def _hold(n: int) -> dict[str, Any]:
    return {"messages": [f"{n:016x}"], "reason": "r"}


async def _consume_until(worker: Broadcast, apply: Any, done: Callable[[], bool]) -> None:
    """Run the worker's `consume` (as its node does once it started) until `done`."""
    task = asyncio.create_task(worker.consume(apply, _adopt))
    try:
        for _ in range(100):
            if done():
                return
            await asyncio.sleep(0.05)
        raise AssertionError("consume did not get there in 5 s")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_hold_by_id_after_a_long_one_is_applied_at_start_its_age_counted_to_the_node_s_return(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reviewer: node a was away; through b, a bounce of many ids, then `hold --id X` (30 s before
    # a came back). Applying the bounce at a's start took 280 s of a throttled spool: the hold was
    # then 310 s old, past [redis] late_operations (300 s), and skipped ("past 300s"): X went out.
    client = redis_server.client()
    worker = _worker(tmp_path, redis_server)
    worker._save_cursor("0-0")
    now = time.time()
    clock = [now]
    monkeypatch.setattr(broadcast_module.time, "time", lambda: clock[0])
    _entry(
        client, "/api/v1/admin/bounce", {"messages": [f"{n:016x}" for n in range(1000)], "reason": "r"}, now - 60, "1"
    )
    _entry(client, HOLD, _hold(7), now - 30, "2")
    applied: list[str] = []

    async def apply(method: str, path: str, body: bytes, operator: str, issued: float) -> tuple[int, Any]:
        applied.append(path)
        if path.endswith("/bounce"):
            clock[0] += 280
        return 200, {}

    try:
        assert await worker.join(_adopt, apply)
    finally:
        client.close()
        await worker.close()
    assert applied == ["/api/v1/admin/bounce", HOLD]


async def test_a_walk_missed_runs_after_the_start_and_a_hold_by_id_issued_after_it_is_applied_before(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A retry of every domain issued while a was away walks the whole spool: not during a's start
    # (SMTP, /healthz and READY=1 wait for it), but after, as `consume` reads on. The hold by id
    # issued after it is applied before a delivers; the later bulk retry is not skipped as late
    # for the time the first walk took (its age is counted to a's return too).
    client = redis_server.client()
    worker = _worker(tmp_path, redis_server)
    worker._save_cursor("0-0")
    now = time.time()
    clock = [now]
    monkeypatch.setattr(broadcast_module.time, "time", lambda: clock[0])
    _entry(client, RETRY, {"domain": "*"}, now - 60, "1")
    _entry(client, HOLD, _hold(7), now - 30, "2")
    _entry(client, RETRY, {"domain": "d1.test"}, now - 20, "3")
    applied: list[tuple[str, bytes]] = []

    async def apply(method: str, path: str, body: bytes, operator: str, issued: float) -> tuple[int, Any]:
        applied.append((path, body))
        if body == b'{"domain": "*"}':
            clock[0] += 290  # a throttled walk of a large spool
        return 200, {}

    try:
        assert await worker.join(_adopt, apply)
        assert [path for path, _ in applied] == [HOLD]  # before the node delivers; the retries after
        await _consume_until(worker, apply, lambda: len(applied) == 3)
        assert [path for path, _ in applied] == [HOLD, RETRY, RETRY], applied  # the hold once
        # A worker that stops now and starts again applies nothing twice: it reads on from the last.
        again = _worker(tmp_path, redis_server)
        try:
            assert await again.join(_adopt, apply)
            await _consume_until(again, apply, lambda: again._cursor is not None)
            await asyncio.sleep(0.3)
        finally:
            await again.close()
        assert len(applied) == 3, applied
    finally:
        client.close()
        await worker.close()


async def test_a_worker_stopped_before_its_walks_ran_applies_them_when_it_starts_again_and_not_the_hold_twice(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    # Stopped (or killed) after its start, before `consume` applied the walk held back: the next
    # start finds the walk still to apply, and does not apply the hold by id after it again (it
    # would undo a `retry --id` issued through this very node meanwhile).
    client = redis_server.client()
    worker = _worker(tmp_path, redis_server)
    worker._save_cursor("0-0")
    _entry(client, RETRY, {"domain": "*"}, time.time() - 10, "1")
    _entry(client, HOLD, _hold(7), time.time() - 5, "2")
    applied: list[str] = []

    async def apply(method: str, path: str, body: bytes, operator: str, issued: float) -> tuple[int, Any]:
        applied.append(path)
        return 200, {}

    try:
        assert await worker.join(_adopt, apply)
    finally:
        await worker.close()
    assert applied == [HOLD]
    again = _worker(tmp_path, redis_server)
    try:
        assert await again.join(_adopt, apply)
        assert applied == [HOLD]
        await _consume_until(again, apply, lambda: len(applied) == 2)
        await asyncio.sleep(0.3)
    finally:
        client.close()
        await again.close()
    assert applied == [HOLD, RETRY]


async def test_a_start_with_redis_hanging_after_the_read_stays_within_its_bound_and_answers_after(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    # A reviewer: five holds by id missed, Redis stopped (SIGSTOP) after the read: each answer
    # pushed to Redis took [redis] timeout (1 s), and the start 5.1 s, past its own bound (3 s),
    # with neither SMTP nor /healthz up meanwhile. Nobody waits for an answer during the start:
    # the answers (to writes within late_operations: the origin keeps those for it) go once it runs.
    client = redis_server.client()
    worker = _worker(tmp_path, redis_server)
    worker._save_cursor("0-0")
    for n in range(5):
        _entry(client, HOLD, _hold(n), time.time() - 10, str(n))
    # Its origin stopped waiting 30 s after, but keeps it for this node until it answers (within late_operations).
    _entry(client, HOLD, _hold(5), time.time() - 60, "old")
    assert redis_server.process is not None
    pid = redis_server.process.pid
    applied: list[str] = []

    async def apply(method: str, path: str, body: bytes, operator: str, issued: float) -> tuple[int, Any]:
        if not applied:
            os.kill(pid, signal.SIGSTOP)
        applied.append(path)
        return 200, {}

    started = time.monotonic()
    try:
        try:
            assert await worker.join(_adopt, apply)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert time.monotonic() - started < 2.0
        assert len(applied) == 6
        await _consume_until(worker, apply, lambda: client.exists("pigeon:admin:answers:4") == 1)
        for n in range(5):
            [reply] = client.lrange(f"pigeon:admin:answers:{n}", 0, -1)
            assert json.loads(reply) == {"node": worker.node, "worker": 0, "status": 200, "answer": {}}
        assert client.exists("pigeon:admin:answers:old")
    finally:
        client.close()
        await worker.close()


async def test_a_start_that_cannot_read_what_was_issued_meanwhile_says_delivery_may_come_first(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis_server.client()
    worker = _worker(tmp_path, redis_server)
    worker._save_cursor("0-0")
    _entry(client, HOLD, _hold(7), time.time() - 5, "1")
    client.close()
    redis_server.stop()

    async def apply(method: str, path: str, body: bytes, operator: str, issued: float) -> tuple[int, Any]:
        raise AssertionError("nothing is read")

    try:
        with caplog.at_level(logging.WARNING, logger="pigeon.node.broadcast"):
            assert not await worker.join(_adopt, apply)
    finally:
        await worker.close()
    [said] = [record for record in caplog.records if "could not be read" in record.getMessage()]
    assert said.levelno == logging.WARNING
    assert "a bounce or a hold by id issued through another node while this node was away" in said.getMessage()
    assert "may deliver the messages it names first" in said.getMessage()
