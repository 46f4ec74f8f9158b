"""A mailbox's note: the last problem a node saw on it, kept in the shared Redis, so that the
operator of any node sees in /healthz and `pigeon top` why the mailbox is unhealthy elsewhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support import zygote
from tests.support.apps import (
    WebhookApp,
    customer_mail,
    imap_mailbox,
    mailbox_health,
    redis_in_use_for_a_while,
    webhook_target,
)
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, RedisServer
from tests.support.sinks import wait_until


def test_a_login_refused_on_one_node_is_seen_from_the_other_and_resolved_when_fixed(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    redis_in_use_for_a_while(redis_server)
    redis = {"url": redis_server.url}
    secret = tmp_path / "a.secret"
    secret.write_text("wrong\n")  # node a's password file was not updated
    dovecot.append("app", [customer_mail(i) for i in range(3)])
    with WebhookApp() as app:
        good = imap_mailbox(dovecot, "hook")
        bad = {k: v for k, v in imap_mailbox(dovecot, "hook").items() if k != "password"}
        bad["password_file"] = str(secret)
        with (
            PigeonProcess(tmp_path / "b", node={"name": "b"}, redis=redis, target=[webhook_target(app)],
                          mailbox=[good]) as b,
            PigeonProcess(tmp_path / "a", node={"name": "a"}, redis=redis, target=[webhook_target(app)],
                          mailbox=[bad]) as a,
        ):  # fmt: skip
            assert app.wait_distinct(3, 20) == 3  # node b does the job all the same
            note = wait_until(lambda: (n := mailbox_health(b)["note"]) and n["node"] == "a" and n, 15)
            assert mailbox_health(b)["status"] == "ok"  # b's own view: fine
            assert "login as app" in note["problem"] and note["resolved_at"] is None, note
            assert mailbox_health(a)["note"] == note  # the same note on every node
            shown = zygote.run(
                ["top", "-c", str(b.config_path), "--once"],
                text=True,
                timeout=60,
                check=False,
                env={**os.environ, "COLUMNS": "300"},
            )
            assert shown.returncode == 0, shown.stderr
            lines = shown.stdout.splitlines()
            (row,) = [i for i, line in enumerate(lines) if line.startswith("support ")]
            assert "note from a," in lines[row + 1] and "login as app" in lines[row + 1], shown.stdout
            secret.write_text("secret\n")  # fixed: node a logs in at its next try
            resolved = wait_until(lambda: (n := mailbox_health(b)["note"])["resolved_at"] and n, 90)
            assert resolved["node"] == "a" and resolved["problem"] == note["problem"]
        with redis_server.client() as client:
            keys = [k.decode() for k in client.keys("*:note")]
            stored = json.loads(client.get(keys[0]))
    assert keys == [f"pigeon:inbound:app@127.0.0.1:{dovecot.port}/INBOX:note"]
    assert stored == resolved
