"""The HTTP listener: health and Prometheus metrics, and how it answers as HTTP."""

from __future__ import annotations

import http.client
import json
import smtplib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

READER = "reader-token-0123456789"


def test_healthz_reports_the_node(pigeon: PigeonProcess) -> None:
    status, body = pigeon.http_get("/healthz")
    assert status == 200
    health = json.loads(body)
    assert health["status"] == "ok"
    assert health["node"] == "test-node"
    assert health["spool"] == {"status": "ok", "messages": 0}
    assert health["log"]["status"] == "ok"


def test_metrics_count_what_happened(pigeon: PigeonProcess) -> None:
    body = b"From: a@example.org\r\nSubject: m\r\n\r\n" + (b"x" * 98 + b"\r\n") * 10
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail("a@example.org", ["b@example.net", "c@other.test"], body)
        client.docmd("MAIL FROM:<bad address>")
    assert pigeon.metric("pigeon_messages_received_total") == 2
    assert pigeon.metric("pigeon_spool_messages") == 2
    assert pigeon.metric("pigeon_bytes_received_total") > len(body)
    assert pigeon.metric("pigeon_spool_commit_batch_size_count") >= 1
    assert pigeon.metric("pigeon_spool_commit_seconds_count") >= 1
    _, text = pigeon.http_get("/metrics")
    assert b'pigeon_rejections_total{code="501",command="MAIL"} 1.0' in text
    assert b'pigeon_receptions_total{listener="smtp"} 1.0' in text


def _ask(node: PigeonProcess, method: str, path: str) -> tuple[int, Any]:
    return node.http_call(method, path, token=node.local_token)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_unknown_api_path_or_method_gets_a_json_error_that_says_what_to_do(tmp_path: Path, workers: int) -> None:
    # With two workers the supervisor passes the answers on (an admin path's from every worker).
    with PigeonProcess(tmp_path / "node", node={"name": "n", "workers": workers}) as node:
        status, answer = _ask(node, "POST", "/api/v1/shaping/effects")
        error = "POST is not allowed on /api/v1/shaping/effects; use GET, HEAD"
        assert (status, answer) == (405, {"error": error, "field": None})
        status, answer = _ask(node, "PUT", "/api/v1/admin/suspend")
        assert status == 405 and "use GET, HEAD, POST" in answer["error"], answer
        status, answer = _ask(node, "GET", "/api/v1/shaping/effect")
        assert status == 404, answer
        assert answer["error"] == "no endpoint at /api/v1/shaping/effect; the API is described at /api/openapi.json"


# --- HTTP conformance: what every answer of the API is, whichever front (a worker, or the
# supervisor of two) gives it.


