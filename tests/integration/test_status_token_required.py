"""`[http] status_token_required`: /metrics and /healthz's detail only to a `read` token bound to
no tenant.

Customers reach the HTTP listener for the API with tokens bound to their tenants; /metrics and
/healthz on the same listener answered anyone, token or not, with every tenant's queue names
(`spring:acme@tb.test`: tenant and campaign), recipient domains and counts. With the option on,
/metrics is 401 without a token and 403 for a token bound to tenants (or without `read`), and
/healthz answers everyone its status and code but its components to the operator's token alone.
Off (the default), both are open as before. A SIGHUP turns it on and off, through a node's one
worker and a supervisor of several alike.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess, to_toml
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

OPS = "ops-read-0123456789"  # read: bound to no tenant (the operator's Prometheus)
ACME = "acme-read-0123456789"  # read, inject: bound to acme
APP = "app-inject-0123456789"  # inject only, bound to no tenant
TOKENS = [
    {"name": "ops", "token": OPS, "scopes": ["read"]},
    {"name": "acme-read", "token": ACME, "scopes": ["read", "inject"], "tenants": ["acme"]},
    {"name": "app", "token": APP, "scopes": ["inject"]},
]
QUEUE = "spring:acme@tb.test"


def _reload(node: PigeonProcess, required: bool) -> None:
    node.config["http"]["status_token_required"] = required
    node.config_path.write_text(to_toml(node.config))
    assert node.process is not None
    node.process.send_signal(signal.SIGHUP)


def _get(node: PigeonProcess, path: str, token: str | None = None) -> tuple[int, Any]:
    return node.http_call("GET", path, token=token)


@pytest.mark.parametrize("workers", [1, 2])
def test_metrics_and_health_detail_go_to_the_operators_read_token_alone_when_required(
    tmp_path: Path, workers: int
) -> None:
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint, retry_interval="1h")
        http = {"token": TOKENS}
        with PigeonProcess(tmp_path / "node", http=http, node={"workers": workers}, **config) as node:
            status, answer = node.http_post(
                "/api/v1/inject",
                {
                    "envelope_sender": "app@example.org",
                    "campaign": "spring",
                    "template": False,
                    "content": "From: app@example.org\r\nSubject: s\r\n\r\nhello\r\n",
                    "recipients": [{"email": "tempfail@tb.test"}],
                },
                ACME,
            )
            assert (status, answer["accepted"]) == (200, 1), answer
            node.wait_records("TransientFailure", timeout=30)

            # The default: open to anyone, as before.
            status, text = _get(node, "/metrics")
            assert status == 200 and f'queue="{QUEUE}"' in text, text
            status, health = _get(node, "/healthz")
            assert status == 200 and "spool" in health, health

            _reload(node, required=True)
            wait_until(lambda: _get(node, "/metrics")[0] == 401, 15)
            status, refused = _get(node, "/metrics")
            assert (status, refused["field"]) == (401, "Authorization"), refused
            for token, why in (
                (ACME, "token 'acme-read' is bound to tenant acme: /metrics and /healthz's detail show every "
                       "tenant's queues"),
                (APP, "token 'app' lacks the 'read' scope"),
                ("not-a-token-0123456789", "unknown token"),
            ):  # fmt: skip
                status, refused = _get(node, "/metrics", token)
                assert status in (401, 403) and refused["error"].startswith(why), refused
                assert QUEUE not in str(refused)
            status, text = _get(node, "/metrics", OPS)
            assert status == 200 and f'queue="{QUEUE}"' in text, text

            # /healthz: its status and code to anyone (a liveness probe needs no token); the rest
            # to the operator's token alone.
            for token in (None, ACME, APP, "not-a-token-0123456789"):
                status, brief = _get(node, "/healthz", token)
                assert (status, brief["status"]) == (200, "ok"), brief
                assert set(brief) == {"status", "detail"}, brief
                assert "status_token_required" in brief["detail"]
            status, health = _get(node, "/healthz", OPS)
            assert (status, health["status"]) == (200, "ok") and "spool" in health, health
            if workers > 1:
                assert len(health["workers"]) == workers, health

            # Off again: open again.
            _reload(node, required=False)
            wait_until(lambda: _get(node, "/metrics")[0] == 200, 15)
            assert "spool" in _get(node, "/healthz")[1]


def test_a_node_started_requiring_a_token_for_its_state_still_shows_it_to_pigeon_top(tmp_path: Path) -> None:
    http = {"token": TOKENS, "status_token_required": True}
    with PigeonProcess(tmp_path / "node", http=http, node={"workers": 2}) as node:
        assert _get(node, "/metrics")[0] == 401
        assert set(_get(node, "/healthz")[1]) == {"status", "detail"}
        # The `pigeon` commands send the local token, bound to no tenant.
        assert '"rates"' in node.cli("top", "--once", "--json")  # (from /metrics: 401 would exit 2)
        command = ["top", "--once", "-c", str(node.config_path), "--token", ACME]
        done = zygote.run(command, text=True, timeout=60, check=False)
        assert done.returncode == 2, done
        assert done.stderr.startswith("pigeon: 403: token 'acme-read' is bound to tenant acme: /metrics"), done
