"""DKIM signing by a real node, checked on what left it: mail sent in over SMTP (DATA and
BDAT) and HTTP, delivered to a sink on loopback, and each signature the sink got verified
by dkimpy and by OpenDKIM, with the keys served by the test's own DNS server."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from email import message_from_string
from email.policy import default
from pathlib import Path

import pytest

from pigeon.dkim.keys import PrivateKey, generate_key, record_text, write_key
from tests.support.dkim import dkimpy_verify, key_server, opendkim_verify
from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess, to_toml
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import Received, ScriptedSink, delivery_config, wait_until

TOKEN = "inject-token-0123456789"


@dataclass
class Keys:
    rsa: PrivateKey
    ed25519: PrivateKey
    tenant: PrivateKey
    other: PrivateKey


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(
        generate_key("rsa-sha256"),
        generate_key("ed25519-sha256"),
        generate_key("rsa-sha256"),
        generate_key("ed25519-sha256"),
    )


@pytest.fixture(scope="module")
def dns(keys: Keys) -> Iterator[DnsServer]:
    zone = Zone()
    for name, key in [
        ("rsa1._domainkey.example.com", keys.rsa),
        ("ed1._domainkey.example.com", keys.ed25519),
        ("sub._domainkey.news.example.org", keys.rsa),
        ("acme._domainkey.acme.test", keys.tenant),
        ("other._domainkey.acme.test", keys.other),
        ("idn._domainkey.xn--bcher-kva.example", keys.ed25519),
        ("dsn._domainkey.mx.pigeon.test", keys.ed25519),  # PigeonProcess's [smtp] hostname
    ]:
        zone.records[name] = [("TXT", record_text(key))]
    server = key_server(zone)
    yield server
    server.stop()


@pytest.fixture
def sink(request: pytest.FixtureRequest) -> Iterator[ScriptedSink]:
    """A sink that offers SMTPUTF8, unless a test parametrizes it (indirectly) with False."""
    with ScriptedSink(smtputf8=getattr(request, "param", True)) as running:
        yield running


def _key_file(directory: Path, name: str, key: PrivateKey) -> Path:
    path = directory / f"{name}.pem"
    write_key(path, key)
    return path


@pytest.fixture
def pigeon(tmp_path: Path, sink: ScriptedSink, keys: Keys) -> Iterator[PigeonProcess]:
    keydir = tmp_path / "keys"
    keydir.mkdir()
    rsa, ed, tenant, other = (_key_file(keydir, n, getattr(keys, n)) for n in ("rsa", "ed25519", "tenant", "other"))
    dkim = [
        {"domain": "example.com", "selector": "rsa1", "private_key": rsa, "name": "example-rsa"},
        {"domain": "example.com", "selector": "ed1", "private_key": ed, "algorithm": "ed25519-sha256"},
        {"domain": "*.example.org", "selector": "sub", "private_key": rsa, "canonicalization": "simple/simple"},
        {"domain": "acme.test", "selector": "acme", "private_key": tenant, "tenant": "acme"},
        {
            "domain": "acme.test",
            "selector": "other",
            "private_key": other,
            "tenant": "other",
            "algorithm": "ed25519-sha256",
        },
        {"domain": "xn--bcher-kva.example", "selector": "idn", "private_key": ed, "algorithm": "ed25519-sha256"},
    ]
    config = delivery_config(sink.endpoint)
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    with PigeonProcess(tmp_path / "node", http={"token": tokens}, dkim=dkim, **config) as process:
        yield process


def _signatures(data: bytes) -> list[dict[str, str]]:
    """The tags of each DKIM-Signature field, top first."""
    found = []
    for match in re.finditer(rb"(?im)^dkim-signature:([^\r\n]*(?:\r\n[ \t][^\r\n]*)*)", data):
        value = re.sub(rb"\s+", b"", match.group(1)).decode("ascii")
        found.append(dict(tag.split("=", 1) for tag in value.split(";") if tag))
    return found


def _check(received: Received, dns: DnsServer, workdir: Path) -> list[dict[str, str]]:
    """Each signature good for both verifiers, each alone; returns the signatures' tags."""
    data = received.data
    signatures = _signatures(data)
    assert signatures, data[:400]
    assert dkimpy_verify(data, dns) == [True] * len(signatures), data.decode("utf-8", "replace")
    # OpenDKIM reports on the message as a whole: give it each signature on its own.
    fields = re.findall(rb"(?im)^dkim-signature:[^\r\n]*(?:\r\n[ \t][^\r\n]*)*\r\n", data)
    for field in fields:
        alone = data
        for other in fields:
            if other is not field:
                alone = alone.replace(other, b"", 1)
        result = opendkim_verify(alone, dns, workdir)
        assert (result.returncode, result.stdout, result.stderr) == (0, b"", b""), (field, alone)
    return signatures


DATE = b"Date: Mon, 1 Jan 2024 00:00:00 +0000\r\n"  # OpenDKIM refuses a message without one (RFC 5322 3.6)


def _smtp(port: int, sender: str, recipients: list[str], data: bytes, *, bdat: list[int] | None = None) -> None:
    """Send one message: with DATA (dot-stuffed here), or with BDAT in chunks of these sizes."""
    utf8 = not (sender + "".join(recipients)).isascii() or not data.isascii()
    with RawSmtp(port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, f"MAIL FROM:<{sender}>" + (" SMTPUTF8 BODY=8BITMIME" if utf8 else ""))
        for recipient in recipients:
            smtp.expect(250, f"RCPT TO:<{recipient}>")
        if bdat is None:
            smtp.expect(354, "DATA")
            stuffed = re.sub(rb"(?m)^\.", b"..", data)
            smtp.send(stuffed + (b"" if stuffed.endswith(b"\r\n") or not stuffed else b"\r\n") + b".\r\n")
            smtp.expect(250)
        else:
            at = 0
            for number, size in enumerate(bdat):
                last = number == len(bdat) - 1
                chunk = data[at:] if last else data[at : at + size]
                at += len(chunk)
                smtp.send(b"BDAT %d%s\r\n" % (len(chunk), b" LAST" if last else b"") + chunk)
                smtp.expect(250)
        smtp.expect(221, "QUIT")


