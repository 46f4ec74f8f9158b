"""A loopback SMTP server for the client's I/O layer: Pigeon's `ServerSession` on a real
socket, in the test's own event loop, with knobs for the ways servers misbehave.

Each connection drives a `tests.unit.smtp.harness.Peer` (the session plus an application that
accepts everything unless told otherwise). STARTTLS is a real TLS handshake with a
self-signed certificate, unless `starttls` says to break it:

* "handshake": 220, then TLS (the default);
* "garbage": 220, then plaintext instead of a TLS server hello, then close;
* "inject": 220 followed by a plaintext reply in the same write (an injection).

`banner` replaces the greeting (a 554 refuses the connection); `stall` makes the server stop
answering after that many writes of its own (0: no banner); `dribble` sends the banner one
byte every `dribble` seconds, never finishing it; `delay` waits before each answer, and
`end_delay` before the one to the end of a message's content (with the replies written with
it: a pipelined MAIL's too, when the content came in the same write). `say()` writes raw
bytes on a connection, unasked.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import pytest
import uvloop

from pigeon.delivery.mx import Resolver
from pigeon.delivery.routes import Destination, Hop, TlsPolicy
from pigeon.listener.tls import ensure_self_signed, server_context
from pigeon.smtp.events import Closing, MessageEnd, StartTls
from pigeon.smtp.replies import Reply
from pigeon.smtp.server import Phase as ServerPhase
from pigeon.smtp.server import ServerConfig
from tests.unit.smtp.harness import Peer

Starttls = Literal["handshake", "garbage", "inject"]


@dataclass
class Connection:
    """What one client connection did: the session's events, every byte each way."""

    peer: Peer
    received: bytearray = field(default_factory=bytearray)
    sent: bytearray = field(default_factory=bytearray)
    reads: int = 0  # data_received calls: on loopback, one per client write
    tls: bool = False
    closed: bool = False


class PeerServer:
    def __init__(
        self,
        config: ServerConfig,
        *,
        certificates: Path | None = None,
        answers: dict[str, list[Reply]] | None = None,
        banner: Reply | None = None,
        starttls: Starttls = "handshake",
        stall: int | None = None,
        dribble: float | None = None,
        delay: float = 0.0,
        end_delay: float = 0.0,
    ) -> None:
        self.config = config
        self.context: ssl.SSLContext | None = None
        if certificates is not None:
            self.context = server_context(*ensure_self_signed(certificates, config.hostname))
        self.answers = answers or {}
        self.banner = banner
        self.starttls = starttls
        self.stall = stall
        self.dribble = dribble
        self.delay = delay  # seconds before each answer
        self.end_delay = end_delay  # seconds before the answer to the end of a message's content
        self.connections: list[Connection] = []
        self._server: asyncio.Server | None = None
        self._protocols: list[_Protocol] = []
        self.port = 0

    async def __aenter__(self) -> PeerServer:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Protocol(self), "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for connection in self.connections:
            connection.closed = True

    def destination(self, tls: TlsPolicy = TlsPolicy.DISABLED, *, verify: bool = False) -> Destination:
        return Destination(f"127.0.0.1:{self.port}", (Hop("127.0.0.1", self.port),), tls, tls_verify=verify)

    def say(self, data: bytes, *, close: bool = False, connection: int = -1) -> None:
        """Write `data` on a connection (the last by default) as if the server had something to say."""
        protocol = self._protocols[connection]
        protocol._write(data)
        if close and protocol.transport is not None:
            protocol.transport.close()

    def new_peer(self) -> Peer:
        peer = Peer.start(self.config, greet=self.banner is None)
        if self.banner is not None:
            peer.session.greet(self.banner)
            peer.banner = peer.session.data_to_send().decode()
        for verb, replies in self.answers.items():
            for reply in replies:
                peer.answer(verb, reply)
        return peer


