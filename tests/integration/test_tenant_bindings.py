"""A credential bound to tenants (the users file's `:tenants=`, `[[http.token]] tenants`) sends
as those tenants alone, at every door: SMTP after AUTH (DATA and BDAT), HTTP injection (the
request's `tenant`, raw content, parts' headers) and `pigeon inject`. A tenant picks its
`[[dkim]] tenant` key: before bindings, any AUTH user or inject token that wrote `X-Tenant: B`
got its mail signed with tenant B's key (d=b.example). Refused: 550 5.7.1 over SMTP, 403
naming the field over HTTP, a Rejection either way. A credential bound to one tenant gives it
to mail naming none. Unbound credentials keep claiming any tenant. A SIGHUP takes changed
bindings, from the next message of a session already open."""

from __future__ import annotations

import base64
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pigeon.dkim.keys import PrivateKey, generate_key, record_text, write_key
from pigeon.listener.passwords import set_password
from tests.support import zygote
from tests.support.dkim import dkimpy_verify, key_server
from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess, to_toml
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

BOUND_TOKEN = "bound-token-0123456789"  # inject, tenants = ["A"]
FREE_TOKEN = "free-token-0123456789"  # inject, unbound
PASSWORD = "secret-password"
DATE = b"Date: Mon, 1 Jan 2024 00:00:00 +0000\r\n"


@dataclass
class Keys:
    a: PrivateKey
    b: PrivateKey


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(generate_key("ed25519-sha256"), generate_key("ed25519-sha256"))


@pytest.fixture(scope="module")
def dns(keys: Keys) -> Iterator[DnsServer]:
    zone = Zone()
    zone.records["s1._domainkey.a.example"] = [("TXT", record_text(keys.a))]
    zone.records["s1._domainkey.b.example"] = [("TXT", record_text(keys.b))]
    server = key_server(zone)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, keys: Keys, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("bindings")
    users = root / "users"
    set_password(users, "alice", PASSWORD, ["A"])  # one tenant: hers by default
    set_password(users, "carol", PASSWORD, ["A", "B"])  # two: mail naming none has none
    set_password(users, "bob", PASSWORD)  # unbound: any tenant, as before bindings
    key_a, key_b = root / "a.pem", root / "b.pem"
    write_key(key_a, keys.a)
    write_key(key_b, keys.b)
    dkim = [
        {"domain": "a.example", "selector": "s1", "private_key": key_a, "tenant": "A", "algorithm": "ed25519-sha256"},
        {"domain": "b.example", "selector": "s1", "private_key": key_b, "tenant": "B", "algorithm": "ed25519-sha256"},
    ]
    tokens = [
        {"name": "shop-a", "token": BOUND_TOKEN, "scopes": ["inject"], "tenants": ["A"]},
        {"name": "ops", "token": FREE_TOKEN, "scopes": ["inject"]},
    ]
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    config = delivery_config(sink.endpoint)
    with PigeonProcess(root / "node", smtp=smtp, http={"token": tokens}, dkim=dkim, **config) as running:
        yield running


def _login(smtp: RawSmtp, user: str) -> None:
    smtp.expect(220)
    smtp.expect(250, "EHLO client.test")
    plain = base64.b64encode(f"\0{user}\0{PASSWORD}".encode()).decode()
    smtp.expect(235, f"AUTH PLAIN {plain}")


def _send(smtp: RawSmtp, data: bytes, *, bdat: bool, to: str = "rcpt@sink.test") -> tuple[int, list[str]]:
    """One message in an open session; the reply to its end."""
    smtp.expect(250, "MAIL FROM:<sender@a.example>")
    smtp.expect(250, f"RCPT TO:<{to}>")
    if bdat:
        smtp.send(b"BDAT %d LAST\r\n" % len(data) + data)
    else:
        smtp.expect(354, "DATA")
        smtp.send(data + b".\r\n")
    return smtp.reply()


