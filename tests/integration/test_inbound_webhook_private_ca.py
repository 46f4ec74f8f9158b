"""A webhook at an https:// receiver under a private CA (the README's own example URL,
`https://helpdesk.internal/inbound`, is one): its `ca_file` trusts that CA, as a mailbox's
does, so the mail is handed over without adding the CA to the system's store; without it the
handoff fails, saying the certificate is not trusted; a `ca_file` that cannot be used stops
the start (exit 2) naming the key."""

from __future__ import annotations

import smtplib
from pathlib import Path
from typing import Any

from tests.support.apps import WebhookApp, customer_mail, private_ca, webhook_target
from tests.support.process import PigeonProcess


def _node(root: Path, app: WebhookApp, **options: Any) -> PigeonProcess:
    return PigeonProcess(
        root,
        delivery={"enabled": True, "retry_interval": "1s"},
        target=[webhook_target(app, **options)],
        inbound=[{"recipient": "support@app.example", "target": "hook"}],
    )


def _send(node: PigeonProcess) -> None:
    with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        client.sendmail("customer@example.com", ["support@app.example"], customer_mail(1))


def test_a_webhook_under_a_private_ca_is_not_trusted_without_its_ca_file(tmp_path: Path) -> None:
    _, server = private_ca(tmp_path / "ca")
    with WebhookApp(tls=server) as app, _node(tmp_path / "p", app) as node:
        _send(node)
        (failure, *_) = node.wait_records("TransientFailure", 1, timeout=20)
        text = failure["response"]["text"]
        assert text == (
            f"hook: {app.url}: cannot connect to 127.0.0.1:{app.port}: "
            "TLS: certificate not trusted: unable to get local issuer certificate"
        ), text
        assert app.started == 0


def test_a_webhook_ca_file_trusts_the_receivers_private_ca(tmp_path: Path) -> None:
    ca_pem, server = private_ca(tmp_path / "ca")
    with WebhookApp(tls=server) as app, _node(tmp_path / "p", app, ca_file=str(ca_pem)) as node:
        _send(node)
        node.wait_records("Delivery", 1, timeout=20)
        assert app.wait_distinct(1, timeout=5) == 1
        assert b"Hello, this is message 1." in next(iter(app.bodies.values()))
        assert not node.records("TransientFailure")


def test_a_webhook_with_tls_verify_false_takes_any_certificate(tmp_path: Path) -> None:
    _, server = private_ca(tmp_path / "ca")
    with WebhookApp(tls=server) as app, _node(tmp_path / "p", app, tls_verify=False) as node:
        _send(node)
        node.wait_records("Delivery", 1, timeout=20)
        assert app.wait_distinct(1, timeout=5) == 1


def test_a_webhook_ca_file_that_is_missing_stops_the_start_with_exit_2_naming_the_key(tmp_path: Path) -> None:
    _, server = private_ca(tmp_path / "ca")
    missing = tmp_path / "nowhere" / "ca.pem"
    with WebhookApp(tls=server) as app:
        node = _node(tmp_path / "p", app, ca_file=str(missing))
        node.start(wait=False)
        assert node.wait_exit() == 2
    said = node.stderr()
    assert "pigeon: configuration error: " in said
    assert f"[[target]] #1 ca_file: target 'hook': CA file {missing} does not exist" in said, said
    assert "line " in said
