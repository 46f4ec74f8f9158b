"""TLS 1.2 or newer, in and out: a TLS 1.1-only peer is refused by the SMTP listener, by the
delivery client and by the IMAP client (both of which take `pigeon.tls.client_context`)."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from pigeon.listener.tls import ensure_self_signed
from pigeon.tls import client_context, server_context
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

# The old peers use the deprecated versions on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")


def _tls11_only(context: ssl.SSLContext) -> ssl.SSLContext:
    # OpenSSL 3 allows TLS 1.0/1.1 only at security level 0.
    context.minimum_version = ssl.TLSVersion.TLSv1_1
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


def _old_client() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return _tls11_only(context)


def _old_server(tmp_path: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*ensure_self_signed(tmp_path / "old", "old.pigeon.test"))
    return _tls11_only(context)


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext) -> str:
    """The version two contexts agree on over a socket pair; raises `ssl.SSLError` if none."""
    near, far = socket.socketpair()
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            with server.wrap_socket(far, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError) as error:
            failures.append(error)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(near, server_hostname="old.pigeon.test") as tls:
            version = tls.version()
            tls.sendall(b"x")
    finally:
        near.close()
        thread.join(10)
        far.close()
    assert version is not None
    return version


def test_the_old_peers_of_these_tests_do_speak_tls_1_1(tmp_path: Path) -> None:
    """Without this, the refusals below could come from a machine that cannot do TLS 1.1 at all."""
    assert _handshake(_old_client(), _old_server(tmp_path)) == "TLSv1.1"


@pytest.mark.parametrize("verify", [False, True])
def test_the_clients_refuse_a_tls_1_1_server(tmp_path: Path, verify: bool) -> None:
    old = _old_server(tmp_path)
    with pytest.raises(ssl.SSLError, match=r"UNSUPPORTED_PROTOCOL|NO_PROTOCOLS_AVAILABLE|VERSION"):
        _handshake(client_context(verify=verify, cafile=tmp_path / "old" / "selfsigned.crt"), old)


def test_the_server_context_refuses_a_tls_1_1_client(tmp_path: Path) -> None:
    server = server_context(*ensure_self_signed(tmp_path / "new", "mx.pigeon.test"))
    with pytest.raises(ssl.SSLError):
        _handshake(_old_client(), server)


def test_the_smtp_listener_refuses_starttls_from_a_tls_1_1_client_and_takes_tls_1_2(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node") as pigeon:
        for context, accepted in ((_old_client(), False), (_tls12_client(), True)):
            with RawSmtp(pigeon.smtp_port) as client:
                client.expect(220)
                client.expect(250, "EHLO old.pigeon.test")
                client.expect(220, "STARTTLS")
                if accepted:
                    with context.wrap_socket(client.sock, server_hostname="mx.pigeon.test") as tls:
                        assert tls.version() == "TLSv1.2"
                else:
                    with pytest.raises(ssl.SSLError):
                        context.wrap_socket(client.sock, server_hostname="mx.pigeon.test")
        # A refused handshake is no lost message: no "message not stored" warning for it.
        with RawSmtp(pigeon.smtp_port) as client:
            client.expect(220)
            client.expect(250, "EHLO client.test")  # a live session after the refused one
        assert "message not stored" not in pigeon.stderr()


def _tls12_client() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context
