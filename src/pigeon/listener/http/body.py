"""Request bodies: their size (`[http] max_request_size`) and their codings, one answer each
from a worker or the supervisor.

A body that says it is too big (Content-Length) is refused before any of it is read; one that
grows too big while it is read (chunked, or a lying length) is refused when it does. Either
way the client gets 413 with a JSON error naming the setting, like every other API refusal
(aiohttp's own is plain text). The connection is not forced shut: aiohttp reads and drops the
rest of the body for its lingering time, so the client reads the 413 rather than a reset.

An injection's 413 is logged (a `Rejection`) by the worker that answers it. On a node with
several workers the supervisor finds the body too big, and it keeps no log: it passes the
request on without its body, marked `TOO_LARGE_HEADER`, and the worker refuses it as though it
had found the body too big itself (after the token, as it would).

A body may come gzip- or deflate-coded (`CODINGS`): decoded here as it is read (`read_coded`), and
the size limit bounds the decoded body. Not by aiohttp (`auto_decompress` off, `errors.
JsonErrorsRunner`): its parser refused `br` and `zstd` (no decoder installed) before any handler,
unlogged, where the handler refuses every other coding. Another content coding is 415
(`coding_refusal`), a body not coded as it says 400 (`read_body`), both naming
`Content-Encoding`; on a node with several workers the supervisor, which reads the body, passes
an injection's on without it, as for a body too big, so that the worker logs its Rejection. A
transfer coding other than chunked is 501 (`transfer_codings`).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError

from pigeon.listener.http.context import from_supervisor

SETTING = "[http] max_request_size"
CODINGS: Final = ("gzip", "deflate")
"""The content codings a request body may come in (`Content-Encoding`), decoded as it is read
(aiohttp's): `[http] max_request_size` bounds the decoded body. Others (br, zstd, compress, a
list of several) are 415: no decoder here, and a body taken as it is would be read as the wrong bytes."""
CODING_HEADER: Final = "Pigeon-Content-Encoding"
"""Set by the supervisor on a request it passes on: the client's `Content-Encoding`. The body
it passes on is decoded already (or none), so the worker is not told to decode it again, only
what a refusal must say."""
UNDECODABLE_HEADER: Final = "Pigeon-Body-Undecodable"
"""Set by the supervisor on an injection it passes on without the body it could not decode as
its `Content-Encoding` says: the worker refuses it as though it had failed to decode it itself."""
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


def content_coding(request: web.Request) -> str:
    """The request body's content coding as the client declared it (`Content-Encoding`, in
    lower case; "" for none): of a request the supervisor passed on, as it forwarded it."""
    if from_supervisor(request):
        return request.headers.get(CODING_HEADER, "").strip().lower()
    return request.headers.get("Content-Encoding", "").strip().lower()


def coding_refusal(request: web.Request) -> web.HTTPUnsupportedMediaType | None:
    """415 naming `Content-Encoding` if the body comes in a coding not in `CODINGS` (RFC 9110
    15.5.16), with `Accept-Encoding` saying which are taken (12.5.3); None if it may be read."""
    coding = content_coding(request)
    if coding in ("", "identity", *CODINGS):
        return None
    text = (
        f"Content-Encoding {coding[:40]!r} is not taken: send the body as it is, or coded "
        f"{' or '.join(CODINGS)} (one coding)"
    )
    return web.HTTPUnsupportedMediaType(
        text=json.dumps({"error": text, "field": "Content-Encoding"}),
        content_type="application/json",
        headers={"Accept-Encoding": ", ".join(CODINGS)},
    )


def undecodable(coding: str) -> web.HTTPBadRequest:
    """400 naming `Content-Encoding` for a body that is not coded as it says."""
    body = json.dumps({"error": undecodable_text(coding), "field": "Content-Encoding"})
    return web.HTTPBadRequest(text=body, content_type="application/json")


def undecodable_text(coding: str) -> str:
    """What the 400 of a body not coded as its `Content-Encoding` (`coding`) says."""
    return f"the body is not {coding[:40]}-coded data as its Content-Encoding says: send it so, or as it is"


async def read_body(request: web.Request) -> bytes:
    """The request's body, decoded as its `Content-Encoding` says; 400 naming that header when
    it cannot be (aiohttp raises its own parser error from `read`, which nothing handled: a
    500 and three chained tracebacks in the log for what is the client's mistake)."""
    if UNDECODABLE_HEADER in request.headers and from_supervisor(request):
        raise undecodable(content_coding(request))
    try:
        return await read_coded(request)
    except ConnectionResetError:
        raise gone() from None
    except (ContentEncodingError, web.RequestPayloadError) as error:
        if not not_decoded(request, error):
            raise
        refusal = undecodable(content_coding(request))
        # The parser stopped in the middle of the body: what follows on this connection cannot
        # be framed, and a keep-alive client's next request would wait for header_timeout.
        refusal.force_close()
        raise refusal from None


async def read_coded(request: web.Request) -> bytes:
    """The request's body, decoded as its `Content-Encoding` (gzip, deflate) says, within the
    application's `client_max_size` (`[http] max_request_size`) decoded: `HTTPRequestEntityTooLarge`
    past it, as `request.read` raises; `ContentEncodingError` for a body not coded as it says.
    A body the supervisor passed on is decoded already. The caller has refused other codings."""
    coding = "" if from_supervisor(request) else content_coding(request)
    if coding not in CODINGS:
        return await request.read()
    max_size = request.client_max_size
    decoder: zlib._Decompress | None = None
    decoded = bytearray()
    read = 0
    try:
        async for chunk in request.content.iter_any():
            read += len(chunk)
            if decoder is None:
                # As aiohttp's: "deflate" is zlib data (RFC 9110 8.4.1.2), or raw deflate as
                # some clients send it (its first byte is no zlib header's).
                raw = coding == "deflate" and chunk[0] & 0xF != 8
                decoder = zlib.decompressobj(
                    16 + zlib.MAX_WBITS if coding == "gzip" else -zlib.MAX_WBITS if raw else zlib.MAX_WBITS
                )
            # At most one octet past the limit: a small body that decodes to gigabytes is not.
            decoded += decoder.decompress(chunk, max_size + 1 - len(decoded))
            if len(decoded) > max_size or read > 2 * max_size:  # (empty blocks decode to nothing)
                raise web.HTTPRequestEntityTooLarge(max_size=max_size, actual_size=max(len(decoded), read))
            if decoder.unused_data:
                raise ContentEncodingError(coding)
    except zlib.error:
        raise ContentEncodingError(coding) from None
    if decoder is not None and not decoder.eof:  # cut short
        raise ContentEncodingError(coding)
    return bytes(decoded)


def gone() -> web.HTTPBadRequest:
    """The answer to a request whose client closed its connection before the end of its body:
    nobody reads it, but answered (not raised as the bare error) it is not an ERROR with a
    traceback in the log, which any client could cause at will."""
    refusal = web.HTTPBadRequest(
        text=json.dumps({"error": "the connection closed before the end of the body", "field": None}),
        content_type="application/json",
    )
    refusal.force_close()
    return refusal


def not_decoded(request: web.Request, error: BaseException) -> bool:
    """Whether reading `request`'s body failed because it could not be decoded as its
    `Content-Encoding` says (aiohttp's C parser raises `RequestPayloadError` caused by the
    `ContentEncodingError` its pure Python one raises). If so, the body is read no further:
    aiohttp would read what is left of it after the answer, meet the error again, and log it as
    an ERROR with three chained tracebacks, which any client could repeat. Its parser has
    stopped at the error, so nothing more comes into the body."""
    if not isinstance(error, ContentEncodingError) and not isinstance(error.__cause__, ContentEncodingError):
        return False
    request.content.feed_eof()
    return True


@web.middleware
async def transfer_codings(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """501 for a request whose `Transfer-Encoding` has a coding other than `chunked`: aiohttp's
    parser reads `gzip, chunked` as chunked and drops the gzip, so the body was taken as the
    wrong bytes. RFC 9112 6.1: a server that does not understand a transfer coding answers 501.
    The connection is closed after it: what the client sends next cannot be trusted to be framed."""
    given = ",".join(request.headers.getall("Transfer-Encoding", []))
    codings = [coding.strip(" \t").lower() for coding in given.split(",") if coding.strip(" \t")]
    if any(coding != "chunked" for coding in codings):
        text = (
            f"Transfer-Encoding {given[:60]!r}: only chunked is taken (RFC 9112 6.1): send the body chunked "
            "alone, or with a Content-Length"
        )
        response = web.json_response({"error": text, "field": "Transfer-Encoding"}, status=501)
        response.force_close()
        return response
    return await handler(request)
