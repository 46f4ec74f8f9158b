"""Request bodies over `[http] max_request_size`: one answer, from a worker or the supervisor.

A body that says it is too big (Content-Length) is refused before any of it is read; one that
grows too big while it is read (chunked, or a lying length) is refused when it does. Either
way the client gets 413 with a JSON error naming the setting, like every other API refusal
(aiohttp's own is plain text). The connection is not forced shut: aiohttp reads and drops the
rest of the body for its lingering time, so the client reads the 413 rather than a reset.
"""

from __future__ import annotations

from aiohttp import web

SETTING = "[http] max_request_size"


def declared_too_large(request: web.Request, max_size: int) -> bool:
    """Whether the request's Content-Length is already over `max_size`."""
    length = request.content_length
    return length is not None and length > max_size


def too_large(max_size: int) -> web.Response:
    """413 with a JSON error that names the limit and its value."""
    return web.json_response({"error": too_large_text(max_size), "field": "$"}, status=413)


def too_large_text(max_size: int) -> str:
    """What a 413 says (and its Rejection record, for an injection)."""
    return f"request body is over {SETTING} ({max_size} bytes)"
