"""GET /healthz: is this node taking mail? 200 when it is, 503 when it is shutting down."""

from __future__ import annotations

from aiohttp import web

from pigeon.listener.http.context import NODE_KEY


async def healthz(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    status = node.health()
    return web.json_response(status, status=200 if status["status"] == "ok" else 503)
