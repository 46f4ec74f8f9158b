"""Retry, backoff and expiry on a clock the test turns: hours of schedule in a second or two.

The node runs in this process with every part that reads the time (intake, scheduler,
settlement, dispatcher) on one `FakeClock`; the network, the spool and the logs are real.
"""

from __future__ import annotations

import asyncio
import itertools
import smtplib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from pigeon.config.load import load
from pigeon.logs.reader import read_records
from pigeon.node.node import Node
from tests.support.process import free_port, to_toml
from tests.support.sinks import ScriptedSink

MESSAGE = b"From: <sender@example.org>\r\nSubject: backoff\r\n\r\nHello.\r\n"
MINUTE = 60.0
HOUR = 3600.0


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class Harness:
    """A node on a fake clock, and what a test needs to drive and observe it."""

    def __init__(self, root: Path, sink: ScriptedSink, **delivery: Any) -> None:
        self.root = root
        self.clock = FakeClock()
        self.smtp_port = free_port()
        settings: dict[str, Any] = {"enabled": True, "idle_timeout": "1s"}
        settings.update(delivery)
        config = {
            "node": {"name": "clock", "workers": 1},
            "smtp": {"listen": [f"127.0.0.1:{self.smtp_port}"], "hostname": "mx.pigeon.test"},
            "http": {"listen": f"127.0.0.1:{free_port()}"},
            "spool": {"path": "spool"},
            "log": {"path": "log"},
            "delivery": settings,
            "dns": {"nameservers": ["127.0.0.1:9"], "timeout": "1s"},
            "route": [{"domain": "*", "next_hop": sink.endpoint, "tls": "disabled"}],
        }
        root.mkdir(parents=True, exist_ok=True)
        (root / "pigeon.toml").write_text(to_toml(config))
        self.node: Node | None = None

    async def start(self) -> None:
        self.node = Node(load(self.root / "pigeon.toml"), clock=self.clock)
        await self.node.start()

    async def stop(self) -> None:
        if self.node is not None:
            await self.node.stop()
            self.node = None

    async def send(self, recipients: list[str], sender: str = "sender@example.org") -> None:
        def send() -> None:
            with smtplib.SMTP("127.0.0.1", self.smtp_port) as client:
                assert client.sendmail(sender, recipients, MESSAGE) == {}

        await asyncio.to_thread(send)

    async def advance_to(self, when: float) -> None:
        """Turn the clock to `when` and let the scheduler see it at once."""
        assert when >= self.clock.now
        self.clock.now = when
        assert self.node is not None and self.node.outbound is not None
        self.node.outbound.scheduler.wake()
        await asyncio.sleep(0)

    def records(self, kind: str) -> list[dict[str, Any]]:
        if self.node is not None:
            self.node.log.flush()
        return [r for r in read_records(self.root / "log") if r["type"] == kind]

    async def wait_for(self, kind: str, count: int, within: float = 10.0) -> list[dict[str, Any]]:
        return await _wait(lambda: len(self.records(kind)) >= count and self.records(kind), within)


