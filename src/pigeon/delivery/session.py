"""One outbound SMTP connection: asyncio glue around `pigeon.smtp.client`.

`ClientConnection.open()` walks the destination's hops in order (each host's addresses in
turn) until one greets it: connect, banner, EHLO (HELO if refused), STARTTLS as the TLS
policy says, EHLO again. `send()` runs one transaction; the connection is then free for
the next message of the same ready queue.

Failures become replies a log reader understands: `451 4.4.1` for a host that would not
talk, `451 4.4.2` for a timeout or a dropped connection, `451 4.7.5` when TLS is required
and impossible. The caller decides what they mean for the message.

The glue is an `asyncio.Protocol`, not streams: replies are parsed as bytes arrive, and a
wait for a reply costs one future and one timer handle rather than a stream read under an
`asyncio.timeout()` context (a few percent of the worker's CPU when relaying).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Final, cast

from pigeon.delivery.mx import DnsFailure, Resolver
from pigeon.delivery.routes import Destination, Hop, TlsPolicy
from pigeon.listener.tls import describe
from pigeon.smtp.client import Capabilities, ClientProtocolError, Envelope, ReplyReader, Result, Transaction
from pigeon.smtp.replies import Reply

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClientOptions:
    helo_name: str
    connect_timeout: float = 30.0
    reply_timeout: float = 300.0  # RFC 5321 4.5.3.2: 5 minutes for most replies, 10 for end of data
    pipelining: bool = True
    chunking: bool = True


class ConnectFailed(Exception):
    """No hop of the destination could be used. `reply` is the last reason."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(str(reply))
        self.reply = reply


class _HandshakeFailed(ConnectFailed):
    """STARTTLS was accepted but the TLS handshake failed."""


