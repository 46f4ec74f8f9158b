"""What a webhook that cannot be reached is said to have done, in the records and replies an
operator reads: where Pigeon could not connect, and why, in plain words (not aiohttp's
"ssl:default" for a plain http URL, nor the address twice)."""

from __future__ import annotations

import smtplib
from pathlib import Path

from tests.support.ports import free_port
from tests.support.process import PigeonProcess


def test_a_webhook_nobody_listens_at_is_said_to_refuse_the_connection_in_plain_words(tmp_path: Path) -> None:
    dead = free_port()
    url = f"http://127.0.0.1:{dead}/json"
    node = PigeonProcess(
        tmp_path / "p",
        delivery={"enabled": True, "retry_interval": "1s"},
        target=[{"name": "hook", "kind": "webhook", "url": url}],
        inbound=[{"recipient": "support@app.example", "target": "hook"}],
    )
    with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        client.sendmail("customer@example.com", ["support@app.example"], b"Subject: x\r\n\r\nhello\r\n")
        (failure, *_) = node.wait_records("TransientFailure", 1, timeout=20)
    text = failure["response"]["text"]
    assert text == f"hook: {url}: cannot connect to 127.0.0.1:{dead}: Connection refused", text
