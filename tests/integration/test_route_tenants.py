"""A `[[route]]` reserved for some tenants (`tenants = ["globex"]`) carries their mail alone.

The route of `globex-relay.test` logs in to a smart host with globex's account. Tenant acme,
bound to its tenant at every door, could not rebind its mail there (`[[http.token]]
routing_domains`), but could simply address it to `anyone@globex-relay.test`: the relay saw
`auth: globex`, `mail: <s@acme.test>`. Now acme's mail (or mail of no tenant) that picks such a
route is refused where it arrives (RCPT of a bound AUTH user, an HTTP injection's recipient,
the end of DATA of an unbound client naming acme), and bounced with a DSN, never sent through
the route, when it reaches it later (an operator's rebind, a reload that reserved the route).
Globex's own mail goes by it as before.
"""

from __future__ import annotations

import base64
import signal
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pigeon.listener.passwords import set_password
from pigeon.listener.tls import ensure_self_signed
from pigeon.tls import server_context
from tests.support import zygote
from tests.support.process import PigeonProcess, to_toml
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

PASSWORD = "secret-password"
GLOBEX_PASSWORD = "gl0bex-relay-Passw0rd"
ACME_TOKEN = "acme-app-0123456789ab"  # inject, tenants = ["acme"]
OPS_TOKEN = "ops-token-0123456789ab"  # inject, admin, read: the operator's
DATE = "Date: Mon, 1 Jan 2024 00:00:00 +0000\r\n"


def _context(directory: Path) -> ssl.SSLContext:
    certificate, key = ensure_self_signed(directory, "relay.test")
    return server_context(certificate, key)


@pytest.fixture
def sinks(tmp_path: Path) -> Iterator[tuple[ScriptedSink, ScriptedSink]]:
    """The ordinary next hop (`*`), and the smart host where globex has an account."""
    users = {"globex": GLOBEX_PASSWORD}
    with ScriptedSink() as ordinary, ScriptedSink(tls=_context(tmp_path / "tls"), users=users) as relay:
        yield ordinary, relay


def _config(tmp_path: Path, ordinary: ScriptedSink, relay: ScriptedSink, *, reserved: bool = True) -> dict[str, Any]:
    users = tmp_path / "users"
    set_password(users, "alice", PASSWORD, ["acme"])  # acme's
    set_password(users, "gina", PASSWORD, ["globex"])  # globex's
    set_password(users, "bob", PASSWORD)  # unbound: names its tenant with X-Tenant
    (tmp_path / "globex-password").write_text(GLOBEX_PASSWORD + "\n")
    config = delivery_config(ordinary.endpoint)
    relay_route = {
        "next_hop": relay.endpoint,
        "tls": "required",
        "auth_username": "globex",
        "auth_password_file": str(tmp_path / "globex-password"),
    } | ({"tenants": ["globex"]} if reserved else {})
    config["route"] = [
        {"domain": "globex-relay.test", **relay_route},
        {"domain": "*.globex.test", **relay_route},  # a glob: its domains are globex's too
        *config["route"],
    ]
    config["smtp"] = {"auth_users": str(users), "allow_plaintext_auth": True}
    config["http"] = {
        "token": [
            {"name": "acme-app", "token": ACME_TOKEN, "scopes": ["inject"], "tenants": ["acme"]},
            {"name": "ops", "token": OPS_TOKEN, "scopes": ["inject", "admin", "read"]},
        ]
    }
    return config


def _login(smtp: RawSmtp, user: str) -> None:
    smtp.expect(220)
    smtp.expect(250, "EHLO client.test")
    plain = base64.b64encode(f"\0{user}\0{PASSWORD}".encode()).decode()
    smtp.expect(235, f"AUTH PLAIN {plain}")


def _rcpt(node: PigeonProcess, user: str, recipient: str) -> str:
    with RawSmtp(node.smtp_port) as smtp:
        _login(smtp, user)
        smtp.expect(250, "MAIL FROM:<s@acme.test>")
        code, text = smtp.command(f"RCPT TO:<{recipient}>")
    return f"{code} {' '.join(text)}"


