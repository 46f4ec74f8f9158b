"""The HTTP listener: health and Prometheus metrics."""

from __future__ import annotations

import json
import smtplib
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess


def test_healthz_reports_the_node(pigeon: PigeonProcess) -> None:
    status, body = pigeon.http_get("/healthz")
    assert status == 200
    health = json.loads(body)
    assert health["status"] == "ok"
    assert health["node"] == "test-node"
    assert health["spool"] == {"status": "ok", "messages": 0}
    assert health["log"]["status"] == "ok"


def test_metrics_count_what_happened(pigeon: PigeonProcess) -> None:
    body = b"Subject: m\r\n\r\n" + (b"x" * 98 + b"\r\n") * 10
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
        assert (status, answer) == (405, {"error": "POST is not allowed on /api/v1/shaping/effects; use GET, HEAD"})
        status, answer = _ask(node, "PUT", "/api/v1/admin/suspend")
        assert status == 405 and "use GET, HEAD, POST" in answer["error"], answer
        status, answer = _ask(node, "GET", "/api/v1/shaping/effect")
        assert status == 404, answer
        assert answer["error"] == "no endpoint at /api/v1/shaping/effect; the API is described at /api/openapi.json"
