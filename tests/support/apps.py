"""The application side of inbound tests: HTTP services that run their own event loop in a
thread (so a test can drive Pigeon processes synchronously while they answer), and the
configuration pieces inbound tests share.

`WebhookApp` counts what it accepted by dedupe key (and when, and from which node, for
tests that time a takeover), and can be told to fail (answer 500) until a given time or to
answer slowly, to show that a failing application loses nothing.
"""

from __future__ import annotations

import asyncio
import collections
import json
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tests.support.process import PigeonProcess, free_port

if TYPE_CHECKING:
    from tests.support.services import Dovecot, RedisServer


class ThreadedApp:
    """An aiohttp application on 127.0.0.1:<port> in a thread of its own. Subclasses add
    their routes in `routes()`; `_lock` guards what they record. `tls`: served over HTTPS
    with this server context (`private_ca`)."""

    def __init__(self, *, tls: ssl.SSLContext | None = None) -> None:
        self.port = free_port()
        self.tls = tls
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{type(self).__name__} did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        self.routes(app)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=self.tls).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())


class WebhookApp(ThreadedApp):
    """POSTs to http://127.0.0.1:<port>/inbound (https:// with `tls`) are recorded by their
    X-Pigeon-Dedupe-Key."""

    def __init__(self, *, status: int = 200, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(tls=tls)
        self.url = f"{'https' if tls is not None else 'http'}://127.0.0.1:{self.port}/inbound"
        self.status = status
        self.fail_until = 0.0  # answer 500 until this time.time()
        # Answer 500 for this many seconds from the first request: an outage the client must meet,
        # however long it takes to start.
        self.fail_for = 0.0
        self.delay = 0.0  # seconds each request takes
        self.node_delay: dict[str, float] = {}  # X-Test-Node: seconds its requests take instead
        self._holds: dict[str, asyncio.Event] = {}  # X-Test-Node: set when its requests may go on
        self.refuse: Callable[[bytes], bool] = lambda body: False  # answer 503 to these bodies
        # The answers (status, headers) to the next requests, first first; then as above.
        self.answers: list[tuple[int, dict[str, str]]] = []
        self.requests: list[float] = []  # time.time() each request came
        self.started = 0  # requests received, answered or not (held, slow)
        self.accepted: collections.Counter[str] = collections.Counter()  # dedupe key: times accepted
        self.refused = 0
        self.bodies: dict[str, bytes] = {}
        self.headers: list[dict[str, str]] = []
        # Each accepted request: (time.time() when accepted, dedupe key, its X-Test-Node header).
        self.arrivals: list[tuple[float, str, str]] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/inbound", self._receive)

    async def _receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        with self._lock:
            self.started += 1
        node = request.headers.get("X-Test-Node", "")
        hold = self._holds.get(node)
        if hold is not None:
            await hold.wait()
        delay = self.node_delay.get(node, self.delay)
        if delay:
            await asyncio.sleep(delay)
        key = request.headers.get("X-Pigeon-Dedupe-Key", "")
        with self._lock:
            self.headers.append(dict(request.headers))
            self.requests.append(time.time())
            if self.answers:
                status, headers = self.answers.pop(0)
                self.refused += 1
                return web.Response(status=status, headers=headers, text="not now")
            if self.fail_for:
                self.fail_until, self.fail_for = time.time() + self.fail_for, 0.0
            if self.refuse(body):
                self.refused += 1
                return web.Response(status=503, text="not now")
            if time.time() < self.fail_until or not 200 <= self.status < 300:
                self.refused += 1
                return web.Response(status=500 if time.time() < self.fail_until else self.status, text="no")
            self.accepted[key] += 1
            self.bodies[key] = body
            self.arrivals.append((time.time(), key, node))
        return web.Response(status=202, text="ok")

    def hold(self, node: str) -> None:
        """Requests from `node` (X-Test-Node) wait, unanswered, until `release(node)`."""
        self._holds[node] = asyncio.Event()

    def release(self, node: str) -> None:
        hold = self._holds.pop(node, None)
        if hold is not None:
            self._loop.call_soon_threadsafe(hold.set)

    def first_arrivals(self) -> dict[str, float]:
        """When each dedupe key was first accepted."""
        with self._lock:
            first: dict[str, float] = {}
            for at, key, _ in self.arrivals:
                first.setdefault(key, at)
            return first

    def accepted_from(self, node: str) -> int:
        """How many requests carrying `X-Test-Node: <node>` were accepted."""
        with self._lock:
            return sum(1 for _, _, sender in self.arrivals if sender == node)

    def wait_distinct(self, count: int, timeout: float) -> int:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self._lock:
                if len(self.accepted) >= count:
                    return len(self.accepted)
            time.sleep(0.1)
        with self._lock:
            return len(self.accepted)


def private_ca(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA of the test's own, no system trusts: (its PEM file in `directory`, a server
    context holding a certificate it issued for 127.0.0.1), for `ThreadedApp`'s `tls`."""
    import trustme

    ca = trustme.CA()
    directory.mkdir(parents=True, exist_ok=True)
    ca_pem = directory / "private-ca.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    return ca_pem, server


def customer_mail(n: int, *, tag: str = "m") -> bytes:
    """A small message from a customer, unique per (n, tag)."""
    return (
        f"From: customer{n}@example.com\r\nTo: support@app.example\r\nMessage-ID: <{tag}{n}@example.com>\r\n"
        f"Subject: question {n}\r\n\r\nHello, this is message {n}.\r\n"
    ).encode()


def imap_mailbox(dovecot: Dovecot, target: str, **options: Any) -> dict[str, Any]:
    """A [[mailbox]] table for the test Dovecot's user app (STARTTLS, its CA trusted)."""
    return {
        "name": "support",
        "host": "127.0.0.1",
        "port": dovecot.port,
        "tls": "starttls",
        "ca_file": str(dovecot.ca_pem_path),
        "username": "app",
        "password": "secret",
        "target": target,
        "poll_interval": "5s",
        **options,
    }


def webhook_target(app: WebhookApp, **options: Any) -> dict[str, Any]:
    """A [[target]] table posting to `app`, retrying quickly."""
    return {"name": "hook", "kind": "webhook", "url": app.url, "retry_interval": "200ms", **options}


def mailbox_health(node: PigeonProcess, name: str = "support") -> dict[str, Any]:
    """A mailbox's state as the node's /healthz reports it."""
    health: dict[str, Any] = json.loads(node.http_get("/healthz")[1])["inbound"][name]
    return health


def mailbox_failure(node: PigeonProcess, name: str = "support") -> str | None:
    """What went wrong with a mailbox, as its /healthz `error` says: None while nothing did, and
    while it only has not worked yet since the node started ("not connected yet ...")."""
    error: str | None = mailbox_health(node, name)["error"]
    return None if error is None or error.startswith(("not connected yet", "connected; not searched yet")) else error


def redis_in_use_for_a_while(redis: RedisServer, prefix: str = "pigeon", *, seconds: float = 3600) -> None:
    """Make a fresh test Redis look like one Pigeon has used for `seconds`: its inbound epoch
    set that long ago. Nodes then claim at once instead of pausing as they must after Redis
    lost its data (for tests that are not about that pause)."""
    client = redis.client()
    try:
        now, micros = client.time()
        key = f"{prefix}:inbound:epoch" if prefix else "inbound:epoch"
        client.set(key, int(now * 1000 + micros // 1000 - seconds * 1000))
    finally:
        client.close()
