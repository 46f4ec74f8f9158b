"""Drives a `ServerSession` the way the I/O layer does: bytes in, events out, replies collected.

`Peer` plays the application around the session. It feeds bytes, pulls every event, answers
each decision (by default with `accept()`, and the end of a message with "queued as"), and
returns what the session wrote back. Tests then assert on those replies and on the events.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import TypeVar

from pigeon.smtp import replies
from pigeon.smtp.events import (
    NEED_DATA,
    AuthCredentials,
    Closing,
    Data,
    DataChunk,
    Decision,
    Ehlo,
    Event,
    Helo,
    MailFrom,
    MessageEnd,
    RcptTo,
    Rejected,
    StartTls,
    TransactionReset,
    _NeedData,
)
from pigeon.smtp.framing import BareLinefeeds
from pigeon.smtp.replies import Reply
from pigeon.smtp.server import ServerConfig, ServerSession

E = TypeVar("E")

HOSTNAME = "mx.test"
QUEUE_ID = "0000000000000001"
QUEUED = f"250 2.0.0 Ok: queued as {QUEUE_ID}\r\n"
REPLY_LINE = re.compile(rb"^[2-5][0-9][0-9][ -]")


def config(**overrides: object) -> ServerConfig:
    """The test server's configuration: hostname mx.test, everything else as given."""
    return ServerConfig(hostname=HOSTNAME, **overrides)  # type: ignore[arg-type]


def decision_verb(event: Decision) -> str:
    """The name an answer is filed under: the command's verb, or MESSAGE for the end of data."""
    return "MESSAGE" if isinstance(event, MessageEnd) else event.verb


@dataclass
class Peer:
    """The application side of one session. Answers decisions as told, else accepts them."""

    session: ServerSession
    events: list[Event] = field(default_factory=list)
    answers: dict[str, deque[Reply]] = field(default_factory=dict)
    established_tls_after_starttls: bool = False
    banner: str = ""

    @classmethod
    def start(cls, server: ServerConfig | None = None, *, tls_active: bool = False, greet: bool = True) -> Peer:
        peer = cls(ServerSession(server or config(), tls_active=tls_active))
        if greet:
            peer.session.greet()
            peer.banner = peer.session.data_to_send().decode("utf-8")
        return peer

    # --- driving the session ------------------------------------------------------------
    def answer(self, verb: str, reply: Reply) -> None:
        """Answer the next decision of this verb (EHLO, MAIL, RCPT, DATA, MESSAGE, ...) with `reply`."""
        self.answers.setdefault(verb.upper(), deque()).append(reply)

    def send(self, data: bytes | str) -> str:
        """Feed `data` in one receive_data call, run the session, return everything it wrote."""
        return self.send_raw(data).decode("utf-8")

    def send_raw(self, data: bytes | str) -> bytes:
        if isinstance(data, str):
            data = data.encode("utf-8")
        if data:
            self.session.receive_data(data)
        self.pump()
        return self.session.data_to_send()

    def send_pieces(self, pieces: Iterable[bytes]) -> str:
        """Feed each piece in its own receive_data call; return all replies written meanwhile."""
        return b"".join(self.send_raw(piece) for piece in pieces).decode("utf-8")

    def close(self) -> str:
        """The peer closes its side (receive_data(b""))."""
        self.session.receive_data(b"")
        self.pump()
        return self.session.data_to_send().decode("utf-8")

    def pump(self) -> list[Event]:
        """Pull events until the session needs data or says Closing; answer every decision."""
        new: list[Event] = []
        while True:
            event = self.session.next_event()
            if isinstance(event, _NeedData):
                assert event is NEED_DATA
                break
            if isinstance(event, Closing) and self.closing() is not None:
                break  # the session keeps saying Closing once it has closed: record it once
            new.append(event)
            self.events.append(event)
            if isinstance(event, (DataChunk, MessageEnd)):
                # What the I/O layer relies on: message content, and its end, are read while
                # their transaction is still open (it builds the message from `session.mail`).
                assert self.session.mail is not None, f"{event!r} read after its transaction ended"
            if isinstance(event, Closing):
                break
            if isinstance(event, Decision):
                self._decide(event)
        return new

    def _decide(self, event: Decision) -> None:
        queue = self.answers.get(decision_verb(event))
        if queue:
            self.session.respond(queue.popleft())
        elif isinstance(event, MessageEnd):
            self.session.respond(replies.queued([QUEUE_ID]))
        else:
            self.session.accept()
            if isinstance(event, StartTls) and self.established_tls_after_starttls:
                self.session.tls_established()

    # --- reading what happened ----------------------------------------------------------
    def of_type(self, kind: type[E]) -> list[E]:
        return [event for event in self.events if isinstance(event, kind)]

    def content(self) -> bytes:
        """All message content delivered so far (DataChunk data, concatenated)."""
        return b"".join(event.data for event in self.events if isinstance(event, DataChunk))

    def message_ends(self) -> list[MessageEnd]:
        return [event for event in self.events if isinstance(event, MessageEnd)]

    def closing(self) -> Closing | None:
        found = [event for event in self.events if isinstance(event, Closing)]
        return found[0] if found else None

    def unanswered_answers(self) -> dict[str, int]:
        return {verb: len(queue) for verb, queue in self.answers.items() if queue}


