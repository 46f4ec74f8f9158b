"""The application side of inbound tests: a webhook receiver that counts what it was given.

It runs its own event loop in a thread, so a test can drive Pigeon processes synchronously
while the receiver answers. It can be told to fail (answer 500) until a given time, to show
that a failing application loses nothing.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any

from aiohttp import web

from tests.support.process import free_port


class WebhookApp:
    """POSTs to http://127.0.0.1:<port>/inbound are recorded by their X-Pigeon-Dedupe-Key."""

    def __init__(self, *, status: int = 200) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/inbound"
        self.status = status
        self.fail_until = 0.0  # answer 500 until this time.time()
        self.delay = 0.0  # seconds each request takes
        self.accepted: collections.Counter[str] = collections.Counter()  # dedupe key: times accepted
        self.refused = 0
        self.bodies: dict[str, bytes] = {}
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> WebhookApp:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("webhook app did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/inbound", self._receive)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    async def _receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.delay:
            await asyncio.sleep(self.delay)
        key = request.headers.get("X-Pigeon-Dedupe-Key", "")
        with self._lock:
            self.headers.append(dict(request.headers))
            if time.time() < self.fail_until or not 200 <= self.status < 300:
                self.refused += 1
                return web.Response(status=500 if time.time() < self.fail_until else self.status, text="no")
            self.accepted[key] += 1
            self.bodies[key] = body
        return web.Response(status=202, text="ok")

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"accepted": sum(self.accepted.values()), "distinct": len(self.accepted), "refused": self.refused}

    def wait_distinct(self, count: int, timeout: float) -> int:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self._lock:
                if len(self.accepted) >= count:
                    return len(self.accepted)
            time.sleep(0.1)
        with self._lock:
            return len(self.accepted)
