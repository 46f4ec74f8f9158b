"""The HTTP listener: builds the aiohttp application and serves it on the configured address."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Final

from aiohttp import web

from pigeon.listener.http import admin, cluster, content, listing
from pigeon.listener.http.body import declared_too_large, too_large, transfer_codings
from pigeon.listener.http.connections import ConnectionLimits, GuardedRunner
from pigeon.listener.http.context import NODE_KEY, NodeView
from pigeon.listener.http.errors import JsonErrorsRunner, json_errors
from pigeon.listener.http.health import healthz
from pigeon.listener.http.inject import INJECT_PATH, KUMO_INJECT_PATH, inject
from pigeon.listener.http.kumo import inject_kumo
from pigeon.listener.http.metrics import metrics
from pigeon.listener.http.openapi import openapi
from pigeon.listener.http.shaping import effects, end_effect


def _body_limit(max_size: int) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware: a body over `[http] max_request_size` gets a JSON 413 (see `body`)."""

    @web.middleware
    async def limit(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        # An injection's is refused by its handler, after its token (and logged there).
        if declared_too_large(request, max_size) and request.match_info.handler not in (inject, inject_kumo):
            return too_large(max_size)
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge as refused:
            if refused.content_type == "application/json":  # a handler's own, naming its limit
                raise
            return too_large(max_size)

    return limit


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
API_ROUTES: Final[tuple[tuple[str, str, Handler], ...]] = (
    ("GET", "/api/openapi.json", openapi),
    ("POST", INJECT_PATH, inject),
    ("POST", KUMO_INJECT_PATH, inject_kumo),
    ("POST", "/api/v1/admin/bounce", admin.write),
    ("GET", "/api/v1/admin/bounce", admin.read),
    ("DELETE", "/api/v1/admin/bounce/{id}", admin.write),
    ("POST", "/api/v1/admin/suspend", admin.write),
    ("GET", "/api/v1/admin/suspend", admin.read),
    ("DELETE", "/api/v1/admin/suspend/{id}", admin.write),
    ("POST", "/api/v1/admin/retry", admin.write),
    ("POST", "/api/v1/admin/rebind", admin.write),
    ("POST", "/api/v1/admin/hold", admin.write),
    ("GET", "/api/v1/messages/{id}", admin.inspect),
    ("GET", listing.PATH, listing.list_messages),
    ("GET", "/api/v1/queues", admin.read),
    ("GET", "/api/v1/admin/operations", admin.read),
    ("GET", cluster.NODES_PATH, cluster.nodes),
    ("DELETE", cluster.FORGET_PATH, cluster.forget),
    ("GET", "/api/v1/shaping/effects", effects),
    ("DELETE", "/api/v1/shaping/effects/{id}", end_effect),
    ("GET", content.CONTENT_PATH, content.content),
    ("GET", content.HEADERS_PATH, content.headers),
)
"""The API's paths and methods, each with its handler here."""


def add_api_routes(app: web.Application, passed_on: Handler | None = None) -> None:
    """The API's routes on `app`: to their handlers, or all to `passed_on` (the supervisor's,
    which hands them to the workers). Both fronts so know the same paths and methods, and
    the router answers an unknown one (404, or 405 with `Allow`) before any token is asked for.
    A GET takes HEAD too, answered with the headers the GET would have."""
    for method, path, handler in API_ROUTES:
        if method == "GET":
            app.router.add_get(path, passed_on or handler)
        else:
            app.router.add_route(method, path, passed_on or handler)


def build_app(node: NodeView, internal: Mapping[str, Handler] | None = None) -> web.Application:
    """`internal`: routes (POST path -> handler) of a worker's control socket alone, which only
    its supervisor asks (`pigeon.node.standing`): never on a listener anyone may reach."""
    max_size = node.config.http.max_request_size
    # The JSON errors outermost: the 413 answered within is JSON already.
    app = web.Application(client_max_size=max_size, middlewares=[json_errors, transfer_codings, _body_limit(max_size)])
    app[NODE_KEY] = node
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    add_api_routes(app)
    for path, handler in (internal or {}).items():
        app.router.add_post(path, handler)
    return app


class HttpListener:
    """Runs the application until `stop()`."""

    def __init__(
        self, node: NodeView, internal: Mapping[str, Handler] | None = None, limits: ConnectionLimits | None = None
    ) -> None:
        """`internal`: see `build_app` (given only for a control socket). `limits`: the bounds
        on the connections of a listener anyone may reach (`connections`); none on a control
        socket, where only the supervisor talks."""
        app = build_app(node, internal)
        if limits is None:
            self._runner = JsonErrorsRunner(app, access_log=None, handle_signals=False)
        else:
            self._runner = GuardedRunner(app, limits, access_log=None, handle_signals=False)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        return sockets[0].getsockname()[:2] if sockets else (host, port)

    async def serve(self, sockets: list[socket.socket]) -> tuple[str, int]:
        """Serve on sockets bound before a privilege drop (listening on them from now)."""
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
