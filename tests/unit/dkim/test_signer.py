"""Which signers sign a message, what their DKIM-Signature says, and the keys they use."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import dkim
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from pigeon.config.schema import DkimConfig
from pigeon.dkim.canonical import header_fields, split_message
from pigeon.dkim.keys import KeyProblem, PrivateKey, dns_record, generate_key, load_key, record_text, write_key
from pigeon.dkim.signer import Signer, SignerRefused, Signers, author_domain
from tests.support.tools import require

RSA = generate_key("rsa-sha256")
ED = generate_key("ed25519-sha256")


def _signer(key: PrivateKey = ED, **config: object) -> Signer:
    settings: dict[str, object] = {"domain": "example.com", "selector": "s", "private_key": Path("unused")}
    settings.update(config)
    if isinstance(key, rsa.RSAPrivateKey):
        settings.setdefault("algorithm", "rsa-sha256")
    else:
        settings.setdefault("algorithm", "ed25519-sha256")
    return Signer.from_config(DkimConfig(**settings), key)  # type: ignore[arg-type]


def _sign(signers: Signers, message: bytes, tenant: str | None = None, names: list[str] | None = None) -> bytes:
    head, body = split_message(message)
    fields = header_fields(head)
    unsigned = signers.prepare(fields, body, signers.choose(fields, tenant, names), 1_700_000_000)
    return b"".join(u.sign() for u in unsigned) + message


def _verify(signed: bytes, key: PrivateKey) -> bool:
    return bool(dkim.verify(signed, dnsfunc=lambda name, timeout=5: record_text(key).encode()))


def _tags(signed: bytes) -> dict[str, str]:
    field = signed.split(b"\r\n\r\n")[0].decode()
    value = re.sub(r"\s+", "", field.split("DKIM-Signature:", 1)[1].split("\r\n", 1)[0] + field.split("\r\n", 1)[1])
    return dict(tag.split("=", 1) for tag in value.split(";") if "=" in tag)


@pytest.mark.parametrize(
    ("from_field", "domain"),
    [
        (b"From: ann@Example.COM", "example.com"),
        (b'From: "Doe, Ann" <ann@example.com>', "example.com"),
        (b"From: ann@example.com (Ann <the first>)", "example.com"),
        (b"From: Ann\r\n <ann@example.com>", "example.com"),
        (b"From: a@one.test, b@two.test", "one.test"),
        # The first mailbox of several, whatever the forms of the others (not the last <...>).
        (b"From: Ann <ann@one.test>, Bob <bob@two.test>", "one.test"),
        (b"From: ann@one.test, Bob <bob@two.test>", "one.test"),
        (b'From: "Doe, Ann <x@three.test>" <ann@one.test>, "Roe, Bob" <bob@two.test>', "one.test"),
        (b'From: "a\\"b, c" <ann@one.test>, bob@two.test', "one.test"),
        (b"From: (Ann, of <two.test>) ann@one.test, bob@two.test", "one.test"),
        (b"From: , ann@one.test", "one.test"),
        # An internationalised domain as its A-label, as [[dkim]] domain and d= are written.
        ("From: Jörg <jörg@Bücher.example>".encode(), "xn--bcher-kva.example"),
        (b"From: undisclosed:;", None),
        (b"Subject: no from", None),
    ],
)
def test_the_author_domain_is_that_of_the_from_address(from_field: bytes, domain: str | None) -> None:
    assert author_domain(header_fields(from_field + b"\r\n")) == domain


def test_a_glob_matches_the_author_domain_and_signs_as_it() -> None:
    signers = Signers([_signer(domain="*.example.com")])
    signed = _sign(signers, b"From: a@News.Example.com\r\nDate: x\r\n\r\nhi\r\n")
    assert _tags(signed)["d"] == "news.example.com"
    assert _sign(signers, b"From: a@example.com\r\n\r\nhi\r\n").startswith(b"From:")  # not *.example.com


def test_an_explicit_signing_domain_is_the_d_whatever_the_author() -> None:
    signers = Signers([_signer(RSA, domain="*", signing_domain="esp.example")])
    signed = _sign(signers, b"From: a@customer.test\r\n\r\nhi\r\n")
    assert _tags(signed)["d"] == "esp.example"


def test_a_tenant_block_signs_only_that_tenants_mail() -> None:
    signers = Signers([_signer(tenant="acme", selector="acme"), _signer(selector="all")])
    message = b"From: a@example.com\r\n\r\nhi\r\n"
    acme = _sign(signers, message, tenant="acme")
    assert re.findall(rb"s=(\w+);", acme) == [b"acme", b"all"]
    assert re.findall(rb"s=(\w+);", _sign(signers, message, tenant="other")) == [b"all"]


def test_a_policys_names_choose_the_signers_among_those_that_can_sign() -> None:
    signers = Signers(
        [_signer(name="one", selector="one"), _signer(name="two", selector="two", signing_domain="x.test")]
    )
    signed = _sign(signers, b"From: a@elsewhere.test\r\n\r\nhi\r\n", names=["two"])
    assert re.findall(rb"s=(\w+);", signed) == [b"two"]
    assert _sign(signers, b"From: a@elsewhere.test\r\n\r\nhi\r\n", names=[]).startswith(b"From:")
    signed = _sign(signers, b"From: a@example.com\r\n\r\nhi\r\n", names=["one", "two"])
    assert re.findall(rb"d=([\w.]+);", signed) == [b"example.com", b"x.test"]


def test_a_named_signer_whose_glob_misses_the_author_domain_is_refused_not_signed_with_a_wrong_d() -> None:
    # d= would be the author's domain, and the key is published for example.com only: a
    # signature that can never verify. Refused, naming the signer and the author domain.
    signers = Signers([_signer(name="rsa", selector="one")])
    with pytest.raises(SignerRefused, match=r"signer 'rsa' \(domain 'example.com', .*author domain 'elsewhere.test'"):
        _sign(signers, b"From: a@elsewhere.test\r\n\r\nhi\r\n", names=["rsa"])


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (b"Subject: x\r\n", "cannot sign a message without a From field (RFC 6376 5.4: a signature covers From)"),
        (b"From: undisclosed-recipients\r\n", "(domain 'example.com', no signing_domain) cannot sign: the From field "
                                              "('undisclosed-recipients') names no author domain to sign as d="),
        (b"From: \r\n", "(domain 'example.com', no signing_domain) cannot sign: the From field ('') names no"),
        (b"From: list:;\r\n", "(domain 'example.com', no signing_domain) cannot sign: the From field ('list:;') names"),
    ],
    ids=["no From", "no domain", "empty", "group"],
)  # fmt: skip
def test_a_named_signer_is_refused_for_a_message_whose_from_names_no_domain_not_skipped(head: bytes, why: str) -> None:
    # It was dropped without a word: the message left unsigned, though the policy asked for a
    # signature, and DMARC then fails it.
    signers = Signers([_signer(name="rsa")])
    with pytest.raises(SignerRefused) as refused:
        _sign(signers, head + b"\r\nhi\r\n", names=["rsa"])
    assert str(refused.value).startswith(f"DKIM signer 'rsa' {why}")


def test_a_named_signer_with_a_signing_domain_signs_a_from_without_a_domain_but_not_a_message_without_from() -> None:
    signers = Signers([_signer(name="esp", signing_domain="esp.example")])
    signed = _sign(signers, b"From: undisclosed-recipients:;\r\n\r\nhi\r\n", names=["esp"])
    assert _tags(signed)["d"] == "esp.example" and _verify(signed, ED)
    with pytest.raises(SignerRefused, match=r"'esp' cannot sign a message without a From field \(RFC 6376 5.4"):
        _sign(signers, b"Subject: x\r\n\r\nhi\r\n", names=["esp"])


@pytest.mark.parametrize("signing_domain", [None, "esp.example"])
def test_blocks_chosen_by_author_domain_leave_mail_whose_from_names_none_unsigned(signing_domain: str | None) -> None:
    signers = Signers([_signer(domain="*", signing_domain=signing_domain)])
    for head in [b"Subject: x\r\n", b"From: undisclosed-recipients\r\n", b"From: \r\n", b"From: list:;\r\n"]:
        assert _sign(signers, head + b"\r\nhi\r\n") == head + b"\r\nhi\r\n"


def test_a_named_tenant_signer_signs_only_its_tenants_mail() -> None:
    signers = Signers([_signer(name="acme", tenant="acme")])
    message = b"From: a@example.com\r\n\r\nhi\r\n"
    assert _tags(_sign(signers, message, tenant="acme", names=["acme"]))["d"] == "example.com"
    with pytest.raises(SignerRefused, match="signs only the mail of tenant 'acme', not of no tenant"):
        _sign(signers, message, names=["acme"])
    with pytest.raises(SignerRefused, match="not of tenant 'globex'"):
        _sign(signers, message, tenant="globex", names=["acme"])


def test_an_internationalised_author_domain_is_matched_and_signed_as_its_a_label() -> None:
    signers = Signers([_signer(domain="xn--bcher-kva.example")])
    signed = _sign(signers, "From: jörg@bücher.example\r\nDate: x\r\n\r\nhi\r\n".encode())
    assert _tags(signed)["d"] == "xn--bcher-kva.example"
    assert _verify(signed, ED)


def test_over_signing_names_each_field_once_more_than_present() -> None:
    signers = Signers([_signer(headers=["from", "to", "subject", "x-custom"], over_sign=["from", "subject"])])
    message = b"From: a@example.com\r\nTo: b@x\r\nTo: c@x\r\nX-Custom: 1\r\n\r\nhi\r\n"
    signed = _sign(signers, message)
    assert _tags(signed)["h"] == "from:from:to:to:subject:x-custom"
    assert _verify(signed, ED)
    # A second Subject added on the way breaks the signature: the over-signed name covers it.
    assert not _verify(signed.replace(b"X-Custom: 1\r\n", b"X-Custom: 1\r\nSubject: added\r\n"), ED)


def test_no_over_signing_when_it_is_off() -> None:
    signers = Signers([_signer(headers=["from", "subject"], over_sign=False)])
    assert _tags(_sign(signers, b"From: a@example.com\r\n\r\nhi\r\n"))["h"] == "from"


@pytest.mark.parametrize("canonicalization", ["relaxed/relaxed", "relaxed/simple", "simple/relaxed", "simple"])
@pytest.mark.parametrize("key", [RSA, ED], ids=["rsa", "ed25519"])
def test_every_canonicalization_and_algorithm_verifies(canonicalization: str, key: PrivateKey) -> None:
    signers = Signers([_signer(key, canonicalization=canonicalization)])
    message = b"From: a@example.com\r\nSubject:  many   spaces \r\n\tfolded\r\n\r\nbody \t text  \r\n\r\n"
    signed = _sign(signers, message)
    assert _tags(signed)["c"] == (canonicalization if "/" in canonicalization else "simple/simple")
    assert _verify(signed, key)


@pytest.mark.parametrize("canonicalization", ["relaxed/relaxed", "simple/simple"])
@pytest.mark.parametrize("key", [RSA, ED], ids=["rsa", "ed25519"])
@pytest.mark.parametrize("selector", ["s", "selector-of-forty-characters-or-so-12345"])
def test_a_dkim_signature_is_folded_into_lines_of_at_most_78_octets_and_verifies(
    canonicalization: str, key: PrivateKey, selector: str
) -> None:
    # RSA-2048's b= left on one 347-octet line, past any lowered [smtp] max_line_length;
    # the first line and t=/h= could pass 78 too. Folded between tags and in h= before signing,
    # b= after: each verifies, relaxed or simple.
    headers = ["from", "to", "cc", "subject", "date", "message-id", "reply-to", "in-reply-to", "references"]
    signers = Signers([_signer(key, canonicalization=canonicalization, selector=selector, headers=headers)])
    message = b"From: a@example.com\r\nTo: b@example.net\r\nSubject: s\r\nReferences: <r@x>\r\n\r\nbody\r\n"
    signed = _sign(signers, message)
    field = signed[: signed.index(b"From: ")]
    assert max(len(line) for line in field.split(b"\r\n")) <= 78, field.decode()
    assert field.count(b"\r\n") >= 3
    assert _verify(signed, key)


def test_the_dns_record_is_split_into_strings_of_255_bytes() -> None:
    record = dns_record("example.com.", "s1", RSA)
    assert record.startswith('s1._domainkey.example.com. IN TXT "v=DKIM1; k=rsa; p=')
    strings = re.findall(r'"([^"]*)"', record)
    assert [len(s) for s in strings[:-1]] == [255] * (len(strings) - 1) and len(strings) == 2
    assert "".join(strings) == record_text(RSA)
    assert dns_record("example.com", "e", ED) == f'e._domainkey.example.com. IN TXT "{record_text(ED)}"'
    assert record_text(ED).startswith("v=DKIM1; k=ed25519; p=")


def test_a_key_of_the_wrong_type_or_size_is_refused_naming_the_file(tmp_path: Path) -> None:
    ed_file, rsa_file = tmp_path / "ed.pem", tmp_path / "rsa.pem"
    write_key(ed_file, ED)
    write_key(rsa_file, RSA)
    assert (ed_file.stat().st_mode & 0o777) == 0o600
    with pytest.raises(KeyProblem, match=f"{ed_file} holds an Ed25519 key, not the RSA key"):
        load_key(ed_file, "rsa-sha256")
    with pytest.raises(KeyProblem, match=f"{rsa_file} holds an RSA key, not the Ed25519 key"):
        load_key(rsa_file, "ed25519-sha256")
    small = tmp_path / "small.pem"  # cryptography makes none under 1024 bits; OpenSSL does
    subprocess.run([require("openssl"), "genrsa", "-out", str(small), "768"], check=True, capture_output=True)
    with pytest.raises(KeyProblem, match="768-bit RSA key"):
        load_key(small, "rsa-sha256")
    curve = tmp_path / "ec.pem"
    curve.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(KeyProblem, match="not the RSA key"):
        load_key(curve, "rsa-sha256")
    locked = tmp_path / "locked.pem"
    locked.write_bytes(
        RSA.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(KeyProblem, match="encrypted"):
        load_key(locked, "rsa-sha256")
    with pytest.raises(KeyProblem, match=f"cannot read the key file {tmp_path / 'none.pem'}"):
        load_key(tmp_path / "none.pem", "rsa-sha256")
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(KeyProblem, match="holds no PEM private key"):
        load_key(tmp_path / "junk.pem", "rsa-sha256")
