"""No backscatter from `[[inbound]]` routes: anyone may send to them, so a DSN of mail the
application refuses for good (or that expires) must not go to whatever sender was written.
The message is held for the operator instead, who can see it and send it again once the
application is fixed; a sender who authenticated, or a route set to bounce, still gets a DSN.

A real Pigeon, a webhook application and an SMTP sink standing for the senders' MX."""

from __future__ import annotations

import json
import smtplib
import time
from pathlib import Path
from typing import Any

from tests.support import zygote
from tests.support.apps import WebhookApp, customer_mail, webhook_target
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, wait_until

SENDER = "victim@example.com"  # the address an attacker writes as the sender


def _node(root: Path, app: WebhookApp, sink: ScriptedSink, **sections: Any) -> PigeonProcess:
    return PigeonProcess(
        root,
        smtp={"relay_networks": ["192.0.2.0/24"]},  # the test client is anyone, not a relay client
        delivery={"enabled": True, "retry_interval": "1s", "max_retry_interval": "1s"},
        # DSNs go to the senders' domains: all of them land in the sink.
        route=[{"domain": "*", "next_hop": sink.endpoint, "tls": "disabled"}],
        target=[webhook_target(app)],
        **sections,
    )


def _send_from_anyone(node: PigeonProcess, recipient: str, n: int = 1) -> None:
    with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        # RET=FULL: the DSN would carry the whole message to the forged sender.
        assert client.sendmail(SENDER, [recipient], customer_mail(n), mail_options=["RET=FULL"]) == {}