def _send(node: PigeonProcess, user: str, recipients: list[str], tenant: str | None) -> str:
    """One message over SMTP after AUTH; the reply to its end of DATA."""
    routing = f"X-Tenant: {tenant}\r\n" if tenant is not None else ""
    data = f"From: s@acme.test\r\n{routing}Subject: hi\r\n{DATE}\r\nbody\r\n".encode()
    with RawSmtp(node.smtp_port) as smtp:
        _login(smtp, user)
        smtp.expect(250, "MAIL FROM:<s@acme.test>")
        for recipient in recipients:
            smtp.expect(250, f"RCPT TO:<{recipient}>")
        smtp.expect(354, "DATA")
        smtp.send(data + b".\r\n")
        code, text = smtp.reply()
    return f"{code} {' '.join(text)}"


def _inject(node: PigeonProcess, token: str, recipients: list[str], tenant: str | None = None) -> tuple[int, Any]:
    body: dict[str, Any] = {
        "envelope_sender": "s@acme.test",
        "template": False,
        "content": f"From: s@acme.test\r\nSubject: hi\r\n{DATE}\r\nhello\r\n",
        "recipients": [{"email": email} for email in recipients],
    }
    if tenant is not None:
        body["tenant"] = tenant
    return node.http_post("/api/v1/inject", body, token)


def _assert_reserved(text: str, domain: str, tenant: str | None) -> None:
    whose = f"mail of tenant {tenant}" if tenant is not None else "mail of no tenant"
    assert text.startswith(f"550 5.7.1 mail to {domain} goes by a [[route]] reserved for other tenants: "), text
    assert whose in text and "ask the operator" in text, text
    assert "globex" not in text.replace(domain, ""), text  # it names no other tenant


def test_a_bound_user_cannot_send_to_a_route_reserved_for_another_tenant_at_rcpt(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink]
) -> None:
    ordinary, relay = sinks
    with PigeonProcess(tmp_path / "node", **_config(tmp_path, ordinary, relay)) as node:
        _assert_reserved(_rcpt(node, "alice", "anyone@globex-relay.test"), "globex-relay.test", "acme")
        _assert_reserved(_rcpt(node, "alice", "anyone@Mail.GLOBEX.test"), "mail.globex.test", "acme")
        rejections = node.wait_records("Rejection", 2)
        assert [r["command"] for r in rejections] == ["RCPT", "RCPT"], rejections
        # Her mail elsewhere goes, and globex's user sends by globex's route, as before.
        assert _send(node, "alice", ["friend@example.net"], None).startswith("250 ")
        assert _send(node, "gina", ["anyone@globex-relay.test"], None).startswith("250 ")
        (received,) = relay.wait_for(1)
        assert (received.auth_user, received.recipients) == ("globex", ["anyone@globex-relay.test"])
        ordinary.wait_for(1)
        assert relay.after(1.0) == [received]


def test_an_unbound_client_naming_another_tenant_is_refused_at_the_end_of_data(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink]
) -> None:
    ordinary, relay = sinks
    with PigeonProcess(tmp_path / "node", **_config(tmp_path, ordinary, relay)) as node:
        # Its tenant is only known from its header: RCPT is taken, DATA refused.
        reply = _send(node, "bob", ["anyone@globex-relay.test", "friend@example.net"], "acme")
        _assert_reserved(reply, "globex-relay.test", "acme")
        _assert_reserved(_send(node, "bob", ["anyone@globex-relay.test"], None), "globex-relay.test", None)
        assert node.records("Reception") == []
        assert _send(node, "bob", ["anyone@globex-relay.test"], "globex").startswith("250 ")
        (received,) = relay.wait_for(1)
        assert received.auth_user == "globex"
        assert relay.after(1.0) == [received]


