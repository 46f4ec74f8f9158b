"""The HTTP listener: health and Prometheus metrics."""

from __future__ import annotations

import json
import smtplib

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