# --- common openings ----------------------------------------------------------------------
def open_transaction(
    peer: Peer, *, sender: str = "a@example.org", recipient: str = "b@example.net", ehlo: bool = True
) -> None:
    """EHLO (unless `ehlo` is False: the session was greeted already), MAIL and RCPT, each
    checked to be accepted."""
    if ehlo:
        assert peer.send("EHLO client.test\r\n").startswith(f"250-{HOSTNAME} greets client.test\r\n")
    assert peer.send(f"MAIL FROM:<{sender}>\r\n") == "250 2.1.0 Sender ok\r\n"
    assert peer.send(f"RCPT TO:<{recipient}>\r\n") == "250 2.1.5 Recipient ok\r\n"


def open_data(peer: Peer) -> None:
    """An open transaction that has just been told 354."""
    open_transaction(peer)
    assert peer.send("DATA\r\n") == "354 End data with <CR><LF>.<CR><LF>\r\n"


def lines(output: str) -> list[str]:
    """The reply lines in `output`, without their CRLF."""
    assert output == "" or output.endswith("\r\n"), f"output does not end with CRLF: {output!r}"
    return output.split("\r\n")[:-1]


# --- event summaries (used by the transcripts' E: lines) ------------------------------------
def summarize(event: Event) -> str:
    """A short, deterministic description of an event: its kind and every non-default field."""
    if isinstance(event, (Ehlo, Helo)):
        return f"{type(event).__name__} {event.domain}"
    if isinstance(event, MailFrom):
        parts = [f"MailFrom <{event.sender}>"]
        for f in fields(event):
            value = getattr(event, f.name)
            if f.name == "sender" or value == f.default:
                continue
            if value is True:
                parts.append(f.name)
            else:
                parts.append(f"{f.name}={getattr(value, 'value', value)}")
        return " ".join(parts)
    if isinstance(event, RcptTo):
        parts = [f"RcptTo <{event.recipient}>"]
        if event.notify is not None:
            parts.append("notify=" + ",".join(sorted(n.value for n in event.notify)))
        if event.orcpt is not None:
            parts.append(f"orcpt={event.orcpt}")
        return " ".join(parts)
    if isinstance(event, Data):
        return "Data"
    if isinstance(event, MessageEnd):
        return f"MessageEnd size={event.size} chunked={event.chunked}"
    if isinstance(event, StartTls):
        return "StartTls"
    if isinstance(event, AuthCredentials):
        return f"AuthCredentials {event.mechanism} {event.username}"
    if isinstance(event, DataChunk):
        return f"DataChunk {event.data!r}"
    if isinstance(event, Rejected):
        enhanced = f" {event.reply.enhanced}" if event.reply.enhanced else ""
        return f"Rejected {event.command or '-'} {event.reply.code}{enhanced}"
    if isinstance(event, TransactionReset):
        return "TransactionReset"
    assert isinstance(event, Closing)
    return f"Closing {event.reply.code if event.reply else None}"


BARE_LINEFEEDS = {mode.name: mode for mode in BareLinefeeds}


def drive(server: ServerConfig, pieces: list[bytes], answers: list[Reply | None], eof: bool) -> bytes:
    """Drive a session like the I/O layer: every decision answered, every byte fed."""
    session = ServerSession(server)
    session.greet()
    plan = iter(answers)
    out = bytearray(session.data_to_send())
    closed = False
    for piece in [*pieces, *([b""] if eof else [])]:
        if closed:
            break
        session.receive_data(piece)
        while True:
            event = session.next_event()
            if event is NEED_DATA:
                break
            if isinstance(event, Closing):
                closed = True
                break
            if isinstance(event, Decision):
                answer = next(plan, None)
                if answer is not None:
                    session.respond(answer)
                elif isinstance(event, MessageEnd):
                    session.respond(replies.queued(["1"]))
                else:
                    session.accept()
                    if isinstance(event, StartTls):
                        session.tls_established()
        out += session.data_to_send()
    return bytes(out)


def http_problem(email: str) -> str | None:
    """What HTTP injection's request check says of `email` as a recipient (None: taken): the
    other door, for tests that hold the session's answer beside it."""
    from pigeon.compose import ComposeError, InjectRecipient, InjectRequest, check_request

    try:
        check_request(InjectRequest("", [InjectRecipient(email)], "Subject: x\n\nhi\n", template=False))
    except ComposeError as error:
        return str(error)
    return None
