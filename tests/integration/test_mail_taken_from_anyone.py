"""Mail Pigeon takes from anyone (RFC 5321 4.5.1 <postmaster>) is not the operator's mail: no
`[[dkim]]` block signs it, or an outsider would get a forged From of a signed domain delivered
passing DMARC; and its X-Tenant and X-Campaign headers route nothing, or it would pick a
tenant's queue, policies and key. The same message from a relay client, or from an
authenticated one, is the operator's: signed, and routed by its headers."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pigeon.dkim.keys import PrivateKey, generate_key, record_text, write_key
from pigeon.listener.passwords import set_password
from tests.support.dkim import dkimpy_verify, key_server
from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import Received, ScriptedSink, delivery_config

RELAY_CLIENT = "127.0.0.2"  # the only address of relay_networks; the tests' 127.0.0.1 is outside
PLAIN = "AGFwcABzZWNyZXQtcGFzc3dvcmQ="  # base64 of "\0app\0secret-password"
FORGED = (
    b"From: CEO <ceo@bank.test>\r\n"
    b"To: postmaster\r\n"
    b"X-Tenant: acme\r\n"
    b"X-Campaign: vip\r\n"
    b"Subject: wire the money today\r\n"
    b"Date: Mon, 1 Jan 2024 00:00:00 +0000\r\n"
    b"Message-ID: <forged@bank.test>\r\n"
    b"\r\n"
    b"Signed by the bank's own key, if Pigeon lets it.\r\n"
)
SIGNER_POLICY = """
    from pigeon.policy import Changes
    def on_message(message):
        seen = f"trusted={message.trusted} tenant={message.tenant}"
        return Changes(dkim=["bank"], add_headers=[("X-Policy-Saw", seen)])
"""


@pytest.fixture(scope="module")
def keys() -> dict[str, PrivateKey]:
    return {"bank": generate_key("rsa-sha256"), "acme": generate_key("ed25519-sha256")}


@pytest.fixture(scope="module")
def dns(keys: dict[str, PrivateKey]) -> Iterator[DnsServer]:
    zone = Zone()
    zone.records["s1._domainkey.bank.test"] = [("TXT", record_text(keys["bank"]))]
    zone.records["acme1._domainkey.esp.test"] = [("TXT", record_text(keys["acme"]))]
    server = key_server(zone)
    yield server
    server.stop()


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


def _node(root: Path, sink: ScriptedSink, keys: dict[str, PrivateKey], **sections: object) -> PigeonProcess:
    """The tester's node: the bank's key for its author domain, and a tenant's key for any
    author domain of that tenant's mail."""
    root.mkdir()
    paths = {}
    for name, key in keys.items():
        paths[name] = root / f"{name}.pem"
        write_key(paths[name], key)
    users = root / "users"
    set_password(users, "app", "secret-password")
    smtp = {
        "relay_networks": [f"{RELAY_CLIENT}/32"],
        "postmaster": "ops-team@provider.test",
        "auth_users": str(users),
        "allow_plaintext_auth": True,
    }
    dkim = [
        {"domain": "bank.test", "selector": "s1", "private_key": paths["bank"], "name": "bank"},
        {
            "domain": "*",
            "signing_domain": "esp.test",
            "selector": "acme1",
            "private_key": paths["acme"],
            "algorithm": "ed25519-sha256",
            "tenant": "acme",
        },
    ]
    return PigeonProcess(root / "node", smtp=smtp, dkim=dkim, **sections, **delivery_config(sink.endpoint))


@pytest.fixture
def pigeon(tmp_path: Path, sink: ScriptedSink, keys: dict[str, PrivateKey]) -> Iterator[PigeonProcess]:
    with _node(tmp_path / "keys", sink, keys) as process:
        yield process


def _send(
    pigeon: PigeonProcess, recipient: str, *, source: str | None = None, login: bool = False, data: bytes = FORGED
) -> tuple[int, list[str]]:
    """Send `data` to `recipient`; the reply to its end of data."""
    with RawSmtp(pigeon.smtp_port, source=source) as client:
        client.expect(220)
        client.expect(250, "EHLO attacker.test")
        if login:
            client.expect(235, f"AUTH PLAIN {PLAIN}")
        client.expect(250, "MAIL FROM:<ceo@bank.test>")
        client.expect(250, f"RCPT TO:<{recipient}>")
        client.expect(354, "DATA")
        client.send(data + b".\r\n")
        answer = client.reply()
        client.expect(221, "QUIT")
    return answer