def _cli(node: PigeonProcess, *args: str) -> str:
    done = zygote.run([*args, "-c", str(node.config_path)], text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _queue(node: PigeonProcess, name: str) -> dict[str, Any]:
    summary = json.loads(_cli(node, "queue", "summary", "--json"))
    (row,) = [r for r in summary["scheduled"] if r["queue"] == name]
    return row  # type: ignore[no-any-return]


def test_mail_the_application_refuses_for_good_is_held_without_a_dsn_and_retried_by_the_operator(
    tmp_path: Path,
) -> None:
    with ScriptedSink() as sink, WebhookApp(status=422) as app:
        node = _node(tmp_path / "p", app, sink, inbound=[{"recipient": "support@app.example", "target": "hook"}])
        with node:
            _send_from_anyone(node, "support@app.example")
            (held,) = node.wait_records("Held", 1, timeout=20)
            assert held["cause"] == "refused" and held["response"]["code"] == 550 and "422" in held["response"]["text"]
            assert held["sender"] == SENDER and "not authenticated" in held["dsn"]
            assert sink.after(2) == []  # no DSN reached the sender
            metrics = node.http_get("/metrics")[1].decode().splitlines()
            assert 'pigeon_recipients_total{outcome="Held"} 1.0' in metrics  # as its site and queue counters
            assert 'pigeon_queue_recipients_total{outcome="Held",queue="inbound:hook"} 1.0' in metrics
            assert node.records("Bounce") == []
            row = _queue(node, "inbound:hook")
            assert (row["messages"], row["held"], row["due"]) == (1, 1, 0)
            shown = _cli(node, "inspect", held["id"])
            assert "refused: 550" in shown and "422" in shown
            # The application is fixed; the operator sends what it refused again.
            app.status = 202
            assert _cli(node, "retry", "--queue", "inbound:hook").strip() == "1 message due now"
            assert app.wait_distinct(1, 20) == 1
            (delivered,) = node.wait_records("Delivery", 1, timeout=20)
            assert delivered["id"] == held["id"]
            wait_until(lambda: node.spool_messages() == [])
        assert sink.received == []


def test_mail_that_expires_on_an_inbound_route_is_held_without_a_dsn_and_retried_by_the_operator(
    tmp_path: Path,
) -> None:
    with ScriptedSink() as sink, WebhookApp() as app:
        app.fail_until = time.time() + 3600  # the application is down: 500 to every request
        node = _node(
            tmp_path / "p",
            app,
            sink,
            queue=[{"name": "inbound:*", "max_age": "3s", "retry_interval": "1s", "max_retry_interval": "1s"}],
            inbound=[{"recipient": "support@app.example", "target": "hook"}],
        )
        with node:
            _send_from_anyone(node, "support@app.example")
            (held,) = node.wait_records("Held", 1, timeout=20)
            assert held["cause"] == "expired" and held["response"]["enhanced"] == "5.4.7"
            assert sink.after(2) == [] and node.records("Expiration") == []
            assert _queue(node, "inbound:hook")["held"] == 1
            # Nothing tries it again by itself.
            attempts = app.refused
            time.sleep(2)
            assert app.refused == attempts
            app.fail_until = 0.0
            # Released, its max_age counts from now: it is attempted rather than expired again.
            assert _cli(node, "retry", "--queue", "inbound:*").strip() == "1 message due now"
            assert app.wait_distinct(1, 20) == 1
            (delivered,) = node.wait_records("Delivery", 1, timeout=20)
            assert delivered["id"] == held["id"]
        assert sink.received == []


def test_an_authenticated_sender_and_a_route_set_to_bounce_still_get_their_dsn(tmp_path: Path) -> None:
    with ScriptedSink() as sink, WebhookApp(status=422) as app:
        node = _node(
            tmp_path / "p",
            app,
            sink,
            inbound=[
                {"recipient": "bounce@app.example", "target": "hook", "bounces": "always"},
                {"recipient": "drop@app.example", "target": "hook", "failed": "drop"},
                {"recipient": "*@app.example", "target": "hook"},
            ],
        )
        with node:
            _send_from_anyone(node, "bounce@app.example")
            (dsn,) = sink.wait_for(1)
            assert dsn.recipients == [SENDER] and dsn.email.get_content_type() == "multipart/report"
            # The application's answer, in a reply Pigeon wrote: no "smtp;" server said it, and the
            # target's name is no mail host to name to an outside sender (Remote-MTA).
            report = dsn.data.decode()
            assert "Diagnostic-Code: X-Pigeon; 550 5.0.0 hook: " in report, report
            assert "Remote-MTA" not in report, report
            # An application's own mail, injected with a token: its sender authenticated.
            status, answer = node.http_post(
                "/api/v1/inject",
                {
                    "envelope_sender": "app@example.org",
                    "recipients": [{"email": "support@app.example"}],
                    "content": "From: a@example.org\r\nSubject: from the app\r\n\r\nhello\r\n",
                },
                node.local_token,
            )
            assert status == 200, answer
            wait_until(lambda: len(sink.received) == 2)
            assert sink.received[1].recipients == ["app@example.org"]
            # A route that drops what it may not bounce: a terminal Bounce saying why no DSN.
            _send_from_anyone(node, "drop@app.example", 2)
            wait_until(lambda: len(node.records("Bounce")) == 3)
            dropped = [r for r in node.records("Bounce") if r["recipient"] == "drop@app.example"]
            assert len(dropped) == 1 and "not authenticated" in dropped[0]["dsn"]
            assert len(sink.after(2)) == 2 and node.records("Held") == []
            wait_until(lambda: [m for m in node.spool_messages() if m["queue"] == "inbound:hook"] == [])


def test_held_mail_nobody_releases_ends_after_held_for_without_a_dsn(tmp_path: Path) -> None:
    with ScriptedSink() as sink, WebhookApp(status=422) as app:
        routes = [
            {"recipient": "support@app.example", "target": "hook", "held_for": "2s"},
            {"recipient": "keep@app.example", "target": "hook", "held_for": 0},  # for ever
        ]
        with _node(tmp_path / "p", app, sink, inbound=routes) as node:
            _send_from_anyone(node, "support@app.example")
            _send_from_anyone(node, "keep@app.example")
            held = {r["recipient"]: r for r in node.wait_records("Held", 2, timeout=20)}
            shown = json.loads(_cli(node, "inspect", held["keep@app.example"]["id"], "--json"))
            assert shown["held"] and shown["held_until"] is None
            (expired,) = node.wait_records("Expiration", 1, timeout=20)
            assert expired["recipient"] == "support@app.example" and expired["id"] == held["support@app.example"]["id"]
            assert "held_for" in expired["dsn"] and expired["response"]["enhanced"] == "5.4.7"
            # (a held deadline is kept to 1/8 s: floats near HELD are that coarse)
            assert 1.8 <= expired["timestamp"] - held["support@app.example"]["timestamp"] < 5
            time.sleep(2)  # the other one waits for the operator
            assert [m["recipients"] for m in node.spool_messages()] == [["keep@app.example"]]
            assert _queue(node, "inbound:hook")["held"] == 1
        assert sink.received == []  # no DSN to the forged sender


def test_a_retry_releases_held_mail_a_suspension_covers_so_that_its_resume_delivers_it(tmp_path: Path) -> None:
    with ScriptedSink() as sink, WebhookApp(status=422) as app:
        node = _node(tmp_path / "p", app, sink, inbound=[{"recipient": "support@app.example", "target": "hook"}])
        with node:
            _send_from_anyone(node, "support@app.example")
            node.wait_records("Held", 1, timeout=20)
            app.status = 202
            status, suspended = node.http_call(
                "POST", "/api/v1/admin/suspend", {"queue": "inbound:hook"}, node.local_token
            )
            assert status == 200, suspended
            status, retried = node.http_call("POST", "/api/v1/admin/retry", {"queue": "inbound:hook"}, node.local_token)
            # Released from held; the suspension then keeps it untried (not left held for ever),
            # and the answer says so: not due now, but held by the suspension.
            assert (retried["made_due"], retried["suspended"]) == (0, 1), retried
            time.sleep(1.0)
            assert not app.accepted
            rule = suspended["rule"]["id"]
            status, resumed = node.http_call("DELETE", f"/api/v1/admin/suspend/{rule}", token=node.local_token)
            assert resumed["made_due"] == 1, resumed
            assert app.wait_distinct(1, 20) == 1


def test_notify_success_on_an_inbound_route_is_reported_delivered_only_where_a_failure_would_be(
    tmp_path: Path,
) -> None:
    # The application's target is the end of the road: a success asked for is "delivered".
    # But not to a sender anyone can write (backscatter), unless the route bounces anyway.
    with ScriptedSink() as sink, WebhookApp() as app:
        inbound = [
            {"recipient": "bounce@app.example", "target": "hook", "bounces": "always"},
            {"recipient": "*@app.example", "target": "hook"},
        ]
        with _node(tmp_path / "p", app, sink, inbound=inbound) as node:
            for recipient in ("quiet@app.example", "bounce@app.example"):
                with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
                    client.ehlo("client.test")
                    client.mail(SENDER)
                    assert client.rcpt(recipient, ["NOTIFY=SUCCESS"])[0] == 250
                    assert client.data(customer_mail(1))[0] == 250
            wait_until(lambda: len([r for r in node.records("Delivery") if "app.example" in r["recipient"]]) == 2)
            (report,) = sink.wait_for(1)
            assert report.recipients == [SENDER]
            status = report.email.get_payload()[1].get_payload()
            assert dict(status[1].items())["Final-Recipient"] == "rfc822; bounce@app.example"
            assert dict(status[1].items())["Action"] == "delivered"
            time.sleep(1)
            assert len(sink.received) == 1  # none for quiet@: its sender is anyone's to write
