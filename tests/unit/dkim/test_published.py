"""Reading a published DKIM key record and comparing it with a private key (`pigeon dkim check`)."""

from __future__ import annotations

import base64

import dkim
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from pigeon.dkim.keys import generate_key, record_text
from pigeon.dkim.published import KeyRecord, Status, compare, key_record


def test_a_record_is_read_as_verifiers_read_it() -> None:
    assert key_record(" v = DKIM1 ; k=rsa; p = AB CD\t EF ") == KeyRecord({"v": "DKIM1", "k": "rsa", "p": "ABCDEF"})
    assert key_record("v=spf1 -all") is None  # no p=
    assert key_record("v=DKIM2; p=AAAA") is None
    assert key_record("p=") == KeyRecord({"p": ""})
    assert key_record("v=DKIM1; P=AAAA") is None  # tag names are case-sensitive (RFC 6376 3.2): no p=
    assert key_record("p=AA; k=rsa; p=BB; p=CC") == KeyRecord({"p": "AA", "k": "rsa"}, repeated=("p",))


def test_a_record_verifiers_pass_over_is_unusable_even_with_the_right_key() -> None:
    key = generate_key("rsa-sha256", 1024)
    right = record_text(key)
    assert compare([right.replace("k=rsa", "k=rsa; h=sha256:sha1; s=* : email")], key).status is Status.OK
    for tag in ("h=sha1", "h=", "s=other", "s=", "k=RSA", "k=rsa"):
        assert compare([right.replace("k=rsa", f"k=rsa; {tag}")], key).status is Status.UNUSABLE, tag
    assert compare([right.replace("k=rsa", "k=ed25519")], key).status is Status.ALGORITHM


def test_a_part_that_is_no_tag_makes_the_record_unusable_as_dkimpy_refuses_it() -> None:
    # RFC 6376 3.2: tag-list = tag-spec *(";" tag-spec) [";"], tag-spec = tag-name "=" tag-value.
    key = generate_key("rsa-sha256", 1024)
    p = record_text(key).split("p=")[1]
    refused = [
        f"v=DKIM1; k=rsa; bogus; p={p}",
        f"v=DKIM1;; p={p}",
        f"v=DKIM1; ; p={p}",
        f"v=DKIM1; p={p};;",
        f"v=DKIM1; =rsa; p={p}",
        f"v=DKIM1; 1k=rsa; p={p}",
    ]
    taken = [f"v=DKIM1; p={p};", f"v=DKIM1; p={p}; ", f" v = DKIM1 ;k=rsa;p={p} ", f"p={p}"]
    for text in refused:
        with pytest.raises(dkim.KeyFormatError):
            dkim.evaluate_pk(b"s._domainkey.example.com", text.encode())
        assert compare([text], key).status is Status.UNUSABLE, text
    for text in taken:
        dkim.evaluate_pk(b"s._domainkey.example.com", text.encode())
        assert compare([text], key).status is Status.OK, text
    # A name with a space in it: dkimpy reads the "a" and takes it, OpenDKIM refuses the record.
    assert compare([f"v=DKIM1; a b=c; p={p}"], key).status is Status.UNUSABLE
    assert key_record("v=DKIM1; bogus;; p=AA") == KeyRecord({"v": "DKIM1", "p": "AA"}, invalid=("bogus", ""))


def test_a_v_after_another_tag_is_unusable_as_rfc_6376_wants_it_first() -> None:
    key = generate_key("ed25519-sha256")
    right = record_text(key)
    assert right.startswith("v=DKIM1; ") and compare([right], key).status is Status.OK
    late = right.replace("v=DKIM1; k=ed25519", "k=ed25519; v=DKIM1")
    assert key_record(late) == KeyRecord(
        {"k": "ed25519", "v": "DKIM1", "p": right.split("p=")[1]}, misplaced_version=True
    )
    assert compare([late], key).status is Status.UNUSABLE
    assert compare([right.replace("v=DKIM1; ", "")], key).status is Status.OK  # no v= at all is fine


def test_an_rsa_key_published_as_pkcs1_is_the_same_key() -> None:
    key = generate_key("rsa-sha256", 1024)
    assert isinstance(key, rsa.RSAPrivateKey)
    pkcs1 = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)
    assert compare([f"v=DKIM1; p={base64.b64encode(pkcs1).decode()}"], key).status is Status.OK
    assert compare(["v=DKIM1; p=not base64!"], key).status is Status.MISMATCH


def test_one_matching_record_among_several_is_enough() -> None:
    key, other = generate_key("ed25519-sha256"), generate_key("ed25519-sha256")
    assert compare([record_text(other), record_text(key)], key).status is Status.OK
    assert compare([record_text(other)], key).status is Status.MISMATCH
    assert compare(["v=DKIM1; k=ed25519; p="], key).status is Status.REVOKED
    assert compare(["hello"], key).status is Status.NO_RECORD