@pytest.fixture(scope="module", params=[1, 2], ids=["one-worker", "two-workers"])
def api_node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """A node with mail deferred for an hour: its queues list something."""
    with ScriptedSink() as sink:
        root = tmp_path_factory.mktemp("conformance") / "node"
        config = delivery_config(sink.endpoint, retry_interval="1h")
        http = {"token": [{"name": "reader", "token": READER, "scopes": ["read"]}]}
        with PigeonProcess(root, node={"workers": request.param}, http=http, **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                for n in range(3):
                    client.sendmail(
                        "a@example.org",
                        ["tempfail@example.net"],
                        f"From: a@example.org\r\nSubject: {n}\r\n\r\nhi\r\n".encode(),
                    )
            pigeon.wait_records("TransientFailure", 3)
            yield pigeon


def _exchange(
    node: PigeonProcess, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request as given (no header added but Host and Content-Length): status, headers, body."""
    connection = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def _raw_exchange(node: PigeonProcess, request: bytes) -> bytes:
    """Bytes the client library would not send as they are: the whole answer, until the close."""
    with socket.create_connection(("127.0.0.1", node.http_port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def _token(node: PigeonProcess) -> dict[str, str]:
    return {"Authorization": f"Bearer {node.local_token}"}


def _json_error(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    assert headers["Content-Type"].startswith("application/json"), (headers, body)
    answer = json.loads(body)
    assert isinstance(answer, dict) and isinstance(answer["error"], str) and set(answer) == {"error", "field"}
    return answer


@pytest.mark.parametrize(
    ("method", "path", "token", "status", "field"),
    [
        ("GET", "/api/v1/queues", None, 401, "Authorization"),
        ("GET", "/api/v1/queues", "wrong-token-0123456789", 401, "Authorization"),
        ("POST", "/api/v1/admin/retry", READER, 403, "Authorization"),
        ("GET", "/api/v1/nothing", "local", 404, None),
        ("PUT", "/api/v1/queues", "local", 405, None),
        ("GET", "/api/v1/messages/0123456789abcdef", "local", 404, "id"),
        ("DELETE", "/api/v1/admin/suspend/no-such-rule", "local", 404, "id"),
        ("DELETE", "/api/v1/shaping/effects/no-such-effect", "local", 404, "id"),
        ("GET", "/api/v1/queues?colour=red", "local", 400, "colour"),
    ],
)
def test_every_api_error_has_an_error_and_a_field_naming_what_is_at_fault_or_null(
    api_node: PigeonProcess, method: str, path: str, token: str | None, status: int, field: str | None
) -> None:
    """README: every error is `{"error": ..., "field": ...}`, whoever finds it: a token
    refused names the Authorization header, an unknown id its path parameter; a path or method
    the API lacks names no one part of the request (null)."""
    secret = api_node.local_token if token == "local" else token
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    got, answer_headers, body = _exchange(api_node, method, path, headers=headers)
    assert got == status, body
    answer = json.loads(body)
    assert answer_headers["Content-Type"].startswith("application/json")
    assert isinstance(answer["error"], str) and answer["error"], answer
    assert "field" in answer and answer["field"] == field, answer


@pytest.mark.parametrize(
    "path", ["/api/v1/queues", "/api/v1/admin/suspend", "/api/openapi.json", "/api/v1/shaping/effects"]
)
def test_head_answers_with_the_headers_the_get_would_have(api_node: PigeonProcess, path: str) -> None:
    status, headers, body = _exchange(api_node, "GET", path, headers=_token(api_node))
    assert status == 200 and int(headers["Content-Length"]) == len(body), (status, body)
    head_status, head_headers, head_body = _exchange(api_node, "HEAD", path, headers=_token(api_node))
    assert (head_status, head_body) == (200, b"")
    assert head_headers["Content-Length"] == headers["Content-Length"]  # not a 34-byte error's
    assert head_headers["Content-Type"] == headers["Content-Type"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("OPTIONS", "/api/openapi.json", "GET,HEAD"),
        ("PUT", "/api/v1/queues", "GET,HEAD"),
        ("DELETE", "/api/v1/admin/retry", "POST"),
        ("PATCH", "/api/v1/admin/bounce/abc", "DELETE"),
        ("POST", "/api/v1/messages/0123456789abcdef", "GET,HEAD"),
    ],
)
def test_an_undeclared_method_gets_405_with_allow_before_any_token_is_asked_for(
    api_node: PigeonProcess, method: str, path: str, allowed: str
) -> None:
    for headers in ({}, _token(api_node)):  # no token: still 405, not 401
        status, answer_headers, body = _exchange(api_node, method, path, headers=headers)
        assert status == 405, (headers, body)
        assert answer_headers["Allow"] == allowed
        assert f"{method} is not allowed on {path}" in _json_error(answer_headers, body)["error"]


@pytest.mark.parametrize("path", ["/api/v1/queues", "/api/v1/admin/suspend"])
def test_two_authorization_headers_are_refused_whichever_comes_first(api_node: PigeonProcess, path: str) -> None:
    good = f"Bearer {api_node.local_token}"
    for first, second in ((good, "Bearer wrong"), ("Bearer wrong", good), (good, good)):
        request = (
            f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {first}\r\nAuthorization: {second}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        answer = _raw_exchange(api_node, request)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == b"400", answer
        assert "one Authorization header" in json.loads(body)["error"]


def test_an_error_from_the_router_or_the_http_parser_is_json_too(api_node: PigeonProcess) -> None:
    # A path segment with a line feed in it: not a spool id (the supervisor's router did not
    # know the path at all, and said "404: Not Found" in text).
    status, headers, body = _exchange(api_node, "GET", "/api/v1/messages/0%0A1", headers=_token(api_node))
    assert status in (400, 404) and _json_error(headers, body)
    status, headers, body = _exchange(api_node, "GET", "/api/v1/nothing%0Ahere", headers=_token(api_node))
    assert status == 404 and "no endpoint at" in _json_error(headers, body)["error"]
    # Content-Length and Transfer-Encoding at once: refused by aiohttp's parser, before any handler.
    request = (
        b"POST /api/v1/admin/retry HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    answer = _raw_exchange(api_node, request)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].split(b" ")[1] == b"400", answer
    assert b"content-type: application/json" in head.lower(), answer
    assert "Transfer-Encoding" in json.loads(body)["error"]


@pytest.mark.parametrize(
    "content_type",
    [None, "application/x-www-form-urlencoded", "text/plain", "application/json; charset=latin-1", "text/json"],
)
@pytest.mark.parametrize("path", ["/api/v1/inject", "/api/v1/admin/suspend"])
def test_a_body_not_declared_json_is_refused_with_415_naming_the_header(
    api_node: PigeonProcess, path: str, content_type: str | None
) -> None:
    body = json.dumps({"domain": "example.net"} if "admin" in path else _INJECTION).encode()
    headers = _token(api_node) | ({"Content-Type": content_type} if content_type else {})
    status, answer_headers, answer = _exchange(api_node, "POST", path, body, headers)
    assert status == 415, answer
    assert _json_error(answer_headers, answer)["field"] == "Content-Type"
    assert _ask(api_node, "GET", "/api/v1/admin/suspend")[1]["rules"] == []  # nothing done


def test_a_body_declared_json_with_a_utf8_charset_is_taken(api_node: PigeonProcess) -> None:
    headers = _token(api_node) | {"Content-Type": "application/json; charset=UTF-8"}
    status, _, answer = _exchange(api_node, "POST", "/api/v1/admin/retry", b'{"domain": "none.test"}', headers)
    assert status == 200, answer
    status, _, answer = _exchange(api_node, "POST", "/api/v1/inject", json.dumps(_INJECTION).encode(), headers)
    assert status == 200, answer


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/admin/suspend", b'{"domain": "example.net", "domain": "example.org"}', "$.domain"),
        ("/api/v1/admin/bounce", b'{"queue": "*", "reason": "a", "duration": "1h", "reason": "b"}', "$.reason"),
        (
            "/api/v1/inject",
            b'{"envelope_sender": "a@example.org", "recipients": [{"email": "b@example.net",'
            b' "metadata": {"k": 1, "k": 2}}], "content": "From: a@example.org\\r\\nSubject: x\\r\\n\\r\\nhi\\r\\n"}',
            "$.recipients[0].metadata.k",
        ),
    ],
)
def test_a_member_named_twice_is_refused_naming_it(api_node: PigeonProcess, path: str, body: bytes, field: str) -> None:
    status, answer = api_node.http_post(path, None, api_node.local_token, raw=body)
    assert (status, answer["field"]) == (400, field), answer
    assert "twice" in answer["error"]
    assert _ask(api_node, "GET", "/api/v1/admin/suspend")[1]["rules"] == []
    assert _ask(api_node, "GET", "/api/v1/admin/bounce")[1]["rules"] == []


@pytest.mark.parametrize("path", ["/api/v1/inject", "/api/v1/admin/suspend"])
def test_malformed_json_is_refused_naming_the_body_as_the_field(api_node: PigeonProcess, path: str) -> None:
    status, answer = api_node.http_post(path, None, api_node.local_token, raw=b"{bad")
    assert (status, answer.get("field")) == (400, "$"), answer
    assert answer["error"].startswith("malformed JSON")


_RAW = b'"From: a@example.org\\r\\nSubject: \\ud800\\r\\n\\r\\nhi\\r\\n"'
_ENVELOPE = b'"envelope_sender": "a@example.org", "recipients": [{"email": "b@example.net"}]'


@pytest.mark.parametrize(
    ("path", "body", "field", "what"),
    [
        ("/api/v1/inject", b"{" + _ENVELOPE + b', "template": false, "content": ' + _RAW + b"}", "$.content", None),
        ("/api/v1/inject", b"{" + _ENVELOPE + b', "template": true, "content": ' + _RAW + b"}", "$.content", None),
        (
            "/api/v1/inject",
            b"{" + _ENVELOPE + b', "content": {"from": {"email": "a@example.org"}, "subject": "\\ud800"}}',
            "$.content.subject",
            None,
        ),
        (  # a high half followed by no low half, but by another escape
            "/api/v1/inject",
            b"{" + _ENVELOPE + b', "substitutions": {"code": "\\ud800\\u0041"}, "content": ' + _RAW + b"}",
            "$.substitutions.code",
            None,
        ),
        (
            "/api/v1/inject",
            b'{"envelope_sender": "a@example.org", "recipients": [{"email": "b@example.net", "metadata":'
            b' {"\\udc00": "x"}}], "content": ' + _RAW + b"}",
            "$.recipients[0].metadata",
            "a member name in $.recipients[0].metadata",
        ),
        ("/api/v1/admin/suspend", b'{"domain": "\\udc00x.example"}', "$.domain", None),
    ],
)
def test_a_lone_surrogate_escape_is_refused_naming_its_path_not_as_truncated_json(
    api_node: PigeonProcess, path: str, body: bytes, field: str, what: str | None
) -> None:
    status, answer = api_node.http_post(path, None, api_node.local_token, raw=body)
    assert (status, answer["field"]) == (400, field), answer
    assert answer["error"].startswith(f"{what or field} holds a lone surrogate"), answer
    assert "not valid Unicode text" in answer["error"]
    assert _ask(api_node, "GET", "/api/v1/admin/suspend")[1]["rules"] == []


_INJECTION = {
    "envelope_sender": "app@example.org",
    "recipients": [{"email": "tempfail@example.net"}],
    "content": "From: a@example.org\r\nSubject: x\r\n\r\nhi\r\n",
}
