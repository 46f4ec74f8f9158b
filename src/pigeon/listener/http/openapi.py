"""GET /api/openapi.json: the API's OpenAPI 3.1 document.

The request and response schemas are generated from the very msgspec types the handlers
decode and encode with, so the document cannot drift from what the server accepts.
"""

from __future__ import annotations

import functools
from typing import Any, Final

import msgspec
from aiohttp import web

from pigeon.compose import InjectRequest
from pigeon.listener.http.inject import ErrorResponse, InjectResponse

_REF: Final = "#/components/schemas/{name}"
_ERRORS: Final = {
    "400": ("The request is malformed; nothing was stored", "ErrorResponse"),
    "401": ("No token, or an unknown one", "ErrorResponse"),
    "403": ("The token lacks the scope", "ErrorResponse"),
    "413": ("The request body is over [http] max_request_size", None),
}


@functools.cache
def document() -> dict[str, Any]:
    (request, response, _), components = msgspec.json.schema_components(
        [InjectRequest, InjectResponse, ErrorResponse], ref_template=_REF
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Pigeon",
            "version": "1",
            "description": "Inject mail into Pigeon. Every operation needs 'Authorization: Bearer <token>'.",
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/v1/inject": {
                "post": {
                    "operationId": "inject",
                    "summary": "Inject mail: one message per recipient, answered once all are durable",
                    "description": "Needs the 'inject' scope. Content is raw RFC 5322 text or parts; "
                    "either is a Jinja2 template rendered per recipient unless 'template' is false.",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
                    "responses": {
                        "200": _response("Per recipient: its spool id, or why it was refused", response),
                        "503": _response("Nothing could be stored (spool trouble): retry later", response),
                        **{code: _response(text, _ref(name)) for code, (text, name) in _ERRORS.items()},
                    },
                }
            }
        },
    }


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=msgspec.json.encode(document()), content_type="application/json")


def _ref(name: str | None) -> dict[str, Any] | None:
    return {"$ref": _REF.format(name=name)} if name else None


def _response(description: str, schema: dict[str, Any] | None) -> dict[str, Any]:
    if schema is None:
        return {"description": description}
    return {"description": description, "content": {"application/json": {"schema": schema}}}
