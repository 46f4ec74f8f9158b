"""The admin API: bounce, suspend (and resume), retry now, inspect one message.

    POST   /api/v1/admin/bounce           {selector..., reason, duration?}   admin
    GET    /api/v1/admin/bounce           standing bounces                  read
    DELETE /api/v1/admin/bounce/{id}      cancel one                        admin
    POST   /api/v1/admin/suspend          {selector..., reason, duration?}   admin
    GET    /api/v1/admin/suspend          suspensions                       read
    DELETE /api/v1/admin/suspend/{id}     resume                            admin
    POST   /api/v1/admin/retry            {selector...}                     admin
    POST   /api/v1/admin/rebind           {selector..., to_queue?, routing_domain?}  admin
    GET    /api/v1/messages/{id}          one message                       read
    GET    /api/v1/queues                 scheduled and ready queues        read
    GET    /api/v1/admin/operations       bulk operations' progress         read

A selector names at least one of domain, tenant, campaign, queue (globs). Durations are
seconds or strings ("30m", "2h"), as in the config. With several workers the supervisor
sends each request to all of them and adds up the answers.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec
from aiohttp import web

from pigeon.config.schema import Duration, decode_hook
from pigeon.listener.http.context import NODE_KEY
from pigeon.listener.http.inject import bad_request
from pigeon.message import parse_id
from pigeon.queue.admin import Admin
from pigeon.queue.rules import Selector

_Glob = Annotated[str, msgspec.Meta(min_length=1)]


class AdminRequest(msgspec.Struct, forbid_unknown_fields=True):
    domain: _Glob | None = None
    tenant: _Glob | None = None
    campaign: _Glob | None = None
    queue: _Glob | None = None
    site: _Glob | None = None
    """Suspend only: deliveries to this site (ready queue) stop; nothing else may be named with it."""
    reason: str = ""
    duration: Duration | None = None
    """How long the rule stands (bounce: also new mail; suspend: until then, else until resumed)."""
    id: str | None = None
    """The rule's id (the supervisor gives one, so every worker's copy has the same)."""

    def selector(self) -> Selector:
        return Selector(
            domain=self.domain, tenant=self.tenant, campaign=self.campaign, queue=self.queue, site=self.site
        )


class RebindRequest(AdminRequest):
    to_queue: _Glob | None = None
    """The scheduled queue to move the messages to (its [[queue]] policy applies from then on)."""
    routing_domain: str | None = None
    """Route them as if their recipients were in this domain ("" routes them by their own again)."""


_DECODER: Final = msgspec.json.Decoder(AdminRequest, dec_hook=decode_hook)
_REBIND_DECODER: Final = msgspec.json.Decoder(RebindRequest, dec_hook=decode_hook)


async def bounce(request: web.Request) -> web.Response:
    return await _standing(request, "bounce")


async def suspend(request: web.Request) -> web.Response:
    return await _standing(request, "suspend")


async def _standing(request: web.Request, kind: str) -> web.Response:
    """Bounce or suspend: the same request, a rule of that kind."""
    admin, operator, body = await _admin_request(request)
    if body.site is not None and (kind != "suspend" or body.domain or body.tenant or body.campaign or body.queue):
        raise bad_request("site names a ready queue to suspend, on its own", "$.site")
    operation = admin.bounce if kind == "bounce" else admin.suspend
    duration = float(body.duration) if body.duration else None
    result = await operation(body.selector(), reason=body.reason, operator=operator, duration=duration, rule_id=body.id)
    return web.json_response(result)


async def rebind(request: web.Request) -> web.Response:
    admin, operator, body = await _admin_request(request, _REBIND_DECODER)
    assert isinstance(body, RebindRequest)
    if body.site is not None:
        raise bad_request("site is for suspend only", "$.site")
    if body.to_queue is None and body.routing_domain is None:
        raise bad_request("say where to: to_queue, routing_domain or both", "$")
    result = await admin.rebind(
        body.selector(), queue=body.to_queue, routing_domain=body.routing_domain, operator=operator, operation=body.id
    )
    return web.json_response(result)


async def retry(request: web.Request) -> web.Response:
    admin, _, body = await _admin_request(request)
    if body.site is not None:
        raise bad_request("site is for suspend only", "$.site")
    return web.json_response(await admin.retry(body.selector(), body.id))


async def operations(request: web.Request) -> web.Response:
    """Recent bulk operations and how far they got (poll it while a big one runs)."""
    return web.json_response({"operations": _admin(request, "read").operations()})


async def list_bounces(request: web.Request) -> web.Response:
    return web.json_response({"rules": _admin(request, "read").rules("bounce")})


async def list_suspensions(request: web.Request) -> web.Response:
    return web.json_response({"rules": _admin(request, "read").rules("suspend")})


async def cancel_bounce(request: web.Request) -> web.Response:
    return await _cancel(request, "bounce")


async def resume(request: web.Request) -> web.Response:
    return await _cancel(request, "suspend")


async def queues(request: web.Request) -> web.Response:
    return web.json_response(await _admin(request, "read").summary())


async def inspect(request: web.Request) -> web.Response:
    admin = _admin(request, "read")
    try:
        spool_id = parse_id(request.match_info["id"])
    except ValueError as error:
        raise bad_request(str(error), "id") from None
    found = admin.inspect(spool_id)
    if found is None:
        return web.json_response({"error": f"no message {request.match_info['id']} here"}, status=404)
    return web.json_response(found)


async def _cancel(request: web.Request, kind: str) -> web.Response:
    admin = _admin(request, "admin")
    rule_id = request.match_info["id"]
    result = await admin.cancel(rule_id, kind)
    if not result["cancelled"]:
        what = "standing bounce" if kind == "bounce" else "suspension"
        return web.json_response({"error": f"no {what} {rule_id}", "cancelled": False}, status=404)
    return web.json_response(result)


async def _admin_request(
    request: web.Request, decoder: msgspec.json.Decoder[Any] = _DECODER
) -> tuple[Admin, str, AdminRequest]:
    node = request.app[NODE_KEY]
    operator = node.tokens.holder(request, "admin")
    admin = _admin(request, None)
    try:
        body = decoder.decode(await request.read())
    except msgspec.ValidationError as error:
        raise bad_request(error) from None
    except msgspec.DecodeError as error:
        raise bad_request(f"malformed JSON: {error}") from None
    if body.selector().empty():
        raise bad_request("name at least one of domain, tenant, campaign, queue (or site, to suspend)", "$")
    return admin, operator, body


def _admin(request: web.Request, scope: Any) -> Admin:
    node = request.app[NODE_KEY]
    if scope is not None:
        node.tokens.holder(request, scope)
    if node.admin is None:
        raise web.HTTPServiceUnavailable(
            text='{"error": "delivery is disabled on this node ([delivery] enabled = false)"}',
            content_type="application/json",
        )
    return node.admin
