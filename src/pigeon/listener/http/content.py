"""One message's stored bytes, for an operator (Postfix's `postcat -q`):

    GET /api/v1/messages/{id}/content    the whole message, message/rfc822       read
    GET /api/v1/messages/{id}/headers    its header section, text/rfc822-headers  read

What is served is the message as stored: the bytes that leave, before the edits made as they
leave (`pigeon.delivery.content.render`): the tenant and campaign headers taken off, the
policy's header edits, a submission's added Date and Message-ID, the DKIM signatures on top.
The header section is its fields, each ending CRLF, without the empty line after them.

Found, and refused, as `GET /api/v1/messages/{id}` finds and refuses it (`admin.inspect`): the
same `read` scope, and another tenant's message is 404, word for word as one that is not there.
A large body (a file in the spool, past `[spool] inline_limit`) is sent in pieces as it is read,
never held whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import email.policy
import os
from typing import Any, BinaryIO, Final

from aiohttp import web

from pigeon.config.schema import Config
from pigeon.listener.http import tenancy
from pigeon.listener.http.context import NODE_KEY
from pigeon.listener.http.inject import bad_request
from pigeon.message import parse_id
from pigeon.queue.admin import Admin
from pigeon.spool.spool import SpoolError

CONTENT_PATH: Final = "/api/v1/messages/{id}/content"
HEADERS_PATH: Final = "/api/v1/messages/{id}/headers"
CHUNK: Final = 64 * 1024
SUBJECT_FROM: Final = 64 * 1024
"""The bytes of a message's start its Subject is looked for in (`subject`): a header section's
first fields; the intake keeps as much of it for the policy (`header_section.KEPT`)."""


def no_message_here(config: Config, given: str) -> web.Response:
    """404 for a message this node does not hold; with [redis], pointing at the cluster: the
    message may be on another node, which a write by id found (and named: `node`), and only
    that node's API shows it."""
    text = f"no message {given} here"
    if config.redis.url is not None:
        text += (
            f" (node {config.node.name}); another node of the cluster may hold it: ask that node "
            f"(`pigeon inspect {given[:16]} --url http://HOST:PORT`); a write by id (`pigeon hold|bounce|retry --id`) "
            "names the node that holds each message it finds"
        )
    return web.json_response({"error": text, "field": "id"}, status=404)


async def content(request: web.Request) -> web.StreamResponse:
    """The whole stored message, as message/rfc822."""
    return await _stored(request, headers_only=False)


async def headers(request: web.Request) -> web.StreamResponse:
    """The stored message's header section, as text/rfc822-headers (RFC 6522)."""
    return await _stored(request, headers_only=True)


async def _stored(request: web.Request, *, headers_only: bool) -> web.StreamResponse:
    node = request.app[NODE_KEY]
    tenants = node.tokens.binding(node.tokens.holder(request, "read"))
    admin = node.reader
    if admin is None:
        raise web.HTTPServiceUnavailable(
            text='{"error": "this node has no spool to read"}', content_type="application/json"
        )
    if request.query:
        name = next(iter(request.query))[:40]
        raise bad_request(f"unknown query parameter {name!r}: it takes none", name)
    try:
        spool_id = parse_id(request.match_info["id"])
    except ValueError as error:
        raise bad_request(str(error), "id") from None
    found = admin.inspect(spool_id, tenants)  # (another tenant's: None, before its row is read)
    source: bytes | BinaryIO | None = None
    if found is not None and (tenants is None or tenancy.owns_message(tenants, found)):
        with contextlib.suppress(SpoolError):  # delivered meanwhile (its body gone): not here
            source = admin.stored_content(spool_id)
    if source is None:
        # As `admin.inspect` answers: another tenant's message is none, word for word.
        return no_message_here(node.config, request.match_info["id"])
    kind = "text/rfc822-headers" if headers_only else "message/rfc822"
    if isinstance(source, bytes):
        body = header_section(source) if headers_only else source
        return web.Response(body=body, headers={"Content-Type": kind})
    try:
        response = web.StreamResponse(headers={"Content-Type": kind})
        if not headers_only:
            response.content_length = os.fstat(source.fileno()).st_size
        await response.prepare(request)
        if request.method != "HEAD":  # (aiohttp leaves out a Response's body, not what is written)
            await (_send_header_section if headers_only else _send)(source, response)
        await response.write_eof()
        return response
    finally:
        source.close()


async def _send(file: BinaryIO, response: web.StreamResponse) -> None:
    while chunk := await asyncio.to_thread(file.read, CHUNK):
        await response.write(chunk)


async def _send_header_section(file: BinaryIO, response: web.StreamResponse) -> None:
    """The fields up to the empty line, read in pieces: a header section may be megabytes."""
    held = b""  # the last bytes read, which may begin the empty line: sent once the next piece tells
    first = True
    while chunk := await asyncio.to_thread(file.read, CHUNK):
        window = held + chunk
        if first and window.startswith(b"\r\n"):
            return  # no header section at all
        first = False
        end = window.find(b"\r\n\r\n")
        if end >= 0:
            await response.write(window[: end + 2])
            return
        await response.write(window[:-3])
        held = window[-3:]
    await response.write(held)  # all header, no body


def header_section(message: bytes) -> bytes:
    """`message`'s header fields, each with its CRLF, without the empty line that ends them."""
    if message.startswith(b"\r\n"):
        return b""
    end = message.find(b"\r\n\r\n")
    return message if end < 0 else message[: end + 2]


def subject(admin: Admin, spool_id: int) -> str | None:
    """A message's Subject, decoded (RFC 2047 encoded words, folding), as `pigeon inspect` shows
    it; None without one, or one past the message's first `SUBJECT_FROM` bytes."""
    try:
        source = admin.stored_content(spool_id)
    except SpoolError:
        return None
    if source is None:
        return None
    if isinstance(source, bytes):
        start = source[:SUBJECT_FROM]
    else:
        with source:
            start = source.read(SUBJECT_FROM)
    return subject_in(header_section(start))


def subject_in(head: bytes) -> str | None:
    """The first Subject field's value in a header section, decoded; None if there is none."""
    text = head.decode("utf-8", "replace")  # (8-bit fields are SMTPUTF8's UTF-8, or garbage)
    try:
        found: Any = email.parser.HeaderParser(policy=email.policy.default).parsestr(text).get("subject")
        return None if found is None else str(found)  # (str(): its decoded, unfolded text)
    except Exception:  # email's header classes raise on what they cannot fold: shown as it is
        for line in text.split("\r\n"):
            name, colon, value = line.partition(":")
            if colon and name.strip().lower() == "subject":
                return value.strip()
        return None
