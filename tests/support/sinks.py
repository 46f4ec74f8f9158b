"""Receiving ends for delivery tests: Postfix's smtp-sink, and a scripted aiosmtpd sink.

The scripted sink answers by recipient local part, like KumoMTA's test sink:

    ok@...          250
    tempfail@...    451 4.3.0 at RCPT
    permfail@...    550 5.1.1 at RCPT
    quota@...       552 5.2.2 mailbox full, at RCPT
    datafail@...    554 5.6.0 at end of data (the whole transaction)
    datatemp@...    451 4.3.0 at end of data
    slow@...        waits `slow` seconds before answering RCPT (slow-<anything>@... too)
    slowend@...     waits `slow` seconds before answering the end of data (slowend-<anything>@... too)
    slowtemp@...    waits `slow` seconds, then 451 4.3.0 at end of data (an attempt long on the wire)
    flaky@...       451 4.3.0 at RCPT for its first `flaky` tries, then 250
    hangup@...      drops the connection in the middle of DATA
    chaos*@...      at random (seeded), per recipient: 451 at RCPT (25%), 550 at RCPT (3%); per
                    message: a hang-up in the middle of DATA (4%), or the message taken and the
                    connection dropped before the 250 (2%: the one case where the sender may
                    rightly deliver it again)

With `max_recipients`, a transaction takes that many recipients and answers the rest
`452 4.5.3 too many recipients` (RFC 5321 4.5.3.1.10), as many real servers do.

A test may also script RCPT replies itself: `rcpt_reply(address)` (when set) answers first,
a reply line such as "421 4.7.0 rate limited", or None for the usual answer above.

Every connection is recorded (`connections`: when it opened, when it ended, the client's
address and EHLO name) and every message's arrival (`arrivals`: when its end of data was
taken, from which address and by which EHLO name), so a test can check connection limits,
rates and egress sources as the receiving end saw them.

`WireSink` is the other kind of next hop: a lenient, line-at-LF server that records every
byte it receives, to show what a smuggled end of data would do at an MTA that takes one.
With `users` (name -> password) it takes SMTP AUTH (PLAIN and LOGIN, once on TLS: after STARTTLS,
or from the first byte with `implicit_tls`, a port 465); a wrong password gets `535 5.7.8`.
`auth_attempts` records each (mechanism, user, whether it was taken), and a message's
`Received.auth_user` the user its connection authenticated as.

`HangUpSink` takes each connection and ends it at once, greeting none (a reset, or a close).

`TurnAwaySink` turns every client away, with a reply of its choosing as its greeting or as
its answer to EHLO (a provider's "421 4.7.0 Try again later, closing connection"), then
closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import smtplib
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message as EmailMessage
from email.policy import default as default_policy
from pathlib import Path
from typing import Any, Self

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from tests.support.process import PigeonProcess, free_port
from tests.support.tools import require


class SmtpSink:
    """`smtp-sink` on a free loopback port; `extra` are its fault options (-r, -f, -q ...)."""

    def __init__(self, *extra: str, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self.port = port or free_port()
        binary = require("/usr/sbin/smtp-sink")
        self.process = subprocess.Popen(
            [binary, "-u", "nobody", "-c", *extra, f"{host}:{self.port}", "256"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(host, self.port)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def __enter__(self) -> SmtpSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Received:
    sender: str
    recipients: list[str]
    data: bytes
    mail_options: list[str] = field(default_factory=list)
    rcpt_options: list[list[str]] = field(default_factory=list)
    dropped: bool = False  # chaos@: stored, but the connection was dropped before the 250
    tls: bool = False  # it came over STARTTLS (or implicit TLS)
    auth_user: str | None = None  # the user its connection authenticated as

    @property
    def email(self) -> EmailMessage:
        return message_from_bytes(self.data, policy=default_policy)  # type: ignore[return-value]


@dataclass
class SinkConnection:
    """One client connection as the sink saw it (time.monotonic())."""

    opened: float
    ended: float = math.inf  # when QUIT came (the client is done), or the connection was lost
    helo: str = ""
    peer: str = ""  # the client's IP address


@dataclass(frozen=True)
class Arrival:
    at: float  # time.monotonic() when the message was taken
    helo: str  # the EHLO name of the client that sent it
    peer: str = ""  # the client's IP address


def peak_connections(connections: list[SinkConnection], since: float = -math.inf, until: float = math.inf,
                     helo: str | None = None) -> int:  # fmt: skip
    """The most connections open at once between `since` and `until` (of one EHLO name)."""
    return busiest_moment(connections, since, until, helo)[0]


def busiest_moment(connections: list[SinkConnection], since: float = -math.inf, until: float = math.inf,
                   helo: str | None = None) -> tuple[int, float, list[SinkConnection]]:  # fmt: skip
    """The most connections open at once (of one EHLO name), when it was first reached, and them."""
    events: list[tuple[float, int]] = []
    for c in connections:
        if (helo is None or c.helo == helo) and c.opened < until and c.ended > since:
            events += [(max(c.opened, since), 1), (c.ended, -1)]
    peak, when, open_now = 0, since, 0
    for at, change in sorted(events, key=lambda e: (e[0], e[1])):  # an end before an open at the same time
        open_now += change
        if open_now > peak:
            peak, when = open_now, at
    at_peak = [c for c in connections if (helo is None or c.helo == helo) and c.opened <= when < c.ended]
    return peak, when, at_peak


def busiest_window(times: list[float], window: float) -> tuple[int, float]:
    """The most arrivals in any `window` seconds (a window starting at each arrival), and where."""
    times = sorted(times)
    best, at, end = 0, 0.0, 0
    for start, t in enumerate(times):
        while end < len(times) and times[end] < t + window:
            end += 1
        if end - start > best:
            best, at = end - start, t
    return best, at


class _Handler:
    def __init__(self, sink: ScriptedSink) -> None:
        self.sink = sink

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        local = address.split("@", 1)[0].lower()
        self.sink.rcpt_log.append(address)
        if self.sink.rcpt_reply is not None and (scripted := self.sink.rcpt_reply(address)) is not None:
            return scripted
        limit = self.sink.max_recipients
        if limit is not None and len(envelope.rcpt_tos) >= limit:
            return self.sink.too_many
        if local == "slow" or local.startswith("slow-"):
            await asyncio.sleep(self.sink.slow)
        if local == "flaky" and self.sink.rcpt_log.count(address) <= self.sink.flaky:
            return "451 4.3.0 not yet"
        if local.startswith("chaos"):
            roll = self.sink.random.random()
            if roll < 0.25:
                return "451 4.3.0 chaos says later"
            if roll < 0.28:
                return "550 5.1.1 chaos says no"
        reply = {
            "tempfail": "451 4.3.0 try again later",
            "permfail": "550 5.1.1 no such user here",
            "quota": "552 5.2.2 mailbox full",
        }.get(local)
        if reply is not None:
            return reply
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.append(options)
        return "250 2.1.5 recipient ok"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        locals_ = {r.split("@", 1)[0].lower() for r in envelope.rcpt_tos}
        if "datafail" in locals_:
            return "554 5.6.0 content rejected"
        if "datatemp" in locals_:
            return "451 4.3.0 content deferred"
        if "slowtemp" in locals_:
            await asyncio.sleep(self.sink.slow)
            return "451 4.3.0 content deferred, slowly"
        if any(local == "slowend" or local.startswith("slowend-") for local in locals_):
            await asyncio.sleep(self.sink.slow)
        data = envelope.original_content or b""
        received = Received(
            envelope.mail_from or "",
            list(envelope.rcpt_tos),
            data,
            list(envelope.mail_options),
            [list(o) for o in envelope.rcpt_options],
            tls=session.ssl is not None or self.sink.implicit,
            auth_user=session.login_data.decode() if isinstance(session.login_data, bytes) else None,
        )
        self.sink.received.append(received)
        peer = session.peer[0] if isinstance(session.peer, tuple) else str(session.peer or "")
        self.sink.arrivals.append(Arrival(time.monotonic(), session.host_name or "", peer))
        record = getattr(server, "record", None)
        if record is not None:
            record.helo = session.host_name or ""
        if any(local.startswith("chaos") for local in locals_) and self.sink.random.random() < 0.02:
            received.dropped = True  # taken, but the sender never hears the 250
            server.transport.close()
        return "250 2.0.0 stored"


class _SevenBitHandler(_Handler):
    """A `_Handler` for a sink that does not offer 8BITMIME (aiosmtpd always does)."""

    async def handle_EHLO(self, server: SMTP, session: Session, envelope: Envelope, hostname: str,
                          responses: list[str]) -> list[str]:  # fmt: skip
        session.host_name = hostname  # (aiosmtpd leaves it to a handler with this hook)
        return [line for line in responses if line != "250-8BITMIME"]


class _HangupSMTP(SMTP):
    """Drops the connection in the middle of DATA when a recipient is hangup@; records each
    connection's life."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.record = SinkConnection(time.monotonic(), peer=peer[0] if peer else "")
        self.event_handler.sink.connections.append(self.record)
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        self.record.ended = min(self.record.ended, time.monotonic())
        super().connection_lost(error)

    async def smtp_QUIT(self, arg: str) -> None:
        # The client is done once it says so: it counts the connection as ended when the 221
        # comes back, which is after this.
        self.record.ended = min(self.record.ended, time.monotonic())
        await super().smtp_QUIT(arg)

    async def smtp_DATA(self, arg: str) -> None:
        chaos = any(r.lower().startswith("chaos") for r in self.envelope.rcpt_tos)
        random_hangup = chaos and self.event_handler.sink.random.random() < 0.04
        if random_hangup or any(r.lower().startswith("hangup@") for r in self.envelope.rcpt_tos):
            await self.push("354 End data with <CR><LF>.<CR><LF>")
            await self._reader.readline()
            self.transport.close()
            return
        await super().smtp_DATA(arg)


