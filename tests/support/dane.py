"""For DANE tests: certificates made by the test (a private CA, leaves it issues, self-signed
ones), their TLSA data, and server contexts that present a leaf with or without its CA."""

from __future__ import annotations

import datetime
import hashlib
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pigeon.tls import server_context

_PEM = serialization.Encoding.PEM
_DER = serialization.Encoding.DER


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Issued:
    """A certificate and its key, as DER and as files a server context loads."""

    def __init__(self, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.certificate = certificate
        self.key = key

    @property
    def der(self) -> bytes:
        return self.certificate.public_bytes(_DER)

    @property
    def spki(self) -> bytes:
        return self.certificate.public_key().public_bytes(_DER, serialization.PublicFormat.SubjectPublicKeyInfo)

    def tlsa(self, usage: int, selector: int, mtype: int) -> tuple[int, int, int, bytes]:
        """The TLSA record (usage, selector, matching type, data) of this certificate."""
        selected = self.der if selector == 0 else self.spki
        if mtype == 0:
            return usage, selector, mtype, selected
        return usage, selector, mtype, hashlib.new("sha256" if mtype == 1 else "sha512", selected).digest()

    def context(self, directory: Path, *above: Issued) -> ssl.SSLContext:
        """A server context presenting this certificate, then `above` (its CA...) as its chain."""
        directory.mkdir(parents=True, exist_ok=True)
        name = f"{self.certificate.serial_number:x}"
        chain = directory / f"{name}.crt"
        key = directory / f"{name}.key"
        chain.write_bytes(b"".join(c.certificate.public_bytes(_PEM) for c in (self, *above)))
        key.write_bytes(self.key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return server_context(chain, key)


class DaneCa(Issued):
    """A private CA (a DANE-TA trust anchor) issuing leaves for DNS names."""

    def __init__(self, name: str = "Pigeon DANE Test CA") -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(days=1))
            .not_valid_after(_now() + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        super().__init__(certificate, key)

    def issue(self, *names: str, expired: bool = False) -> Issued:
        """A server certificate for the DNS `names` (already expired, with `expired`)."""
        key = ec.generate_private_key(ec.SECP256R1())
        end = _now() - datetime.timedelta(days=1) if expired else _now() + datetime.timedelta(days=30)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(days=10))
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return Issued(certificate, key)


def self_signed(name: str, *, expired: bool = False) -> Issued:
    """A self-signed leaf for `name`, what a DANE-EE host commonly presents."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    end = _now() - datetime.timedelta(days=1) if expired else _now() + datetime.timedelta(days=30)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(days=10))
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(certificate, key)
