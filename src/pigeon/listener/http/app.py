"""The HTTP listener: builds the aiohttp application and serves it on the configured address."""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from pigeon.listener.http import admin
from pigeon.listener.http.body import declared_too_large, too_large
from pigeon.listener.http.context import NODE_KEY, NodeView
from pigeon.listener.http.health import healthz
from pigeon.listener.http.inject import inject
from pigeon.listener.http.metrics import metrics
from pigeon.listener.http.openapi import openapi
from pigeon.listener.http.shaping import effects, end_effect


@web.middleware
async def _json_routing_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """A path or method the router does not know gets a JSON error that says what to do, like
    every other API refusal (aiohttp's own is "405: Method Not Allowed" as plain text)."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as refusal:
        if refusal.content_type == "application/json":
            raise
        allowed = ", ".join(sorted(refusal.allowed_methods))
        message = f"{request.method} is not allowed on {request.path}; use {allowed}"
        raise web.HTTPMethodNotAllowed(
            request.method,
            refusal.allowed_methods,
            text=json.dumps({"error": message}),
            content_type="application/json",
        ) from None
    except web.HTTPNotFound as refusal:
        if refusal.content_type == "application/json":
            raise
        message = f"no endpoint at {request.path}; the API is described at /api/openapi.json"
        raise web.HTTPNotFound(text=json.dumps({"error": message}), content_type="application/json") from None


def _body_limit(max_size: int) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware: a body over `[http] max_request_size` gets a JSON 413 (see `body`)."""

    @web.middleware
    async def limit(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if declared_too_large(request, max_size):
            return too_large(max_size)
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return too_large(max_size)

    return limit


def build_app(node: NodeView) -> web.Application:
    max_size = node.config.http.max_request_size
    app = web.Application(client_max_size=max_size, middlewares=[_body_limit(max_size), _json_routing_errors])
    app[NODE_KEY] = node
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/openapi.json", openapi)
    app.router.add_post("/api/v1/inject", inject)
    app.router.add_post("/api/v1/admin/bounce", admin.write)
    app.router.add_get("/api/v1/admin/bounce", admin.read)
    app.router.add_delete("/api/v1/admin/bounce/{id}", admin.write)
    app.router.add_post("/api/v1/admin/suspend", admin.write)
    app.router.add_get("/api/v1/admin/suspend", admin.read)
    app.router.add_delete("/api/v1/admin/suspend/{id}", admin.write)
    app.router.add_post("/api/v1/admin/retry", admin.write)
    app.router.add_post("/api/v1/admin/rebind", admin.write)
    app.router.add_get("/api/v1/messages/{id}", admin.inspect)
    app.router.add_get("/api/v1/queues", admin.read)
    app.router.add_get("/api/v1/admin/operations", admin.read)
    app.router.add_get("/api/v1/shaping/effects", effects)
    app.router.add_delete("/api/v1/shaping/effects/{id}", end_effect)
    return app


class HttpListener:
    """Runs the application until `stop()`."""

    def __init__(self, node: NodeView) -> None:
        self._runner = web.AppRunner(build_app(node), access_log=None, handle_signals=False)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        return sockets[0].getsockname()[:2] if sockets else (host, port)

    async def serve(self, sockets: list[socket.socket]) -> tuple[str, int]:
        """Serve on listening sockets bound before a privilege drop."""
        await self._runner.setup()
        for sock in sockets:
            await web.SockSite(self._runner, sock).start()
        host, port = sockets[0].getsockname()[:2]
        return host, port

    async def start_unix(self, path: Path) -> None:
        """Serve on a unix socket (a worker's control socket, read by the supervisor)."""
        await self._runner.setup()
        await web.UnixSite(self._runner, str(path)).start()

    async def stop(self) -> None:
        await self._runner.cleanup()
