"""A body over `[http] max_request_size` gets 413 with a JSON error naming the setting, whether
its Content-Length says so or it only grows too big (chunked), from a node with one worker
and through the supervisor of one with two; the connection's next request is unharmed. An
injection's 413 is logged as one Rejection either way."""

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


def _post(
    port: int, token: str, body: bytes | Iterator[bytes], extra: dict[str, str] | None = None
) -> tuple[int, str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", **(extra or {})}
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
        "content": "From: a@example.org\nSubject: x\n\n" + ("x" * 75 + "\n") * (size // 76),
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


@pytest.mark.parametrize("workers", [1, 2])
def test_an_injection_refused_with_413_writes_one_rejection_naming_the_token(tmp_path: Path, workers: int) -> None:
    """A node with several workers finds the body too big in its supervisor, which keeps no
    log: the 413 is logged all the same, as with one worker (README: 400, 413 and 415 each
    write one Rejection)."""
    token = "size-token-0123456789"
    http = {"max_request_size": LIMIT, "token": [{"name": "app", "token": token, "scopes": ["inject"]}]}
    with PigeonProcess(tmp_path / "node", node={"workers": workers}, http=http) as pigeon:
        big = _request_of(2 * LIMIT)
        assert _post(pigeon.http_port, token, big)[0] == 413  # by its Content-Length
        chunks = iter([big[i : i + 8192] for i in range(0, len(big), 8192)])
        assert _post(pigeon.http_port, token, chunks)[0] == 413  # grown too big while read
        rejections = pigeon.wait_records("Rejection", 2)
        assert len(rejections) == 2, rejections
        for record in rejections:
            assert (record["command"], record["auth_user"]) == ("inject", "app"), record
            assert record["response"]["code"] == 413
            assert record["response"]["text"] == f"{ERROR['error']} ($)"
            assert record["peer"].startswith("127.0.0.1:")
        # What only the supervisor may say, a client cannot: its small request is taken.
        status, _, answer = _post(pigeon.http_port, token, _request_of(1000), {"Pigeon-Body-Too-Large": "1"})
        assert (status, answer["accepted"]) == (200, 1), answer
        assert len(pigeon.records("Rejection")) == 2