class _Controller(Controller):
    def factory(self) -> SMTP:
        return _HangupSMTP(self.handler, **self.SMTP_kwargs)


class ScriptedSink:
    """An aiosmtpd server in a thread, answering by recipient (see the module docstring)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        slow: float = 0.0,
        flaky: int = 2,
        seed: int = 1,
        smtputf8: bool = False,
        tls: ssl.SSLContext | None = None,
        max_recipients: int | None = None,
        too_many: str = "452 4.5.3 too many recipients",
        eight_bit_mime: bool = True,
        users: dict[str, str] | None = None,
        implicit_tls: ssl.SSLContext | None = None,
    ) -> None:
        """`smtputf8`: offer SMTPUTF8 (internationalised mail), which aiosmtpd leaves off by
        default. `tls`: offer STARTTLS with this server context. `max_recipients`: recipients
        a transaction takes (the rest get `too_many`); None: any number. `eight_bit_mime`:
        offer 8BITMIME (aiosmtpd does, unless told not to here). `users`: take AUTH with these
        (name -> password), on TLS only. `implicit_tls`: TLS from the first byte, with this
        server context (a port 465)."""
        self.host = host
        self.random = random.Random(seed)
        self.port = port or free_port()
        self.slow = slow
        self.flaky = flaky
        self.max_recipients = max_recipients
        self.too_many = too_many
        self.received: list[Received] = []
        self.rcpt_log: list[str] = []
        self.connections: list[SinkConnection] = []
        self.arrivals: list[Arrival] = []
        self.rcpt_reply: Callable[[str], str | None] | None = None
        self.users = users
        self.implicit = implicit_tls is not None
        self.auth_attempts: list[tuple[str, str, bool]] = []
        handler = _Handler(self) if eight_bit_mime else _SevenBitHandler(self)
        auth: dict[str, Any] = {}
        if users is not None:
            # On implicit TLS aiosmtpd sees no STARTTLS: the connection is on TLS all the same.
            auth = {"authenticator": self._authenticate, "auth_require_tls": implicit_tls is None}
        self._controller = _Controller(
            handler,
            hostname=host,
            port=self.port,
            ready_timeout=10,
            enable_SMTPUTF8=smtputf8,
            tls_context=tls,
            ssl_context=implicit_tls,
            **auth,
        )
        self._controller.start()

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        assert self.users is not None and isinstance(data, LoginPassword)
        user, password = data.login.decode(), data.password.decode()
        taken = self.users.get(user) == password
        self.auth_attempts.append((mechanism, user, taken))
        return AuthResult(success=taken, handled=False, auth_data=data)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Received]:
        """The messages received, once there are at least `count`; fails when time runs out."""
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            if time.monotonic() >= deadline:
                raise AssertionError(f"the sink received {len(self.received)} messages in {timeout}s, not {count}")
            time.sleep(0.05)
        return list(self.received)

    def after(self, seconds: float) -> list[Received]:
        """What was received after `seconds` more (to show that nothing more came)."""
        time.sleep(seconds)
        return list(self.received)

    def stop(self) -> None:
        self._controller.stop()

    def __enter__(self) -> ScriptedSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class WireTransaction:
    """One transaction as a lenient next hop understood it."""

    sender: str
    recipients: list[str] = field(default_factory=list)
    data: bytes = b""


class _SocketSink:
    """A raw-socket next hop on a free loopback port: a thread accepts, and each connection is
    served by `_serve` on a thread of its own. Subclasses say what is said on the wire."""

    def __init__(self, host: str, name: str, port: int | None = None) -> None:
        self.host = host
        self._lock = threading.Lock()
        # (not port 0: see tests.support.ports)
        self._listener = socket.create_server((host, free_port() if port is None else port))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=name, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(10)
        self._listener.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._accepted()
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _accepted(self) -> None:
        """Called on the accepting thread for each connection, before it is served."""

    def _serve(self, connection: socket.socket) -> None:
        raise NotImplementedError


class WireSink(_SocketSink):
    """A next hop that reads lines up to LF (a CR before it dropped), as the MTAs that SMTP
    smuggling abuses do: "<LF>.<LF>" and "<LF>.<CR><LF>" end its DATA too. It offers
    PIPELINING, 8BITMIME and SMTPUTF8 but not CHUNKING, so its clients send DATA.

    `wire` is every byte received, on every connection; `transactions` what it made of them.
    """

    def __init__(self, *, host: str = "127.0.0.1") -> None:
        self.wire = bytearray()
        self.transactions: list[WireTransaction] = []
        super().__init__(host, "wire-sink")

    def senders(self) -> list[str]:
        with self._lock:
            return [t.sender for t in self.transactions]

    def wait_for(self, count: int, timeout: float = 20.0) -> list[WireTransaction]:
        """The transactions ended with a 250, once there are at least `count`."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                done = [t for t in self.transactions if t.data]
            if len(done) >= count:
                return done
            if time.monotonic() >= deadline:
                raise AssertionError(f"the wire sink saw {len(done)} messages in {timeout}s, not {count}")
            time.sleep(0.05)

    def _serve(self, connection: socket.socket) -> None:
        connection.settimeout(30)
        buffer = b""
        current: WireTransaction | None = None
        in_data = False
        content: list[bytes] = []

        def say(*lines: str) -> None:
            connection.sendall("".join(line + "\r\n" for line in lines).encode())

        with connection:
            say("220 wire.test ESMTP")
            while not self._stopping.is_set():
                if b"\n" not in buffer:
                    try:
                        chunk = connection.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    with self._lock:
                        self.wire += chunk
                    buffer += chunk
                    continue
                raw, _, buffer = buffer.partition(b"\n")
                line = raw.removesuffix(b"\r")
                if in_data:
                    if line == b".":
                        in_data = False
                        assert current is not None
                        with self._lock:
                            current.data = b"".join(content)
                        say("250 2.0.0 stored")
                    else:
                        content.append((line[1:] if line.startswith(b".") else line) + b"\r\n")
                    continue
                verb = line[:4].upper()
                if verb in (b"EHLO", b"HELO"):
                    say("250-wire.test", "250-PIPELINING", "250-8BITMIME", "250 SMTPUTF8")
                elif verb == b"MAIL":
                    sender = line.decode(errors="replace").partition("<")[2].partition(">")[0]
                    current = WireTransaction(sender)
                    with self._lock:
                        self.transactions.append(current)
                    say("250 2.1.0 ok")
                elif verb == b"RCPT" and current is not None:
                    current.recipients.append(line.decode(errors="replace").partition("<")[2].partition(">")[0])
                    say("250 2.1.5 ok")
                elif verb == b"DATA" and current is not None:
                    in_data, content = True, []
                    say("354 go ahead")
                elif verb in (b"RSET", b"NOOP"):
                    say("250 2.0.0 ok")
                elif verb == b"QUIT":
                    say("221 2.0.0 bye")
                    return
                else:
                    say("500 5.5.2 what?")