def _smtp(node: PigeonProcess, user: str, data: bytes, *, bdat: bool, to: str = "rcpt@sink.test") -> str:
    with RawSmtp(node.smtp_port) as smtp:
        _login(smtp, user)
        code, text = _send(smtp, data, bdat=bdat, to=to)
    return f"{code} {' '.join(text)}"


def _message(author: str, tenant: str | None, subject: str) -> bytes:
    routing = f"X-Tenant: {tenant}\r\n".encode() if tenant is not None else b""
    return f"From: {author}\r\n".encode() + routing + f"Subject: {subject}\r\n".encode() + DATE + b"\r\nbody\r\n"


def _delivered(sink: ScriptedSink, subject: str) -> bytes:
    """The data the sink got for the message with this subject."""
    marker = f"Subject: {subject}\r\n".encode()
    found = wait_until(lambda: [r for r in sink.received if marker in r.data])
    assert len(found) == 1
    return bytes(found[0].data)


def _signers(data: bytes, dns: DnsServer) -> list[str]:
    """The d= of each signature, each verified by dkimpy with the test's DNS."""
    assert all(dkimpy_verify(data, dns)), data[:600]
    return re.findall(r"\bd=([^;\s]+)", re.sub(r"\r\n[ \t]", " ", data.decode()))


def _rejections(node: PigeonProcess, command: str, code: int, user: str) -> list[dict[str, Any]]:
    return [
        r
        for r in node.records("Rejection")
        if r["command"] == command and r["response"]["code"] == code and r.get("auth_user") == user
    ]


@pytest.mark.parametrize("bdat", [False, True], ids=["DATA", "BDAT"])
def test_a_bound_user_may_not_send_as_another_tenant(node: PigeonProcess, sink: ScriptedSink, bdat: bool) -> None:
    verb = "BDAT" if bdat else "DATA"
    before = len(_rejections(node, verb, 550, "alice"))
    subject = f"claims B {verb}"
    reply = _smtp(node, "alice", _message("ceo@b.example", "B", subject), bdat=bdat)
    assert reply == "550 5.7.1 alice may not send as tenant B (X-Tenant header)"
    (rejection,) = wait_until(lambda: _rejections(node, verb, 550, "alice")[before:])
    assert "may not send as tenant B" in rejection["response"]["text"]
    assert rejection["recipients"] == ["rcpt@sink.test"]
    # Nothing stored, nothing sent: however the header is written.
    assert _smtp(node, "alice", _message("ceo@b.example", "  B ", subject + " spaced"), bdat=bdat).startswith("550 ")
    time.sleep(0.5)
    assert not [r for r in sink.received if subject.encode() in r.data]


@pytest.mark.parametrize("bdat", [False, True], ids=["DATA", "BDAT"])
def test_a_bound_user_sends_as_its_own_tenant_signed_with_its_key(
    node: PigeonProcess, sink: ScriptedSink, dns: DnsServer, bdat: bool
) -> None:
    verb = "BDAT" if bdat else "DATA"
    assert _smtp(node, "alice", _message("shop@a.example", "A", f"own {verb}"), bdat=bdat).startswith("250 ")
    data = _delivered(sink, f"own {verb}")
    assert _signers(data, dns) == ["a.example"]
    assert b"x-tenant" not in data.lower()
    # Naming no tenant, her mail is her one tenant's: signed with its key, in its queues.
    assert _smtp(node, "alice", _message("shop@a.example", None, f"none {verb}"), bdat=bdat).startswith("250 ")
    assert _signers(_delivered(sink, f"none {verb}"), dns) == ["a.example"]
    assert wait_until(lambda: node.records("Reception")[-1]["queue"]) == "A@sink.test"


