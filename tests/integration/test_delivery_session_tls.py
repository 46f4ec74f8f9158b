"""STARTTLS on a real socket, under each TLS policy: the client's I/O layer starts TLS when its
session says so, and turns what the server does into a connection or a `ConnectFailed`.

The server is Pigeon's own server session on loopback (`session_peer.PeerServer`), with a
real TLS handshake on a self-signed certificate. Each test runs under asyncio's loop and
under uvloop, whose `start_tls` is a different implementation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

from pigeon.delivery.routes import Destination, Hop, TlsPolicy
from pigeon.delivery.session import ClientConnection, ClientOptions, ConnectFailed
from pigeon.smtp import replies
from pigeon.smtp.client import Envelope, Recipient
from pigeon.smtp.events import Ehlo, StartTls
from pigeon.smtp.replies import Reply
from pigeon.smtp.server import ServerConfig
from tests.integration.session_peer import PeerServer, no_dns, on_both_loops

OPTIONS = ClientOptions(helo_name="client.test", connect_timeout=5.0, reply_timeout=5.0)
BODY = b"Subject: tls\r\n\r\nhello\r\n"
MESSAGE = Envelope("a@example.org", [Recipient("b@example.net")], BODY)


def tls_server(tmp_path: Path, **knobs: Any) -> PeerServer:
    return PeerServer(ServerConfig(hostname="mx.test", tls_available=True), certificates=tmp_path, **knobs)


def plain_server(**knobs: Any) -> PeerServer:
    return PeerServer(ServerConfig(hostname="mx.test", tls_available=False), **knobs)


async def deliver(connection: ClientConnection) -> None:
    result, _ = await connection.send(MESSAGE)
    assert [reply.code for reply in result.replies] == [250]
    await connection.quit()


@pytest.mark.parametrize("policy", [TlsPolicy.OPPORTUNISTIC, TlsPolicy.REQUIRED])
@on_both_loops
async def test_starttls_offered_is_used_and_the_server_is_greeted_again_on_tls(
    tmp_path: Path, policy: TlsPolicy
) -> None:
    async with tls_server(tmp_path) as server:
        connection = await ClientConnection.open(server.destination(policy), no_dns(), OPTIONS)
        assert connection.tls is not None and connection.tls.startswith("TLSv1.")
        assert "STARTTLS" not in connection.capabilities  # the offer made on TLS, not the first one
        (session,) = server.connections
        assert session.tls
        assert [type(e) for e in session.peer.events if isinstance(e, (Ehlo, StartTls))] == [Ehlo, StartTls, Ehlo]
        await deliver(connection)
        assert session.peer.content() == BODY


@on_both_loops
async def test_disabled_tls_stays_in_the_clear_with_a_server_that_offers_it(tmp_path: Path) -> None:
    async with tls_server(tmp_path) as server:
        connection = await ClientConnection.open(server.destination(TlsPolicy.DISABLED), no_dns(), OPTIONS)
        assert connection.tls is None
        assert "STARTTLS" in connection.capabilities
        await deliver(connection)
        assert b"STARTTLS" not in server.connections[0].received


@on_both_loops
async def test_opportunistic_tls_goes_on_in_the_clear_when_starttls_is_not_offered() -> None:
    async with plain_server() as server:
        connection = await ClientConnection.open(server.destination(TlsPolicy.OPPORTUNISTIC), no_dns(), OPTIONS)
        assert connection.tls is None
        await deliver(connection)


@on_both_loops
async def test_required_tls_without_starttls_offered_fails_with_4_7_4_and_sends_no_mail() -> None:
    async with plain_server() as server:
        with pytest.raises(ConnectFailed) as failed:
            await ClientConnection.open(server.destination(TlsPolicy.REQUIRED), no_dns(), OPTIONS)
        reply = failed.value.reply
        assert (reply.code, reply.enhanced) == (451, "4.7.4")  # RFC 3463: security features not supported
        assert reply.text == f"TLS required, but [127.0.0.1]:{server.port} does not offer STARTTLS"
        await _settle()
        assert bytes(server.connections[0].received) == b"EHLO client.test\r\nQUIT\r\n"


@on_both_loops
async def test_opportunistic_tls_goes_on_in_the_clear_when_starttls_is_refused(tmp_path: Path) -> None:
    async with tls_server(tmp_path, answers={"STARTTLS": [replies.TLS_UNAVAILABLE]}) as server:
        connection = await ClientConnection.open(server.destination(TlsPolicy.OPPORTUNISTIC), no_dns(), OPTIONS)
        assert connection.tls is None
        await deliver(connection)
        assert len(server.connections) == 1  # the same connection carried the mail


@on_both_loops
async def test_required_tls_with_starttls_refused_fails_with_the_servers_reply(tmp_path: Path) -> None:
    async with tls_server(tmp_path, answers={"STARTTLS": [replies.TLS_UNAVAILABLE]}) as server:
        with pytest.raises(ConnectFailed) as failed:
            await ClientConnection.open(server.destination(TlsPolicy.REQUIRED), no_dns(), OPTIONS)
        assert str(failed.value.reply) == (
            f"451 4.7.4 TLS required, [127.0.0.1]:{server.port} refused STARTTLS: 454 4.7.0 TLS not available"
        )


@on_both_loops
async def test_a_failed_handshake_under_opportunistic_tls_is_retried_in_the_clear(tmp_path: Path) -> None:
    async with tls_server(tmp_path, starttls="garbage") as server:
        connection = await ClientConnection.open(server.destination(TlsPolicy.OPPORTUNISTIC), no_dns(), OPTIONS)
        assert connection.tls is None
        await deliver(connection)
        first, second = server.connections
        assert first.received == b"EHLO client.test\r\nSTARTTLS\r\n" or first.received.startswith(
            b"EHLO client.test\r\nSTARTTLS\r\n\x16"  # the start of the client's TLS hello
        )
        assert b"STARTTLS" not in second.received  # the second connection did not try again
        assert second.received.startswith(b"EHLO client.test\r\nMAIL FROM:")


@on_both_loops
async def test_a_failed_handshake_tried_again_in_the_clear_says_so_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found from outside: falling back to the clear left no trace in the log."""
    async with tls_server(tmp_path, starttls="garbage") as server:
        destination = server.destination(TlsPolicy.OPPORTUNISTIC)
        with caplog.at_level(logging.WARNING, logger="pigeon.delivery.session"):
            connection = await ClientConnection.open(destination, no_dns(), OPTIONS)
        assert connection.tls is None
        await connection.quit()
    (warning,) = [r for r in caplog.records if r.name == "pigeon.delivery.session"]
    assert warning.levelno == logging.WARNING
    said = warning.getMessage()
    assert said.startswith(f"{destination.site}: 451 4.7.5 TLS handshake with [127.0.0.1]:{server.port} failed: ")
    assert said.endswith("; trying again in the clear")


