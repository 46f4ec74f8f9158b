"""A body over `[http] max_request_size` gets 413 with a JSON error naming the setting, whether
its Content-Length says so or it only grows too big (chunked), from a node with one worker
and through the supervisor of one with two; the connection's next request is unharmed."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess

LIMIT = 64 * 1024
ERROR = {"error": f"request body is over [http] max_request_size ({LIMIT} bytes)", "field": "$"}


def _post(port: int, token: str, body: bytes | Iterator[bytes]) -> tuple[int, str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        chunked = not isinstance(body, bytes)
        connection.request("POST", "/api/v1/inject", body=body, headers=headers, encode_chunked=chunked)
        response = connection.getresponse()
        raw = response.read()
        return response.status, response.getheader("Content-Type", "").split(";")[0], json.loads(raw)
    finally:
        connection.close()


def _request_of(size: int) -> bytes:
    """A valid injection whose JSON is about `size` bytes (the padding is in the message)."""
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "big@example.net"}],
        "content": "Subject: x\n\n" + ("x" * 75 + "\n") * (size // 76),
        "template": False,
    }
    return json.dumps(request).encode()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_body_over_max_request_size_gets_a_json_413_naming_the_setting(tmp_path: Path, workers: int) -> None:
    config = {"node": {"workers": workers}, "http": {"max_request_size": LIMIT}}
    with PigeonProcess(tmp_path / "node", **config) as pigeon:
        token = pigeon.local_token
        big = _request_of(16 * LIMIT)
        assert _post(pigeon.http_port, token, big) == (413, "application/json", ERROR)
        chunks = iter([big[i : i + 8192] for i in range(0, len(big), 8192)])
        assert _post(pigeon.http_port, token, chunks) == (413, "application/json", ERROR)
        assert pigeon.spool_messages() == []
        # Just under the limit is taken.
        under = _request_of(LIMIT - 1500)
        assert LIMIT - 1000 < len(under) <= LIMIT
        status, _, answer = _post(pigeon.http_port, token, under)
        assert status == 200 and answer["accepted"] == 1, answer
        assert len(pigeon.spool_messages()) == 1