def test_an_injection_of_another_tenant_refuses_the_reserved_routes_recipient_alone(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink]
) -> None:
    ordinary, relay = sinks
    with PigeonProcess(tmp_path / "node", **_config(tmp_path, ordinary, relay)) as node:
        status, answer = _inject(node, ACME_TOKEN, ["anyone@globex-relay.test", "friend@example.net"])
        assert (status, answer["accepted"], answer["failed"]) == (200, 1, 1), answer
        refused, taken = answer["recipients"]
        _assert_reserved(refused["error"], "globex-relay.test", "acme")
        assert taken["id"], taken
        # The operator's token naming acme alike; with every recipient refused, 422.
        status, answer = _inject(node, OPS_TOKEN, ["a@x.globex.test"], "acme")
        assert (status, answer["accepted"]) == (422, 0), answer
        _assert_reserved(answer["recipients"][0]["error"], "x.globex.test", "acme")
        # Naming no tenant, its message is judged when it is stored: no tenant is none of globex.
        status, answer = _inject(node, OPS_TOKEN, ["a@globex-relay.test"])
        assert (status, answer["accepted"]) == (422, 0), answer
        _assert_reserved(answer["recipients"][0]["error"], "globex-relay.test", None)
        # KumoMTA's endpoint answers 200 with the recipient refused, every one or not, as its own
        # section says (found from outside: the README promised it 422 as well).
        kumo = {
            "envelope_sender": "s@acme.test",
            "content": f"From: s@acme.test\r\nSubject: hi\r\n{DATE}\r\nhello\r\n",
            "recipients": [{"email": "b@globex-relay.test"}],
        }
        status, answer = node.http_post("/api/inject/v1", kumo, ACME_TOKEN)
        assert (status, answer["success_count"], answer["fail_count"]) == (200, 0, 1), answer
        assert answer["failed_recipients"] == ["b@globex-relay.test"], answer
        _assert_reserved(answer["errors"][0].partition(": ")[2], "globex-relay.test", "acme")
        rejections = node.wait_records("Rejection", 4)
        assert [(r["command"], r["response"]["code"]) for r in rejections] == [("inject", 550)] * 4, rejections
        status, answer = _inject(node, OPS_TOKEN, ["a@globex-relay.test"], "globex")
        assert (status, answer["accepted"]) == (200, 1), answer
        (received,) = relay.wait_for(1)
        assert (received.auth_user, received.recipients) == ("globex", ["a@globex-relay.test"])
        ordinary.wait_for(1)
        assert relay.after(1.0) == [received]


def test_a_rebind_onto_a_route_reserved_for_another_tenant_leaves_that_mail_in_place_and_says_so(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink]
) -> None:
    """Found from outside: `pigeon rebind --routing-domain globex-relay.test` of acme's mail
    answered `rebound 1 message`, exit 0, and the mail then bounced (as it never goes under
    globex's account). Now it stays where it was, and the answer says so; mail of a tenant
    the route is for moves as before."""
    ordinary, relay = sinks
    ordinary.rcpt_reply = lambda address: "451 4.3.0 try again later" if address.startswith("wait") else None
    config = _config(tmp_path, ordinary, relay)
    config["delivery"]["retry_interval"] = config["delivery"]["max_retry_interval"] = "1h"
    with PigeonProcess(tmp_path / "node", **config) as node:
        status, answer = _inject(node, ACME_TOKEN, ["wait@example.net"])
        assert (status, answer["accepted"]) == (200, 1), answer
        status, answer = _inject(node, OPS_TOKEN, ["wait-g@example.net"], "globex")
        assert (status, answer["accepted"]) == (200, 1), answer
        wait_until(lambda: len(node.records("TransientFailure")) == 2, 30)
        said = node.cli("rebind", "--tenant", "acme", "--routing-domain", "globex-relay.test")
        assert said.splitlines()[0] == (
            "rebound 0 messages (0 once their attempt under way ends); 1 message left in place: the [[route]] of "
            "globex-relay.test is reserved for other tenants than theirs ([[route]] tenants); moved there they "
            "would bounce"
        ), said
        rebind = {"domain": "example.net", "routing_domain": "globex-relay.test"}  # both tenants' mail
        status, rebound = node.http_call("POST", "/api/v1/admin/rebind", rebind, OPS_TOKEN)
        assert (status, rebound["rebound"], rebound["reserved_left"]) == (200, 1, 1), rebound
        (received,) = relay.wait_for(1)  # globex's went by its route
        assert (received.auth_user, received.recipients) == ("globex", ["wait-g@example.net"])
        node.wait_records("Delivery", 1)  # (globex's gone from the spool: written once the relay took it)
        assert node.records("Bounce") == []
        # Acme's waits where it was, for its own next hop.
        (waiting,) = [m["envelope"] for m in node.spool_messages()]
        assert (waiting.tenant, waiting.routing_domain) == ("acme", None), waiting
        assert relay.after(1.0) == [received]