class TurnAwaySink(_SocketSink):
    """A next hop that turns every client away: it greets with `greeting`, or greets with 220
    and answers the first command (EHLO) with `ehlo`, then closes its side. Replies are given
    as lines ("421-...\\r\\n421 ..."). `received` is every command line the clients sent, the
    ones after the close included (a HELO that should not have come)."""

    def __init__(self, *, greeting: str | None = None, ehlo: str | None = None, host: str = "127.0.0.1") -> None:
        if (greeting is None) == (ehlo is None):
            raise ValueError("turn clients away at the greeting or at EHLO")
        self.greeting = greeting
        self.ehlo = ehlo
        self.received: list[str] = []
        self.connections = 0
        super().__init__(host, "turn-away-sink")

    def _accepted(self) -> None:
        with self._lock:
            self.connections += 1

    def _serve(self, connection: socket.socket) -> None:
        connection.settimeout(10)
        with connection, contextlib.suppress(OSError):
            if self.greeting is not None:
                connection.sendall(self.greeting.encode() + b"\r\n")
                return
            connection.sendall(b"220 turn-away.test ESMTP\r\n")
            buffer = b""
            while b"\n" not in buffer:
                chunk = connection.recv(4096)
                if not chunk:
                    return
                buffer += chunk
            line = buffer.partition(b"\n")[0].removesuffix(b"\r").decode(errors="replace")
            with self._lock:
                self.received.append(line)
            assert self.ehlo is not None
            connection.sendall(self.ehlo.encode() + b"\r\n")
            # Closed for the client (it reads the end), still read: a HELO it sends is recorded.
            connection.shutdown(socket.SHUT_WR)
            connection.settimeout(2)
            rest = buffer.partition(b"\n")[2]
            while chunk := connection.recv(4096):
                rest += chunk
            with self._lock:
                self.received += [raw.removesuffix(b"\r").decode(errors="replace") for raw in rest.split(b"\n") if raw]