async def _wait(predicate: Callable[[], Any], within: float = 10.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {within}s")


def _settled_beyond(pigeon: Harness, transients: int) -> Callable[[], Any]:
    """True once the message expired or failed once more than `transients` times."""
    return lambda: pigeon.records("Expiration") or len(pigeon.records("TransientFailure")) > transients


@pytest.fixture
async def sink() -> AsyncIterator[ScriptedSink]:
    sink = ScriptedSink(flaky=2)
    yield sink
    sink.stop()


async def test_a_deferred_recipient_is_retried_on_the_backoff_schedule_until_delivered(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    pigeon = Harness(tmp_path, sink, retry_interval="10m", max_retry_interval="1h", max_age="1d")
    await pigeon.start()
    try:
        sent_at = pigeon.clock.now
        await pigeon.send(["flaky@example.net"])
        (first,) = await pigeon.wait_for("TransientFailure", 1)
        assert first["attempt"] == 1 and first["response"]["code"] == 451
        # 10 minutes, give or take the 10% jitter that keeps a queue from retrying in lockstep.
        assert 9 * MINUTE <= first["next_attempt"] - sent_at <= 11 * MINUTE

        # Nothing happens before the retry is due, however often the scheduler looks.
        await pigeon.advance_to(first["next_attempt"] - 1)
        await asyncio.sleep(0.5)
        assert sink.rcpt_log == ["flaky@example.net"]

        await pigeon.advance_to(first["next_attempt"])
        second = (await pigeon.wait_for("TransientFailure", 2))[1]
        assert second["attempt"] == 2
        assert 18 * MINUTE <= second["next_attempt"] - pigeon.clock.now <= 22 * MINUTE  # doubled

        await pigeon.advance_to(second["next_attempt"])
        (delivery,) = await pigeon.wait_for("Delivery", 1)
        assert delivery["attempt"] == 3 and delivery["recipient"] == "flaky@example.net"
        assert [r.recipients for r in sink.received] == [["flaky@example.net"]]
        assert pigeon.records("Expiration") == [] and pigeon.records("Bounce") == []
    finally:
        await pigeon.stop()


async def test_a_recipient_that_never_gets_through_expires_at_max_age_with_a_dsn(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    pigeon = Harness(tmp_path, sink, retry_interval="10m", max_retry_interval="30m", max_age="2h")
    await pigeon.start()
    try:
        sent_at = pigeon.clock.now
        await pigeon.send(["tempfail@example.net"])
        transients: list[dict[str, Any]] = []
        while not pigeon.records("Expiration"):
            transients = await pigeon.wait_for("TransientFailure", len(transients) + 1)
            due = transients[-1]["next_attempt"]
            assert due <= sent_at + 2 * HOUR  # a retry is never planned past max_age
            await pigeon.advance_to(due)
            await _wait(_settled_beyond(pigeon, len(transients)))

        (expiration,) = await pigeon.wait_for("Expiration", 1)
        assert expiration["recipient"] == "tempfail@example.net"
        assert expiration["response"]["code"] == 554
        assert "not delivered within 2 hours" in expiration["response"]["text"]  # (max_age, in words)
        assert "451" in expiration["response"]["text"]  # the last reason is kept for the sender
        delays = [b["next_attempt"] - a["next_attempt"] for a, b in itertools.pairwise(transients)]
        assert delays and all(d <= 33 * MINUTE for d in delays)  # capped at max_retry_interval
        assert pigeon.clock.now >= sent_at + 2 * HOUR * 0.9

        # The sender hears about it: a multipart/report from the mailer daemon.
        (dsn,) = await _wait(lambda: [r for r in sink.received if r.recipients == ["sender@example.org"]])
        assert dsn.sender == "<>"  # the null sender, as aiosmtpd records it
        assert dsn.email.get_content_type() == "multipart/report"
        assert b"Action: failed" in dsn.data and b"tempfail@example.net" in dsn.data
        # The expiry's Status, and the server's last reply as the server's (Postfix's form):
        # a parser reads the remote status there.
        assert b"Status: 5.4.7\r\n" in dsn.data and b"Remote-MTA: dns; [127.0.0.1]\r\n" in dsn.data
        assert b"Diagnostic-Code: smtp; 451 4.3.0 try again later\r\n" in dsn.data
    finally:
        await pigeon.stop()


async def test_a_message_waiting_in_a_ready_queue_expires_there(tmp_path: Path) -> None:
    sink = ScriptedSink(slow=2.0)
    pigeon = Harness(tmp_path, sink, connection_limit=1, max_age="1h", dsn=False)
    await pigeon.start()
    try:
        sent_at = pigeon.clock.now
        await pigeon.send(["slow@example.net"])  # holds the only connection for two seconds
        await _wait(lambda: sink.rcpt_log == ["slow@example.net"])
        await pigeon.send(["ok@example.net"])  # waits behind it, ready
        await pigeon.advance_to(sent_at + HOUR + 1)
        (expiration,) = await pigeon.wait_for("Expiration", 1, within=1.5)
        assert expiration["recipient"] == "ok@example.net" and expiration["attempt"] == 0
        # The attempt already on the wire finishes: max_age stops new attempts, not old ones.
        (delivery,) = await pigeon.wait_for("Delivery", 1)
        assert delivery["recipient"] == "slow@example.net"
        assert [r.recipients for r in sink.received] == [["slow@example.net"]]
    finally:
        await pigeon.stop()
        sink.stop()


async def test_a_restart_resumes_the_schedule_where_it_was(tmp_path: Path, sink: ScriptedSink) -> None:
    pigeon = Harness(tmp_path, sink, retry_interval="1h", max_retry_interval="4h", max_age="1d")
    await pigeon.start()
    try:
        await pigeon.send(["flaky@example.net"])
        (first,) = await pigeon.wait_for("TransientFailure", 1)
    finally:
        await pigeon.stop()

    await pigeon.start()  # a new node on the same spool, same clock
    try:
        await pigeon.advance_to(first["next_attempt"] - 60)
        await asyncio.sleep(0.5)
        assert len(sink.rcpt_log) == 1  # not retried early just because the node restarted
        await pigeon.advance_to(first["next_attempt"])
        second = (await pigeon.wait_for("TransientFailure", 2))[1]
        assert second["attempt"] == 2  # the count of attempts survived the restart
        assert 1.8 * HOUR <= second["next_attempt"] - pigeon.clock.now <= 2.2 * HOUR
    finally:
        await pigeon.stop()
