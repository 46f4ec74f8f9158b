"""`[[log_hook]]`: the log's records reach an application over HTTP, in batches, through a real
node delivering to a real SMTP sink: in order, once its receiver is back, across a `kill -9`
(repeating at most the batch that was on its way), and across segment rotations."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import smtplib
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from pigeon.logs.reader import read_records
from tests.support.ports import free_port
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

OUTCOMES = ("Delivery", "TransientFailure", "Bounce", "Expiration", "AdminBounce", "Held")
SECRET = "hook-secret-for-the-test"
MESSAGE = b"From: <sender@example.org>\r\nSubject: hook\r\n\r\nHello.\r\n"


class Receiver:
    """An aiohttp app on loopback, in a thread of its own: keeps every POST (headers, body, the
    status it answered, None if it never did). `status` is what it answers; `before_answer`,
    if set, is awaited with the request's number (from 1) first."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/events"
        self.status = 200
        self.before_answer: Callable[[int], Awaitable[None]] | None = None
        self.requests: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hook receiver", daemon=True)
        self._thread.start()
        self._runner: web.AppRunner | None = None

    def start(self) -> Receiver:
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/events", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        seen: dict[str, Any] = {"headers": dict(request.headers), "body": body, "status": None}
        self.requests.append(seen)
        if self.before_answer is not None:
            await self.before_answer(len(self.requests))
        seen["status"] = self.status
        return web.Response(status=self.status)

    def stop(self) -> None:
        """Down: nothing listens on its port until `start()` again."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def taken(self) -> list[dict[str, Any]]:
        """The records of the batches it answered 2xx, in the order they came."""
        return [record for r in self.requests if r["status"] == 200 for record in json.loads(r["body"])]

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _node(root: Path, sink: ScriptedSink, receiver: Receiver, **hook: Any) -> PigeonProcess:
    settings = {"name": "app", "url": receiver.url, "batch": 5, "linger": "0.2s", "secret": SECRET,
                "retry_interval": "0.2s", "max_retry_interval": "0.5s", "timeout": "5s"} | hook  # fmt: skip
    sections = delivery_config(sink.endpoint)
    return PigeonProcess(root, tables={"log_hook": [settings]}, **sections)


def _send(pigeon: PigeonProcess, recipients: list[str]) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        for recipient in recipients:
            assert client.sendmail("sender@example.org", [recipient], MESSAGE) == {}


def _logged(pigeon: PigeonProcess) -> list[dict[str, Any]]:
    return [r for r in read_records(pigeon.root / "log") if r["type"] in OUTCOMES]


def _all_sent(pigeon: PigeonProcess, receiver: Receiver, expected: int) -> bool:
    logged = _logged(pigeon)
    return len(logged) >= expected and not pigeon.spool_messages() and len(receiver.taken()) >= len(logged)


def test_delivered_and_bounced_records_reach_the_receiver_in_order_in_signed_batches(tmp_path: Path) -> None:
    with ScriptedSink() as sink, Receiver() as receiver, _node(tmp_path / "node", sink, receiver) as pigeon:
        recipients = [f"ok{n}@example.net" if n % 3 else f"permfail@d{n}.example.net" for n in range(12)]
        _send(pigeon, recipients)
        # 12 outcomes, and a Delivery of each of the 4 bounces' DSN to the sender.
        wait_until(lambda: _all_sent(pigeon, receiver, 16), timeout=30)
        time.sleep(0.5)  # nothing more comes
        logged = _logged(pigeon)
        assert {r["type"] for r in logged} == {"Delivery", "Bounce"}
        assert receiver.taken() == logged  # every outcome, once, in the order logged
        for request in receiver.requests:
            headers, body = request["headers"], request["body"]
            assert 1 <= len(json.loads(body)) <= 5
            assert headers["Content-Type"] == "application/json"
            assert headers["X-Pigeon-Node"] == "test-node" and headers["X-Pigeon-Log-Hook"] == "app"
            assert int(headers["X-Pigeon-Batch-Size"]) == len(json.loads(body))
            stamp, mac = (part.split("=", 1)[1] for part in headers["X-Pigeon-Signature"].split(","))
            expected = hmac.new(SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
            assert hmac.compare_digest(mac, expected)
        assert len({r["headers"]["X-Pigeon-Batch-Id"] for r in receiver.requests}) == len(receiver.requests)
        assert pigeon.metric('pigeon_log_hook_records_sent_total{hook="app"}') == len(logged)
        assert pigeon.metric('pigeon_log_hook_lag_seconds{hook="app"}') == 0


def test_records_logged_while_the_receiver_refuses_or_is_down_all_arrive_once_it_takes_them(tmp_path: Path) -> None:
    with ScriptedSink() as sink, Receiver() as receiver, _node(tmp_path / "node", sink, receiver) as pigeon:
        receiver.status = 400  # a refusal: never skipped, said loudly, sent again
        _send(pigeon, [f"ok{n}@example.net" for n in range(6)])
        wait_until(lambda: len(_logged(pigeon)) == 6)
        wait_until(lambda: len(receiver.requests) >= 3)
        pigeon.wait_stderr("refused")
        assert pigeon.metric('pigeon_log_hook_failing{hook="app"}') == 1
        assert pigeon.metric('pigeon_log_hook_failures_total{hook="app",kind="refused"}') >= 3
        receiver.stop()  # then down altogether, while more mail goes out
        _send(pigeon, [f"ok{n}@example.net" for n in range(6, 12)])
        wait_until(lambda: len(_logged(pigeon)) == 12)
        time.sleep(1.5)
        assert pigeon.metric('pigeon_log_hook_failures_total{hook="app",kind="unavailable"}') >= 1
        assert pigeon.metric('pigeon_log_hook_lag_seconds{hook="app"}') > 1
        assert receiver.taken() == []
        receiver.status = 200
        receiver.start()
        wait_until(lambda: _all_sent(pigeon, receiver, 12), timeout=30)
        time.sleep(0.5)
        assert receiver.taken() == _logged(pigeon)  # nothing lost, nothing twice
        assert pigeon.metric('pigeon_log_hook_failing{hook="app"}') == 0


def test_a_kill_9_mid_stream_loses_nothing_and_repeats_only_the_batch_on_its_way(tmp_path: Path) -> None:
    held, released = threading.Event(), threading.Event()

    async def hold_the_third(number: int) -> None:
        if number == 3:
            held.set()
            # No answer: the node is killed meanwhile. (A threading.Event, set by the test's thread.)
            await asyncio.to_thread(released.wait, 60)
            raise ConnectionResetError("the node that asked is gone")  # (not answered: no status)

    with ScriptedSink() as sink, Receiver() as receiver:
        receiver.before_answer = hold_the_third
        pigeon = _node(tmp_path / "node", sink, receiver)
        with pigeon:
            _send(pigeon, [f"ok{n}@example.net" for n in range(30)])
            assert held.wait(30)
            pigeon.kill()
            receiver.before_answer = None
            released.set()
            pigeon.start()
            wait_until(lambda: _all_sent(pigeon, receiver, 30), timeout=40)
            time.sleep(0.5)
            logged = _logged(pigeon)
        assert len(logged) == 30
        third = receiver.requests[2]
        assert third["status"] is None
        again = [
            r
            for r in receiver.requests[3:]
            if r["headers"]["X-Pigeon-Batch-Id"] == third["headers"]["X-Pigeon-Batch-Id"]
        ]
        assert len(again) == 1 and again[0]["body"] == third["body"]  # the same batch, the same records
        taken = receiver.taken()
        assert taken == logged  # the unanswered batch aside, every record once, in order
        assert "sending again batch" in pigeon.stderr()


def test_records_reach_the_receiver_once_each_while_two_workers_rotate_and_compress_segments(tmp_path: Path) -> None:
    with ScriptedSink() as sink, Receiver() as receiver:
        sections = delivery_config(sink.endpoint)
        hook = {"name": "app", "url": receiver.url, "batch": 7, "linger": "0.1s", "types": ["*"]}
        with PigeonProcess(tmp_path / "node", node={"workers": 2}, log={"max_segment_size": "2KiB"},
                           tables={"log_hook": [hook]}, **sections) as pigeon:  # fmt: skip
            for n in range(60):  # a connection each: both workers take some
                _send(pigeon, [f"ok{n}@example.net"])
            wait_until(lambda: len(_logged(pigeon)) == 60 and not pigeon.spool_messages(), timeout=40)
            everything = lambda: read_records(pigeon.root / "log")  # noqa: E731
            wait_until(lambda: len(receiver.taken()) >= len(everything()), timeout=30)
            time.sleep(0.5)
            logged = everything()
        assert len(list((tmp_path / "node" / "log").glob("*-w0.jsonl.gz"))) >= 2
        assert len(list((tmp_path / "node" / "log").glob("*-w1.jsonl.gz"))) >= 2
        assert len(list((tmp_path / "node" / "log").glob("*.jsonl.gz"))) > 15
        taken = receiver.taken()
        assert sorted(json.dumps(r, sort_keys=True) for r in taken) == sorted(
            json.dumps(r, sort_keys=True) for r in logged
        )
        # Each message's records in the order they were written: its Reception before its Delivery.
        order = [(r["type"], r["id"]) for r in taken if r["type"] in ("Reception", "Delivery")]
        for kind, ident in order:
            if kind == "Delivery":
                assert order.index(("Reception", ident)) < order.index((kind, ident))


def test_a_refusal_after_other_failures_is_said_at_once_as_an_error(tmp_path: Path) -> None:
    """Found from outside: a 400 after a streak of 500s was never logged, as the once-a-minute
    reminder was not due yet; the README promises an ERROR for a refusal."""
    with ScriptedSink() as sink, Receiver() as receiver, _node(tmp_path / "node", sink, receiver) as pigeon:
        receiver.status = 500
        _send(pigeon, ["ok1@example.net"])
        wait_until(lambda: len(receiver.requests) >= 2)
        pigeon.wait_stderr("not taken")
        receiver.status = 400
        pigeon.wait_stderr("refused: ", timeout=10)  # (well before a minute's reminder)
        receiver.status = 200
        wait_until(lambda: _all_sent(pigeon, receiver, 1), timeout=30)


def test_a_worker_that_logged_nothing_before_a_restart_is_no_lost_segment(tmp_path: Path) -> None:
    """Found from outside: with two workers and all mail on one of them, a restart logged an
    ERROR that the other's segment "is gone before all of it was sent": it was empty, and the
    log writer removes a segment it closes empty. Nothing was lost, and nothing is said."""
    with ScriptedSink() as sink, Receiver() as receiver:
        sections = delivery_config(sink.endpoint)
        hook = {"name": "app", "url": receiver.url, "batch": 5, "linger": "0.1s"}
        with PigeonProcess(tmp_path / "node", node={"workers": 2}, tables={"log_hook": [hook]},
                           **sections) as pigeon:  # fmt: skip
            _send(pigeon, [f"ok{n}@example.net" for n in range(4)])  # (one connection: one worker)
            wait_until(lambda: _all_sent(pigeon, receiver, 4), timeout=30)
            time.sleep(1.0)  # (the hook saves its cursor with every writer it knows)
            pigeon.stop()
            pigeon.start()
            _send(pigeon, [f"more{n}@example.net" for n in range(3)])
            wait_until(lambda: _all_sent(pigeon, receiver, 7), timeout=30)
            time.sleep(0.5)
            logged = _logged(pigeon)
            said = pigeon.stderr()
        assert "is gone before all of it was sent" not in said
        assert receiver.taken() == logged and len(logged) == 7
