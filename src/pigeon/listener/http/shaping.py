"""GET /api/v1/shaping/effects: the live effects of shaping reactions (scope "read").

    {"mode": "cluster" | "node" | "node-local", "effects": [{id, rule, key, action, created,
     expires_at, reply, node, connection_limit?, max_message_rate?}, ...]}

`mode` says how far effects reach: every node ("cluster", through Redis), this node's workers
("node", no [redis]), or this node alone because Redis does not answer ("node-local"). Every
worker knows every effect, so the supervisor's merge (lists joined by id) shows each once.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from pigeon.listener.http.context import NODE_KEY


async def effects(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    node.tokens.holder(request, "read")
    board = node.effects
    if board is None:
        raise web.HTTPServiceUnavailable(
            text='{"error": "delivery is disabled on this node ([delivery] enabled = false): no shaping effects"}',
            content_type="application/json",
        )
    body = {"mode": board.mode, "effects": msgspec.to_builtins(board.live())}
    return web.json_response(body)
