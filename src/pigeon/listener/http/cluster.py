"""GET /api/v1/cluster/nodes: the nodes the cluster knows, running or not (scope "read");
DELETE /api/v1/cluster/nodes/{node}: forget one that is not running (scope "admin").

    {"node": this node's name, "nodes": [{node, running, last_seen, left?, forgotten_at?,
     workers, spool, entry}, ...]}

The cluster knows a node by its entry in the presence hash (`<prefix>:admin:nodes`,
`pigeon.node.presence`): renewed every 2 s while it runs, kept for a day (`REMEMBERED`) after
it stopped, and meanwhile every admin write names it `pending` (a one-off write: it applies it
when it starts, if within `[redis] late_operations`). A node taken out of the cluster for good
would be named so for a day: forgetting it removes its entry now, and says it forgotten
(`<prefix>:admin:nodes:forgotten`, and in the memory of the worker asked), so that the nodes that
give the presence hash back after Redis lost its data do not give it back too
(`pigeon.node.presence.forget`). A node that runs is not
forgotten (409, saying to stop it first): its workers would write their entry again within
2 s, and a write issued meanwhile would not wait for it. Started again after it was forgotten,
a node is known again, and reads the admin stream on from where it stopped, as any node does.

Asked of one worker (each reads Redis itself); the supervisor passes it on as it is. Without
`[redis] url` there is no cluster: 409. Redis not answering: 503. A token bound to tenants gets
403: the nodes carry every tenant's mail (`tenancy`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from pigeon.config.schema import Config
from pigeon.listener.http import tenancy
from pigeon.listener.http.auth import Scope
from pigeon.listener.http.context import NODE_KEY
from pigeon.node import presence
from pigeon.node.presence import PRESENCE, known_nodes, presence_key
from pigeon.redaction import redact, redact_url

if TYPE_CHECKING:
    import redis.asyncio as aioredis

# (redis is imported where these endpoints are asked, not with the HTTP app: a node without
# [redis] does not load the client, nor the cryptography it brings; test_start_up_imports.)

_log = logging.getLogger(__name__)

NODES_PATH: Final = "/api/v1/cluster/nodes"
FORGET_PATH: Final = "/api/v1/cluster/nodes/{node}"
NO_CLUSTER: Final = "this node has no [redis] url: it is in no cluster, and knows no other node"


async def nodes(request: web.Request) -> web.Response:
    _unbound(request, "read")
    from redis.exceptions import RedisError

    config = request.app[NODE_KEY].config
    client = _client(config)
    try:
        entries: dict[Any, Any] = await client.hgetall(presence_key(config))
    except (RedisError, OSError) as error:
        raise _unreachable(config, error, "the cluster's nodes cannot be listed") from None
    finally:
        await _close(client)
    return web.json_response({"node": config.node.name, "nodes": known_nodes(entries, time.time())})


async def forget(request: web.Request) -> web.Response:
    operator = _unbound(request, "admin")
    from redis.exceptions import RedisError, WatchError

    node = request.app[NODE_KEY]
    config = node.config
    name = request.match_info["node"]
    client = _client(config)
    try:
        rows, known = await presence.forget(client, config, name)
    except WatchError as error:
        raise _error(web.HTTPServiceUnavailable, f"{error}: try again") from None
    except (RedisError, OSError) as error:
        raise _unreachable(config, error, f"node {name} was not forgotten") from None
    finally:
        await _close(client)
    if not rows:
        raise _not_known(name, known)
    if running := [row for row in rows if row["running"]]:
        raise _running(name, running[0], config, time.time())
    # This worker gives the forget back with the nodes' presence should Redis lose its data
    # before the other nodes have seen it (`pigeon.node.presence.forget`).
    node.forgot({row["entry"]: row["last_seen"] for row in rows})
    for row in rows:
        _log.warning(
            "cluster: node %s (spool id %s, %d worker(s), last there at %s) forgotten by the cluster, "
            "asked by %s: admin writes no longer name it pending",
            name,
            row["spool"],
            row["workers"],
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["last_seen"])),
            operator,
        )
    return web.json_response({"forgotten": rows, "by": operator})


def _unbound(request: web.Request, scope: Scope) -> str:
    """The name of the request's token, if it grants `scope` and is bound to no tenant (403
    otherwise); 409 when this node is in no cluster."""
    node = request.app[NODE_KEY]
    holder = node.tokens.holder(request, scope)
    tenants = node.tokens.binding(holder)
    if tenants is not None:
        raise tenancy.no_tenant(holder, tenants, "the cluster's nodes carry the mail of every tenant")
    if node.config.redis.url is None:
        raise _error(web.HTTPConflict, NO_CLUSTER)
    return holder


def _client(config: Config) -> aioredis.Redis:
    import redis.asyncio as aioredis

    timeout = float(config.redis.timeout)
    assert config.redis.url is not None
    return aioredis.Redis.from_url(config.redis.url, socket_timeout=timeout, socket_connect_timeout=timeout)


async def _close(client: aioredis.Redis) -> None:
    from redis.exceptions import RedisError

    try:
        await client.aclose()
    except (RedisError, OSError):
        pass


def _not_known(name: str, known: list[dict[str, Any]]) -> web.HTTPException:
    names = ", ".join(sorted({row["node"] for row in known})) or "none"
    return _error(
        web.HTTPNotFound,
        f"no node named {name!r} is known to the cluster (known: {names}): forgotten already, or never there",
        "node",
    )


def _running(name: str, row: dict[str, Any], config: Config, now: float) -> web.HTTPException:
    which = "this node" if name == config.node.name else f"node {name}"
    return _error(
        web.HTTPConflict,
        f"{which} is running (it renewed its presence {max(0.0, now - row['last_seen']):.0f}s ago; "
        f"{row['workers']} worker(s), spool id {row['spool']}): stop it first (SIGTERM to its pigeon serve, "
        f"systemctl stop pigeon on its host), then forget it; a node stopped gracefully is not running at once, "
        f"one killed {PRESENCE:.0f}s after",
        "node",
    )


def _unreachable(config: Config, error: BaseException, what: str) -> web.HTTPException:
    assert config.redis.url is not None
    return _error(
        web.HTTPServiceUnavailable,
        f"Redis at {redact_url(config.redis.url)} cannot be reached ({redact(str(error))}): {what}; "
        "try again once it answers",
    )


def _error(kind: type[web.HTTPException], message: str, field: str | None = None) -> web.HTTPException:
    return kind(text=json.dumps({"error": message, "field": field}), content_type="application/json")