class _Protocol(asyncio.Protocol):
    def __init__(self, server: PeerServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.connection: Connection | None = None
        self.writes = 0
        self.garbage_next = False
        self.early: bytearray | None = None  # decrypted bytes that beat the handshake's completion

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.connection = Connection(self.server.new_peer())
        self.server.connections.append(self.connection)
        self.server._protocols.append(self)
        if self.server.dribble is not None:
            self.loop.create_task(self._dribble(self.connection.peer.banner.encode()))
        else:
            self._write(self.connection.peer.banner.encode())
            if self.connection.peer.session.phase is ServerPhase.CLOSED:
                self.transport.close()  # a refusing banner: the server hangs up

    def data_received(self, data: bytes) -> None:
        if self.early is not None:
            self.early += data
            return
        connection = self.connection
        assert connection is not None
        connection.received += data
        connection.reads += 1
        if self.garbage_next:
            self._write(b"this is not a TLS server hello\r\n")
            assert self.transport is not None
            self.transport.close()
            return
        peer = connection.peer
        seen = len(peer.events)
        out = peer.send_raw(data)
        new = peer.events[seen:]
        if any(isinstance(event, StartTls) for event in new) and peer.session.phase is ServerPhase.TLS:
            self._starttls(out)
            return
        delay = self.server.delay
        if self.server.end_delay and any(isinstance(event, MessageEnd) for event in new):
            delay = self.server.end_delay  # taking the message: the answers wait for it
        if delay:
            self.loop.call_later(delay, self._write_then_maybe_close, out)
        else:
            self._write_then_maybe_close(out)

    def _write_then_maybe_close(self, out: bytes) -> None:
        assert self.connection is not None and self.transport is not None
        self._write(out)
        if any(isinstance(event, Closing) for event in self.connection.peer.events):
            self.transport.close()

    def _starttls(self, out: bytes) -> None:
        assert self.transport is not None
        mode = self.server.starttls
        if mode == "inject":
            self._write(out + b"250 2.0.0 injected\r\n")
            return
        self._write(out)
        if mode == "garbage":
            self.garbage_next = True  # answer the client's TLS hello with plaintext
            return
        self.transport.pause_reading()  # the client's hello goes to the TLS layer, not to us
        self.early = bytearray()
        self.loop.create_task(self._handshake())

    async def _handshake(self) -> None:
        assert self.transport is not None and self.connection is not None and self.server.context is not None
        try:
            new = await self.loop.start_tls(self.transport, self, self.server.context, server_side=True)
        except (OSError, ssl.SSLError):
            return
        if new is None:
            return
        self.transport = new
        self.connection.tls = True
        self.connection.peer.session.tls_established()
        early, self.early = self.early, None
        if early:
            self.data_received(bytes(early))

    def _write(self, data: bytes) -> None:
        if not data or self.transport is None or self.transport.is_closing():
            return
        if self.server.stall is not None and self.writes >= self.server.stall:
            return
        self.writes += 1
        assert self.connection is not None
        self.connection.sent += data
        self.transport.write(data)

    async def _dribble(self, data: bytes) -> None:
        assert self.server.dribble is not None
        for byte in data[:-2]:  # never the CRLF that would end the reply
            await asyncio.sleep(self.server.dribble)
            if self.transport is None or self.transport.is_closing():
                return
            self.transport.write(bytes([byte]))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.connection is not None:
            self.connection.closed = True


def no_dns() -> Resolver:
    """A resolver for destinations given as IP addresses: it never asks anyone."""
    return Resolver([("127.0.0.1", 9)], timeout=0.1)


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def on_both_loops(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test once on asyncio's loop and once on uvloop's (which Pigeon runs on)."""

    @functools.wraps(test)
    def run(loop: str, *args: Any, **kwargs: Any) -> None:
        with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
            runner.run(test(*args, **kwargs))

    signature = inspect.signature(test)
    loop = inspect.Parameter("loop", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    run.__signature__ = signature.replace(parameters=[loop, *signature.parameters.values()])  # type: ignore[attr-defined]
    del run.__wrapped__  # pytest reads __signature__ then, not the test's own
    parametrized: Callable[..., None] = pytest.mark.parametrize("loop", list(LOOPS))(run)
    return parametrized