def test_a_reload_that_reserves_a_route_bounces_the_mail_waiting_for_it(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink]
) -> None:
    ordinary, relay = sinks
    relay.rcpt_reply = lambda address: "451 4.3.0 try again later"
    config = _config(tmp_path, ordinary, relay, reserved=False)
    with PigeonProcess(tmp_path / "node", **config) as node:
        # Before the reload the route is anyone's: acme's mail is tried there (deferred).
        status, answer = _inject(node, ACME_TOKEN, ["anyone@globex-relay.test"])
        assert (status, answer["accepted"]) == (200, 1), answer
        wait_until(lambda: node.records("TransientFailure"), 30)
        for route in node.config["route"][:2]:
            route["tenants"] = ["globex"]
        node.config_path.write_text(to_toml(node.config))
        assert node.process is not None
        before = node.stderr().count("reloaded:")
        node.process.send_signal(signal.SIGHUP)
        wait_until(lambda: node.stderr().count("reloaded:") > before, timeout=10)
        tried = len(relay.rcpt_log)
        (bounce,) = node.wait_records("Bounce", 1, timeout=30)
        assert bounce["response"]["enhanced"] == "5.7.1", bounce
        assert len(relay.rcpt_log) == tried  # never tried there again
        # New mail of acme's is refused where it arrives.
        status, answer = _inject(node, ACME_TOKEN, ["anyone@globex-relay.test"])
        assert (status, answer["accepted"]) == (422, 0), answer


def test_an_unreserved_route_with_a_reserved_routes_account_is_warned_about_by_check_and_at_start(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink]
) -> None:
    """Found from outside: a second, unreserved `[[route]]` with globex's next hop, user and
    password file passed `serve --check` without a word, and any tenant's mail for its domain
    then went out through globex's account."""
    ordinary, relay = sinks
    config = _config(tmp_path, ordinary, relay)
    shared = {k: v for k, v in config["route"][0].items() if k != "tenants"}
    config["route"].insert(2, shared | {"domain": "other-relay.test"})
    node = PigeonProcess(tmp_path / "node", **config)
    warning = (
        f"[[route]] #3 (domain 'other-relay.test') logs in to 127.0.0.1:{relay.port} as 'globex' as #1 (domain "
        "'globex-relay.test') does, and they are not reserved alike (#1: tenant globex's alone; #3: any tenant's "
        "mail, or none's): by either, its tenants' mail goes out through that one account; give them the same "
        "tenants, or each an account of its own"
    )
    checked = zygote.run(
        ["serve", "--check", "-c", str(node.config_path)],
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    assert f"pigeon: warning: {warning}\n" in checked.stderr, checked.stderr
    assert checked.stderr.count("logs in to") == 1, checked.stderr  # #2 is reserved alike: no word of it
    with node:
        node.wait_stderr(warning)
    # Reserved alike, not a word.
    config["route"][2]["tenants"] = ["globex"]
    alike = tmp_path / "alike.toml"
    alike.write_text(to_toml({**node.config, "route": config["route"]}))
    checked = zygote.run(
        ["serve", "--check", "-c", str(alike)],
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0 and "logs in to" not in checked.stderr, checked.stderr
