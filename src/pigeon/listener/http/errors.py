"""Every error the HTTP listener answers is JSON in the API's one shape, `{"error": ...,
"field": ...}` (`inject.ErrorResponse`), whoever made it: a handler, aiohttp's router (no such
path, no such method: 404, or 405 with `Allow`), aiohttp's HTTP parser before any handler runs
(a request with both Content-Length and Transfer-Encoding, a malformed request line or header),
or an exception nothing caught (500). A client of the API reads every answer the same way, and
a text/plain "404: Not Found" is not one it can. `field` names what is at fault where a handler
knows (a JSON path, a parameter, a header); an API error that names nothing gets `null` here,
so that no refusal made anywhere, now or later, lacks the member.

The same for a worker's listener and for the supervisor's (`pigeon.node.supervisor`): their
404 and 405 read alike, whichever answered.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, Final

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError
from aiohttp.web_request import BaseRequest

from pigeon.listener.http.body import CODINGS, undecodable_text
from pigeon.logs.peer_text import shown

_log = logging.getLogger(__name__)
_KEPT_HEADERS = ("Allow", "WWW-Authenticate", "Retry-After")
_UNSUPPORTED: Final = re.compile(r"^Can not decode content-encoding: \w+ \(")
"""aiohttp's parser's words for a content coding it has no decoder for: `brotli (br)`, `zstandard (zstd)`."""


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """A refusal that is not JSON already (aiohttp's own are text) as a JSON one that says what
    to do, with its status and the headers that go with it (`Allow` of a 405)."""
    try:
        response = await handler(request)
    except web.HTTPError as refusal:
        if refusal.content_type == "application/json":
            _name_a_field(request, refusal)
            raise
        headers = {name: refusal.headers[name] for name in _KEPT_HEADERS if name in refusal.headers}
        answer = {"error": _message(request, refusal), "field": None}
        return web.json_response(answer, status=refusal.status, headers=headers)
    _name_a_field(request, response)
    return response


def _name_a_field(request: web.Request, response: web.StreamResponse) -> None:
    """An API error in JSON without `field` gets `"field": null`. Not /healthz's 503: it is a
    state, not a refusal, and its `error` members say what is wrong with the node."""
    if response.status < 400 or not request.path.startswith("/api/") or not isinstance(response, web.Response):
        return
    if response.content_type != "application/json" or not isinstance(response.body, bytes):
        return
    try:
        answer = json.loads(response.body)
    except ValueError:
        return
    if isinstance(answer, dict) and "error" in answer and "field" not in answer:
        response.text = json.dumps({"error": answer.pop("error"), "field": None, **answer})


def _message(request: web.Request, refusal: web.HTTPError) -> str:
    if isinstance(refusal, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(refusal.allowed_methods))
        return f"{request.method} is not allowed on {request.path}; use {allowed}"
    if isinstance(refusal, web.HTTPNotFound):
        return f"no endpoint at {request.path}; the API is described at /api/openapi.json"
    text = refusal.text or ""
    default = f"{refusal.status}: {refusal.reason}"  # what aiohttp says when told nothing more
    return refusal.reason if text in ("", default) else text


class JsonErrorsRunner(web.AppRunner):
    """An `AppRunner` whose connections answer the errors found before any handler runs (the
    request could not be parsed) and the exceptions nothing caught (500) in JSON too.

    Its parser decodes no body (`auto_decompress` off): `body.read_coded` does, after the
    handler has looked at the request. aiohttp's refused `br` and `zstd` itself (no decoder
    installed), before any handler: an HTTP/1.0 answer logged as a malformed request, where the
    handler's 415 of every other coding is an injection's `Rejection`."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        super().__init__(app, auto_decompress=False, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = JsonErrorsServer  # aiohttp has no hook for these answers: its handler is swapped
        return server


class JsonErrorsServer(web.Server):
    """aiohttp's server of one listener, whose connections answer their errors in JSON."""

    def __call__(self) -> web.RequestHandler:
        handler = super().__call__()
        handler.__class__ = JsonErrorsHandler
        return handler


class JsonErrorsHandler(web.RequestHandler):
    """aiohttp's handler of one connection, answering what it refuses before any route in JSON."""

    __slots__ = ()

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        field, headers = None, None
        if isinstance(exc, ContentEncodingError):
            # The parser's own: a coding it has no decoder for (br, zstd), whose "400 ... Please
            # install `Brotli`" is advice for a server's operator, not for the client, which is told
            # what is taken instead, as for any other coding (`body.coding_refusal`); or a deflate
            # body found cut short at its end ("deflate"), the client's as any undecodable body is.
            said = exc.message.strip()
            field = "Content-Encoding"
            if _UNSUPPORTED.search(said):
                status, headers = HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"Accept-Encoding": ", ".join(CODINGS)}
                message = f"Content-Encoding is not taken: send the body as it is, or coded {' or '.join(CODINGS)}"
            else:
                message = undecodable_text(said.rpartition(" ")[2])
        if status < HTTPStatus.INTERNAL_SERVER_ERROR and isinstance(exc, HttpProcessingError):
            # The client's fault (a request aiohttp's parser refused): a line of WARNING, at
            # most once a minute per kind, where aiohttp would log an ERROR with a traceback,
            # which any client could repeat to flood the log.
            _malformed.report(request.remote, message or str(exc), status)
            if request.writer.output_size > 0:  # as aiohttp's: no second answer on a begun one
                raise ConnectionError("an answer was begun; no error answer can follow")
        else:
            # aiohttp's own logs the error (a traceback for a 500) and refuses if an answer was
            # already begun; its text/plain answer is replaced.
            super().handle_error(request, status, exc, message)
        if status == HTTPStatus.INTERNAL_SERVER_ERROR:
            text = "internal error: the node's log says what went wrong"
        elif message:  # the parser's first line; what follows points into the request with a caret
            text = message.strip().partition("\n")[0].rstrip(":")
        else:
            text = _phrase(status)
        response = web.json_response({"error": text, "field": field}, status=status, headers=headers)
        response.force_close()  # as aiohttp's: what follows on this connection cannot be trusted
        return response


class _MalformedRequests:
    """A WARNING line for each kind of malformed request (what aiohttp's parser says first:
    duplicate Content-Length, Content-Length with Transfer-Encoding, a bad header, ...), said
    at most once per `every` seconds per kind, with how many more came meanwhile. The kinds
    are bounded (`KINDS`; past them, one for all the rest): a message may quote the client."""

    KINDS: Final = 32

    def __init__(self, every: float = 60.0) -> None:
        self.every = every
        self._said: dict[str, float] = {}
        self._unsaid: dict[str, int] = {}

    def report(self, peer: str | None, message: str, status: int = HTTPStatus.BAD_REQUEST) -> None:
        now = time.monotonic()
        first = message.strip().partition("\n")[0].rstrip(":")
        kind = first[:80]
        if kind not in self._said and len(self._said) >= self.KINDS:
            kind = "other"
        said = self._said.get(kind)
        if said is not None and now - said < self.every:
            self._unsaid[kind] = self._unsaid.get(kind, 0) + 1
            return
        unsaid = self._unsaid.pop(kind, 0)
        more = f"; {unsaid} more like it in the last {now - said:.0f}s" if said is not None and unsaid else ""
        _log.warning(
            "http: malformed request from %s refused (%d): %s%s (said at most once a minute per kind)",
            shown(peer or "unknown", 60),
            status,
            shown(first, 200),
            more,
        )
        self._said[kind] = now


_malformed = _MalformedRequests()


def _phrase(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)
