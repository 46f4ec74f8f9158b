"""Mail an `[[inbound]]` route took over SMTP and hands to a webhook: each call's outcome is
recorded as soon as the call answers, not once the slowest call beside it does, so a kill -9
makes again only what was on the wire.

Found from outside: a webhook's batch (its concurrency, 16) was recorded once all of its calls
had answered, and the node runs several batches at once, sharing the webhook's 16 request
slots: answered calls of many batches waited unrecorded behind one slow call each (p90 1.4 to
2.95 s from a 200 to its `Delivery` record), and one kill -9 made 66 to 102 calls again where
at most 16 were ever in flight, most of them answered before the kill.
"""

from __future__ import annotations

import asyncio
import collections
import smtplib
import time
from pathlib import Path

from aiohttp import web

from tests.support.apps import WebhookApp, customer_mail, webhook_target
from tests.support.process import PigeonProcess, to_toml
from tests.support.sinks import wait_until


class HoldsTheFirstCall(WebhookApp):
    """Answers 200 at once, but for the first call it gets, which waits until `release()`
    (a call for the same message later, after a restart, is answered at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.received: collections.Counter[str] = collections.Counter()  # dedupe key: calls
        self.held: str | None = None  # the dedupe key of the call held
        self._go_on: asyncio.Event | None = None

    async def _receive(self, request: web.Request) -> web.Response:
        await request.read()
        key = request.headers["X-Pigeon-Dedupe-Key"]
        with self._lock:
            self.received[key] += 1
            hold = self.held is None
            if hold:
                self.held = key
                self._go_on = asyncio.Event()
        if hold and self._go_on is not None:
            await self._go_on.wait()
        return web.Response(status=200, text="ok")

    def let_go(self) -> None:
        if self._go_on is not None:
            self._loop.call_soon_threadsafe(self._go_on.set)

    def calls(self) -> collections.Counter[str]:
        with self._lock:
            return collections.Counter(self.received)


def test_calls_answered_beside_a_held_one_are_recorded_and_a_kill_makes_only_the_held_one_again(
    tmp_path: Path,
) -> None:
    messages = 48  # three batches of the webhook's concurrency (16)
    with HoldsTheFirstCall() as app:
        node = PigeonProcess(
            tmp_path / "p",
            delivery={"enabled": False, "retry_interval": "200ms"},
            target=[webhook_target(app)],
            inbound=[{"recipient": "support@app.example", "target": "hook"}],
        )
        try:
            # Spooled while the node does not deliver, so that all of it is ready at once when
            # it does: full batches, one of which has the held call.
            with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
                for n in range(messages):
                    client.sendmail("customer@example.com", ["support@app.example"], customer_mail(n))
            assert len(node.spool_messages()) == messages
            node.config["delivery"]["enabled"] = True
            node.config_path.write_text(to_toml(node.config))
            node.start()
            wait_until(lambda: len(app.calls()) == messages, 60)  # every call made, all but one answered
            deadline = time.monotonic() + 10
            while len(node.records("Delivery")) < messages - 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            recorded = len(node.records("Delivery"))
            node.kill()  # kill -9, the held call still on the wire

            node.start()
            held = app.held
            assert held is not None
            wait_until(lambda: app.calls()[held] == 2, 30)
            wait_until(lambda: node.spool_messages() == [], 30)
            node.wait_records("Delivery", messages)
            node.stop()
        finally:
            app.let_go()
            node.kill()
    calls = app.calls()
    again = sorted(key for key, count in calls.items() if count > 1)
    assert (recorded, again) == (messages - 1, [held]), (
        f"{recorded} of the {messages - 1} answered calls recorded before the kill; "
        f"{len(again)} calls made again after it, not only the one held"
    )
    assert len(calls) == messages
    assert sorted(d["recipient"] for d in node.records("Delivery")) == ["support@app.example"] * messages
