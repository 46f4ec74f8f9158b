"""SMTP mail for an `[[inbound]]` route waits in the spool while its target fails: /healthz
says so under `targets`, naming what the target answered, until a handoff works. Never
"down": the mail is kept and retried, and the SMTP listener must stay in service."""

from __future__ import annotations

import json
import smtplib
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.apps import WebhookApp, customer_mail, webhook_target
from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until


def _health(node: PigeonProcess) -> tuple[int, dict[str, Any]]:
    status, body = node.http_get("/healthz")
    return status, json.loads(body)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_route_target_makes_healthz_degraded_until_mail_goes_in(tmp_path: Path, workers: int) -> None:
    with WebhookApp() as app:
        app.fail_until = time.time() + 3600
        node = PigeonProcess(
            tmp_path / "p",
            node={"name": "test-node", "workers": workers, "shutdown_timeout": "10s"},
            delivery={"enabled": True, "retry_interval": "200ms"},
            target=[webhook_target(app)],
            inbound=[{"recipient": "reply+*@app.example", "target": "hook"}],
        )
        with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            wait_until(lambda: _health(node)[0] == 200, timeout=15)
            assert _health(node)[1]["targets"]["hook"] == {"status": "ok", "error": None}
            client.sendmail("customer@example.com", ["reply+1@app.example"], customer_mail(1))
            wait_until(lambda: _health(node)[1]["targets"]["hook"]["status"] == "degraded", timeout=15)
            code, health = _health(node)
            assert code == 200  # degraded, not down: the listener stays in service
            assert health["status"] == "degraded"
            assert "500" in health["targets"]["hook"]["error"]
            app.fail_until = 0.0
            wait_until(lambda: sum(app.accepted.values()) == 1, timeout=15)
            wait_until(lambda: _health(node)[1]["targets"]["hook"]["status"] == "ok", timeout=15)
            assert _health(node)[1]["status"] == "ok"


def test_a_node_without_inbound_routes_says_nothing_of_targets(tmp_path: Path) -> None:
    with (
        WebhookApp() as app,
        PigeonProcess(tmp_path / "p", delivery={"enabled": True}, target=[webhook_target(app)]) as node,
    ):
        wait_until(lambda: _health(node)[0] == 200, timeout=15)
        assert "targets" not in _health(node)[1]
