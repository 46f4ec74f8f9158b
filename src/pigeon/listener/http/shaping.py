"""GET /api/v1/shaping/effects: the live effects of shaping reactions (scope "read");
DELETE /api/v1/shaping/effects/{id}: end one early (scope "admin").

    {"mode": "cluster" | "node" | "node-local", "effects": [{id, rule, key, action, created,
     expires_at, reply, node, connection_limit?, max_message_rate?}, ...]}

`mode` says how far effects reach: every node ("cluster", through Redis), this node's workers
("node", no [redis]), or this node alone because Redis does not answer ("node-local"). Every
worker knows every effect, so the supervisor's merge (lists joined by id) shows each once.

Ending one is asked of one worker, which ends it at once and tells the others (see
`pigeon.shaping.effects`: the node's workers within a scan, the cluster's nodes within a poll,
both 0.2 s): `{"ended": {the effect, with ended_at and ended_by}, "mode": ...}`. What it held
is started at once; its rule may start a new effect at the next matching reply. 404: no live
effect has that id (it ended, or never was).

A token bound to tenants (`[[http.token]] tenants`) gets 403 at both: an effect is of a site,
whose mail is every tenant's (`tenancy`).
"""

from __future__ import annotations

import json

import msgspec
from aiohttp import web

from pigeon.listener.http import tenancy
from pigeon.listener.http.auth import Scope
from pigeon.listener.http.context import NODE_KEY
from pigeon.shaping.effects import Board


async def effects(request: web.Request) -> web.Response:
    _unbound(request, "read")
    board = _board(request)
    body = {"mode": board.mode, "effects": msgspec.to_builtins(board.live())}
    return web.json_response(body)


async def end_effect(request: web.Request) -> web.Response:
    operator = _unbound(request, "admin")
    board = _board(request)
    effect_id = request.match_info["id"]
    ended = await board.end(effect_id, by=operator)
    if ended is None:
        message = (
            f"no live shaping effect {effect_id!r}: it ended, or never was (GET /api/v1/shaping/effects lists them)"
        )
        raise web.HTTPNotFound(text=json.dumps({"error": message, "field": "id"}), content_type="application/json")
    return web.json_response({"ended": msgspec.to_builtins(ended), "mode": board.mode})


def _unbound(request: web.Request, scope: Scope) -> str:
    """The name of the request's token, if it grants `scope` and is bound to no tenant: an
    effect is of a site, whose queue every tenant's mail shares (`tenancy`), 403 otherwise."""
    tokens = request.app[NODE_KEY].tokens
    holder = tokens.holder(request, scope)
    tenants = tokens.binding(holder)
    if tenants is not None:
        raise tenancy.no_tenant(holder, tenants, "shaping effects are of sites")
    return holder


def _board(request: web.Request) -> Board:
    board = request.app[NODE_KEY].effects
    if board is None:
        raise web.HTTPServiceUnavailable(
            text='{"error": "delivery is disabled on this node ([delivery] enabled = false): no shaping effects"}',
            content_type="application/json",
        )
    return board
