"""Request bodies over `[http] max_request_size`: one answer, from a worker or the supervisor.

A body that says it is too big (Content-Length) is refused before any of it is read; one that
grows too big while it is read (chunked, or a lying length) is refused when it does. Either
way the client gets 413 with a JSON error naming the setting, like every other API refusal
(aiohttp's own is plain text). The connection is not forced shut: aiohttp reads and drops the
rest of the body for its lingering time, so the client reads the 413 rather than a reset.

An injection's 413 is logged (a `Rejection`) by the worker that answers it. On a node with
several workers the supervisor finds the body too big, and it keeps no log: it passes the
request on without its body, marked `TOO_LARGE_HEADER`, and the worker refuses it as though it
had found the body too big itself (after the token, as it would).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from pigeon.listener.http.context import from_supervisor

SETTING = "[http] max_request_size"
TOO_LARGE_HEADER: Final = "Pigeon-Body-Too-Large"
"""Set by the supervisor on a request it passes on without the body it found too big."""


def declared_too_large(request: web.Request, max_size: int) -> bool:
    """Whether the request's Content-Length is already over `max_size`, or the supervisor
    found its body so (a client's `TOO_LARGE_HEADER` means nothing)."""
    length = request.content_length
    if length is not None and length > max_size:
        return True
    return TOO_LARGE_HEADER in request.headers and from_supervisor(request)


def too_large(max_size: int) -> web.Response:
    """413 with a JSON error that names the limit and its value."""
    return web.json_response({"error": too_large_text(max_size), "field": "$"}, status=413)


def too_large_text(max_size: int) -> str:
    """What a 413 says (and its Rejection record, for an injection)."""
    return f"request body is over {SETTING} ({max_size} bytes)"
