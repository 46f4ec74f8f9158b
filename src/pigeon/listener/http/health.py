"""GET /healthz: is this node taking mail? 200 when it is, 503 when it is shutting down.

The body says more: `"degraded"` when mail is taken but something needs an operator (the
event log cannot be written: records wait in the spool's outbox), and what each part is doing.
"""

from __future__ import annotations

from aiohttp import web

from pigeon.listener.http.context import NODE_KEY


async def healthz(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    status = node.health()
    return web.json_response(status, status=503 if status["status"] == "stopping" else 200)
