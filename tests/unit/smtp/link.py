"""A `ClientSession` and a `ServerSession` wired back to back, as h11 tests its two sides.

`Link` plays both I/O layers at once. Every client write goes to the server in one
`receive_data()`; the server's application (`harness.Peer`) answers its decisions (accept by
default, or as a test asks with `link.server.answer(verb, reply)`); every server write goes
back to the client. When the client says `StartTls`, the handshake is simulated: both sides
are told it worked (`handshake=True`) or the client is told it failed. When the server says
`Closing`, the client receives end of file, as the listener would close the connection.

Each side's writes are kept as they were made, so tests can count round trips and writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pigeon.smtp.client import Envelope, Result
from pigeon.smtp.client_session import (
    ClientSession,
    Closed,
    Deliver,
    Event,
    Quit,
    StartTls,
    TlsPolicy,
    TransactionDone,
    Unusable,
)
from pigeon.smtp.events import DataChunk, MessageEnd, _NeedData
from pigeon.smtp.replies import Reply
from pigeon.smtp.server import ServerConfig

from .harness import Peer, config

CLIENT_NAME = "client.test"


@dataclass
class Link:
    client: ClientSession
    server: Peer
    handshake: bool = True  # whether a TLS handshake after STARTTLS succeeds
    client_writes: list[bytes] = field(default_factory=list)
    server_writes: list[bytes] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    _server_closed: bool = False

    @classmethod
    def open(
        cls,
        server: ServerConfig | None = None,
        *,
        tls: TlsPolicy = TlsPolicy.OPPORTUNISTIC,
        handshake: bool = True,
        answers: dict[str, list[Reply]] | None = None,
        pipelining: bool = True,
        chunking: bool = True,
    ) -> Link:
        """Connect: the server greets, and the two talk until the client is ready or gives up."""
        peer = Peer.start(server or config())
        peer.established_tls_after_starttls = handshake  # the server's half of the handshake
        for verb, replies in (answers or {}).items():
            for reply in replies:
                peer.answer(verb, reply)
        client = ClientSession(CLIENT_NAME, tls=tls, pipelining=pipelining, chunking=chunking)
        link = cls(client, peer, handshake)
        link._to_client(peer.banner.encode())
        link._carry(link.client.data_to_send())
        return link

    # --- what a test does ---------------------------------------------------------------------
    def send(self, command: Deliver | Quit) -> list[Event]:
        """The client sends `command`; both sides talk until quiet. Returns the client's new events."""
        before = len(self.events)
        self._carry(self.client.send(command))
        return self.events[before:]

    def deliver(self, envelope: Envelope) -> Result:
        """One message, which must complete: its result."""
        events = self.send(Deliver(envelope))
        assert isinstance(events[0], TransactionDone), events
        return events[0].result

    def quit(self) -> list[Event]:
        return self.send(Quit())

    # --- what a test looks at -----------------------------------------------------------------
    def messages(self) -> list[bytes]:
        """The content of every message the server took to its end (accepted or not)."""
        found, chunks = [], []
        for event in self.server.events:
            if isinstance(event, DataChunk):
                chunks.append(event.data)
            elif isinstance(event, MessageEnd):
                found.append(b"".join(chunks))
                chunks = []
        return found

    def final(self) -> Event | None:
        return self.events[-1] if self.events and isinstance(self.events[-1], (Closed, Unusable)) else None

    # --- moving bytes ---------------------------------------------------------------------------
    def _carry(self, data: bytes) -> None:
        """Client bytes to the server, its answer back, and so on until neither has more to say."""
        while data:
            self.client_writes.append(data)
            answer = self.server.send_raw(data)
            self._to_client(answer)
            data = self.client.data_to_send()

    def _to_client(self, answer: bytes) -> None:
        if answer:
            self.server_writes.append(answer)
            self.client.receive_data(answer)
        if self.server.closing() is not None and not self._server_closed:
            self._server_closed = True
            self.client.receive_data(b"")  # the listener closes the connection after its last reply
        self._pump()

    def _pump(self) -> None:
        while True:
            event = self.client.next_event()
            if isinstance(event, _NeedData):
                return
            if isinstance(event, (Closed, Unusable)):
                if not any(seen is event for seen in self.events):
                    self.events.append(event)
                return
            self.events.append(event)
            if isinstance(event, StartTls):
                if self.handshake:
                    self.client.tls_established()
                else:
                    self.client.tls_failed("handshake failure")
