"""The HTTP listener's errors are JSON whoever makes them: an exception no handler caught (500)
and a request aiohttp's parser refuses before any handler runs (400) too, which aiohttp answers
in text/plain by itself (`pigeon.listener.http.errors`). Each has `error` and `field`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from pigeon.listener.http.errors import JsonErrorsRunner, json_errors
from tests.support.ports import HOST, free_port


async def _broken(request: web.Request) -> web.Response:
    raise RuntimeError("a bug")


async def _busy(request: web.Request) -> web.Response:
    return web.json_response({"error": "busy: try again shortly", "retry": 1}, status=503)


async def _down(request: web.Request) -> web.Response:
    return web.json_response({"status": "down", "error": "the spool is full"}, status=503)


@pytest.fixture
async def port() -> AsyncIterator[int]:
    app = web.Application(middlewares=[json_errors])
    app.router.add_get("/broken", _broken)
    app.router.add_get("/api/busy", _busy)
    app.router.add_get("/healthz", _down)
    runner = JsonErrorsRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    chosen = free_port()
    await web.TCPSite(runner, HOST, chosen).start()
    try:
        yield chosen
    finally:
        await runner.cleanup()


async def _exchange(port: int, request: bytes) -> tuple[int, str, dict[str, str]]:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(request)
    answer = await reader.read()  # each of these answers closes the connection
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers["Content-Type"], json.loads(body)


async def test_an_exception_no_handler_caught_is_a_json_500(port: int, caplog: pytest.LogCaptureFixture) -> None:
    status, content_type, answer = await _exchange(port, b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, content_type) == (500, "application/json; charset=utf-8")
    assert answer == {"error": "internal error: the node's log says what went wrong", "field": None}
    assert "a bug" in caplog.text  # aiohttp still logs the traceback


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"GET /x\x01y HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
async def test_a_request_the_parser_refuses_is_a_json_400(port: int, request_bytes: bytes) -> None:
    status, content_type, answer = await _exchange(port, request_bytes)
    assert (status, content_type) == (400, "application/json; charset=utf-8")
    assert set(answer) == {"error", "field"} and answer["error"] and "\n" not in answer["error"]


async def test_an_api_error_made_without_a_field_gets_a_null_one_and_healthz_is_left_alone(port: int) -> None:
    """README: every API error has `error` and `field`, whoever made it; /healthz's 503 is a
    state, not a refusal."""
    status, _, answer = await _exchange(port, b"GET /api/busy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (status, answer) == (503, {"error": "busy: try again shortly", "field": None, "retry": 1})
    status, _, answer = await _exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (status, answer) == (503, {"status": "down", "error": "the spool is full"})
