"""A STARTTLS handshake that fails is logged naming the client's address and which side gave
up, and one that stalls is cut after `[smtp] command_timeout`, as a command would be.

Found from outside: "session 5e538e59000019: client gone; TLS handshake failed:
[SSL: UNSUPPORTED_PROTOCOL]..." named no address (no line tied the session to one) and said
"client gone" when Pigeon had refused; a client silent after STARTTLS was cut after a fixed,
undocumented 30 s."""

from __future__ import annotations

import re
import ssl
import time
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import wait_until

pytestmark = pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")


def _client(*, old: bool = False, verify: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if old:  # TLS 1.1 only, which Pigeon does not take (OpenSSL 3 allows it at level 0 only)
        context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_1
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


def _after_starttls(pigeon: PigeonProcess) -> tuple[RawSmtp, str]:
    client = RawSmtp(pigeon.smtp_port)
    client.expect(220)
    client.expect(250, "EHLO client.test")
    client.expect(220, "STARTTLS")
    host, port = client.sock.getsockname()[:2]
    return client, f"{host}:{port}"


def _said(pigeon: PigeonProcess, pattern: str) -> str:
    return str(wait_until(lambda: re.search(pattern, pigeon.stderr()), timeout=10).group(0))


def test_a_handshake_pigeon_refuses_is_logged_as_refused_naming_the_client(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node") as pigeon:
        client, peer = _after_starttls(pigeon)
        with client, pytest.raises(ssl.SSLError):
            _client(old=True).wrap_socket(client.sock, server_hostname="mx.pigeon.test")
        line = _said(pigeon, rf"session \w+ from {re.escape(peer)}: TLS handshake [^\n]*")
        assert "TLS handshake refused: [SSL: UNSUPPORTED_PROTOCOL]" in line, line
        assert "client gone" not in pigeon.stderr()


def test_a_handshake_the_client_refuses_is_logged_as_the_clients_refusal(tmp_path: Path) -> None:
    # The client verifies, and Pigeon's self-signed certificate does not.
    with PigeonProcess(tmp_path / "node") as pigeon:
        client, peer = _after_starttls(pigeon)
        with client, pytest.raises(ssl.SSLCertVerificationError):
            _client(verify=True).wrap_socket(client.sock, server_hostname="mx.pigeon.test")
        line = _said(pigeon, rf"session \w+ from {re.escape(peer)}: TLS handshake [^\n]*")
        assert "TLS handshake failed: the client refused it ([SSL: " in line, line


def test_a_client_silent_after_starttls_is_cut_after_command_timeout(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={"command_timeout": "1s"}) as pigeon:
        client, peer = _after_starttls(pigeon)
        started = time.monotonic()
        with client:
            assert client.closed_by_peer()
        assert time.monotonic() - started < 5
        line = _said(pigeon, rf"session \w+ from {re.escape(peer)}: TLS handshake [^\n]*")
        assert line.endswith("TLS handshake failed: not done within 1s ([smtp] command_timeout)"), line
