"""A request body in a content coding (`Content-Encoding: gzip` or `deflate`) is decoded as it is
read, `[http] max_request_size` bounding the decoded body; a body not coded as it says is the
client's mistake, a 400 naming `Content-Encoding` (an injection's logged as a `Rejection`), where
it was a 500 and three chained tracebacks (zlib.error, ContentEncodingError, RequestPayloadError)
in the log. A coding no decoder here takes (br, compress, ...) is 415 with `Accept-Encoding`, not
a body read as the wrong bytes; a transfer coding other than chunked (`gzip, chunked`, whose gzip
aiohttp dropped) is 501 (RFC 9112 6.1). Through a node's one worker and a supervisor of several."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import delivery_config, wait_until

TOKEN = "codings-token-0123456789"
INJECTION = {
    "envelope_sender": "app@example.org",
    "recipients": [{"email": "rcpt@example.net"}],
    "template": False,
    "content": "From: app@example.org\r\nSubject: coded\r\n\r\nhello\r\n",
}


@pytest.fixture(params=[1, 2], ids=["one-worker", "supervisor"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject", "admin", "read"]}]
    delivery = delivery_config("127.0.0.1:9")  # (admin writes need delivery; nothing answers there)
    with PigeonProcess(
        tmp_path / "node", node={"workers": request.param}, http={"token": tokens}, **delivery
    ) as running:
        yield running


def _post(node: PigeonProcess, path: str, body: bytes, *headers: str) -> tuple[int, dict[str, str], Any]:
    """POST `body` as it is, with these extra header lines and a Content-Length unless one of
    them frames it: the status, the headers (lower-case names) and the JSON answer."""
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Authorization: Bearer {TOKEN}", "Content-Type: application/json"]
    lines += headers
    if not any(h.lower().startswith("transfer-encoding:") for h in headers):
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    with socket.create_connection(("127.0.0.1", node.http_port), timeout=10) as connection:
        connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, content = answer.partition(b"\r\n\r\n")
    status_line, *fields = head.decode().split("\r\n")
    found = {name.strip().lower(): value.strip() for name, _, value in (f.partition(":") for f in fields)}
    found[":version"] = status_line.split()[0]  # (no header has that name)
    return int(status_line.split()[1]), found, json.loads(content)


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def test_a_body_not_coded_as_its_content_encoding_says_is_a_400_naming_it_and_logged(node: PigeonProcess) -> None:
    status, _, answer = _post(node, "/api/v1/inject", b"{}", "Content-Encoding: gzip")
    assert (status, answer["field"]) == (400, "Content-Encoding"), answer
    assert answer["error"].startswith("the body is not gzip-coded data as its Content-Encoding says"), answer
    (rejection,) = node.wait_records("Rejection")
    assert (rejection["command"], rejection["auth_user"]) == ("inject", "app")
    assert rejection["response"]["code"] == 400 and "(Content-Encoding)" in rejection["response"]["text"]
    # An admin write alike; and a deflate body found cut short at its end by aiohttp's parser.
    status, _, answer = _post(node, "/api/v1/admin/retry", b"{}", "Content-Encoding: gzip")
    assert (status, answer["field"]) == (400, "Content-Encoding"), answer
    status, _, answer = _post(node, "/api/v1/inject", b"{}", "Content-Encoding: deflate")
    assert (status, answer["field"]) == (400, "Content-Encoding"), answer
    assert answer["error"].startswith("the body is not deflate-coded data as its Content-Encoding says"), answer
    stderr = node.stderr()
    assert "Traceback" not in stderr and " ERROR " not in stderr, stderr


def test_a_gzip_or_deflate_body_is_taken_decoded(node: PigeonProcess) -> None:
    body = json.dumps(INJECTION).encode()
    for coding, coded in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        status, _, answer = _post(node, "/api/v1/inject", coded, f"Content-Encoding: {coding}")
        assert (status, answer["accepted"]) == (200, 1), (coding, answer)
    status, _, answer = _post(
        node, "/api/v1/admin/retry", gzip.compress(b'{"domain": "x.test"}'), "Content-Encoding: gzip"
    )
    assert status == 200, answer


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, gzip"])
def test_a_content_coding_not_taken_is_a_415_saying_which_are(node: PigeonProcess, coding: str) -> None:
    status, headers, answer = _post(
        node, "/api/v1/inject", json.dumps(INJECTION).encode(), f"Content-Encoding: {coding}"
    )
    assert (status, answer["field"]) == (415, "Content-Encoding"), answer
    assert headers["accept-encoding"] == "gzip, deflate"
    assert "send the body as it is, or coded gzip or deflate" in answer["error"], answer
    # Every such coding alike: br and zstd were refused by aiohttp's parser before any handler
    # (an HTTP/1.0 answer, "malformed request" in the log, no Rejection).
    assert headers[":version"] == "HTTP/1.1"
    (rejection,) = node.wait_records("Rejection")
    assert (rejection["command"], rejection["auth_user"], rejection["response"]["code"]) == ("inject", "app", 415)
    assert "malformed request" not in node.stderr()
    assert not node.records("Reception")  # not read as the wrong bytes
    stderr = node.stderr()
    assert "Traceback" not in stderr and " ERROR " not in stderr, stderr


def test_a_transfer_coding_other_than_chunked_is_501_and_nothing_is_taken(node: PigeonProcess) -> None:
    body = _chunked(json.dumps(INJECTION).encode())
    status, headers, answer = _post(node, "/api/v1/inject", body, "Transfer-Encoding: gzip, chunked")
    assert (status, answer["field"]) == (501, "Transfer-Encoding"), answer
    assert answer["error"].startswith("Transfer-Encoding 'gzip, chunked': only chunked is taken (RFC 9112 6.1)")
    assert headers["connection"] == "close"
    status, _, answer = _post(node, "/api/v1/inject", body, "Transfer-Encoding: chunked")
    assert (status, answer["accepted"]) == (200, 1), answer
    assert len(wait_until(lambda: node.records("Reception"))) == 1


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_client_that_sent_a_body_not_coded_as_it_says_gets_its_next_request_answered(
    node: PigeonProcess, coding: str
) -> None:
    # The parser stopped at the bad coding, so the rest of that connection cannot be framed:
    # the 400 closes it, and a keep-alive client's next request goes on a new one (it waited
    # for header_timeout, then got a 408, and the injection was lost).
    connection = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=5)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    connection.request(
        "POST", "/api/v1/inject", json.dumps(INJECTION).encode(), {**headers, "Content-Encoding": coding}
    )
    refused = connection.getresponse()
    assert refused.status == 400 and json.loads(refused.read())["field"] == "Content-Encoding"
    connection.request("POST", "/api/v1/inject", json.dumps(INJECTION).encode(), headers)
    taken = connection.getresponse()
    assert taken.status == 200, taken.read()
    assert json.loads(taken.read())["accepted"] == 1
    connection.close()
    wait_until(lambda: len(node.records("Reception")) == 1, timeout=10)


def test_a_client_gone_before_the_end_of_its_body_leaves_no_error_in_the_log(node: PigeonProcess) -> None:
    head = (
        "POST /api/v1/inject HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{{"
    )
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", node.http_port), timeout=5) as connection:
            connection.sendall(head.encode())
    status, _, answer = _post(node, "/api/v1/inject", json.dumps(INJECTION).encode())
    assert status == 200 and answer["accepted"] == 1  # the node serves on
    time.sleep(0.5)
    assert "Error handling request" not in node.stderr()
    assert "ConnectionResetError" not in node.stderr()


def test_a_coded_body_is_bounded_decoded_by_max_request_size(node: PigeonProcess) -> None:
    """Decoded by Pigeon (no longer by aiohttp's parser), the limit still bounds what it decodes to:
    64 MiB and one octet of zeros, 65 KB of gzip, is refused with a 413 as a plain body of that size is."""
    bomb = gzip.compress(b"\0" * ((64 << 20) + 1))
    for path in ("/api/v1/inject", "/api/v1/admin/retry"):
        status, _, answer = _post(node, path, bomb, "Content-Encoding: gzip")
        assert (status, answer["field"]) == (413, "$"), answer
        assert "[http] max_request_size" in answer["error"], answer