class HangUpSink(_SocketSink):
    """A next hop that takes each TCP connection and ends it at once without a word (no
    greeting): with a reset (`reset`, SO_LINGER 0), or a plain close. `connections` counts them."""

    def __init__(self, *, reset: bool = True, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.reset = reset
        self.connections = 0
        super().__init__(host, "hang-up-sink", port)

    def _accepted(self) -> None:
        with self._lock:
            self.connections += 1

    def _serve(self, connection: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if self.reset:
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.close()


class AnswerSink(_SocketSink):
    """A next hop whose every reply a test may choose, even one no server should send: a 250 to
    DATA, a 354 to the end of data, a 421 to RCPT that is not followed by a close. `answers`
    maps a command ("EHLO", "MAIL", "RCPT", "DATA", "BDAT", "RSET", "QUIT") or "." (the end of
    DATA's content) to the reply line(s) to send instead of the usual ones, "" to close the
    connection without a word; `delays` to the seconds to wait before answering. A whole command
    line as received ("RCPT TO:<a@b.example>") is a key too, ahead of its command's: one
    recipient answered apart from the others. It offers 8BITMIME, and PIPELINING and CHUNKING
    as `extensions` says. Content is read after a 354 to DATA (up
    to "." on a line of its own, CRLF only, dot-stuffing left as it is), and a BDAT's octets
    after BDAT, whatever the reply. With "STARTTLS" in `extensions`, STARTTLS is answered 220
    and the client's TLS hello with plaintext, then the connection closes: a handshake that
    always fails (a client may then try again in the clear). `port`: the one to listen on
    (None: a free one), for hosts that must share one (MX hosts on addresses of their own).
    `close_at_mail`: on each connection, the MAIL of that number (from 1) or a later one ends it, as a server's
    idle timeout or limit of messages a connection may just as MAIL comes: closed without a word
    (what came with it, a pipelined RCPT and BDAT, unread), or with `answer_before_close` after
    its answer (a 250), what followed then read to the client's end.

    `commands` is every command line received (content not included), `sessions` the same for
    each connection apart, `contents` every message's content in full (what ended with "." or
    BDAT LAST), and `quits`/`drops` count the connections that ended with QUIT and without."""

    def __init__(
        self,
        answers: dict[str, str] | None = None,
        *,
        extensions: tuple[str, ...] = (),
        delays: dict[str, float] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        close_at_mail: int | None = None,
        answer_before_close: bool = False,
    ) -> None:
        self.answers = answers or {}
        self.delays = delays or {}
        self.close_at_mail = close_at_mail
        self.answer_before_close = answer_before_close
        self.extensions = extensions
        self.commands: list[str] = []
        self.sessions: list[list[str]] = []
        self.contents: list[bytes] = []
        self.quits = 0
        self.drops = 0
        super().__init__(host, "answer-sink", port)

    def _serve(self, connection: socket.socket) -> None:
        connection.settimeout(30)
        buffer = b""
        usual = {
            "EHLO": "\r\n".join(f"250-{k}" for k in ("answer.test", "8BITMIME", *self.extensions)) + "\r\n250 SIZE",
            "HELO": "250 answer.test",
            "MAIL": "250 2.1.0 ok",
            "RCPT": "250 2.1.5 ok",
            "DATA": "354 go ahead",
            ".": "250 2.0.0 stored",
            "BDAT": "250 2.0.0 stored",
            "RSET": "250 2.0.0 ok",
            "NOOP": "250 2.0.0 ok",
            "QUIT": "221 2.0.0 bye",
            "STARTTLS": "220 2.0.0 go ahead",
        }

        def read(until: bytes) -> bytes | None:
            nonlocal buffer
            while until not in buffer:
                try:
                    chunk = connection.recv(65536)
                except OSError:
                    return None
                if not chunk:
                    return None
                buffer += chunk
            found, _, buffer = buffer.partition(until)
            return found

        def say(key: str, line: str = "") -> str:
            answer = self.answers.get(line, self.answers.get(key, usual.get(key, "500 5.5.2 what?")))
            time.sleep(self.delays.get(line, self.delays.get(key, 0.0)))
            with contextlib.suppress(OSError):
                if not answer:
                    connection.shutdown(socket.SHUT_RDWR)  # gone without a word (counted as a drop)
                else:
                    connection.sendall(answer.encode() + b"\r\n")
            return answer

        def close_at(text: str) -> None:
            """Ends the connection at a MAIL (`close_at_mail`): counted as a drop."""
            with contextlib.suppress(OSError):
                if not self.answer_before_close:
                    connection.shutdown(socket.SHUT_RDWR)
                    return
                say("MAIL", text)
                connection.shutdown(socket.SHUT_WR)
                connection.settimeout(5)
                while connection.recv(65536):
                    pass  # (read to the client's end: no reset may overtake the answer)

        session: list[str] = []
        mails = 0
        with self._lock:
            self.sessions.append(session)
        with connection:
            connection.sendall(b"220 answer.test ESMTP\r\n")
            while not self._stopping.is_set():
                line = read(b"\r\n")
                if line is None:
                    with self._lock:
                        self.drops += 1
                    return
                text = line.decode(errors="replace")
                verb = text.split(" ", 1)[0].upper()
                with self._lock:
                    self.commands.append(text)
                    session.append(text)
                if verb == "BDAT":
                    size = int(text.split()[1])
                    while len(buffer) < size:
                        chunk = connection.recv(65536)
                        if not chunk:
                            break
                        buffer += chunk
                    content, buffer = buffer[:size], buffer[size:]
                    with self._lock:
                        self.contents.append(content)
                    say("BDAT")
                    continue
                mails += verb == "MAIL"
                if verb == "MAIL" and self.close_at_mail is not None and mails >= self.close_at_mail:
                    close_at(text)
                    with self._lock:
                        self.drops += 1
                    return
                answer = say(verb, text)
                if verb == "STARTTLS" and answer.startswith("220"):
                    with contextlib.suppress(OSError):
                        connection.recv(65536)  # the client's hello
                        connection.sendall(b"this is not a TLS server hello\r\n")
                    return
                if verb == "QUIT":
                    with self._lock:
                        self.quits += 1
                    return
                if verb == "DATA" and answer.startswith("354"):
                    body = read(b"\r\n.\r\n")  # (an empty message is no test's)
                    if body is None:
                        with self._lock:
                            self.drops += 1
                        return
                    with self._lock:
                        self.contents.append(body)
                    say(".")


def _wait_port(host: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port}")


def delivery_config(next_hop: str, **delivery: Any) -> dict[str, dict[str, Any]]:
    """Sections for PigeonProcess: deliver everything to `next_hop`, retry fast. A
    `retry_interval` given without a `max_retry_interval` is the wait before every retry."""
    settings: dict[str, Any] = {
        "enabled": True,
        "retry_interval": "1s",
        "max_retry_interval": "2s",
        # A dead sink is a dead site (`pigeon.delivery.sites`): probed again as fast as retried.
        "site_retry_interval": "1s",
        "max_site_retry_interval": "2s",
        "idle_timeout": "2s",
    }
    if "retry_interval" in delivery:
        # Else the 2 s ceiling would shorten a test's "retry in an hour" to 2 s: a message the
        # test expects to wait would be tried again whenever the test took over 2 s.
        settings["max_retry_interval"] = delivery["retry_interval"]
    settings.update(delivery)
    return {"delivery": settings, "route": [{"domain": "*", "next_hop": next_hop, "tls": "disabled"}]}


def wait_until(predicate: Any, timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


@contextlib.contextmanager
def node_failing_at_each(
    root: Path, sinks: Mapping[str, AnswerSink], message: bytes, **delivery: Any
) -> Iterator[tuple[PigeonProcess, dict[str, dict[str, Any]]]]:
    """A node that routes `<name>.example` to each named sink, once a message to `a@` of every
    such domain has had an attempt at each that failed: the node, and by name the
    TransientFailure record of its recipient. Mail waits an hour after a failed attempt."""
    config = delivery_config("unused", retry_interval="1h", **delivery)
    config["route"] = [  # type: ignore[assignment]  # (an array of tables)
        {"domain": f"{name}.example", "next_hop": sink.endpoint, "tls": "disabled"} for name, sink in sinks.items()
    ]
    with PigeonProcess(root, **config) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("sender@example.org", [f"a@{name}.example" for name in sinks], message)
        failures = wait_until(lambda: len(found := pigeon.records("TransientFailure")) == len(sinks) and found)
        yield pigeon, {record["recipient"].removeprefix("a@").removesuffix(".example"): record for record in failures}