def _signers(received: Received) -> list[tuple[str, str]]:
    """The d= and s= of each DKIM-Signature, top first."""
    found = []
    for match in re.finditer(rb"(?im)^dkim-signature:([^\r\n]*(?:\r\n[ \t][^\r\n]*)*)", received.data):
        value = re.sub(rb"\s+", b"", match.group(1)).decode("ascii")
        tags = dict(tag.split("=", 1) for tag in value.split(";") if tag)
        found.append((tags["d"], tags["s"]))
    return found


def _routing_headers(received: Received) -> list[bytes]:
    return re.findall(rb"(?im)^x-(?:tenant|campaign)[ \t]*:", received.data)


def test_an_outsiders_mail_to_the_postmaster_is_delivered_unsigned_and_in_the_untenanted_queue(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    assert _send(pigeon, "postmaster")[0] == 250
    (received,) = sink.wait_for(1)
    assert received.recipients == ["ops-team@provider.test"]
    # Neither the bank's key (its From) nor the tenant's (its X-Tenant) signed it.
    assert _signers(received) == [], received.data.decode()
    (reception,) = pigeon.wait_records("Reception")
    assert reception["queue"] == "provider.test"
    # Its routing headers routed nothing, and do not leave either (as a relay client's).
    assert _routing_headers(received) == []
    assert b"Subject: wire the money today" in received.data


def test_an_outsiders_tenant_header_that_could_not_name_a_queue_is_not_refused_as_it_names_none(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    data = FORGED.replace(b"X-Tenant: acme", b"X-Tenant: " + b"a" * 300)
    refusal = "5.6.0 X-Tenant header is 300 characters long: at most 255 (it names a queue)"
    assert _send(pigeon, "ops-team@provider.test", source=RELAY_CLIENT, data=data) == (554, [refusal])
    assert _send(pigeon, "postmaster", data=data)[0] == 250
    (received,) = sink.wait_for(1)
    assert _routing_headers(received) == []
    assert [r["queue"] for r in pigeon.wait_records("Reception")] == ["provider.test"]


@pytest.mark.parametrize(
    ("source", "login"), [(RELAY_CLIENT, False), (None, True)], ids=["relay-client", "authenticated"]
)
def test_the_same_message_is_signed_and_tenanted_from_a_relay_or_authenticated_client_not_from_an_outsider(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, source: str | None, login: bool
) -> None:
    assert _send(pigeon, "ops-team@provider.test", source=source, login=login)[0] == 250
    assert _send(pigeon, "postmaster")[0] == 250
    trusted, outsider = sink.wait_for(2)
    assert _signers(trusted) == [("bank.test", "s1"), ("esp.test", "acme1")]
    assert dkimpy_verify(trusted.data, dns) == [True, True]
    assert _signers(outsider) == []
    assert [r["queue"] for r in pigeon.wait_records("Reception", 2)] == ["vip:acme@provider.test", "provider.test"]
    assert _routing_headers(trusted) == _routing_headers(outsider) == []


def test_a_policy_that_names_a_signer_for_an_outsiders_mail_has_it_signed_and_is_told_it_is_untrusted(
    tmp_path: Path, sink: ScriptedSink, keys: dict[str, PrivateKey], dns: DnsServer
) -> None:
    # The policy is the operator's code: a signer it names is its decision, made knowing
    # (`trusted`) that the mail came from anyone, and with no tenant from the headers.
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(SIGNER_POLICY))
    with _node(tmp_path / "keys", sink, keys, policy={"module": str(module)}) as pigeon:
        assert _send(pigeon, "postmaster")[0] == 250
        (received,) = sink.wait_for(1)
        assert b"X-Policy-Saw: trusted=False tenant=None\r\n" in received.data
        assert _signers(received) == [("bank.test", "s1")]
        assert dkimpy_verify(received.data, dns) == [True]
        (reception,) = pigeon.wait_records("Reception")
        assert reception["queue"] == "provider.test"
