"""GET /metrics: the node's Prometheus metrics in the text exposition format."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pigeon.listener.http.context import NODE_KEY


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[NODE_KEY].metrics.registry
    response = web.Response(body=generate_latest(registry))
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    response.charset = "utf-8"
    return response
