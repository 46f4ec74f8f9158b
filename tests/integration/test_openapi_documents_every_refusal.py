"""What a client of `POST /api/v1/inject` meets on a node of two workers, beyond what fuzzing
reaches, is in the OpenAPI document, with a schema its body matches: the 503 of a busy node
(`{"error", "field": null}` with Retry-After, where the document said an InjectResponse, which a
generated client then failed to parse), the 502 of a worker gone mid-request (`outcome_unknown`),
the listener's 408 for slow headers and the 501 of a transfer coding it does not take."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from tests.support.process import PigeonProcess

TOKEN = "document-token-0123456789"
INJECTION = json.dumps(
    {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "rcpt@example.net"}],
        "template": False,
        "content": "From: app@example.org\r\nSubject: x\r\n\r\nhello\r\n",
    }
).encode()


def _head(length: int | None = None, *more: str) -> bytes:
    lines = ["POST /api/v1/inject HTTP/1.1", "Host: x", f"Authorization: Bearer {TOKEN}"]
    lines += ["Content-Type: application/json", "Connection: close", *more]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *fields = head.decode().split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (f.partition(":") for f in fields)}
    return int(status_line.split()[1]), headers, json.loads(body)


def _connect(node: PigeonProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", node.http_port), timeout=30)


def _documented(document: dict[str, Any], status: int, answer: Any) -> dict[str, Any]:
    """The document's response for `status` of the injection, once `answer` matches its schema."""
    import jsonschema_rs  # schemathesis's own validator, installed with it

    responses = document["paths"]["/api/v1/inject"]["post"]["responses"]
    assert str(status) in responses, (status, sorted(responses))
    schema = responses[str(status)]["content"]["application/json"]["schema"]
    validator = jsonschema_rs.validator_for({"components": document["components"], **schema})
    errors = [f"{e.instance_path}: {e.message}" for e in validator.iter_errors(answer)]
    assert not errors, (status, answer, errors)
    return dict(responses[str(status)])


def test_the_refusals_of_an_injection_are_in_the_openapi_document(tmp_path: Path) -> None:
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    http = {"token": tokens, "max_open_requests": 1, "header_timeout": "1s"}
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, http=http) as node:
        document = json.loads(node.http_get("/api/openapi.json")[1])

        # Busy: the one request it may hold is still sending its body.
        with closing(_connect(node)) as held:
            held.sendall(_head(len(INJECTION)) + INJECTION[:10])
            time.sleep(0.3)
            with closing(_connect(node)) as sock:
                sock.sendall(_head(len(INJECTION)) + INJECTION)
                status, headers, answer = _answer(sock)
        assert status == 503 and answer["field"] is None, answer
        assert "[http] max_open_requests" in answer["error"]
        busy = _documented(document, 503, answer)
        assert headers["retry-after"] == "1" and "Retry-After" in busy["headers"]

        # Headers too slow: the listener's own answer.
        with closing(_connect(node)) as sock:
            sock.sendall(_head(None)[:40])
            status, _, answer = _answer(sock)
        assert status == 408, answer
        _documented(document, 408, answer)

        with closing(_connect(node)) as sock:
            chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(INJECTION), INJECTION)
            sock.sendall(_head(None, "Transfer-Encoding: gzip, chunked") + chunked)
            status, _, answer = _answer(sock)
        assert status == 501, answer
        _documented(document, 501, answer)

        # A worker gone once it had the request: both stopped, so whichever took it holds it unanswered.
        pids = node.shard_owners()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        answers: list[tuple[int, dict[str, str], Any]] = []
        with closing(_connect(node)) as sock:
            sock.sendall(_head(len(INJECTION)) + INJECTION)
            reading = threading.Thread(target=lambda: answers.append(_answer(sock)))
            reading.start()
            time.sleep(0.5)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            reading.join(30)
        ((status, _, answer),) = answers
        assert status == 502 and answer["outcome_unknown"] is True, answer
        _documented(document, 502, answer)