MESSY = (
    b"From: Ann Example <ann@example.com>\r\n"
    b"To: bob@sink.test,\r\n"
    b"\t  carol@sink.test\r\n"
    b"Subject:   a  folded\r\n"
    b"   subject\t with   spaces  \r\n"
    b"Received: from a; Mon, 1 Jan 2024 00:00:00 +0000\r\n"
    b"Received: from b; Mon, 1 Jan 2024 00:00:00 +0000\r\n"
    b"Comments: one\r\n"
    b"Comments: two\r\n"
    b"Date: Mon, 1 Jan 2024 00:00:00 +0000\r\n"
    b"Message-ID: <messy@example.com>\r\n"
    b"\r\n"
    b"A body  with\t tabs and trailing spaces   \r\n"
    b".a line that starts with a dot\r\n"
    b"..two dots\r\n"
    b".\r\n"
    b"x" * 990 + b"\r\n"
    b"\r\n"
    b"   \r\n"
    b"\r\n"
)


def test_smtp_mail_is_signed_twice_rsa_and_ed25519_and_both_verify(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    _smtp(pigeon.smtp_port, "ann@example.com", ["bob@sink.test"], MESSY)
    (received,) = sink.wait_for(1)
    signatures = _check(received, dns, tmp_path)
    assert [(s["a"], s["d"], s["s"], s["c"]) for s in signatures] == [
        ("rsa-sha256", "example.com", "rsa1", "relaxed/relaxed"),
        ("ed25519-sha256", "example.com", "ed1", "relaxed/relaxed"),
    ]
    # Over-signed: From, To, Subject, Date and Message-ID once more than the message has them.
    names = signatures[0]["h"].split(":")
    assert [names.count(n) for n in ("from", "to", "subject", "date", "message-id")] == [2, 2, 2, 2, 2]
    assert "received" not in names and "comments" not in names
    # The content arrived as it was sent (dots unstuffed), below the signatures and our Received.
    assert received.data.endswith(MESSY.split(b"\r\n\r\n", 1)[1])


def test_bdat_mail_without_a_final_crlf_in_several_chunks_is_signed(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    data = (
        b"From: ann@example.com\r\nSubject: chunks\r\n"
        + DATE
        + b"\r\nfirst line\r\nlast line, no CRLF, trailing spaces  "
    )
    _smtp(pigeon.smtp_port, "ann@example.com", ["bob@sink.test"], data, bdat=[10, 30])
    (received,) = sink.wait_for(1)
    assert len(_check(received, dns, tmp_path)) == 2
    assert received.data.endswith(b"last line, no CRLF, trailing spaces  \r\n")


def test_an_empty_body_is_signed(pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path) -> None:
    _smtp(
        pigeon.smtp_port,
        "ann@example.com",
        ["bob@sink.test"],
        b"From: ann@example.com\r\nSubject: empty\r\n" + DATE + b"\r\n",
    )
    _smtp(
        pigeon.smtp_port, "ann@example.com", ["bob@sink.test"], DATE + b"From: ann@example.com\r\nSubject: no body\r\n"
    )
    for received in sink.wait_for(2):
        signatures = _check(received, dns, tmp_path)
        # The hash of an empty body, relaxed: SHA-256 of nothing (RFC 6376 3.4.4).
        assert signatures[0]["bh"] == base64.b64encode(hashlib.sha256(b"").digest()).decode()


def test_8bit_and_smtputf8_mail_is_signed(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    data = (
        "From: Zoë <zoë@example.com>\r\nTo: jörg@sink.test\r\nSubject: Grüße aus Köln\r\n"
        + DATE.decode()
        + "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"
        "Ünïcödé  body\t text\r\n"
    ).encode()
    _smtp(pigeon.smtp_port, "zoë@example.com", ["jörg@sink.test"], data)
    (received,) = sink.wait_for(1)
    assert "SMTPUTF8" in received.mail_options
    assert [s["a"] for s in _check(received, dns, tmp_path)] == ["rsa-sha256", "ed25519-sha256"]


def test_mail_from_an_internationalised_domain_is_signed_by_its_a_label_block(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    # [[dkim]] domain is written as an A-label (the configuration and keygen want one): it
    # must match the From domain written in Unicode, and d= is the A-label.
    data = ("From: Jörg <jörg@Bücher.example>\r\nSubject: Bücher\r\n" + DATE.decode() + "\r\nHallo\r\n").encode()
    _smtp(pigeon.smtp_port, "jörg@bücher.example", ["bob@sink.test"], data)
    (received,) = sink.wait_for(1)
    assert [(s["d"], s["s"]) for s in _check(received, dns, tmp_path)] == [("xn--bcher-kva.example", "idn")]


def test_with_several_authors_the_first_from_mailbox_names_the_signing_domain(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    data = b'From: "Example, Ann" <ann@example.com>, Shop <shop@acme.test>\r\nSubject: two\r\n' + DATE + b"\r\nhi\r\n"
    _smtp(pigeon.smtp_port, "ann@example.com", ["bob@sink.test"], data)
    (received,) = sink.wait_for(1)
    assert [(s["d"], s["s"]) for s in _check(received, dns, tmp_path)] == [
        ("example.com", "rsa1"),
        ("example.com", "ed1"),
    ]


def test_a_message_that_is_all_header_is_delivered_with_the_empty_line_and_verifies_simple(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    # Over BDAT a message may end with its last header field (no empty line, no final CRLF).
    # OpenDKIM failed `simple` header canonicalization of it as it came; dkimpy passed.
    data = b"From: list@news.example.org\r\n" + DATE + b"Subject: header only"
    _smtp(pigeon.smtp_port, "list@news.example.org", ["bob@sink.test"], data, bdat=[len(data)])
    (received,) = sink.wait_for(1)
    assert [(s["s"], s["c"]) for s in _check(received, dns, tmp_path)] == [("sub", "simple/simple")]
    assert received.data.endswith(DATE + b"Subject: header only\r\n\r\n")


def test_internal_headers_are_stripped_and_the_tenant_signs_with_its_own_key(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    data = b"X-Tenant: acme\r\nFrom: shop@acme.test\r\nX-Campaign: spring\r\nSubject: sale\r\n" + DATE + b"\r\nbuy\r\n"
    _smtp(pigeon.smtp_port, "shop@acme.test", ["bob@sink.test"], data)
    (received,) = sink.wait_for(1)
    assert b"x-tenant" not in received.data.lower() and b"x-campaign" not in received.data.lower()
    # The tenant "other" has a signer for acme.test too: not for acme's mail.
    assert [(s["d"], s["s"]) for s in _check(received, dns, tmp_path)] == [("acme.test", "acme")]
    # Without the tenant, nothing signs acme.test mail.
    _smtp(pigeon.smtp_port, "shop@acme.test", ["bob@sink.test"], data.replace(b"X-Tenant: acme\r\n", b""))
    assert _signatures(sink.wait_for(2)[1].data) == []


@pytest.mark.parametrize("order", [("acme", "other"), ("other", "acme")])
def test_of_two_tenant_fields_the_first_names_the_queue_and_the_signer_and_neither_leaves(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path, order: tuple[str, str]
) -> None:
    first, second = order
    data = f"X-Tenant: {first}\r\nFrom: shop@acme.test\r\nX-Tenant: {second}\r\n".encode() + DATE + b"\r\nbuy\r\n"
    _smtp(pigeon.smtp_port, "shop@acme.test", ["bob@sink.test"], data)
    (received,) = sink.wait_for(1)
    assert b"x-tenant" not in received.data.lower()
    assert [(s["d"], s["s"]) for s in _check(received, dns, tmp_path)] == [("acme.test", first)]
    (reception,) = pigeon.wait_records("Reception")
    assert reception["queue"] == f"{first}@sink.test"


def test_a_glob_signs_for_the_author_subdomain_and_simple_canonicalization_verifies(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    data = b"From: <list@news.example.org>\r\nSubject:  simple  \r\n" + DATE + b"\r\nbody   with spaces  \r\n\r\n\r\n"
    _smtp(pigeon.smtp_port, "list@news.example.org", ["bob@sink.test", "dora@other.test"], data)
    for received in sink.wait_for(2):  # one copy per recipient domain, the same signature on each
        signatures = _check(received, dns, tmp_path)
        assert [(s["d"], s["s"], s["c"]) for s in signatures] == [("news.example.org", "sub", "simple/simple")]
    first, second = sink.received
    assert _signatures(first.data) == _signatures(second.data)


def test_http_injected_mail_is_signed(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    parts = {
        "from": {"email": "ann@example.com", "name": "Ann"},
        "subject": "Hello {{ name }}",
        "text": "Hi {{ name }},\n\nline one  \n.dot line\n",
        "html": "<p>Hi {{ name }}</p>\n",
    }
    request = {
        "envelope_sender": "ann@example.com",
        "recipients": [{"email": "bob@sink.test", "substitutions": {"name": "Bob"}}],
        "content": parts,
        "tenant": "acme",
        "campaign": "spring",
    }
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer
    raw = "From: shop@acme.test\nSubject: raw\n\nraw body\n"  # the injection adds a Date
    status, answer = pigeon.http_post(
        "/api/v1/inject",
        {
            "envelope_sender": "shop@acme.test",
            "recipients": [{"email": "x@sink.test"}],
            "content": raw,
            "tenant": "acme",
        },
        TOKEN,
    )
    assert status == 200, answer
    built, injected_raw = sorted(sink.wait_for(2), key=lambda r: r.recipients[0])
    assert b"x-tenant" not in built.data.lower()
    assert [s["s"] for s in _check(built, dns, tmp_path)] == ["rsa1", "ed1"]
    assert [s["s"] for s in _check(injected_raw, dns, tmp_path)] == ["acme"]


def _inject_parts(pigeon: PigeonProcess, sender: str, author: str) -> None:
    parts = {"from": {"email": author, "name": "Jörg"}, "subject": "s", "text": "b"}
    request = {"envelope_sender": sender, "recipients": [{"email": "bob@sink.test"}], "content": parts}
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer


def test_http_parts_from_a_unicode_address_are_signed_for_its_a_label_domain(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    # The outside tester's request: From went out as one encoded word, address and all,
    # unsigned (no domain to be found in it), where SMTP and raw HTTP mail was signed.
    _inject_parts(pigeon, "jörg@bücher.example", "jörg@bücher.example")
    (received,) = sink.wait_for(1)
    assert "SMTPUTF8" in received.mail_options
    author = message_from_string(received.data.decode("utf-8"), policy=default)["From"].addresses[0]
    assert (author.display_name, author.addr_spec) == ("Jörg", "jörg@bücher.example")
    assert [(s["d"], s["s"]) for s in _check(received, dns, tmp_path)] == [("xn--bcher-kva.example", "idn")]


@pytest.mark.parametrize("sink", [False], indirect=True, ids=["sink-without-smtputf8"])
def test_http_parts_from_an_ascii_local_part_go_as_an_a_label_to_a_server_without_smtputf8(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    _inject_parts(pigeon, "joerg@bücher.example", "joerg@bücher.example")
    (received,) = sink.wait_for(1)
    assert received.data.isascii() and "SMTPUTF8" not in received.mail_options
    author = received.email["From"].addresses[0]
    assert (author.display_name, author.addr_spec) == ("Jörg", "joerg@xn--bcher-kva.example")
    assert [(s["d"], s["s"]) for s in _check(received, dns, tmp_path)] == [("xn--bcher-kva.example", "idn")]


def test_a_changed_message_fails_both_verifiers(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path
) -> None:
    # The check above is not one that passes whatever it is given.
    _smtp(pigeon.smtp_port, "ann@example.com", ["bob@sink.test"], DATE + b"From: ann@example.com\r\n\r\nbody\r\n")
    (received,) = sink.wait_for(1)
    tampered = received.data.replace(b"body\r\n", b"b0dy\r\n")
    assert dkimpy_verify(tampered, dns) == [False, False]
    assert opendkim_verify(tampered, dns, tmp_path).returncode != 0


def test_sighup_reads_the_keys_again_and_a_bad_key_keeps_the_old_one(
    pigeon: PigeonProcess, sink: ScriptedSink, dns: DnsServer, tmp_path: Path, keys: Keys
) -> None:
    key_file = tmp_path / "keys" / "rsa.pem"
    # A new key in the file: signatures made after SIGHUP use it (and fail against the old record).
    new = generate_key("rsa-sha256")
    key_file.unlink()
    write_key(key_file, new)
    assert pigeon.process is not None
    pigeon.process.send_signal(signal.SIGHUP)
    pigeon.wait_stderr("DKIM signers (keys read again)")
    _smtp(pigeon.smtp_port, "ann@example.com", ["bob@sink.test"], b"From: ann@example.com\r\n\r\nnew key\r\n")
    (received,) = sink.wait_for(1)
    assert dkimpy_verify(received.data, dns) == [False, True]  # RSA with a key not published: bad
    new_record = base64.b64decode(record_text(new).split("p=")[1])
    assert new_record  # the new key really differs from the published one
    # A broken key file: the reload is refused, the error names the file, signing goes on.
    key_file.write_text("not a key")
    pigeon.process.send_signal(signal.SIGHUP)
    error = pigeon.wait_stderr("reload failed")
    assert str(key_file) in error
    _smtp(pigeon.smtp_port, "ann@example.com", ["bob@sink.test"], b"From: ann@example.com\r\n\r\nstill\r\n")
    received = sink.wait_for(2)[1]
    assert len(_signatures(received.data)) == 2
    wait_until(lambda: pigeon.records("Delivery"))
    assert json.dumps(pigeon.records("Delivery")[0])  # delivered, not refused


def test_a_node_started_without_dkim_signs_once_a_reload_adds_a_signer(
    tmp_path: Path, sink: ScriptedSink, dns: DnsServer, keys: Keys
) -> None:
    # Such a node has not loaded DKIM's modules (nor `cryptography`): the reload does.
    with PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        _smtp(pigeon.smtp_port, "ann@example.com", ["bob@sink.test"], DATE + b"From: ann@example.com\r\n\r\nbefore\r\n")
        assert _signatures(sink.wait_for(1)[0].data) == []
        key = _key_file(tmp_path, "rsa", keys.rsa)
        pigeon.config["dkim"] = [{"domain": "example.com", "selector": "rsa1", "private_key": key}]
        pigeon.config_path.write_text(to_toml(pigeon.config))
        assert pigeon.process is not None
        pigeon.process.send_signal(signal.SIGHUP)
        pigeon.wait_stderr("1 DKIM signer (keys read again)")
        _smtp(pigeon.smtp_port, "ann@example.com", ["bob@sink.test"], DATE + b"From: ann@example.com\r\n\r\nafter\r\n")
        assert [s["s"] for s in _check(sink.wait_for(2)[1], dns, tmp_path)] == ["rsa1"]


def test_a_domain_glob_without_signing_domain_is_warned_about_at_start_and_at_each_reload(
    tmp_path: Path, keys: Keys
) -> None:
    """`domain = "*"` signs any author domain as d=<that domain> with one key: said, since it
    verifies only where the selector is published under every such domain."""
    key = _key_file(tmp_path, "rsa", keys.rsa)
    dkim = [
        {"domain": "*", "selector": "rsa1", "private_key": key},
        {"domain": "*.example.net", "selector": "rsa2", "private_key": key, "signing_domain": "example.net"},
        {"domain": "example.org", "selector": "rsa3", "private_key": key},
    ]
    warning = (
        "[[dkim]] #1 (*, selector rsa1): domain '*' matches more than one domain and there is no signing_domain: "
        "each author domain it matches is signed as d=<that domain> with this one key, so "
        "rsa1._domainkey.<domain> must be published under every such domain (else its signatures fail); "
        "or set signing_domain"
    )
    for workers in (1, 2):
        with PigeonProcess(tmp_path / f"n{workers}", node={"workers": workers}, dkim=dkim) as pigeon:
            pigeon.wait_stderr(warning)
            assert pigeon.process is not None
            pigeon.process.send_signal(signal.SIGHUP)
            pigeon.wait_stderr("reloaded:", workers)
            assert pigeon.stderr().count(warning) == 2, pigeon.stderr()
            assert "selector rsa2)" not in pigeon.stderr() and "selector rsa3)" not in pigeon.stderr()


def test_overlapping_blocks_with_one_key_and_selector_put_one_signature_on_the_message(
    tmp_path: Path, sink: ScriptedSink, dns: DnsServer, keys: Keys
) -> None:
    """Three blocks that all match a message of tenant acme From example.com, with one key
    and selector: it leaves with that signature once, not three times."""
    key = _key_file(tmp_path, "rsa", keys.rsa)
    copy = _key_file(tmp_path, "copy", keys.rsa)  # the same key in another file is the same key
    dkim = [
        {"domain": "*", "selector": "rsa1", "private_key": key},
        {"domain": "example.com", "selector": "rsa1", "private_key": copy},
        {"domain": "example.com", "selector": "rsa1", "private_key": key, "tenant": "acme"},
        {
            "domain": "example.com",
            "selector": "ed1",
            "private_key": _key_file(tmp_path, "ed", keys.ed25519),
            "algorithm": "ed25519-sha256",
        },
    ]
    with PigeonProcess(tmp_path / "node", dkim=dkim, **delivery_config(sink.endpoint)) as pigeon:
        data = b"X-Tenant: acme\r\nFrom: ann@example.com\r\nSubject: once\r\n" + DATE + b"\r\nhi\r\n"
        _smtp(pigeon.smtp_port, "ann@example.com", ["bob@sink.test"], data)
        (received,) = sink.wait_for(1)
        signatures = _check(received, dns, tmp_path)
        assert [(s["d"], s["s"]) for s in signatures] == [("example.com", "rsa1"), ("example.com", "ed1")]


def test_a_body_spilled_to_a_spool_file_is_signed(
    tmp_path: Path, sink: ScriptedSink, dns: DnsServer, keys: Keys
) -> None:
    # Past [spool] inline_limit the body goes to a file as it arrives; the signing thread reads it back.
    key = _key_file(tmp_path, "rsa", keys.rsa)
    dkim = [{"domain": "example.com", "selector": "rsa1", "private_key": key}]
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", spool={"inline_limit": "4KiB"}, dkim=dkim, **config) as node:
        body = b"".join(b"line %06d of a long message  with\tspaces \r\n" % n for n in range(5000))
        _smtp(
            node.smtp_port, "ann@example.com", ["bob@sink.test"], b"From: ann@example.com\r\n" + DATE + b"\r\n" + body
        )
        (received,) = sink.wait_for(1)
    assert len(received.data) > 200_000 and received.data.endswith(body)
    assert [s["s"] for s in _check(received, dns, tmp_path)] == ["rsa1"]


# --- with a policy: its header edits and signer choice --------------------------------------
POLICY = """
    from pigeon.policy import Changes
    def on_message(message):
        return Changes(
            dkim=["example-rsa"],
            tenant="shop",
            add_headers=[("List-Unsubscribe", "<mailto:unsubscribe@example.com>")],
            remove_headers=["X-Internal-Note"],
        )
"""


def test_a_policys_header_edits_are_signed_by_the_signer_it_chose_and_verify(
    tmp_path: Path, sink: ScriptedSink, keys: Keys, dns: DnsServer
) -> None:
    keydir = tmp_path / "keys"
    keydir.mkdir()
    rsa, ed = _key_file(keydir, "rsa", keys.rsa), _key_file(keydir, "ed", keys.ed25519)
    dkim = [
        {"domain": "example.com", "selector": "rsa1", "private_key": rsa, "name": "example-rsa"},
        {"domain": "example.com", "selector": "ed1", "private_key": ed, "algorithm": "ed25519-sha256"},
    ]
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(POLICY))
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", dkim=dkim, policy={"module": str(module)}, **config) as pigeon:
        data = b"From: news@example.com\r\nX-Internal-Note: do not ship\r\nSubject: hi\r\n" + DATE + b"\r\nbody\r\n"
        _smtp(pigeon.smtp_port, "news@example.com", ["bob@sink.test"], data)
        (received,) = sink.wait_for(1)
        lines = received.data.split(b"\r\n")
        assert lines[0].lower().startswith(b"dkim-signature:")
        data = received.data  # the policy's field below the trace block, above the message's own
        assert data.index(b"\r\nReceived: ") < data.index(b"\r\nList-Unsubscribe: <mailto:") < data.index(b"\r\nFrom: ")
        assert b"X-Internal-Note" not in received.data
        # Only the signer the policy named (not the Ed25519 one the author domain would take),
        # and it covers the added header: both verifiers accept the message as delivered.
        (signature,) = _check(received, dns, tmp_path)
        assert (signature["d"], signature["s"]) == ("example.com", "rsa1")
        assert "list-unsubscribe" in signature["h"].lower().split(":")


UNKNOWN_SIGNER_POLICY = """
    from pigeon.policy import Changes
    def on_message(message):
        return Changes(dkim=["example-rsa", message.headers.get("X-Signer") or "example-rsa"])
"""


def test_a_policy_naming_a_signer_that_does_not_exist_gets_451_not_unsigned_mail(
    tmp_path: Path, sink: ScriptedSink, keys: Keys
) -> None:
    # A typo, or a tenant without keys of its own: the mail must not leave unsigned (DMARC
    # would fail it), and the operator must hear which name was wrong.
    dkim = [{"domain": "example.com", "selector": "rsa1", "private_key": _key_file(tmp_path, "rsa", keys.rsa),
             "name": "example-rsa"}]  # fmt: skip
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(UNKNOWN_SIGNER_POLICY))
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", dkim=dkim, policy={"module": str(module)}, **config) as pigeon:
        with RawSmtp(pigeon.smtp_port) as smtp:
            smtp.expect(220)
            smtp.expect(250, "EHLO client.test")
            smtp.expect(250, "MAIL FROM:<news@example.com>")
            smtp.expect(250, "RCPT TO:<bob@sink.test>")
            smtp.expect(354, "DATA")
            smtp.send(b"From: news@example.com\r\nX-Signer: exmaple-rsa\r\n\r\nbody\r\n.\r\n")
            assert smtp.expect(451)[0].startswith("4.3.0")
        status, answer = pigeon.http_post(
            "/api/v1/inject",
            {"envelope_sender": "news@example.com", "recipients": [{"email": "bob@sink.test"}],
             "content": "From: news@example.com\r\nX-Signer: acme-rsa\r\n\r\nbody\r\n"},
            pigeon.local_token,
        )  # fmt: skip
        assert status == 503 and answer["recipients"][0]["error"].startswith("451 4.3.0"), answer
        failures = pigeon.wait_records("PolicyFailure", 2)
        assert ["'exmaple-rsa'" in failures[0]["error"], "'acme-rsa'" in failures[1]["error"]] == [True, True]
        assert all("known: example-rsa" in f["error"] for f in failures)
        # The same policy naming signers that exist still signs and sends.
        _smtp(pigeon.smtp_port, "news@example.com", ["bob@sink.test"], b"From: news@example.com\r\n\r\nok\r\n")
        (received,) = sink.wait_for(1)
        assert len(_signatures(received.data)) == 1
        assert not pigeon.spool_messages() or wait_until(lambda: not pigeon.spool_messages())


NAMED_SIGNER_POLICY = """
    from pigeon.policy import Changes
    def on_message(message):
        return Changes(dkim=[message.headers["X-Signer"]], remove_headers=["X-Signer"])
"""


def test_a_named_signer_that_cannot_sign_the_message_gets_451_not_a_signature_that_fails(
    tmp_path: Path, sink: ScriptedSink, keys: Keys, dns: DnsServer
) -> None:
    # d= is the author domain unless signing_domain says otherwise: a block for example.com
    # named for other.test mail would sign d=other.test with example.com's key. And a tenant's
    # key is that tenant's. Either way the message is refused and the operator told why.
    dkim = [
        {"domain": "example.com", "selector": "rsa1", "private_key": _key_file(tmp_path, "rsa", keys.rsa),
         "name": "rsa"},
        {"domain": "acme.test", "selector": "acme", "private_key": _key_file(tmp_path, "acme", keys.tenant),
         "tenant": "acme", "name": "acme"},
    ]  # fmt: skip
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(NAMED_SIGNER_POLICY))
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", dkim=dkim, policy={"module": str(module)}, **config) as pigeon:
        for author, signer, tenant in [("news@other.test", "rsa", ""), ("shop@acme.test", "acme", "")]:
            with RawSmtp(pigeon.smtp_port) as smtp:
                smtp.expect(220)
                smtp.expect(250, "EHLO client.test")
                smtp.expect(250, f"MAIL FROM:<{author}>")
                smtp.expect(250, "RCPT TO:<bob@sink.test>")
                smtp.expect(354, "DATA")
                smtp.send(f"From: {author}\r\nX-Signer: {signer}\r\n{tenant}\r\nbody\r\n.\r\n".encode())
                assert smtp.expect(451)[0].startswith("4.3.0")
        domain, tenant = pigeon.wait_records("PolicyFailure", 2)
        assert domain["hook"] == "on_message" and domain["action"] == "451 4.3.0"
        assert "DKIM signer 'rsa'" in domain["error"] and "author domain 'other.test'" in domain["error"]
        assert "DKIM signer 'acme' signs only the mail of tenant 'acme', not of no tenant" in tenant["error"]
        # Each signer still signs what it may: both verify, with the author's domain as d=.
        _smtp(pigeon.smtp_port, "news@example.com", ["bob@sink.test"],
              b"From: news@example.com\r\nX-Signer: rsa\r\n" + DATE + b"\r\nok\r\n")  # fmt: skip
        _smtp(pigeon.smtp_port, "shop@acme.test", ["bob@sink.test"],
              b"From: shop@acme.test\r\nX-Tenant: acme\r\nX-Signer: acme\r\n" + DATE + b"\r\nok\r\n")  # fmt: skip
        signed = [_check(received, dns, tmp_path) for received in sink.wait_for(2)]
        assert sorted((s["d"], s["s"]) for (s,) in signed) == [("acme.test", "acme"), ("example.com", "rsa1")]


def test_a_named_signer_for_mail_whose_from_names_no_domain_gets_451_at_both_doors_not_unsigned_mail(
    tmp_path: Path, sink: ScriptedSink, keys: Keys
) -> None:
    # Such mail was taken (250) and left unsigned: the signer was dropped without a word.
    dkim = [{"domain": "example.com", "selector": "rsa1", "private_key": _key_file(tmp_path, "rsa", keys.rsa),
             "name": "ex-rsa"}]  # fmt: skip
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(NAMED_SIGNER_POLICY))
    config = delivery_config(sink.endpoint)
    froms = [b"", b"From: undisclosed-recipients\r\n", b"From: \r\n", b"From: list:;\r\n"]
    with PigeonProcess(tmp_path / "node", dkim=dkim, policy={"module": str(module)}, **config) as pigeon:
        for from_field in froms:  # relayed over SMTP (relay_networks): left as it came
            with RawSmtp(pigeon.smtp_port) as smtp:
                smtp.expect(220)
                smtp.expect(250, "EHLO client.test")
                smtp.expect(250, "MAIL FROM:<news@example.com>")
                smtp.expect(250, "RCPT TO:<bob@sink.test>")
                smtp.expect(354, "DATA")
                smtp.send(from_field + b"X-Signer: ex-rsa\r\n" + DATE + b"\r\nbody\r\n.\r\n")
                assert smtp.expect(451)[0] == "4.3.0 policy error; try again later"
        for from_field in froms[1::2]:  # (an injection without a From, or an empty one, is refused before)
            status, answer = pigeon.http_post(
                "/api/v1/inject",
                {"envelope_sender": "news@example.com", "recipients": [{"email": "bob@sink.test"}],
                 "content": (from_field + b"X-Signer: ex-rsa\r\n\r\nbody\r\n").decode()},
                pigeon.local_token,
            )  # fmt: skip
            assert (status, answer["recipients"][0]["error"]) == (503, "451 4.3.0 policy error; try again later")
        failures = pigeon.wait_records("PolicyFailure", 6)
        assert [f["error"].partition(": ")[2] for f in failures] == [
            "DKIM signer 'ex-rsa' cannot sign a message without a From field (RFC 6376 5.4: a signature covers From)",
            *[
                f"DKIM signer 'ex-rsa' (domain 'example.com', no signing_domain) cannot sign: the From field "
                f"({shown!r}) names no author domain to sign as d="
                for shown in ["undisclosed-recipients", "", "list:;", "undisclosed-recipients", "list:;"]
            ],
        ]
        assert {(f["hook"], f["action"]) for f in failures} == {("on_message", "451 4.3.0")}
        assert not pigeon.spool_messages() and not sink.received


@pytest.mark.parametrize("domain", ["pigeon.test", "*.pigeon.test"])
def test_pigeons_own_dsns_are_signed_only_by_a_block_that_matches_its_hostname(
    tmp_path: Path, sink: ScriptedSink, keys: Keys, dns: DnsServer, domain: str
) -> None:
    # A DSN is From: MAILER-DAEMON@<[smtp] hostname> (mx.pigeon.test here): its author domain is
    # the hostname, which a block for the hostname's parent domain does not match.
    dkim = [{"domain": domain, "selector": "dsn", "private_key": _key_file(tmp_path, "ed", keys.ed25519),
             "algorithm": "ed25519-sha256"}]  # fmt: skip
    with PigeonProcess(tmp_path / "node", dkim=dkim, **delivery_config(sink.endpoint)) as pigeon:
        _smtp(
            pigeon.smtp_port,
            "ann@example.com",
            ["permfail@sink.test"],
            b"From: ann@example.com\r\n" + DATE + b"\r\nx\r\n",
        )
        (dsn,) = sink.wait_for(1)
        assert dsn.recipients == ["ann@example.com"]
        assert b"\r\nFrom: Mail Delivery System <MAILER-DAEMON@mx.pigeon.test>\r\n" in dsn.data
        if domain == "pigeon.test":
            assert _signatures(dsn.data) == []
        else:
            (signature,) = _check(dsn, dns, tmp_path)
            assert (signature["d"], signature["s"]) == ("mx.pigeon.test", "dsn")


def test_a_dsn_is_signed_by_the_block_of_the_dsn_from_domain(
    tmp_path: Path, sink: ScriptedSink, keys: Keys, dns: DnsServer
) -> None:
    # `[delivery] dsn_from` in a domain a smart host verified: the DSN's author domain is that
    # one, and its block signs it (DMARC aligned), not only a block for the hostname.
    dkim = [{"domain": "example.com", "selector": "ed1", "private_key": _key_file(tmp_path, "ed", keys.ed25519),
             "algorithm": "ed25519-sha256"}]  # fmt: skip
    sections = delivery_config(sink.endpoint, dsn_from="MAILER-DAEMON@example.com")
    with PigeonProcess(tmp_path / "node", dkim=dkim, **sections) as pigeon:
        _smtp(
            pigeon.smtp_port,
            "ann@example.org",
            ["permfail@sink.test"],
            b"From: ann@example.org\r\n" + DATE + b"\r\nx\r\n",
        )
        (dsn,) = sink.wait_for(1)
        assert dsn.recipients == ["ann@example.org"]  # (its message unsigned: no block for example.org)
        assert b"\r\nFrom: Mail Delivery System <MAILER-DAEMON@example.com>\r\n" in dsn.data
        (signature,) = _check(dsn, dns, tmp_path)
        assert (signature["d"], signature["s"]) == ("example.com", "ed1")


ADDED_HEADERS_POLICY = """
    from pigeon.policy import Changes
    def on_message(message):
        if message.headers.get("X-Case") == "unfoldable":
            return Changes(add_headers=[("X-Token", "a " + "x" * 1200)])
        words = " ".join(f"word{n:04d}" for n in range(250))
        return Changes(add_headers=[("X-Long", words), ("X-Greeting", "Grüße aus Köln")])
"""


def test_a_policys_long_and_utf8_headers_leave_folded_with_smtputf8_and_signed_as_delivered(
    tmp_path: Path, sink: ScriptedSink, keys: Keys, dns: DnsServer
) -> None:
    dkim = [{"domain": "example.com", "selector": "rsa1", "private_key": _key_file(tmp_path, "rsa", keys.rsa),
             "headers": ["from", "subject", "date", "x-long", "x-greeting"]}]  # fmt: skip
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(ADDED_HEADERS_POLICY))
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", dkim=dkim, policy={"module": str(module)}, **config) as pigeon:
        # Plain ASCII mail, sent without SMTPUTF8.
        with RawSmtp(pigeon.smtp_port) as smtp:
            smtp.expect(220)
            smtp.expect(250, "EHLO client.test")
            smtp.expect(250, "MAIL FROM:<ann@example.com>")
            smtp.expect(250, "RCPT TO:<bob@sink.test>")
            smtp.expect(354, "DATA")
            smtp.send(b"From: ann@example.com\r\nSubject: hi\r\n" + DATE + b"\r\nbody\r\n.\r\n")
            smtp.expect(250)
            # A value that cannot be folded under 998 octets is the hook's failure: 451.
            smtp.expect(250, "MAIL FROM:<ann@example.com>")
            smtp.expect(250, "RCPT TO:<bob@sink.test>")
            smtp.expect(354, "DATA")
            smtp.send(b"From: ann@example.com\r\nX-Case: unfoldable\r\n" + DATE + b"\r\nbody\r\n.\r\n")
            assert smtp.expect(451)[0].startswith("4.3.0")
        (received,) = sink.wait_for(1)
        head = received.data.split(b"\r\n\r\n", 1)[0]
        # Every line within RFC 5322's 78 octets, and unfolded the value is the policy's.
        field = re.search(rb"(?m)^X-Long:.*\r\n(?:[ \t].*\r\n)*", head + b"\r\n")
        assert field is not None
        lines = field.group().split(b"\r\n")[:-1]
        assert len(lines) > 25 and max(len(line) for line in lines) <= 78
        words = " ".join(f"word{n:04d}" for n in range(250))
        assert b"".join(lines) == f"X-Long: {words}".encode()
        # UTF-8 in a header field goes with SMTPUTF8 (RFC 6532), and the signature covers both.
        assert "SMTPUTF8" in received.mail_options
        assert "X-Greeting: Grüße aus Köln".encode() in head
        (signature,) = _check(received, dns, tmp_path)
        assert {"x-long", "x-greeting"} <= set(signature["h"].split(":"))
        (failure,) = pigeon.wait_records("PolicyFailure")
        assert "cannot be folded into lines of at most 998 octets" in failure["error"]


@pytest.mark.parametrize("workers", [1, 2])
def test_the_signing_process_holds_none_of_the_nodes_listening_sockets(
    tmp_path: Path, sink: ScriptedSink, keys: Keys, workers: int
) -> None:
    """It held the SMTP and HTTP listeners (fds 4 and 5): still bound while it lived on, though
    no code of its own would ever accept on them."""
    dkim = [{"domain": "example.com", "selector": "rsa1", "private_key": _key_file(tmp_path, "rsa", keys.rsa)}]
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", dkim=dkim, node={"workers": workers}, **config) as pigeon:
        assert pigeon.process is not None
        for n in range(2 * workers):  # (connections are spread over the workers: each starts one)
            _smtp(pigeon.smtp_port, "news@example.com", ["bob@sink.test"], b"From: news@example.com\r\n\r\n%d\r\n" % n)
        sink.wait_for(2 * workers)
        listening = _listening({pigeon.smtp_port, pigeon.http_port})
        assert len(listening) == 2
        signers = [pid for pid in _descendants(pigeon.process.pid) if b"pigeon.dkim.key_process" in _cmdline(pid)]
        assert signers
        for pid in signers:
            held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            assert not held & {f"socket:[{inode}]" for inode in listening}, (pid, held)


def _listening(ports: set[int]) -> set[str]:
    """The inodes of the TCP sockets listening on these ports (/proc/net/tcp, tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            columns = line.split()
            if columns[3] == "0A" and int(columns[1].rpartition(":")[2], 16) in ports:  # 0A: LISTEN
                found.add(columns[9])
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _descendants(root: int) -> list[int]:
    """Every process below `root`, from each one's parent in /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rpartition(")")[2].split()[1])
    below, found = {root}, []
    while True:
        more = [pid for pid, parent in parents.items() if parent in below and pid not in below]
        if not more:
            return found
        below.update(more)
        found += more


@pytest.mark.parametrize("canonicalization", ["relaxed/relaxed", "simple/simple"])
def test_every_line_of_a_dkim_signature_keeps_within_a_lowered_max_line_length_and_verifies(
    tmp_path: Path, sink: ScriptedSink, keys: Keys, dns: DnsServer, canonicalization: str
) -> None:
    # With max_line_length = 100, every signed message left with a 347-octet "\tb=..." line
    # (RSA-2048), which a next hop with the same limit refused. The field is folded between
    # tags and in h= before it is signed, and b= after (FWS in it is not signed, RFC 6376 3.5).
    keydir = tmp_path / "keys"
    keydir.mkdir()
    rsa, ed = _key_file(keydir, "rsa", keys.rsa), _key_file(keydir, "ed", keys.ed25519)
    dkim = [
        {"domain": "example.com", "selector": "rsa1", "private_key": rsa, "canonicalization": canonicalization},
        {
            "domain": "example.com",
            "selector": "ed1",
            "private_key": ed,
            "algorithm": "ed25519-sha256",
            "canonicalization": canonicalization,
        },
    ]
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", smtp={"max_line_length": 100}, dkim=dkim, **config) as pigeon:
        message = MESSY.replace(b"x" * 990, b"x" * 90)
        _smtp(pigeon.smtp_port, "ann@example.com", ["bob@sink.test"], message)
        (received,) = sink.wait_for(1)
    signatures = _check(received, dns, tmp_path)
    assert [s["a"] for s in signatures] == ["rsa-sha256", "ed25519-sha256"]
    assert {s["c"] for s in signatures} == {canonicalization}
    fields = re.findall(rb"(?im)^dkim-signature:[^\r\n]*(?:\r\n[ \t][^\r\n]*)*\r\n", received.data)
    assert len(fields) == 2
    for field in fields:
        assert max(len(line) for line in field.split(b"\r\n")) <= 78, field
    assert max(len(line) for line in received.data.split(b"\r\n")) <= 100
