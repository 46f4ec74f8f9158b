"""A request aiohttp's parser refuses is the client's fault: it gets its JSON 400, and the log a
one-line WARNING, at most once a minute per kind, never an ERROR with a traceback, which any
client without a token could repeat to flood the log."""

from __future__ import annotations

import socket

from tests.support.process import PigeonProcess

_TWO_LENGTHS = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
_LENGTH_AND_CHUNKED = b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
_SPACE_BEFORE_COLON = b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization : Bearer x\r\n\r\n"


def _send(pigeon: PigeonProcess, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", pigeon.http_port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_a_malformed_request_is_one_warning_line_per_kind_not_a_traceback(pigeon: PigeonProcess) -> None:
    for request in (_TWO_LENGTHS, _LENGTH_AND_CHUNKED, _SPACE_BEFORE_COLON):
        for _ in range(5):
            answer = _send(pigeon, request)
            assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
            assert b'"field": null' in answer
    pigeon.wait_stderr("http: malformed request from 127.0.0.1 refused (400): ", 3)
    stderr = pigeon.stderr()
    assert "Traceback" not in stderr and "ERROR" not in stderr, stderr
    warnings = [line for line in stderr.splitlines() if "malformed request" in line]
    assert len(warnings) == 3, warnings  # one per kind, though each came five times
    assert all(line.startswith("WARNING ") or " WARNING " in line for line in warnings), warnings
    assert any("Content-Length" in line for line in warnings), warnings
