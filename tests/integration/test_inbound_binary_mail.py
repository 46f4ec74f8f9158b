"""Mail that is not UTF-8 (8-bit text in another charset) reaches the targets that carry it in
JSON (a Sidekiq job, a JSON webhook, a log line) as base64, marked `"raw_encoding": "base64"`,
where the README says: an application that reads the README decodes it right."""

from __future__ import annotations

import base64
import json
import smtplib
from pathlib import Path
from typing import Any

from tests.support.apps import WebhookApp, webhook_target
from tests.support.process import ROOT, PigeonProcess
from tests.support.services import RedisServer
from tests.support.sinks import wait_until

LATIN1 = b"From: client@example.com\r\nSubject: caf\xe9\r\n\r\nVoil\xe0 ma question.\r\n"


def _raw_of(raw: str, meta: dict[str, Any]) -> bytes:
    """The message as the README says an application decodes it."""
    return base64.b64decode(raw) if meta.get("raw_encoding") == "base64" else raw.encode()


def test_mail_that_is_not_utf8_reaches_json_targets_as_base64_marked_as_the_readme_says(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    with WebhookApp() as app:
        node = PigeonProcess(
            tmp_path / "p",
            smtp={"relay_networks": ["192.0.2.0/24"]},
            delivery={"enabled": True, "retry_interval": "1s"},
            target=[
                {"name": "jobs", "kind": "sidekiq", "redis_url": redis_server.url, "queue": "mail"},
                webhook_target(app, format="json"),
                {"name": "audit", "kind": "log", "path": str(tmp_path / "inbound.jsonl")},
            ],
            inbound=[
                {"domain": "jobs.example", "target": "jobs"},
                {"domain": "hook.example", "target": "hook"},
                {"domain": "audit.example", "target": "audit"},
            ],
        )
        with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            to = ["a@jobs.example", "a@hook.example", "a@audit.example"]
            client.sendmail("client@example.com", to, LATIN1, mail_options=["BODY=8BITMIME"])
            node.wait_records("Delivery", 3, timeout=20)
            redis = redis_server.client()
            (job,) = [json.loads(j) for j in redis.lrange("queue:mail", 0, -1)]
            redis.close()
            (hook,) = [json.loads(b) for b in app.bodies.values()]
        (line,) = [json.loads(x) for x in wait_until(lambda: (tmp_path / "inbound.jsonl").read_bytes(), 5).splitlines()]
    raw, meta = job["args"]
    assert meta["raw_encoding"] == "base64" and _raw_of(raw, meta).endswith(LATIN1)
    for payload in (hook, line):
        assert payload["raw_encoding"] == "base64" and _raw_of(payload["raw"], payload).endswith(LATIN1)


def test_the_readme_says_where_each_target_marks_a_base64_message() -> None:
    readme = (ROOT / "README.md").read_text()
    inbound = readme[readme.index("## Inbound routing") : readme.index("## Event log")]
    paragraph = next(p for p in inbound.split("\n\n") if '"raw_encoding": "base64"' in p)
    for where in ("Sidekiq", "`args[1]`", "JSON webhook", "log", "UTF-8"):
        assert where in paragraph, where