def test_a_user_bound_to_two_tenants_sends_as_either_and_none_by_default(
    node: PigeonProcess, sink: ScriptedSink, dns: DnsServer
) -> None:
    for tenant, domain in (("A", "a.example"), ("B", "b.example")):
        assert _smtp(node, "carol", _message(f"x@{domain}", tenant, f"carol {tenant}"), bdat=False).startswith("250")
        assert _signers(_delivered(sink, f"carol {tenant}"), dns) == [domain]
    assert _smtp(node, "carol", _message("x@b.example", None, "carol none"), bdat=False).startswith("250")
    assert _signers(_delivered(sink, "carol none"), dns) == []  # no tenant: no tenant's key
    assert _smtp(node, "carol", _message("x@b.example", "C", "carol C"), bdat=True).startswith("550 5.7.1 carol ")


def test_an_unbound_user_claims_any_tenant_as_before(node: PigeonProcess, sink: ScriptedSink, dns: DnsServer) -> None:
    assert _smtp(node, "bob", _message("ceo@b.example", "B", "bob B"), bdat=False).startswith("250 ")
    assert _signers(_delivered(sink, "bob B"), dns) == ["b.example"]


def _inject(node: PigeonProcess, token: str, content: Any, tenant: str | None = None) -> tuple[int, Any]:
    request: dict[str, Any] = {
        "envelope_sender": "sender@a.example",
        "recipients": [{"email": "rcpt@sink.test"}],
        "content": content,
        "template": False,
    }
    if tenant is not None:
        request["tenant"] = tenant
    return node.http_post("/api/v1/inject", request, token)