@on_both_loops
async def test_a_connection_opened_on_the_fallback_names_the_handshake_that_failed(tmp_path: Path) -> None:
    """What its mail's records say (`tls_failed`): a server that offers no STARTTLS is in the
    clear too, and only this tells the two apart."""
    failed = "TLS handshake with [127.0.0.1]:{} failed: "
    async with tls_server(tmp_path, starttls="garbage") as server:
        connection = await ClientConnection.open(server.destination(TlsPolicy.OPPORTUNISTIC), no_dns(), OPTIONS)
        assert connection.tls is None
        assert connection.tls_failed is not None and connection.tls_failed.startswith(failed.format(server.port))
        await connection.quit()
    async with tls_server(tmp_path) as server:
        destination = server.destination(TlsPolicy.OPPORTUNISTIC, verify=True)
        connection = await ClientConnection.open(destination, no_dns(), OPTIONS)
        assert connection.tls is not None and connection.tls.endswith(", certificate not verified")
        assert connection.tls_failed is not None and connection.tls_failed.startswith(failed.format(server.port))
        assert "certificate verify failed" in connection.tls_failed
        await connection.quit()
        connection = await ClientConnection.open(server.destination(TlsPolicy.OPPORTUNISTIC), no_dns(), OPTIONS)
        assert connection.tls is not None and connection.tls_failed is None  # (not asked to verify: no fallback)
        await connection.quit()
    async with plain_server() as server:
        connection = await ClientConnection.open(server.destination(TlsPolicy.OPPORTUNISTIC), no_dns(), OPTIONS)
        assert connection.tls is None and connection.tls_failed is None
        await connection.quit()


