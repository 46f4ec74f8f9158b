"""The SMTP listener: asyncio glue around `pigeon.smtp.server.ServerSession`.

One `SmtpConnection` (an `asyncio.Protocol`) per client. It moves bytes and makes the
decisions the session asks for; it never parses SMTP itself. Replies produced while
working through a pipelined group are written with one `write()` when the group is done.

A decision that takes time (storing a message, checking a password, the TLS handshake)
pauses reading from the socket and resumes when its future is done, so a client that
pipelines cannot make us buffer without bound, and replies stay in command order.

The policy module's `on_connect`, `on_mail_from` and `on_rcpt_to` hooks, when it has them,
are asked here (`intake.policy`): a plain hook answers at once, an async one is waited for
like any other decision. Without them nothing is asked and nothing is built.

Connections are bounded twice. One client address outside `relay_networks` may hold
`max_connections_per_client` of them on the node (further ones get 421 at once), so one host
cannot take the listener; with several workers the count is kept in a table they share
(`connection_limits`), since the kernel spreads one client's connections over them. Past
`max_connections` (per worker: it guards the worker's descriptors and memory, and only the
worker can close its own idle connections) a newcomer is still let in when some connection
is idle between transactions (or stalled in a TLS handshake): the one that has been silent
longest is told 421 (or, mid-handshake, just closed) to make room (Postfix's "stress" mode
shortens timeouts for the same purpose). Many idle hosts then churn among themselves while a
client that talks keeps its place. Either refusal is logged as a Rejection of the CONNECT.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import itertools
import logging
import secrets
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, Final, cast

from pigeon.intake import Arrival, ClientGone, Draft, Intake, Refused
from pigeon.listener.auth_throttle import AuthLimits, Lockout
from pigeon.listener.connection_limits import ClientConnections, Held, LocalConnections
from pigeon.listener.password_checker import CheckerBusy, PasswordChecker
from pigeon.listener.passwords import PasswordFile
from pigeon.listener.tls import describe
from pigeon.logs.peer_text import shown
from pigeon.logs.records import Rejection, Response
from pigeon.message import Envelope, Recipient, format_id
from pigeon.policy import objects
from pigeon.policy.answers import Refuse
from pigeon.policy.hooks import POLICY_ERROR, HookFailed, at_greeting, refusal
from pigeon.smtp import replies
from pigeon.smtp.events import (
    NEED_DATA,
    AuthCredentials,
    Closing,
    Data,
    DataChunk,
    Ehlo,
    Helo,
    MailFrom,
    MessageEnd,
    Notify,
    RcptTo,
    Rejected,
    StartTls,
    TransactionReset,
)
from pigeon.smtp.replies import Reply
from pigeon.smtp.server import Phase, ServerConfig, ServerSession
from pigeon.spool.spool import SpoolError

_log = logging.getLogger(__name__)
_NOT_STORED: Final = "message not stored"
_MAX_BUFFERED = 1024 * 1024  # bytes a client may send ahead while a command is being decided
_SESSION_PREFIX = secrets.token_hex(4)  # session ids: unique per process run, cheap to make
_session_numbers = itertools.count(1)


def _next_session_id() -> str:
    return f"{_SESSION_PREFIX}{next(_session_numbers):06x}"


IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class SmtpListener:
    """Accepts SMTP connections on one or more addresses."""

    def __init__(
        self,
        session_config: ServerConfig,
        intake: Intake,
        *,
        relay_networks: list[IpNetwork],
        postmaster: str,
        tls_context: ssl.SSLContext | None = None,
        passwords: PasswordFile | None = None,
        password_checker: PasswordChecker | None = None,
        auth_throttle: AuthLimits | None = None,
        client_connections: ClientConnections | None = None,
        idle_timeout: float = 300.0,
        command_timeout: float = 300.0,
        min_data_rate: float = 500.0,
        max_connections: int = 2000,
        max_connections_per_client: int = 50,
    ) -> None:
        self.session_config = session_config
        self.intake = intake
        self.relay_networks = relay_networks
        self.postmaster = postmaster
        """The address that mail for <postmaster> (no domain) is delivered to."""
        self.tls_context = tls_context
        self.passwords = passwords
        self.password_checker = password_checker or PasswordChecker()
        """Checks AUTH passwords on threads of its own; closed when the listener has drained."""
        self.auth_throttle = auth_throttle
        self.idle_timeout = idle_timeout
        self.command_timeout = command_timeout
        self.min_data_rate = min_data_rate
        """Bytes a second a message's content must keep up beyond `command_timeout` (see `_data_received`)."""
        self.max_connections = max_connections
        self.max_connections_per_client = max_connections_per_client
        # Open connections, least recently heard from first (a dict keeps insertion order).
        self.connections: dict[SmtpConnection, None] = {}
        self.client_connections = client_connections or LocalConnections()
        """Open connections per client address outside `relay_networks`: the worker's, or the node's."""
        self.draining = False
        self._relay_cache: dict[str, bool] = {}
        self._servers: list[asyncio.Server] = []
        self._all_closed = asyncio.Event()
        self._all_closed.set()

    async def start(self, addresses: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Listen on every address; returns the bound (host, port) pairs (port 0 picks one)."""
        loop = asyncio.get_running_loop()
        bound = []
        for host, port in addresses:
            # No SO_REUSEPORT: a node's workers share sockets bound once (`serve`), and another
            # process on the same port must fail to bind, not take half the connections.
            server = await loop.create_server(
                lambda: SmtpConnection(self), host, port, backlog=4096, reuse_address=True
            )
            self._servers.append(server)
            for sock in server.sockets:
                bound.append(sock.getsockname()[:2])
        return bound

    async def serve(self, sockets: list[socket.socket]) -> list[tuple[str, int]]:
        """Accept on sockets bound elsewhere (before a privilege drop, maybe in another
        process, and shared with other workers); returns their (host, port) pairs."""
        loop = asyncio.get_running_loop()
        for sock in sockets:
            server = await loop.create_server(lambda: SmtpConnection(self), sock=sock, backlog=4096)
            self._servers.append(server)
        return [sock.getsockname()[:2] for sock in sockets]

    async def drain(self, grace: float) -> None:
        """Stop accepting; let open transactions finish for up to `grace` seconds; close the rest."""
        self.draining = True
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.close_when_idle()
        try:
            await asyncio.wait_for(self._all_closed.wait(), grace)
        except TimeoutError:
            for connection in list(self.connections):
                connection.abort()
        for server in self._servers:
            await server.wait_closed()
        self.password_checker.close()

    def admit(self, connection: SmtpConnection) -> Reply | None:
        """Take a new connection into account; the 421 to greet it with if it may not stay."""
        hostname = self.session_config.hostname
        if self.draining:
            return replies.shutting_down(hostname)
        if not connection._relay:
            held = self.client_connections.open(connection.peer_ip, self.max_connections_per_client)
            if held is None:
                return replies.too_many_connections_from_you(hostname)
            connection._held = held
        if len(self.connections) >= self.max_connections:
            idle = next((c for c in self.connections if c.evictable()), None)
            if idle is None:
                return replies.too_many_connections(hostname)
            self.intake.metrics.counts.smtp_connections_evicted += 1
            idle.evict()
        return None

    def _opened(self, connection: SmtpConnection) -> None:
        self.connections[connection] = None
        self._all_closed.clear()
        self.intake.metrics.counts.smtp_connections_accepted += 1

    def _heard_from(self, connection: SmtpConnection) -> None:
        # Move to the end: the least recently heard from stays first, for eviction.
        if self.connections.pop(connection, False) is None:
            self.connections[connection] = None

    def _closed(self, connection: SmtpConnection) -> None:
        if self.connections.pop(connection, False) is None and connection._held is not None:
            self.client_connections.close(connection.peer_ip, connection._held)
            connection._held = None
        if not self.connections:
            self._all_closed.set()

    def relay_allowed(self, ip: str) -> bool:
        allowed = self._relay_cache.get(ip)
        if allowed is None:
            if len(self._relay_cache) > 10_000:
                self._relay_cache.clear()
            allowed = self._relay_cache[ip] = self._in_relay_networks(ip)
        return allowed

    def _in_relay_networks(self, ip: str) -> bool:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.relay_networks)


class SmtpConnection(asyncio.Protocol):
    """One client connection."""

    def __init__(self, listener: SmtpListener) -> None:
        self._listener = listener
        self._loop = asyncio.get_running_loop()
        self._session = ServerSession(listener.session_config)
        self._transport: asyncio.Transport | None = None
        self._draft: Draft | None = None
        self._recipients: list[Recipient] = []
        self._blocked = False
        self._closed = False
        self._close_when_idle = False
        self._timer: asyncio.TimerHandle | None = None
        self._last_bytes = 0.0
        self._last_progress = 0.0
        self._data_deadline: float | None = None  # while the client owes a message's content
        self._tls: str | None = None
        self.id = _next_session_id()
        self.peer = ""
        self.peer_ip = ""
        self._relay = False
        self._held: Held | None = None  # where this connection is counted against its client's limit
        self._paused = False
        self._tls_early: bytearray | None = None
        self._arrival: Arrival | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without inheriting from it.
        self._transport = cast(asyncio.Transport, transport)
        listener = self._listener
        peername = self._transport.get_extra_info("peername")
        if isinstance(peername, tuple):
            self.peer_ip = str(peername[0])
            self.peer = f"[{peername[0]}]:{peername[1]}" if ":" in self.peer_ip else f"{peername[0]}:{peername[1]}"
        self._relay = listener.relay_allowed(self.peer_ip)
        refusal = listener.admit(self)
        listener._opened(self)
        if refusal is not None:
            self._log_rejection("CONNECT", refusal, sender=None)
        now = self._loop.time()
        self._last_bytes = self._last_progress = now
        hook = listener.intake.policy.on_connect
        if refusal is None and hook is not None:
            sockname = self._transport.get_extra_info("sockname")
            local = sockname if isinstance(sockname, tuple) else ("", 0)
            port = peername[1] if isinstance(peername, tuple) else 0
            verdict = hook(objects.Connection(self.id, self.peer_ip, port, str(local[0]), local[1]), session=self.id)
            if isinstance(verdict, asyncio.Future):
                # No greeting until the policy has spoken; what the client sends meanwhile
                # waits in the session (it should not talk first anyway).
                self._blocked = True
                self._arm_timer()
                verdict.add_done_callback(self._connect_decided)
                return
            refusal = self._policy_reply(verdict, "CONNECT")
        self._session.greet(refusal)
        self._arm_timer()
        self._pump()

    def _connect_decided(self, future: asyncio.Future[Refuse | HookFailed | None]) -> None:
        self._blocked = False
        if self._closed:
            return
        self._last_bytes = self._last_progress = self._loop.time()  # the wait for the hook was ours
        self._session.greet(self._policy_reply(_verdict(future), "CONNECT"))
        self._pump()

    def _policy_reply(self, verdict: Refuse | HookFailed | None, command: str) -> Reply | None:
        """The reply to a policy hook's refusal (logged as a Rejection), or None to go on."""
        if verdict is None:
            return None
        reply = refusal(verdict)
        if command == "CONNECT":
            # A hook's Refuse(550), or a call cancelled as 451, goes as a greeting may refuse.
            reply = at_greeting(reply)
            self._log_rejection(command, reply, sender=None)  # (the others: by _respond)
        return reply

    def data_received(self, data: bytes) -> None:
        self._last_bytes = now = self._loop.time()
        self._listener._heard_from(self)
        if self._data_deadline is not None:
            self._data_received(len(data), now)
        if self._tls_early is not None:
            # Decrypted bytes that beat the handshake's completion callback: keep them for
            # the session, which still thinks it is waiting for the handshake.
            self._tls_early += data
            return
        session = self._session
        session.receive_data(data)
        if not self._blocked:
            self._pump()
        elif not self._paused and session.buffered > _MAX_BUFFERED and self._transport is not None:
            # A client pipelining far ahead while we wait: stop reading until we catch up.
            # (Pausing on every wait would cost two system calls per message.)
            self._transport.pause_reading()
            self._paused = True

    def eof_received(self) -> bool:
        self._session.receive_data(b"")
        if not self._blocked:
            self._pump()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._draft is not None:
            self._draft.discard()
            self._draft = None
        if self._timer is not None:
            self._timer.cancel()
        self._listener._closed(self)

    # --- driving the session -----------------------------------------------------------
    def _pump(self) -> None:
        session = self._session
        commands = session.commands
        while not self._blocked and not self._closed:
            event = session.next_event()
            if event is NEED_DATA:
                break
            _HANDLERS[type(event)](self, event)
        receiving_content = session.receiving_content
        if session.commands != commands or receiving_content != (self._data_deadline is not None):
            now = self._loop.time()
            if receiving_content:
                if self._data_deadline is None:  # content starts (354 sent, or the first BDAT read)
                    self._data_deadline = now + self._listener.command_timeout
            else:
                self._data_deadline = None
                self._last_progress = now
        self._flush()

    def _flush(self) -> None:
        out = self._session.data_to_send()
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(out)

    def _respond(
        self, reply: Reply, command: str, message_id: str | None = None, *, recipient: str | None = None
    ) -> None:
        if reply.code >= 400:
            self._log_rejection(command, reply, message_id, recipient=recipient, sender=self._open_sender())
        self._session.respond(reply)

    def _wait(
        self, future: asyncio.Future[Any], then: Callable[[asyncio.Future[Any]], None], *, what: str = ""
    ) -> None:
        """Handle no more commands until `future` is done, then call `then(future)` and carry on.
        `what` the future is, for the log if the client is gone by then and it failed."""
        self._blocked = True
        self._flush()
        future.add_done_callback(lambda f: self._resume(f, then, what))

    def _resume(self, future: asyncio.Future[Any], then: Callable[[asyncio.Future[Any]], None], what: str) -> None:
        self._blocked = False
        # The wait was ours: the client's time for its next command starts with our answer.
        self._last_bytes = self._last_progress = self._loop.time()
        if self._closed:
            # No one to answer, but a failure is still retrieved and said (asyncio would
            # otherwise print "Future exception was never retrieved" when it is collected).
            # (A message's commit is not among them: `_committed` says what became of it.)
            error = None if future.cancelled() else future.exception()
            if error is not None:
                _log.info("session %s: client gone; %s: %s", self.id, what or "its command failed",
                          str(error) or type(error).__name__)  # fmt: skip
            return
        then(future)
        if self._paused and self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
        self._paused = False
        if self._close_when_idle and self._session.phase in (Phase.GREETED, Phase.READY):
            self._say_goodbye()
            return
        self._pump()

    # --- decisions ---------------------------------------------------------------------
    def _on_greeting(self, event: Ehlo | Helo) -> None:
        self._session.accept()

    def _on_mail(self, event: MailFrom) -> None:
        self._recipients = []
        if event.size:
            # RFC 1870 6.1: a declared size under the maximum (larger ones got 552 5.3.4 from
            # the parser) that this worker's spool shard cannot store now gets 452 at once,
            # rather than a 452 after the client has sent it all.
            room = self._listener.intake.spool.room()
            if 0 <= room < event.size:
                self._respond(replies.no_room_now(event.size), "MAIL")
                return
        hook = self._listener.intake.policy.on_mail_from
        if hook is not None:
            session = self._session
            verdict = hook(
                objects.MailFrom(
                    self.id,
                    self.peer_ip,
                    session.helo or "",
                    event.sender,
                    event.size,
                    event.smtputf8,
                    self._tls,
                    session.authenticated,
                ),
                session=self.id,
            )
            if isinstance(verdict, asyncio.Future):
                self._wait(verdict, lambda done: self._decided(_verdict(done), "MAIL"))
                return
            if verdict is not None:
                self._decided(verdict, "MAIL")
                return
        self._session.accept()

    def _decided(
        self, verdict: Refuse | HookFailed | None, command: str, recipient: Recipient | None = None, given: str = ""
    ) -> None:
        """Answer MAIL or RCPT as the policy decided: a RCPT taken adds `recipient`, a RCPT
        refused is logged with the address as the client `given` it."""
        reply = self._policy_reply(verdict, command)
        if reply is not None:
            self._respond(reply, command, recipient=given if command == "RCPT" else None)
            return
        if recipient is not None:
            self._recipients.append(recipient)
        self._session.accept()

    def _on_rcpt(self, event: RcptTo) -> None:
        address = event.recipient
        notify = sorted(n.value for n in event.notify) if event.notify is not None else None
        trusted = self._relay or self._session.authenticated is not None
        if self._is_postmaster(address):
            # RFC 5321 4.5.1: taken from anyone, so that a sender we turn away can say so.
            address = self._listener.postmaster
            if not trusted:
                # Anyone may write any sender here: if the postmaster address fails, a DSN
                # (with the whole message under RET=FULL) would go to a victim of their choice.
                notify = [Notify.NEVER.value]
        elif not trusted:
            # Mail for an application's [[inbound]] route is ours to take from anyone.
            routes = self._listener.intake.inbound_routes
            if not (routes and routes.routing_key(address)):
                # At a domain of the routes, an address none takes is unknown, not relaying.
                known = routes is not None and routes.receives(address)
                reply = replies.UNKNOWN_RECIPIENT if known else replies.RELAY_DENIED
                self._respond(reply, "RCPT", recipient=event.recipient)
                return
        recipient = Recipient(address, notify, event.orcpt)
        hook = self._listener.intake.policy.on_rcpt_to
        if hook is not None:
            session = self._session
            mail = session.mail
            verdict = hook(
                objects.RcptTo(
                    self.id,
                    self.peer_ip,
                    session.helo or "",
                    mail.sender if mail is not None else "",
                    address,
                    tuple(r.address for r in self._recipients),
                    self._tls,
                    session.authenticated,
                ),
                session=self.id,
            )
            if isinstance(verdict, asyncio.Future):
                self._wait(verdict, lambda done: self._decided(_verdict(done), "RCPT", recipient, event.recipient))
                return
            if verdict is not None:
                self._decided(verdict, "RCPT", given=event.recipient)
                return
        self._recipients.append(recipient)
        self._session.accept()

    def _is_postmaster(self, address: str) -> bool:
        """<postmaster> (the parser lower-cases it without a domain), or postmaster at our own
        hostname, in any case."""
        if address == "postmaster":
            return True
        local, at, domain = address.rpartition("@")
        hostname = self._listener.session_config.hostname
        quoted_or_not = local.lower() in ("postmaster", '"postmaster"')
        return bool(at) and quoted_or_not and domain.lower() == hostname.lower()

    def _on_data(self, event: Data) -> None:
        self._session.accept()
        self._draft = self._new_draft()

    def _on_chunk(self, event: DataChunk) -> None:
        if self._draft is None:
            self._draft = self._new_draft()
        self._draft.write(event.data)

    def _on_message_end(self, event: MessageEnd) -> None:
        draft = self._draft or self._new_draft()
        self._draft = None
        # (`_wait`, with the 250 sent from the callback that completes the commit: commit's `then`)
        self._blocked = True
        self._flush()
        verb = "BDAT" if event.chunked else "DATA"
        # The draft asks `_present` before it stores the message (a client that hung up while a
        # hook or the signing ran is not answered: it will send the message again) and once the
        # commit ends (one that went meanwhile has its message kept, its 250 not given).
        draft.commit(then=lambda stored: self._committed(stored, draft.id, verb), present=self._present)

    def _present(self) -> bool:
        """Whether the client can still be answered: not closed, by it (its EOF closes the
        transport) or by us."""
        transport = self._transport
        return not self._closed and transport is not None and not transport.is_closing()

    def _committed(self, future: asyncio.Future[Any], message_id: int, verb: str) -> None:
        """A message's commit ended: answer the client, or, gone, say what became of the message
        (as the draft found it: `_present` answers the same once false)."""
        if self._present():
            self._resume(future, functools.partial(self._stored, message_id, verb), _NOT_STORED)
            return
        self._blocked = False
        if future.cancelled():  # a stop: nothing was stored, and there is no one to tell
            return
        error = future.exception()
        if error is None:
            ids = " ".join(format_id(spool_id) for spool_id in future.result().ids)
            _log.warning("session %s: client gone during the commit: message %s is stored and kept, but its 250 "
                         "could not be given (the client may send it again)", self.id, ids)  # fmt: skip
            return
        # Not stored: what Pigeon writes for a message it did not take, though no one hears it.
        if isinstance(error, ClientGone):
            _log.warning("session %s: client gone before message %s was stored: %s (nothing was accepted: it "
                         "never got a 250)", self.id, format_id(message_id), _NOT_STORED)  # fmt: skip
            reply = error.reply
        elif isinstance(error, (Refused, SpoolError)):
            _log.warning("session %s: client gone; %s: %s", self.id, _NOT_STORED, error)
            reply = error.reply
        else:
            _log.error("session %s: client gone; %s", self.id, _NOT_STORED, exc_info=error)
            reply = replies.SPOOL_ERROR
        self._log_rejection(verb, reply, format_id(message_id), sender=self._open_sender())
        self._recipients = []

    def _stored(self, message_id: int, verb: str, future: asyncio.Future[Any]) -> None:
        """`message_id`: the id the message was given, which the policy's on_message saw (and a
        PolicyFailure names): its Rejection carries it too, or nothing else would name it."""
        error = future.exception()
        if error is None:
            self._session.respond(future.result().reply)
        elif isinstance(error, (Refused, SpoolError)):
            if isinstance(error, SpoolError):
                _log.error("session %s: message not stored: %s", self.id, error)
            self._respond(error.reply, verb, format_id(message_id))
        else:
            _log.error("session %s: message not stored", self.id, exc_info=error)
            self._respond(replies.SPOOL_ERROR, verb, format_id(message_id))
        self._recipients = []

    def _on_starttls(self, event: StartTls) -> None:
        if self._listener.tls_context is None:
            self._respond(replies.TLS_UNAVAILABLE, "STARTTLS")
            return
        self._session.accept()
        self._flush()
        self._wait(asyncio.ensure_future(self._start_tls()), self._tls_done, what="TLS handshake failed")

    async def _start_tls(self) -> None:
        transport = self._transport
        context = self._listener.tls_context
        assert transport is not None and context is not None
        # From here on the transport hands its bytes to the TLS layer, so whatever reaches
        # data_received() is decrypted. Plaintext that came before was dropped by the session.
        self._tls_early = bytearray()
        new = await self._loop.start_tls(transport, self, context, server_side=True, ssl_handshake_timeout=30.0)
        if new is None:
            raise ConnectionError("connection closed during the TLS handshake")
        self._transport = new
        self._tls = describe(new.get_extra_info("ssl_object"))

    def _tls_done(self, future: asyncio.Future[Any]) -> None:
        error = future.exception()
        if error is not None:
            _log.info("session %s: TLS handshake with %s failed: %s", self.id, self.peer, error)
            self.abort()
            return
        self._session.tls_established()
        early, self._tls_early = self._tls_early, None
        if early:
            self._session.receive_data(bytes(early))

    def _on_auth(self, event: AuthCredentials) -> None:
        listener = self._listener
        passwords = listener.passwords
        if passwords is None:
            self._respond(replies.AUTH_FAILED, "AUTH")
            return
        throttle = listener.auth_throttle
        username = event.username
        if throttle is not None and throttle.begin(self.peer_ip, username, self._loop.time()) is not None:
            # Refused before the check: a guesser learns nothing and costs us no hashing.
            self._respond(replies.AUTH_LOCKED_OUT, "AUTH")
            return
        try:
            check = listener.password_checker.check(passwords, username, event.password)
        except CheckerBusy:
            if throttle is not None:
                throttle.abandoned(self.peer_ip, username)
            self._respond(replies.AUTH_BUSY, "AUTH")
            return
        # Counted when the check ends, whether or not the client is still there to hear it:
        # a guesser that hangs up after AUTH is counted all the same.
        check.add_done_callback(lambda future: self._count_auth(future, username))
        self._wait(check, self._auth_checked)

    @staticmethod
    def _passed(future: asyncio.Future[Any]) -> bool:
        return not future.cancelled() and future.exception() is None and bool(future.result())

    def _count_auth(self, future: asyncio.Future[Any], username: str) -> None:
        throttle = self._listener.auth_throttle
        if throttle is None:
            return
        if self._passed(future):
            throttle.succeeded(self.peer_ip, username, self._loop.time())
            return
        for lockout in throttle.failed(self.peer_ip, username, self._loop.time()):
            self._log_lockout(lockout, username)

    def _auth_checked(self, future: asyncio.Future[Any]) -> None:
        if self._passed(future):
            self._session.accept()
            return
        self._respond(replies.AUTH_FAILED, "AUTH")

    def _log_lockout(self, lockout: Lockout, username: str) -> None:
        seconds = lockout.until - self._loop.time()
        if lockout.kind == "address":
            _log.warning(
                "session %s: AUTH locked out for client %s for %.0fs after repeated failures (last user %r)",
                self.id,
                lockout.key,
                seconds,
                username,
            )
        else:
            _log.warning(
                "session %s: AUTH locked out for user %r for %.0fs after repeated failures (last from %s)",
                self.id,
                lockout.key,
                seconds,
                self.peer_ip,
            )

    # --- notices -----------------------------------------------------------------------
    def _on_rejected(self, event: Rejected) -> None:
        # The sender as the refusal found it: a refused message's transaction is over by now.
        self._log_rejection(event.command, event.reply, recipient=event.recipient, sender=event.sender)

    def _on_reset(self, event: TransactionReset) -> None:
        if self._draft is not None:
            self._draft.discard()
            self._draft = None
        self._recipients = []
        if self._close_when_idle:
            self._say_goodbye()

    def _on_closing(self, event: Closing) -> None:
        self._flush()
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    # --- helpers -------------------------------------------------------------------------
    def _open_sender(self) -> str | None:
        """The sender of the transaction open now (None: none is)."""
        mail = self._session.mail
        return mail.sender if mail is not None else None

    def _new_draft(self) -> Draft:
        session = self._session
        mail = session.mail
        assert mail is not None
        envelope = Envelope(
            sender=mail.sender,
            recipients=self._recipients,
            ret=mail.ret.value if mail.ret else None,
            envid=mail.envid,
            body=mail.body.value if mail.body else None,
            smtputf8=mail.smtputf8,
            peer=self.peer,
            helo=session.helo or "",
            auth_user=session.authenticated,
            protocol=self._protocol_keyword(mail.smtputf8),
        )
        arrival = self._arrival
        if arrival is None or arrival.helo != envelope.helo or arrival.protocol != envelope.protocol:
            # Built once per connection and kept while HELO, TLS and AUTH stay the same.
            arrival = self._arrival = Arrival(
                listener="smtp",
                session=self.id,
                peer=self.peer,
                peer_ip=self.peer_ip,
                helo=envelope.helo,
                protocol=envelope.protocol,
                tls=self._tls,
                auth_user=session.authenticated,
            )
        return self._listener.intake.draft(envelope, arrival)

    def _protocol_keyword(self, smtputf8: bool) -> str:
        # RFC 3848 / RFC 6531 WITH keywords.
        session = self._session
        if not session.esmtp:
            return "SMTP"
        keyword = "UTF8SMTP" if smtputf8 else "ESMTP"
        if session.tls_active:
            keyword += "S"
        if session.authenticated is not None:
            keyword += "A"
        return keyword

    def _log_rejection(
        self,
        command: str,
        reply: Reply,
        message_id: str | None = None,
        *,
        recipient: str | None = None,
        sender: str | None,
    ) -> None:
        """`recipient`: the address a refused RCPT gave, as the client sent it (escaped here).
        A message refused whole (DATA, BDAT: by the policy's on_message, the content checks,
        the spool) names the sender and recipients it was for: the record is all an operator
        has to find whose mail was turned away, since nothing is stored under its id.
        `sender`: the transaction's (None: no transaction was open)."""
        session = self._session
        recipients = [shown(recipient)] if recipient is not None else None
        if recipient is None and command in ("DATA", "BDAT") and self._recipients:
            recipients = [shown(r.address) for r in self._recipients]
        self._listener.intake.metrics.rejections.labels(command or "-", str(reply.code)).inc()
        self._listener.intake.log.write(
            Rejection(
                timestamp=time.time(),
                session=self.id,
                peer=self.peer,
                command=command,
                response=Response.of(reply),
                helo=session.helo,
                sender=sender,
                recipients=recipients,
                tls=self._tls,
                auth_user=session.authenticated,
                id=message_id,
            )
        )

    def close_when_idle(self) -> None:
        """Shutdown: close now if no transaction is open, else right after it ends."""
        self._close_when_idle = True
        if not self._blocked and self._session.phase in (Phase.GREETED, Phase.READY, Phase.CLOSED):
            self._say_goodbye()

    def _say_goodbye(self) -> None:
        if self._closed or self._transport is None:
            return
        reply = replies.shutting_down(self._listener.session_config.hostname)
        self._flush()
        self._transport.write(reply.encode(enhanced=self._session.greeted))
        self._closed = True
        self._transport.close()

    def evictable(self) -> bool:
        """Idle between transactions, with nothing being decided, or in the TLS handshake after
        STARTTLS (the client owes its part, as it owes the next command when idle: one that
        stalls there would otherwise hold its place until the handshake timeout): may make
        room for a newcomer."""
        if self._closed:
            return False
        phase = self._session.phase
        return phase is Phase.TLS or (not self._blocked and (phase is Phase.GREETED or phase is Phase.READY))

    def evict(self) -> None:
        """Close with 421 to make room for a newcomer (see `SmtpListener.admit`)."""
        reply = replies.idle_evicted(self._listener.session_config.hostname)
        if self._session.phase is Phase.TLS:
            # Mid-handshake a 421 cannot be said: there is no TLS yet to say it in, and in
            # plaintext it would be garbage to the client's TLS layer. Closed all the same,
            # and logged as any eviction is.
            self._log_rejection("", reply, sender=None)
            self._closed = True
            self.abort()
        else:
            self._close_with(reply)
        self._listener._closed(self)

    def _close_with(self, reply: Reply, command: str = "") -> None:
        """Say `reply` (logged as a rejection of `command`) after whatever is queued, and close."""
        self._log_rejection(command, reply, sender=self._open_sender())
        self._flush()
        if self._transport is not None:
            self._transport.write(reply.encode(enhanced=self._session.greeted))
            self._transport.close()
        self._closed = True

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # --- timeouts ------------------------------------------------------------------------
    # Three clocks. `idle_timeout`: no bytes at all for that long. `command_timeout`: one
    # command line, from our last answer (or the previous command) to its CRLF, so a line
    # dribbled a byte at a time ends, while NOOPs answered at once do not (the session limits
    # those by number: `max_junk_commands`). A message's content (DATA's up to the final dot,
    # or a BDAT sequence up to the end of its LAST chunk) has a deadline of its own:
    # `command_timeout` from its start, pushed back by 1/`min_data_rate` seconds for every byte
    # that arrives, but never past `command_timeout` from now (Postfix's smtpd_min_data_rate).
    # A sender at least that fast never meets it, however large its message; a trickle of a
    # line or a byte a second (or of one-byte chunks) meets it about `command_timeout` after
    # the content began.

    def _data_received(self, size: int, now: float) -> None:
        listener = self._listener
        deadline = self._data_deadline
        assert deadline is not None
        if listener.min_data_rate > 0:
            deadline += size / listener.min_data_rate
        self._data_deadline = min(deadline, now + listener.command_timeout)

    def _arm_timer(self) -> None:
        listener = self._listener
        deadline = self._data_deadline
        if deadline is None:
            deadline = self._last_progress + listener.command_timeout
        self._timer = self._loop.call_at(min(self._last_bytes + listener.idle_timeout, deadline), self._check_timeouts)

    def _check_timeouts(self) -> None:
        if self._closed:
            return
        listener = self._listener
        now = self._loop.time()
        if self._blocked:
            # We are the slow one (spool, password check): not the client's fault.
            self._last_bytes = self._last_progress = now
        elif self._data_deadline is not None and now >= self._data_deadline:
            command = "DATA" if self._session.phase is Phase.DATA else "BDAT"
            self._close_with(replies.timeout(listener.session_config.hostname), command)
            return
        elif now - self._last_bytes >= listener.idle_timeout or (
            self._data_deadline is None and now - self._last_progress >= listener.command_timeout
        ):
            self._close_with(replies.timeout(listener.session_config.hostname))
            return
        self._arm_timer()


def _verdict(future: asyncio.Future[Refuse | HookFailed | None]) -> Refuse | HookFailed | None:
    """A hook's answer; a call cancelled (the loop is closing) counts as failed."""
    return HookFailed(POLICY_ERROR) if future.cancelled() else future.result()


_HANDLERS: dict[type, Callable[[SmtpConnection, Any], None]] = {
    Ehlo: SmtpConnection._on_greeting,
    Helo: SmtpConnection._on_greeting,
    MailFrom: SmtpConnection._on_mail,
    RcptTo: SmtpConnection._on_rcpt,
    Data: SmtpConnection._on_data,
    DataChunk: SmtpConnection._on_chunk,
    MessageEnd: SmtpConnection._on_message_end,
    StartTls: SmtpConnection._on_starttls,
    AuthCredentials: SmtpConnection._on_auth,
    Rejected: SmtpConnection._on_rejected,
    TransactionReset: SmtpConnection._on_reset,
    Closing: SmtpConnection._on_closing,
}
