"""Inbound routing against real servers: a private Dovecot, Redis and PostgreSQL, a webhook
receiver, and Pigeon as a process. What the application receives, what stays in the mailbox,
and what Pigeon logs."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import smtplib
import time
from pathlib import Path

import pytest

from tests.support import zygote
from tests.support.apps import (
    WebhookApp,
    customer_mail,
    imap_mailbox,
    mailbox_failure,
    mailbox_health,
    webhook_target,
)
from tests.support.process import PigeonProcess, free_port
from tests.support.services import Dovecot, Postgres, RedisServer
from tests.support.sinks import wait_until


def test_mailbox_messages_reach_the_webhook_signed_once_each_and_are_marked_seen(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(30)])
    with (
        WebhookApp() as app,
        PigeonProcess(
            tmp_path / "p", target=[webhook_target(app, secret="k3y")], mailbox=[imap_mailbox(dovecot, "hook")]
        ) as node,
    ):
        assert app.wait_distinct(30, 20) == 30
        more = dovecot.append("app", [customer_mail(i, tag="late") for i in range(5)])  # arrives while idling
        assert app.wait_distinct(35, 10) == 35
        assert sum(app.accepted.values()) == 35
        wait_until(lambda: not dovecot.unseen("app"), 10)
        assert "\\Seen" in dovecot.flags("app", more[-1])
        records = node.wait_records("InboundDelivery", 35)
        assert len(records) == 35
        shown = zygote.run(["top", "-c", str(node.config_path), "--once"], text=True, timeout=60, check=False)
        assert shown.returncode == 0, shown.stderr
        top = shown.stdout
        health = mailbox_health(node)
        assert health["connected"] is True
        assert time.time() - health["last_poll"] < 10
    (row,) = [line for line in top.splitlines() if line.startswith("support ")]
    assert row.split()[1:3] == ["hook", "connected"]
    assert "inbound  delivered " in top
    headers = app.headers[0]
    key = headers["X-Pigeon-Dedupe-Key"]
    assert hashlib.sha256(app.bodies[key]).hexdigest() == key
    assert headers["Content-Type"] == "message/rfc822"
    signed = dict(part.split("=", 1) for part in headers["X-Pigeon-Signature"].split(","))
    assert signed["v1"] == hmac.new(b"k3y", f"{signed['t']}.".encode() + app.bodies[key], hashlib.sha256).hexdigest()
    # Mail from a mailbox has no envelope headers: v2 binds the dedupe key and the body.
    assert "X-Pigeon-Recipients" not in headers and "X-Pigeon-Sender" not in headers
    v2 = f"{signed['t']}\nx-pigeon-dedupe-key:{key}\n\n".encode() + app.bodies[key]
    assert signed["v2"] == hmac.new(b"k3y", v2, hashlib.sha256).hexdigest()
    record = next(r for r in records if r["dedupe_key"] == key)
    assert record["acknowledged"] == "seen"
    assert {r["attempt"] for r in records} == {1}  # written on a first attempt too, as documented
    assert record["mailbox"].startswith("app@127.0.0.1:")
    assert record["uid"] >= 1 and record["uidvalidity"] > 0


def test_accepted_messages_are_moved_or_deleted_as_configured(tmp_path: Path, dovecot: Dovecot) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(10)])
    with WebhookApp() as app:
        options = {"after_delivery": "move", "move_to": "Processed"}
        with PigeonProcess(
            tmp_path / "p", target=[webhook_target(app)], mailbox=[imap_mailbox(dovecot, "hook", **options)]
        ):
            assert app.wait_distinct(10, 20) == 10
            wait_until(lambda: dovecot.count("app") == 0, 10)
        assert dovecot.count("app", "Processed") == 10
        dovecot.append("app", [customer_mail(i, tag="d") for i in range(10)])
        options = {"after_delivery": "delete"}
        with PigeonProcess(
            tmp_path / "q", target=[webhook_target(app)], mailbox=[imap_mailbox(dovecot, "hook", **options)]
        ):
            assert app.wait_distinct(20, 20) == 20
            wait_until(lambda: dovecot.count("app") == 0, 10)
    assert dovecot.count("app", "Processed") == 10


def test_a_refusing_application_gets_nothing_lost_and_permanent_refusals_go_to_the_failed_folder(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(5)])
    with WebhookApp(status=422) as app:
        box = imap_mailbox(dovecot, "hook", failed_folder="Failed")
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            failures = node.wait_records("InboundFailure", 5)
            wait_until(lambda: dovecot.count("app", "Failed") == 5, 10)
        assert dovecot.count("app") == 0
        assert all(
            r["permanent"] and r["action"] == "moved to Failed" and r["detail"].startswith("422") for r in failures
        )
        assert not node.records("InboundDelivery")
        assert sum(app.accepted.values()) == 0


def test_a_message_over_max_message_size_is_set_aside_unfetched_and_its_record_says_its_size(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    big = customer_mail(0, tag="big") + (b"y" * 70 + b"\r\n") * 70  # 5 kB
    dovecot.append("app", [big, customer_mail(1)])
    with WebhookApp() as app:
        box = imap_mailbox(dovecot, "hook", max_message_size=1000, failed_folder="Failed")
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            (failure,) = node.wait_records("InboundFailure", 1)
            assert app.wait_distinct(1, 20) == 1
            wait_until(lambda: dovecot.count("app", "Failed") == 1, 10)
    assert failure["permanent"] is True and failure["action"] == "moved to Failed"
    assert failure["detail"] == f"{len(big)} bytes is over max_message_size (1000)"
    assert failure["size"] == len(big)  # the server's RFC822.SIZE: the body was never fetched
    assert failure["dedupe_key"] == ""  # ... so there is nothing to take its hash of
    assert len(app.bodies) == 1 and big not in app.bodies.values()


def test_a_webhook_that_fails_for_a_while_gets_every_message_later(tmp_path: Path, dovecot: Dovecot) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(8)])
    with WebhookApp() as app:
        app.fail_for = 3
        with PigeonProcess(
            tmp_path / "p", target=[webhook_target(app)], mailbox=[imap_mailbox(dovecot, "hook")]
        ) as node:
            assert app.wait_distinct(8, 30) == 8
            wait_until(lambda: not dovecot.unseen("app"), 10)
            failures = node.records("InboundFailure")
            delivered = node.wait_records("InboundDelivery", 8)
        assert app.refused >= 8
        assert failures and not any(r.get("permanent") for r in failures)
        assert all(r["next_attempt"] > r["timestamp"] for r in failures)
        assert max(r["attempt"] for r in delivered) >= 2
        assert sum(app.accepted.values()) == 8


def test_sidekiq_jobs_are_pushed_as_sidekiq_s_client_pushes_them(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    raws = [customer_mail(i) for i in range(12)]
    dovecot.append("app", raws)
    target = {"name": "jobs", "kind": "sidekiq", "queue": "mail", "job_class": "InboundEmailJob"}
    with PigeonProcess(
        tmp_path / "p", redis={"url": redis_server.url}, target=[target], mailbox=[imap_mailbox(dovecot, "jobs")]
    ):
        client = redis_server.client()
        wait_until(lambda: client.llen("queue:mail") == 12, 20)
        jobs = [json.loads(j) for j in client.lrange("queue:mail", 0, -1)]
        assert client.smembers("queues") == {b"mail"}
    assert {j["class"] for j in jobs} == {"InboundEmailJob"}
    assert sorted(j["args"][0].encode() for j in jobs) == sorted(raws)
    assert {j["args"][1]["dedupe_key"] for j in jobs} == {hashlib.sha256(r).hexdigest() for r in raws}
    assert all(len(j["jid"]) == 24 and j["retry"] is True and j["enqueued_at"] >= j["created_at"] for j in jobs)


def test_postgresql_rows_are_unique_by_dedupe_key(tmp_path: Path, dovecot: Dovecot, postgres: Postgres) -> None:
    # The same bytes twice (two UIDs): the application's table holds one row for them.
    dovecot.append("app", [customer_mail(i) for i in range(6)] + [customer_mail(0)])
    target = {"name": "db", "kind": "postgresql", "dsn": postgres.dsn, "table": "inbound_emails"}
    with PigeonProcess(tmp_path / "p", target=[target], mailbox=[imap_mailbox(dovecot, "db")]) as node:
        node.wait_records("InboundDelivery", 7, timeout=20)
        wait_until(lambda: not dovecot.unseen("app"), 10)
    rows = postgres.query("SELECT dedupe_key, message_id, source FROM inbound_emails ORDER BY id")
    assert len(rows) == 6
    assert {r[1] for r in rows} == {f"<m{i}@example.com>" for i in range(6)}
    assert {r[2] for r in rows} == {"imap:support"}


def test_maildir_target_writes_each_message_once(tmp_path: Path, dovecot: Dovecot) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(4)] + [customer_mail(1)])
    target = {"name": "box", "kind": "maildir", "path": str(tmp_path / "Maildir")}
    with PigeonProcess(tmp_path / "p", target=[target], mailbox=[imap_mailbox(dovecot, "box")]) as node:
        node.wait_records("InboundDelivery", 5, timeout=20)
    files = sorted((tmp_path / "Maildir" / "new").iterdir())
    assert len(files) == 4
    assert sorted(f.read_bytes() for f in files) == sorted(customer_mail(i) for i in range(4))


def test_log_target_holds_every_message_once_before_the_mailbox_is_acknowledged(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    sent = [customer_mail(i) for i in range(120)]  # a few batches
    dovecot.append("app", sent)
    target = {"name": "audit", "kind": "log", "path": str(tmp_path / "inbound.jsonl")}
    with PigeonProcess(tmp_path / "p", target=[target], mailbox=[imap_mailbox(dovecot, "audit")]) as node:
        node.wait_records("InboundDelivery", 120, timeout=30)
        wait_until(lambda: not dovecot.unseen("app"), 10)
    lines = [json.loads(line) for line in (tmp_path / "inbound.jsonl").read_bytes().splitlines()]
    assert sorted(line["raw"].encode() for line in lines) == sorted(sent)
    assert {line["dedupe_key"] for line in lines} == {hashlib.sha256(raw).hexdigest() for raw in sent}


def test_a_batch_of_big_messages_is_handed_over_a_memory_budget_at_a_time(tmp_path: Path, dovecot: Dovecot) -> None:
    # Three messages of 30 MiB claimed in one batch: 64 MiB at a time are fetched and handed
    # over, the third waits for the next batch. Each is handed over once.
    filler = b"x" * 998 + b"\r\n"
    sent = [customer_mail(i).replace(b"Hello", filler * (30 * 1024) + b"Hello") for i in range(3)]
    dovecot.append("app", sent)
    target = {"name": "audit", "kind": "log", "path": str(tmp_path / "inbound.jsonl")}
    with PigeonProcess(tmp_path / "p", target=[target], mailbox=[imap_mailbox(dovecot, "audit")]) as node:
        records = node.wait_records("InboundDelivery", 3, timeout=60)
        wait_until(lambda: not dovecot.unseen("app"), 10)
    assert len({r["dedupe_key"] for r in records}) == 3
    lines = (tmp_path / "inbound.jsonl").read_bytes().splitlines()
    assert sorted(hashlib.sha256(json.loads(line)["raw"].encode()).hexdigest() for line in lines) == sorted(
        hashlib.sha256(raw).hexdigest() for raw in sent
    )


def test_smtp_mail_for_an_inbound_route_is_taken_from_anyone_and_posted_to_the_application(tmp_path: Path) -> None:
    with WebhookApp() as app:
        node = PigeonProcess(
            tmp_path / "p",
            smtp={"relay_networks": ["192.0.2.0/24"]},  # the test client is not a relay client
            delivery={"enabled": True, "retry_interval": "1s"},
            target=[webhook_target(app, format="json")],
            inbound=[{"recipient": "support@app.example", "target": "hook"}],
        )
        with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            client.sendmail("customer@example.com", ["support@app.example"], customer_mail(1))
            with pytest.raises(smtplib.SMTPRecipientsRefused):
                client.sendmail("customer@example.com", ["someone@elsewhere.example"], customer_mail(2))
            assert app.wait_distinct(1, 20) == 1
            delivered = node.wait_records("Delivery", 1)
            metrics = node.http_get("/metrics")[1].decode()
        (body,) = [json.loads(b) for b in app.bodies.values()]
    assert body["raw"].endswith(customer_mail(1).decode())  # after Pigeon's Received header
    assert ["Subject", "question 1"] in body["headers"]
    assert body["recipients"] == ["support@app.example"] and body["sender"] == "customer@example.com"
    assert "X-Pigeon-Recipients" not in app.headers[0]  # JSON carries the envelope in its body
    assert 'pigeon_inbound_messages_total{outcome="delivered",source="smtp",target="hook"} 1.0' in metrics
    assert delivered[0]["site"] == "inbound:hook" and delivered[0]["queue"] == "inbound:hook"
    reception = node.records("Reception")[0]
    assert reception["queue"] == "inbound:hook"


def test_smtp_mail_to_a_maildir_or_a_raw_webhook_says_which_addresses_it_was_for(tmp_path: Path) -> None:
    # Bcc'd to two reply addresses: the header names neither, and one file (one POST) serves
    # both, so the envelope must travel with it for the application to route the reply.
    with WebhookApp() as app:
        node = PigeonProcess(
            tmp_path / "p",
            smtp={"relay_networks": ["192.0.2.0/24"]},
            delivery={"enabled": True, "retry_interval": "1s"},
            target=[{"name": "box", "kind": "maildir", "path": str(tmp_path / "Maildir")}, webhook_target(app)],
            inbound=[
                {"recipient": "reply+*@app.example", "target": "box"},
                {"domain": "hook.example", "target": "hook"},
            ],
        )
        with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            client.sendmail("customer@example.com", ["reply+1@app.example", "reply+2@app.example"], customer_mail(1))
            client.sendmail("customer@example.com", ["a1@hook.example", "a2@hook.example"], customer_mail(2))
            assert app.wait_distinct(1, 20) == 1
            node.wait_records("Delivery", 4)
        (headers,) = app.headers
    (file,) = (tmp_path / "Maildir" / "new").iterdir()
    text = file.read_bytes()
    assert text.startswith(
        b"Return-Path: <customer@example.com>\r\n"
        b"X-Original-To: reply+1@app.example\r\nX-Original-To: reply+2@app.example\r\n"
    ), text[:200]
    assert text.endswith(customer_mail(1))
    assert headers["X-Pigeon-Sender"] == "customer@example.com"
    assert headers["X-Pigeon-Recipients"] == "a1@hook.example, a2@hook.example"


def test_smtp_mail_the_application_refuses_for_good_is_bounced_where_its_route_drops_it(tmp_path: Path) -> None:
    with WebhookApp(status=400) as app:
        node = PigeonProcess(
            tmp_path / "p",
            delivery={"enabled": True, "dsn": False},
            target=[webhook_target(app)],
            inbound=[{"domain": "*.app.example", "target": "hook", "failed": "drop"}],
        )
        with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            client.sendmail("customer@example.com", ["a@eu.app.example"], customer_mail(1))
            (bounce,) = node.wait_records("Bounce", 1, timeout=20)
    assert bounce["response"]["code"] == 550
    assert "400" in bounce["response"]["text"]


def test_implicit_tls_mailbox_verifies_the_server_and_hands_mail_over(tmp_path: Path, dovecot: Dovecot) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(3)])
    with WebhookApp() as app:
        box = imap_mailbox(dovecot, "hook", tls="implicit", port=dovecot.imaps_port)
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]):
            assert app.wait_distinct(3, 20) == 3


def test_a_server_certificate_pigeon_cannot_verify_is_refused_and_reported(tmp_path: Path, dovecot: Dovecot) -> None:
    dovecot.append("app", [customer_mail(1)])
    with WebhookApp() as app:
        box = imap_mailbox(dovecot, "hook", tls="implicit", port=dovecot.imaps_port)
        del box["ca_file"]  # the system's CAs do not know the test's own CA
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:

            def reported() -> str:
                return mailbox_failure(node) or ""

            said = wait_until(reported, 10)
            assert said.startswith(f"TLS to 127.0.0.1:{dovecot.imaps_port} (implicit): certificate not trusted: "), said
            assert said.endswith("; set ca_file to the PEM file of the CA that issued it (or tls_verify = false)"), said
            shown = zygote.run(["top", "-c", str(node.config_path), "--once"], text=True, timeout=60, check=False)
        # Not yet "down": that is what /healthz says after down_after (and answers 503 for).
        (row,) = [line for line in shown.stdout.splitlines() if line.startswith("support ")]
        assert row.split()[1:3] == ["hook", "degraded"], shown.stdout
        assert not app.accepted
    assert dovecot.unseen("app")


def test_an_imap_server_that_dies_mid_run_costs_a_reconnect_and_nothing_else(tmp_path: Path, dovecot: Dovecot) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(200)])
    with WebhookApp() as app:
        app.delay = 0.01
        # (A Dovecot starting again on a loaded machine can take over 3 s to log a client in.)
        box = imap_mailbox(dovecot, "hook", timeout="10s", batch=20)
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            wait_until(lambda: len(app.accepted) >= 40, 30)
            dovecot.kill()  # mid-batch: fetches, handoffs and acknowledgements in flight
            time.sleep(1)
            dovecot.start()
            assert app.wait_distinct(200, 60) == 200, mailbox_health(node)
            wait_until(lambda: not dovecot.unseen("app"), 20)
            health = mailbox_health(node)
        # Handed over but not yet acknowledged when the server died: found done, acknowledged,
        # not handed over again.
        assert sum(app.accepted.values()) == 200
    assert health["connected"] is True


def test_a_message_in_backoff_does_not_delay_new_mail(tmp_path: Path, dovecot: Dovecot) -> None:
    dovecot.append("app", [customer_mail(0, tag="poison")])
    with WebhookApp() as app:
        app.refuse = lambda body: b"poison" in body
        box = imap_mailbox(dovecot, "hook", poll_interval="60s")
        target = webhook_target(app, retry_interval="60s")
        with PigeonProcess(tmp_path / "p", target=[target], mailbox=[box]) as node:
            node.wait_records("InboundFailure", 1)
            time.sleep(0.5)
            dovecot.append("app", [customer_mail(1)])
            appended = time.monotonic()
            assert app.wait_distinct(1, 10) == 1
            # IDLE heard of it: neither the 60 s poll nor the 60 s backoff held it up.
            assert time.monotonic() - appended < 5
            assert len(node.records("InboundFailure")) == 1
            # And it idles rather than polls while the refused one waits out its backoff.
            time.sleep(1)
            polled = mailbox_health(node)["last_poll"]
            time.sleep(3)
            assert mailbox_health(node)["last_poll"] == polled
        assert dovecot.unseen("app") == [1]  # the refused one is still there, for later


def test_claims_paused_for_a_redis_that_refuses_connections_is_said_in_one_clean_line(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    dovecot.append("app", [customer_mail(1)])
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with (
        WebhookApp() as app,
        PigeonProcess(
            tmp_path / "p",
            redis={"url": dead, "timeout": "500ms"},
            target=[webhook_target(app)],
            mailbox=[imap_mailbox(dovecot, "hook")],
        ) as node,
    ):
        logged = node.wait_stderr("claims paused", timeout=20)
    (line,) = [line for line in logged.splitlines() if "claims paused" in line]
    assert f"mailbox support: Redis at {dead}: " in line and line.endswith("Connection refused; claims paused"), line
    assert sum(app.accepted.values()) == 0


@pytest.mark.parametrize(
    ("tls", "port", "advice"),
    [("implicit", "port", 'set tls = "starttls"'), ("starttls", "imaps_port", 'set tls = "implicit"')],
    ids=["implicit-on-a-plain-port", "starttls-on-an-implicit-port"],
)
def test_tls_that_does_not_match_the_port_names_the_key_to_set(
    tmp_path: Path, dovecot: Dovecot, tls: str, port: str, advice: str
) -> None:
    dovecot.append("app", [customer_mail(1)])
    with WebhookApp() as app:
        box = imap_mailbox(dovecot, "hook", tls=tls, port=getattr(dovecot, port), timeout="1s")
        with PigeonProcess(tmp_path / "p", target=[webhook_target(app)], mailbox=[box]) as node:
            error = wait_until(lambda: mailbox_failure(node), 10)
            assert advice in error
            assert advice in node.stderr()
        assert not app.accepted


def test_a_redis_outage_mid_batch_is_logged_once_and_its_end_too(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    # Handoffs of the batch in hand finish while Redis is away: their done marks fail one
    # after another, which used to log a warning for each (ten a second, for seconds).
    dovecot.append("app", [customer_mail(i) for i in range(60)])
    with WebhookApp() as app:
        app.delay = 0.2
        box = imap_mailbox(dovecot, "hook", batch=60, concurrency=4)
        with PigeonProcess(
            tmp_path / "p", redis={"url": redis_server.url}, target=[webhook_target(app)], mailbox=[box]
        ) as node:
            wait_until(lambda: len(app.accepted) >= 4, 30)
            redis_server.stop()
            time.sleep(3)
            redis_server.start()
            assert app.wait_distinct(60, 60) == 60
            dovecot.append("app", [customer_mail(i, tag="after") for i in range(5)])  # marked done again
            assert app.wait_distinct(65, 60) == 65
            wait_until(lambda: "claims resumed" in node.stderr() or "claims paused" not in node.stderr(), 10)
            logged = node.stderr()
    assert logged.count("could not mark handoffs done") <= 1, logged
    assert logged.count("claims paused") <= 1, logged
    # An outage's end is news, no trouble: INFO, as the target's "accepts messages again" is.
    if "could not mark handoffs done" in logged:
        assert re.search(r"INFO .*mailbox support: handoffs are marked done again", logged), logged
    if "claims paused" in logged:
        assert re.search(r"INFO .*mailbox support: arbitration answers again; claims resumed", logged), logged