@on_both_loops
async def test_a_421_to_the_ehlo_on_tls_fails_naming_the_host_and_its_tls(tmp_path: Path) -> None:
    """The records of a failure before the transaction name the host, and its TLS when it was
    on TLS, as a delivery's would (found from outside: they had no `peer`)."""
    greeting = Reply(250, None, ("mx.test", "PIPELINING", "STARTTLS"))
    closing = Reply(421, "4.7.0", ("mx.test going away",))
    async with tls_server(tmp_path, answers={"EHLO": [greeting, closing]}) as server:
        with pytest.raises(ConnectFailed) as failed:
            await ClientConnection.open(server.destination(TlsPolicy.OPPORTUNISTIC), no_dns(), OPTIONS)
    assert failed.value.reply.code == 421
    assert failed.value.peer == f"[127.0.0.1]:{server.port}"
    assert failed.value.tls is not None and failed.value.tls.startswith("TLSv1.")


@on_both_loops
async def test_a_failed_handshake_under_required_tls_fails_with_4_7_5(tmp_path: Path) -> None:
    async with tls_server(tmp_path, starttls="garbage") as server:
        with pytest.raises(ConnectFailed) as failed:
            await ClientConnection.open(server.destination(TlsPolicy.REQUIRED), no_dns(), OPTIONS)
        reply = failed.value.reply
        assert (reply.code, reply.enhanced) == (451, "4.7.5")
        assert reply.text.startswith(f"TLS handshake with [127.0.0.1]:{server.port} failed: ")
        assert len(server.connections) == 1  # no second try in the clear


@on_both_loops
async def test_a_certificate_that_does_not_verify_fails_required_tls_and_opportunistic_takes_it_unverified(
    tmp_path: Path,
) -> None:
    async with tls_server(tmp_path) as server:
        with pytest.raises(ConnectFailed) as failed:
            await ClientConnection.open(server.destination(TlsPolicy.REQUIRED, verify=True), no_dns(), OPTIONS)
        assert failed.value.reply.enhanced == "4.7.5"
        assert "certificate verify failed" in failed.value.reply.text
        # Opportunistic with verify: not the clear, which would protect the mail less than
        # leaving verify off does, but TLS without verifying.
        connection = await ClientConnection.open(
            server.destination(TlsPolicy.OPPORTUNISTIC, verify=True), no_dns(), OPTIONS
        )
        assert connection.tls is not None and connection.tls.startswith("TLSv1.")
        await deliver(connection)
        assert len(server.connections) == 3  # required: one; opportunistic: verified, then unverified TLS


@pytest.mark.parametrize("policy", [TlsPolicy.OPPORTUNISTIC, TlsPolicy.REQUIRED])
@on_both_loops
async def test_plaintext_injected_after_the_220_to_starttls_ends_the_connection(
    tmp_path: Path, policy: TlsPolicy
) -> None:
    async with tls_server(tmp_path, starttls="inject") as server:
        with pytest.raises(ConnectFailed) as failed:
            await ClientConnection.open(server.destination(policy), no_dns(), OPTIONS)
        reply = failed.value.reply
        assert (reply.code, reply.enhanced) == (451, "4.5.0")
        assert "after the 220 reply to STARTTLS" in reply.text
        await _settle()
        assert bytes(server.connections[0].received) == b"EHLO client.test\r\nSTARTTLS\r\n"  # nothing after


async def _settle() -> None:
    """Let the server read what the client wrote just before closing."""
    for _ in range(20):
        await asyncio.sleep(0.01)


