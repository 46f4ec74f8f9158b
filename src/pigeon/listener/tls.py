"""TLS for the listeners: the server context, and a self-signed pair made at first start.

A self-signed certificate is what most MTAs present to each other anyway (opportunistic
TLS does not verify), and it means STARTTLS works out of the box. Configure a real one
with `[smtp] tls_certificate` and `tls_private_key`.

`cryptography` is imported by the functions that read or make a certificate, not with this
module: its X.509 part takes some 30 ms, which a process that finds its pair made (a node's
restart, its other workers, the supervisor) need not spend.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import ssl
from pathlib import Path
from typing import Final

from pigeon.tls import server_context

__all__ = ["PairProblem", "check_pair", "describe", "ensure_self_signed", "expiry_warning", "server_context"]

EXPIRY_NOTICE: Final = datetime.timedelta(days=14)
"""How long before a listener certificate's end `expiry_warning` starts saying so."""


class PairProblem(Exception):
    """A certificate and key that cannot serve STARTTLS. `which` is the file at fault:
    "certificate" or "private key"; the message names the file and says what is wrong."""

    def __init__(self, which: str, message: str) -> None:
        super().__init__(message)
        self.which = which


def check_pair(certificate: Path, private_key: Path) -> None:
    """Raise `PairProblem` unless `certificate` is a readable PEM certificate chain and
    `private_key` a readable, unencrypted PEM key that belongs to its first certificate.

    Checked when the configuration loads: the server context is only made at start-up in
    each worker, and a pair that does not match would otherwise fail every STARTTLS."""
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    cert_bytes = _read(certificate, "certificate")
    key_bytes = _read(private_key, "private key")
    try:
        chain = x509.load_pem_x509_certificates(cert_bytes)
    except ValueError as error:
        raise PairProblem("certificate", f"{certificate} holds no PEM certificate ({error})") from None
    try:
        key = serialization.load_pem_private_key(key_bytes, password=None)
    except TypeError:
        raise PairProblem("private key", f"{private_key} is encrypted; Pigeon needs it without a passphrase") from None
    except (ValueError, UnsupportedAlgorithm) as error:
        raise PairProblem("private key", f"{private_key} holds no PEM private key ({error})") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    ours = key.public_key().public_bytes(serialization.Encoding.DER, public)
    theirs = chain[0].public_key().public_bytes(serialization.Encoding.DER, public)
    if ours != theirs:
        raise PairProblem(
            "private key", f"{private_key} is not the key of the certificate in {certificate} (they do not match)"
        )
    try:  # what OpenSSL itself will say when a worker loads them
        server_context(certificate, private_key)
    except (OSError, ssl.SSLError) as error:
        raise PairProblem("certificate", f"{certificate} with {private_key}: TLS cannot use them ({error})") from None


def expiry_warning(certificate: Path, now: datetime.datetime | None = None) -> str | None:
    """A warning if the first certificate in `certificate` (the one the listener presents)
    has expired, or expires within `EXPIRY_NOTICE`; None otherwise, or if the file cannot be
    read as one (`check_pair` says why). An expired certificate still serves STARTTLS, but
    every client that verifies it refuses the handshake, which the node never hears of."""
    from cryptography import x509

    try:
        chain = x509.load_pem_x509_certificates(certificate.read_bytes())
    except (OSError, ValueError):
        return None
    now = now or datetime.datetime.now(datetime.UTC)
    ends = chain[0].not_valid_after_utc
    when = ends.strftime("%Y-%m-%d %H:%M:%S UTC")
    if ends <= now:
        return (
            f"[smtp] tls_certificate: {certificate} expired on {when}: clients that verify it refuse STARTTLS; "
            "renew it (a reload reads it again)"
        )
    if ends - now <= EXPIRY_NOTICE:
        days = (ends - now).days
        left = "less than a day" if days < 1 else f"{days} day{'s' if days != 1 else ''}"
        return f"[smtp] tls_certificate: {certificate} expires on {when}, in {left}: renew it (a reload reads it again)"
    return None


def _read(path: Path, which: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise PairProblem(which, f"cannot read {path}: {error.strerror or error}") from None


def ensure_self_signed(directory: Path, hostname: str) -> tuple[Path, Path]:
    """The paths of a self-signed certificate and key in `directory`, made if missing.

    Several workers start at once and each may find the pair missing: an exclusive lock makes
    one of them write it and the others use it (without it, one worker's certificate could end
    up beside another's key).
    """
    cert_path, key_path = directory / "selfsigned.crt", directory / "selfsigned.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    directory.mkdir(parents=True, exist_ok=True)
    lock = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cert_path.exists() and key_path.exists()):
            key_bytes, cert_bytes = _self_signed(hostname)
            _write_atomically(key_path, key_bytes, 0o600)
            _write_atomically(cert_path, cert_bytes, 0o644)
    finally:
        os.close(lock)  # releases the lock
    return cert_path, key_path


def _self_signed(hostname: str) -> tuple[bytes, bytes]:
    """A new key and a certificate for `hostname` signed by it, both PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    # A common name holds at most 64 characters (RFC 5280 ub-common-name); a longer host
    # name is cut there, and the subjectAltName, which clients check, carries it whole.
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname[:64])])
    now = datetime.datetime.now(datetime.UTC)
    alt_names: list[x509.GeneralName] = [x509.DNSName(hostname)]
    literal = hostname.removeprefix("[").removesuffix("]").removeprefix("IPv6:")  # [192.0.2.1], [IPv6:...]
    try:
        alt_names = [x509.IPAddress(ipaddress.ip_address(literal))]
    except ValueError:
        pass
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_bytes, cert.public_bytes(serialization.Encoding.PEM)


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    # A crash mid-write leaves the old file or none, never half a PEM file.
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, path)


def describe(ssl_object: ssl.SSLObject | None) -> str | None:
    """ "TLSv1.3 with cipher TLS_AES_256_GCM_SHA384 (256/256 bits)", for logs and headers."""
    if ssl_object is None:
        return None
    cipher = ssl_object.cipher()
    if cipher is None:
        return ssl_object.version()
    name, _, bits = cipher
    return f"{ssl_object.version()} with cipher {name} ({bits}/{bits} bits)"