def _parts(author: str, subject: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {"from": {"email": author}, "subject": subject, "text": "body", "headers": headers or {}}


def _raw(author: str, subject: str, tenant: str | None = None) -> str:
    return _message(author, tenant, subject).decode()


def test_a_bound_token_may_not_inject_as_another_tenant(node: PigeonProcess, sink: ScriptedSink) -> None:
    before = len(_rejections(node, "inject", 403, "shop-a"))
    refused = "550 5.7.1 shop-a may not send as tenant B"
    cases = [
        (_raw("ceo@b.example", "tok raw"), "B", "$.tenant"),
        (_parts("ceo@b.example", "tok parts"), "B", "$.tenant"),
        (_raw("ceo@b.example", "tok raw header", "B"), None, "$.content"),
        (_parts("ceo@b.example", "tok parts header", {"X-Tenant": "B"}), None, "$.content.headers.X-Tenant"),
    ]
    for content, tenant, field in cases:
        status, answer = _inject(node, BOUND_TOKEN, content, tenant)
        assert (status, answer["field"]) == (403, field), answer
        assert answer["error"].startswith(refused), answer
    wait_until(lambda: len(_rejections(node, "inject", 403, "shop-a")) == before + len(cases))
    time.sleep(0.5)
    assert not [r for r in sink.received if b"Subject: tok " in r.data]


def test_a_tenant_that_names_no_queue_is_refused_as_such_before_the_binding_at_every_door(
    node: PigeonProcess,
) -> None:
    # `othe\u200br` is no tenant at all, so none alice may not name: SMTP says the first,
    # and so must HTTP (it said 403, the binding, for the same content).
    reply = "554 5.6.0 X-Tenant header contains U+200B ZERO WIDTH SPACE: no control or format characters allowed"
    with RawSmtp(node.smtp_port) as smtp:
        _login(smtp, "alice")
        smtp.expect(250, "MAIL FROM:<sender@a.example> SMTPUTF8")
        smtp.expect(250, "RCPT TO:<rcpt@sink.test>")
        smtp.expect(354, "DATA")
        smtp.send(_message("ceo@b.example", "othe\u200br", "zw smtp") + b".\r\n")
        code, text = smtp.reply()
    assert f"{code} {' '.join(text)}".startswith(reply), text
    for content, field in [
        (_raw("ceo@b.example", "zw raw", "othe\u200br"), "$.content"),
        (_parts("ceo@b.example", "zw parts", {"X-Tenant": "othe\u200br"}), "$.content.headers.X-Tenant"),
    ]:
        status, answer = _inject(node, BOUND_TOKEN, content)
        assert (status, answer["field"]) == (400, field), answer
        assert answer["error"].startswith(reply), answer


def test_a_bound_token_injects_as_its_tenant_signed_with_its_key(
    node: PigeonProcess, sink: ScriptedSink, dns: DnsServer
) -> None:
    for content, tenant, subject in [
        (_raw("shop@a.example", "inj raw"), "A", "inj raw"),
        (_parts("shop@a.example", "inj parts", {"X-Tenant": "A"}), None, "inj parts"),
        (_parts("shop@a.example", "inj none"), None, "inj none"),  # its one tenant, named or not
    ]:
        status, answer = _inject(node, BOUND_TOKEN, content, tenant)
        assert (status, answer["accepted"]) == (200, 1), answer
        assert _signers(_delivered(sink, subject), dns) == ["a.example"]
    assert node.records("Reception")[-1]["queue"] == "A@sink.test"


def test_an_unbound_token_injects_as_any_tenant(node: PigeonProcess, sink: ScriptedSink, dns: DnsServer) -> None:
    status, answer = _inject(node, FREE_TOKEN, _raw("ceo@b.example", "free raw"), "B")
    assert (status, answer["accepted"]) == (200, 1), answer
    assert _signers(_delivered(sink, "free raw"), dns) == ["b.example"]


def test_pigeon_inject_with_a_bound_token_is_refused_another_tenant(node: PigeonProcess) -> None:
    command = ["inject", "-c", str(node.config_path), "--token", BOUND_TOKEN]
    command += ["--from", "ceo@b.example", "--to", "rcpt@sink.test", "--tenant", "B", "--subject", "cli", "--text", "x"]
    done = zygote.run(command, timeout=60, check=False)
    assert done.returncode != 0, done
    assert "shop-a may not send as tenant B" in done.stderr.decode(), done


def _hangup(node: PigeonProcess) -> None:
    assert node.process is not None
    before = node.stderr().count("reloaded:")
    node.process.send_signal(signal.SIGHUP)
    wait_until(lambda: node.stderr().count("reloaded:") > before, timeout=10)


def test_a_reload_takes_changed_bindings(tmp_path: Path) -> None:
    users = tmp_path / "users"
    set_password(users, "alice", PASSWORD, ["A"])
    tokens = [{"name": "shop", "token": BOUND_TOKEN, "scopes": ["inject"], "tenants": ["A"]}]
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    with PigeonProcess(tmp_path / "node", smtp=smtp, http={"token": tokens}) as node:
        with RawSmtp(node.smtp_port) as session:  # open across the reload
            _login(session, "alice")
            assert _send(session, _message("x@b.example", "B", "before"), bdat=False)[0] == 550
            status, _ = _inject(node, BOUND_TOKEN, _raw("x@b.example", "before"), "B")
            assert status == 403
            # Bound to B now, her password left as it is (a new one would end her session's
            # authentication: `test_reload_withdraws_open_sessions_authorization`).
            users.write_text(users.read_text().replace(":tenants=A", ":tenants=B"))
            node.config["http"]["token"][0]["tenants"] = ["B"]
            node.config_path.write_text(to_toml(node.config))
            _hangup(node)
            assert _send(session, _message("x@b.example", "B", "after"), bdat=True)[0] == 250
            assert _send(session, _message("x@a.example", "A", "after A"), bdat=False)[0] == 550
            assert _send(session, _message("x@b.example", None, "after none"), bdat=False)[0] == 250
            assert node.wait_records("Reception", 2)[-1]["queue"] == "B@sink.test"
        status, answer = _inject(node, BOUND_TOKEN, _raw("x@b.example", "after"), "B")
        assert (status, answer["accepted"]) == (200, 1), answer
        assert _inject(node, BOUND_TOKEN, _raw("x@a.example", "after"), "A")[0] == 403
        # Unbound again (the option removed by hand): any tenant.
        users.write_text(re.sub(r":tenants=[^\n]*", "", users.read_text()))
        _hangup(node)
        with RawSmtp(node.smtp_port) as session:
            _login(session, "alice")
            assert _send(session, _message("x@a.example", "Z", "unbound"), bdat=False)[0] == 250