@on_both_loops
async def test_verified_tls_to_an_ip_next_hop_checks_the_certificate_names_that_ip(tmp_path: Path) -> None:
    # A trusted certificate for "mx.test" (no IP in it), reached at 127.0.0.1 (a next_hop given
    # as an address): the chain verifies, the name does not, so required+verify refuses it.
    async with tls_server(tmp_path) as server:
        trusting = dataclasses.replace(
            server.destination(TlsPolicy.REQUIRED, verify=True), ca_file=str(tmp_path / "selfsigned.crt")
        )
        with pytest.raises(ConnectFailed) as failed:
            await ClientConnection.open(trusting, no_dns(), OPTIONS)
        assert failed.value.reply.enhanced == "4.7.5"
        assert "127.0.0.1" in failed.value.reply.text, failed.value.reply.text


@on_both_loops
async def test_a_route_ca_file_trusts_a_private_ca_and_is_read_again_when_it_changes(tmp_path: Path) -> None:
    # A smart host at 127.0.0.1 whose certificate (naming 127.0.0.1) is under no public CA:
    # the system's CAs refuse it, the route's ca_file trusts it. The file is read again when it
    # changes, so a CA renewed on disk is trusted without a restart.
    config = ServerConfig(hostname="127.0.0.1", tls_available=True)
    other = tls_server(tmp_path / "other")  # makes a certificate for mx.test: the wrong CA
    async with other, PeerServer(config, certificates=tmp_path / "smarthost") as server:
        verified = server.destination(TlsPolicy.REQUIRED, verify=True)
        with pytest.raises(ConnectFailed) as failed:
            await ClientConnection.open(verified, no_dns(), OPTIONS)
        assert failed.value.reply.enhanced == "4.7.5"

        ca_file = tmp_path / "trusted.pem"
        shutil.copy(tmp_path / "other" / "selfsigned.crt", ca_file)
        private = dataclasses.replace(verified, ca_file=str(ca_file))
        with pytest.raises(ConnectFailed) as failed:
            await ClientConnection.open(private, no_dns(), OPTIONS)
        assert failed.value.reply.enhanced == "4.7.5"

        shutil.copy(tmp_path / "smarthost" / "selfsigned.crt", ca_file)
        connection = await ClientConnection.open(private, no_dns(), OPTIONS)
        assert connection.tls is not None
        await deliver(connection)
        assert server.connections[-1].peer.content() == BODY

        ca_file.unlink()  # gone: the handshake fails, and says why, instead of trusting anything
        with pytest.raises(ConnectFailed) as failed:
            await ClientConnection.open(private, no_dns(), OPTIONS)
        assert failed.value.reply.enhanced == "4.7.5"
        assert "trusted.pem" in failed.value.reply.text, failed.value.reply.text


@pytest.mark.parametrize(
    ("after_220", "said"),
    [("hang", "timed out after 1s ([delivery] reply_timeout)"), ("reset", "connection reset by the server")],
)
@on_both_loops
async def test_a_handshake_the_server_never_finishes_fails_required_tls_in_words(after_220: str, said: str) -> None:
    """Found from outside: `TLS handshake with ... failed: TimeoutError` (a server that
    answered 220 to STARTTLS, then nothing) and `... failed: ConnectionResetError`."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 mx.test\r\n")
        await reader.readline()
        writer.write(b"250-mx.test\r\n250 STARTTLS\r\n")
        await reader.readline()
        writer.write(b"220 go ahead\r\n")
        await writer.drain()
        await reader.read(1)  # the start of the client's hello
        if after_220 == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            await asyncio.sleep(5)
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    destination = Destination(f"127.0.0.1:{port}", (Hop("127.0.0.1", port),), TlsPolicy.REQUIRED, tls_verify=False)
    try:
        with pytest.raises(ConnectFailed) as failed:
            await ClientConnection.open(destination, no_dns(), dataclasses.replace(OPTIONS, reply_timeout=1.0))
    finally:
        server.close()
    reply = failed.value.reply
    assert (reply.code, reply.enhanced) == (451, "4.7.5")
    assert reply.text == f"TLS handshake with [127.0.0.1]:{port} failed: {said}"
