"""Passwords in configured URLs and DSNs never leave the node: not through /healthz, /metrics,
the log files, stderr or the `pigeon` commands, even when the service they name fails. The
host does, so the operator can tell what failed."""

from __future__ import annotations

import json
import smtplib
import subprocess
import sys
from pathlib import Path

from tests.support.apps import customer_mail, imap_mailbox, mailbox_health
from tests.support.process import PigeonProcess, free_port
from tests.support.services import Dovecot
from tests.support.sinks import wait_until

# Each a distinct word, so a leak says which one leaked.
ARBITER_PASSWORD = "arbiter-pw-8c1f"
SIDEKIQ_PASSWORD = "sidekiq-pw-52d0"
DSN_PASSWORD = "dsn-pw-a93e"
HOOK_PASSWORD = "hook-pw-6e2a"
HOOK_TOKEN = "hook-token-d41c"
SECRETS = (ARBITER_PASSWORD, SIDEKIQ_PASSWORD, DSN_PASSWORD, HOOK_PASSWORD, HOOK_TOKEN)


def _pigeon(node: PigeonProcess, *commands: list[str]) -> list[str]:
    """What each `pigeon` command prints (stdout and stderr), the commands run side by side."""
    running = [
        subprocess.Popen(
            [sys.executable, "-m", "pigeon", *args, "-c", str(node.config_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for args in commands
    ]
    return [process.communicate(timeout=60)[0] for process in running]


def _everything_in(directory: Path) -> str:
    """Every byte under `directory`, compressed segments decompressed, as text."""
    import gzip

    texts = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        texts.append(data.decode(errors="replace"))
    return "\n".join(texts)


def test_passwords_in_redis_postgresql_and_webhook_urls_never_leave_the_node_when_each_fails(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    dead = free_port()  # nothing listens here: every service below fails to connect
    targets = [
        {"name": "hook", "kind": "webhook", "retry_interval": "1s",
         "url": f"http://hooker:{HOOK_PASSWORD}@127.0.0.1:{dead}/in?token={HOOK_TOKEN}&v=2"},
        {"name": "db", "kind": "postgresql", "retry_interval": "1s",
         "dsn": f"postgresql://app:{DSN_PASSWORD}@127.0.0.1:{dead}/mail"},
        {"name": "jobs", "kind": "sidekiq", "retry_interval": "1s",
         "redis_url": f"redis://:{SIDEKIQ_PASSWORD}@127.0.0.1:{dead}/0"},
    ]  # fmt: skip
    dovecot.append("app", [customer_mail(1)])
    node = PigeonProcess(
        tmp_path / "p",
        delivery={"enabled": True, "retry_interval": "1s"},
        redis={"url": f"redis://:{ARBITER_PASSWORD}@127.0.0.1:{dead}/0", "timeout": "500ms"},
        target=targets,
        mailbox=[imap_mailbox(dovecot, "hook")],
        inbound=[{"recipient": f"{t['name']}@app.example", "target": t["name"]} for t in targets],
    )
    with node:
        with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            for target in targets:
                client.sendmail("customer@example.com", [f"{target['name']}@app.example"], customer_mail(2))

        def every_target_failed() -> bool:
            said = {r["response"]["text"].split(":")[0] for r in node.records("TransientFailure")}
            return said >= {t["name"] for t in targets}

        wait_until(every_target_failed, 30)
        failures = node.records("TransientFailure")
        wait_until(lambda: "Redis" in (mailbox_health(node)["error"] or ""), 20)
        health = node.http_get("/healthz")[1].decode()
        metrics = node.http_get("/metrics")[1].decode()
        ids = {r["queue"]: str(r["id"]) for r in failures}.values()  # one message per target
        shown = _pigeon(node, ["top", "--once"], ["logs"], ["queue", "summary"], *(["inspect", i] for i in ids))
    stderr = node.stderr()
    logs = _everything_in(node.root / "log")
    for name, text in {"/healthz": health, "/metrics": metrics, "stderr": stderr, "log files": logs,
                       "pigeon commands": "\n".join(shown)}.items():  # fmt: skip
        leaked = [secret for secret in SECRETS if secret in text]
        assert not leaked, f"{name} shows {leaked}"
    # What failed is still plain: the mailbox's claims (Redis at host:port) and each target's.
    error = json.loads(health)["inbound"]["support"]["error"]
    assert f"Redis at redis://:***@127.0.0.1:{dead}/0" in error
    responses = "\n".join(r["response"]["text"] for r in failures)
    assert f"127.0.0.1:{dead}" in responses
    assert f"Sidekiq's Redis (redis://:***@127.0.0.1:{dead}/0)" in responses
    assert f"PostgreSQL at postgresql://app:***@127.0.0.1:{dead}/mail" in responses