class ConnectionLost(Exception):
    """The connection broke during a transaction (timeout, reset, garbage)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(str(reply))
        self.reply = reply


def _context(verify: bool) -> ssl.SSLContext:
    if verify:
        return ssl.create_default_context()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


_CONTEXTS = {True: _context(True), False: _context(False)}


class _Wire(asyncio.Protocol):
    """The socket side of one client connection: bytes in become replies, waited for in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.reader = ReplyReader()
        self.replies: deque[Reply] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.error: Reply | None = None  # why the connection cannot be used any more

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, but are one.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.replies.extend(self.reader.feed(data))
        except ClientProtocolError as error:
            self.fail(Reply(451, "4.5.0", (f"sent garbage: {error}",)))
            if self.transport is not None:
                self.transport.abort()
            return
        if self.replies:
            self._wake()

    def eof_received(self) -> bool | None:
        self.fail(Reply(451, "4.4.2", ("closed the connection",)))
        return None  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection lost: {exc}" if exc is not None else "closed the connection"
        self.fail(Reply(451, "4.4.2", (reason,)))

    def fail(self, reply: Reply) -> None:
        if self.error is None:
            self.error = reply
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class ClientConnection:
    """An open, greeted SMTP connection to one peer."""

    def __init__(
        self,
        wire: _Wire,
        *,
        peer: str,
        capabilities: Capabilities,
        tls: str | None,
        options: ClientOptions,
    ) -> None:
        self._wire = wire
        self.peer = peer
        self.capabilities = capabilities
        self.tls = tls
        self.options = options
        self.deliveries = 0
        self.needs_reset = False
        self.broken = False

    # --- opening ---------------------------------------------------------------------------
    @classmethod
    async def open(cls, destination: Destination, resolver: Resolver, options: ClientOptions) -> ClientConnection:
        """The first hop that takes the connection. Raises ConnectFailed with the last reason."""
        last = Reply(451, "4.4.1", (f"no host to try for {destination.site}",))
        for hop in destination.hops:
            try:
                addresses = [hop.host] if _is_ip(hop.host) else await resolver.addresses(hop.host)
            except DnsFailure as error:
                last = Reply(451, "4.4.3", (f"{hop.host}: {error.reply.text}",))
                continue
            for address in addresses:
                try:
                    return await cls._open_one(hop, address, destination, options, tls=True)
                except _HandshakeFailed as error:
                    last = error.reply
                    if destination.tls is TlsPolicy.OPPORTUNISTIC:
                        # Opportunistic means "TLS if it works": try again in the clear.
                        try:
                            return await cls._open_one(hop, address, destination, options, tls=False)
                        except ConnectFailed as again:
                            last = again.reply
                except ConnectFailed as error:
                    last = error.reply
        raise ConnectFailed(last)

    @classmethod
    async def _open_one(
        cls, hop: Hop, address: str, destination: Destination, options: ClientOptions, *, tls: bool
    ) -> ClientConnection:
        peer = f"{hop.host} [{address}]:{hop.port}" if hop.host != address else f"[{address}]:{hop.port}"
        loop = asyncio.get_running_loop()
        wire = _Wire(loop)
        try:
            async with asyncio.timeout(options.connect_timeout):
                await loop.create_connection(lambda: wire, address, hop.port)
        except (OSError, TimeoutError) as error:
            reason = "timed out" if isinstance(error, TimeoutError) else (error.strerror or str(error))
            raise ConnectFailed(Reply(451, "4.4.1", (f"cannot connect to {peer}: {reason}",))) from None
        connection = cls(wire, peer=peer, capabilities=Capabilities(), tls=None, options=options)
        try:
            await connection._greet(hop, destination, tls=tls)
        except ConnectFailed:
            connection.close()
            raise
        except ConnectionLost as error:
            connection.close()
            raise ConnectFailed(error.reply) from None
        except BaseException:
            connection.close()
            raise
        return connection

    async def _greet(self, hop: Hop, destination: Destination, *, tls: bool) -> None:
        banner = await self._reply()
        if banner.code != 220:
            raise ConnectFailed(Reply(451, "4.4.1", (f"{self.peer} greeted with: {banner}",)))
        await self._ehlo()
        policy = destination.tls
        if policy is TlsPolicy.DISABLED or not tls:
            return
        if "STARTTLS" not in self.capabilities:
            if policy is TlsPolicy.REQUIRED:
                raise ConnectFailed(Reply(451, "4.7.5", (f"TLS required, but {self.peer} does not offer STARTTLS",)))
            return
        reply = await self._command(b"STARTTLS\r\n")
        if reply.code != 220:
            if policy is TlsPolicy.REQUIRED:
                raise ConnectFailed(Reply(451, "4.7.5", (f"TLS required, {self.peer} refused STARTTLS: {reply}",)))
            return
        server_name = None if _is_ip(hop.host) else hop.host
        wire = self._wire
        assert wire.transport is not None
        try:
            async with asyncio.timeout(self.options.reply_timeout):
                transport = await wire.loop.start_tls(
                    wire.transport, wire, _CONTEXTS[destination.tls_verify], server_hostname=server_name
                )
        except (ssl.SSLError, OSError, TimeoutError) as error:
            # The connection is unusable after a failed handshake; `open()` decides whether
            # to come back in the clear.
            raise _HandshakeFailed(Reply(451, "4.7.5", (f"TLS handshake with {self.peer} failed: {error}",))) from None
        if transport is None:
            raise _HandshakeFailed(Reply(451, "4.7.5", (f"{self.peer} closed the connection during TLS",)))
        wire.transport = transport
        self.tls = describe(transport.get_extra_info("ssl_object"))
        await self._ehlo()

    async def _ehlo(self) -> None:
        reply = await self._command(b"EHLO %s\r\n" % self.options.helo_name.encode())
        if reply.code == 250:
            self.capabilities = Capabilities.from_ehlo(reply)
            return
        reply = await self._command(b"HELO %s\r\n" % self.options.helo_name.encode())
        if reply.code != 250:
            raise ConnectFailed(Reply(451, "4.4.1", (f"{self.peer} refused EHLO and HELO: {reply}",)))
        self.capabilities = Capabilities.helo_only()

    # --- sending ---------------------------------------------------------------------------
    async def send(self, envelope: Envelope) -> tuple[Result, float]:
        """Run one transaction. Returns its result and how long it took (seconds).

        Raises ConnectionLost if the connection broke; the caller then treats every
        recipient as a transient failure with that reply.
        """
        started = time.monotonic()
        options = self.options
        transaction = Transaction(
            envelope,
            self.capabilities,
            pipelining=options.pipelining,
            chunking=options.chunking,
            reset_first=self.needs_reset,
        )
        self._write(transaction.start())
        while not transaction.done:
            out = transaction.on_reply(await self._reply())
            if out:
                self._write(out)
        result = transaction.result()
        self.needs_reset = result.needs_reset
        self.deliveries += 1
        return result, time.monotonic() - started

    def alive(self) -> bool:
        """False if the connection broke or the server closed it while it sat idle."""
        wire = self._wire
        return not (self.broken or wire.error is not None or wire.transport is None or wire.transport.is_closing())

    async def quit(self) -> None:
        """Say goodbye politely (briefly); close either way."""
        if not self.broken:
            try:
                self._write(b"QUIT\r\n")
                await self._reply(patience=5.0)
            except ConnectionLost:
                pass
        self.close()

    def close(self) -> None:
        self.broken = True
        if self._wire.transport is not None:
            self._wire.transport.close()

    # --- bytes -------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        wire = self._wire
        if wire.transport is None or wire.transport.is_closing():
            self.broken = True
            raise ConnectionLost(self._lost(wire.error or Reply(451, "4.4.2", ("connection closed",))))
        wire.transport.write(data)

    async def _command(self, line: bytes) -> Reply:
        self._write(line)
        return await self._reply()

    async def _reply(self, patience: float | None = None) -> Reply:
        wire = self._wire
        if not wire.replies:
            if wire.error is None:
                waiter = wire.waiter = wire.loop.create_future()
                timer = wire.loop.call_later(
                    self.options.reply_timeout if patience is None else patience, wire.fail, _TIMED_OUT
                )
                try:
                    await waiter
                finally:
                    timer.cancel()
                    wire.waiter = None
            if not wire.replies:
                self.broken = True
                assert wire.error is not None
                raise ConnectionLost(self._lost(wire.error))
        return wire.replies.popleft()

    def _lost(self, reason: Reply) -> Reply:
        """The reason, naming the peer: "451 4.4.2 mx.example.net [192.0.2.1]:25 closed the connection"."""
        if reason is _TIMED_OUT:
            return Reply(451, "4.4.2", (f"timeout waiting for {self.peer}",))
        return Reply(reason.code, reason.enhanced, (f"{self.peer} {reason.text}",))


_TIMED_OUT: Final = Reply(451, "4.4.2", ("timed out",))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
