"""The self-signed pair made at first start is one pair, even when several workers start at
once, and is made for any hostname the config accepts."""

from __future__ import annotations

import ipaddress
import multiprocessing
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from pigeon.listener.tls import _self_signed, ensure_self_signed


def _make(directory: str) -> None:
    ensure_self_signed(Path(directory), "mx.pigeon.test")


def test_workers_starting_together_end_up_with_one_matching_certificate_and_key(tmp_path: Path) -> None:
    for round_no in range(5):  # the race needs a few tries to show without the lock
        directory = tmp_path / f"tls-{round_no}"
        context = multiprocessing.get_context("fork")
        workers = [context.Process(target=_make, args=(str(directory),)) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
            assert worker.exitcode == 0
        cert, key = ensure_self_signed(directory, "mx.pigeon.test")
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)  # raises on a mismatch
        assert sorted(p.name for p in directory.iterdir()) == [".lock", "selfsigned.crt", "selfsigned.key"]
        assert key.stat().st_mode & 0o077 == 0  # the private key is not readable by others


def test_an_existing_pair_is_kept(tmp_path: Path) -> None:
    cert, key = ensure_self_signed(tmp_path, "mx.pigeon.test")
    before = (cert.read_bytes(), key.read_bytes())
    assert ensure_self_signed(tmp_path, "mx.pigeon.test") == (cert, key)
    assert (cert.read_bytes(), key.read_bytes()) == before


@pytest.mark.parametrize(
    ("hostname", "alt_name"),
    [
        ("mx." + "long-label." * 8 + "example", None),  # over 64 characters
        ("[192.0.2.1]", ipaddress.ip_address("192.0.2.1")),
        ("[IPv6:2001:db8::1]", ipaddress.ip_address("2001:db8::1")),
    ],
)
def test_a_certificate_is_made_for_any_hostname_the_config_accepts(
    hostname: str, alt_name: ipaddress.IPv4Address | ipaddress.IPv6Address | None
) -> None:
    _, pem = _self_signed(hostname)
    certificate = x509.load_pem_x509_certificate(pem)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    if alt_name is None:
        assert names.get_values_for_type(x509.DNSName) == [hostname]
    else:
        assert names.get_values_for_type(x509.IPAddress) == [alt_name]
