"""TLSA records and the DANE match (RFC 7672 3.1, RFC 6698 2.1), on certificates made here."""

from __future__ import annotations

import hashlib

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from pigeon.delivery.dane import HostPolicy, Mismatch, Record, check, parse, subject_public_key_info
from tests.support.dane import DaneCa, self_signed

HOST = "mx.example.net"


def _policy(*records: tuple[int, int, int, bytes]) -> HostPolicy:
    return HostPolicy(HOST, f"_25._tcp.{HOST}", tuple(Record(*r) for r in records))


def test_a_tlsa_record_is_read_from_its_wire_form() -> None:
    digest = bytes(range(32))
    assert parse(b"\x03\x01\x01" + digest) == Record(3, 1, 1, digest)
    with pytest.raises(ValueError, match="at least 3 octets"):
        parse(b"\x03\x01")


@pytest.mark.parametrize(
    ("record", "usable"),
    [
        (Record(3, 1, 1, bytes(32)), True),
        (Record(2, 0, 2, bytes(64)), True),
        (Record(3, 0, 0, b"\x30\x00"), True),
        (Record(1, 1, 1, bytes(32)), False),  # PKIX-EE: not for SMTP (RFC 7672 3.1.3)
        (Record(0, 0, 1, bytes(32)), False),  # PKIX-TA
        (Record(4, 1, 1, bytes(32)), False),  # an unknown usage
        (Record(3, 2, 1, bytes(32)), False),  # an unknown selector
        (Record(3, 1, 3, bytes(32)), False),  # an unknown matching type
        (Record(3, 1, 1, bytes(31)), False),  # a SHA-256 digest of the wrong length
        (Record(3, 1, 0, b""), False),
    ],
)
def test_only_dane_ta_and_dane_ee_records_with_known_parameters_are_usable(record: Record, usable: bool) -> None:
    assert record.usable is usable


def test_the_spki_selected_is_the_certificate_s_own_for_ec_and_rsa_keys() -> None:
    ec_leaf = self_signed(HOST)
    assert subject_public_key_info(ec_leaf.der) == ec_leaf.spki
    rsa_key = rsa.generate_private_key(65537, 2048)
    ca = DaneCa()
    # (an RSA key in a certificate the CA signs: the SPKI as cryptography writes it)
    built = (
        x509.CertificateBuilder()
        .subject_name(ca.certificate.subject)
        .issuer_name(ca.certificate.subject)
        .public_key(rsa_key.public_key())
        .serial_number(1)
        .not_valid_before(ca.certificate.not_valid_before_utc)
        .not_valid_after(ca.certificate.not_valid_after_utc)
        .sign(ca.key, hashes.SHA256())
    )
    spki = rsa_key.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    assert subject_public_key_info(built.public_bytes(Encoding.DER)) == spki
    with pytest.raises(ValueError, match="not a certificate"):
        subject_public_key_info(b"\x30\x03\x02\x01\x01")


@pytest.mark.parametrize("selector", [0, 1])
@pytest.mark.parametrize("mtype", [0, 1, 2])
def test_a_record_matches_its_certificate_by_each_selector_and_matching_type(selector: int, mtype: int) -> None:
    leaf, other = self_signed(HOST), self_signed(HOST)
    record = Record(*leaf.tlsa(3, selector, mtype))
    assert record.matches(leaf.der)
    assert not record.matches(other.der)


def test_dane_ee_matches_the_leaf_whatever_its_name_and_expiry() -> None:
    # RFC 7672 3.1.1: with DANE-EE the name and validity period are not checked.
    leaf = self_signed("not-the-mx.example.org", expired=True)
    assert check(_policy(leaf.tlsa(3, 1, 1)), [leaf.der]).describe() == "DANE-EE 3 1 1"


def test_a_certificate_that_matches_no_record_is_refused() -> None:
    leaf = self_signed(HOST)
    with pytest.raises(Mismatch, match=f"no TLSA record of _25._tcp.{HOST} matches"):
        check(_policy(self_signed(HOST).tlsa(3, 1, 1)), [leaf.der])
    with pytest.raises(Mismatch, match="no certificate"):
        check(_policy(leaf.tlsa(3, 1, 1)), [])


def test_dane_ee_matches_only_the_leaf_not_a_certificate_above_it() -> None:
    ca = DaneCa()
    leaf = ca.issue(HOST)
    with pytest.raises(Mismatch):
        check(_policy(ca.tlsa(3, 0, 1)), [leaf.der, ca.der])


def test_dane_ta_matches_a_leaf_for_the_mx_host_issued_by_the_anchor() -> None:
    ca = DaneCa()
    leaf = ca.issue(HOST)
    assert check(_policy(ca.tlsa(2, 0, 1)), [leaf.der, ca.der]).describe() == "DANE-TA 2 0 1"
    assert check(_policy(ca.tlsa(2, 1, 1)), [leaf.der, ca.der]).describe() == "DANE-TA 2 1 1"


def test_dane_ta_refuses_a_leaf_for_another_name() -> None:
    ca = DaneCa()
    leaf = ca.issue("other.example.net")
    with pytest.raises(Mismatch, match="does not chain to the trust anchor of DANE-TA 2 0 1"):
        check(_policy(ca.tlsa(2, 0, 1)), [leaf.der, ca.der])


def test_dane_ta_refuses_an_expired_leaf() -> None:
    ca = DaneCa()
    leaf = ca.issue(HOST, expired=True)
    with pytest.raises(Mismatch, match="does not chain"):
        check(_policy(ca.tlsa(2, 0, 1)), [leaf.der, ca.der])


def test_dane_ta_refuses_a_leaf_another_ca_issued_whatever_the_chain_presented() -> None:
    anchor, forger = DaneCa(), DaneCa()
    leaf = forger.issue(HOST)
    with pytest.raises(Mismatch):
        check(_policy(anchor.tlsa(2, 0, 1)), [leaf.der, anchor.der])


def test_dane_ta_without_the_presented_chain_matches_nothing() -> None:
    ca = DaneCa()
    with pytest.raises(Mismatch, match="chain, needed for DANE-TA"):
        check(_policy(ca.tlsa(2, 0, 1)), [ca.issue(HOST).der])


def test_a_sha512_record_of_the_spki_matches() -> None:
    leaf = self_signed(HOST)
    record = Record(3, 1, 2, hashlib.sha512(leaf.spki).digest())
    assert record.usable and check(_policy((3, 1, 2, record.data)), [leaf.der]) == record
