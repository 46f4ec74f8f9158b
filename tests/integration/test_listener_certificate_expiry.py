"""A listener certificate (`[smtp] tls_certificate`) that has expired, or expires within 14
days, is warned about at the start, at each reload and by `serve --check`, naming the file
and the date: it still serves STARTTLS, but every client that verifies it refuses.

Found from outside: an expired certificate was taken silently at all three."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pigeon.listener.tls import expiry_warning
from tests.integration.test_cli import pigeon_cli
from tests.integration.test_reload import _hangup
from tests.support.process import PigeonProcess

NOW = datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def _pair(directory: Path, ends: datetime.datetime) -> tuple[Path, Path]:
    """A self-signed certificate for mx.pigeon.test valid until `ends`, and its key."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mx.pigeon.test")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(ends - datetime.timedelta(days=90))
        .not_valid_after(ends)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("mx.pigeon.test")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def _date(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def test_an_expired_listener_certificate_is_warned_about_at_start_and_at_each_reload(tmp_path: Path) -> None:
    ended = NOW - datetime.timedelta(days=3)
    certificate, key = _pair(tmp_path / "tls", ended)
    warning = f"[smtp] tls_certificate: {certificate} expired on {_date(ended)}: clients that verify it refuse STARTTLS"
    smtp = {"tls_certificate": str(certificate), "tls_private_key": str(key)}
    with PigeonProcess(tmp_path / "node", smtp=smtp) as pigeon:
        assert pigeon.stderr().count(warning) == 1, pigeon.stderr()
        _hangup(pigeon, "reloaded:")
        assert pigeon.stderr().count(warning) == 2, pigeon.stderr()
        # Renewed: the next reload says nothing more.
        _pair(tmp_path / "tls", NOW + datetime.timedelta(days=90))
        _hangup(pigeon, "reloaded:")
        assert pigeon.stderr().count(warning) == 2
        assert "tls_certificate:" not in pigeon.stderr().split(warning)[-1]


def test_serve_check_warns_of_an_expired_listener_certificate_and_still_says_ok(tmp_path: Path) -> None:
    ended = NOW - datetime.timedelta(days=1)
    certificate, key = _pair(tmp_path / "tls", ended)
    key.chmod(0o600)  # (a key others may read is warned about too: not this test's business)
    config = tmp_path / "pigeon.toml"
    config.write_text(
        f'[spool]\npath = "spool"\n[smtp]\ntls_certificate = "{certificate}"\ntls_private_key = "{key}"\n'
    )
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert (result.returncode, result.stdout) == (0, f"{config}: ok\n"), result.stderr
    assert result.stderr == (
        f"pigeon: warning: [smtp] tls_certificate: {certificate} expired on {_date(ended)}: clients that verify "
        "it refuse STARTTLS; renew it (a reload reads it again)\n"
    )


def test_a_listener_certificate_expiring_within_14_days_is_warned_about_and_one_further_off_is_not(
    tmp_path: Path,
) -> None:
    soon, _ = _pair(tmp_path / "soon", NOW + datetime.timedelta(days=10, hours=1))
    later, _ = _pair(tmp_path / "later", NOW + datetime.timedelta(days=15))
    said = expiry_warning(soon, NOW)
    ends = _date(NOW + datetime.timedelta(days=10, hours=1))
    assert said == f"[smtp] tls_certificate: {soon} expires on {ends}, in 10 days: renew it (a reload reads it again)"
    assert expiry_warning(later, NOW) is None
