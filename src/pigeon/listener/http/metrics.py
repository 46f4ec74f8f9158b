"""GET /metrics: the node's Prometheus metrics in the text exposition format.

Open without a token, unless `[http] status_token_required`: then only to a `read` token bound
to no tenant (`Tokens.status_holder`; its queue names are every tenant's), and always to the
supervisor asking a worker over its control socket. `?cluster=1` (with a `read` token: it costs
every node some work) adds up every node's sharing [redis], for `pigeon top --cluster`; a
comment line says whose."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pigeon.listener.http.admin import cluster_wide
from pigeon.listener.http.context import NODE_KEY, from_supervisor
from pigeon.node.answers import merge_metric_answers


async def metrics(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    holder = None
    if node.tokens.status_token_required and not from_supervisor(request):
        # (The supervisor asks its workers for the node's sum, having checked its client itself.)
        holder = node.tokens.status_holder(request)
    text = generate_latest(node.metrics.registry).decode()
    broadcast = node.broadcast_front
    if cluster_wide(request) and broadcast is not None:
        operator = holder or node.tokens.holder(request, "read")

        async def local() -> tuple[int, Any]:
            return 200, {"text": text}

        _, answer = await broadcast.around("GET", "/metrics", b"", operator, local, merge_metric_answers)
        text = answer["text"] + cluster_comment(answer["cluster"])
    return exposition(text)


def cluster_comment(cluster: dict[str, Any]) -> str:
    """A comment line (ignored by Prometheus) naming the nodes a cluster-wide exposition adds up."""
    nodes = " ".join(f"{node}={state}" for node, state in sorted(cluster.get("nodes", {}).items()))
    return f"# pigeon cluster nodes: {nodes}\n"


def exposition(text: str) -> web.Response:
    response = web.Response(text=text)
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    response.charset = "utf-8"
    return response
