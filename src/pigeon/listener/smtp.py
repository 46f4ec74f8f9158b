"""The SMTP listener: asyncio glue around `pigeon.smtp.server.ServerSession`.

One `SmtpConnection` (an `asyncio.Protocol`) per client. It moves bytes and makes the
decisions the session asks for; it never parses SMTP itself. Replies produced while
working through a pipelined group are written with one `write()` when the group is done.

A decision that takes time (storing a message, checking a password, the TLS handshake)
pauses reading from the socket and resumes when its future is done, so a client that
pipelines cannot make us buffer without bound, and replies stay in command order. An AUTH
whose address's (or user's) allowance is held by checks in progress waits so too, for one of
them to be counted (`auth_turns`), before its own check begins.

The policy module's `on_connect`, `on_mail_from` and `on_rcpt_to` hooks, when it has them,
are asked here (`intake.policy`): a plain hook answers at once, an async one is waited for
like any other decision. Without them nothing is asked and nothing is built.

Connections are bounded twice. One client address (IPv6: its /64) outside `relay_networks` may hold
`max_connections_per_client` of them on the node (further ones get 421 at once), so one host
cannot take the listener; with several workers the count is kept in a table they share
(`connection_limits`), since the kernel spreads one client's connections over them. Past
`max_connections` (per worker: it guards the worker's descriptors and memory, and only the
worker can close its own idle connections) a newcomer is still let in when some connection
is idle between transactions (or stalled in a TLS handshake): the one that has been silent
longest is told 421 (or, mid-handshake, just closed) to make room (Postfix's "stress" mode
shortens timeouts for the same purpose). With none idle, an outsider (not in `relay_networks`,
not authenticated) whose transaction's envelope has been open for long (`long_envelope`: a
real client sends one in well under a second) is told 421 instead, the longest open first:
clients that drip RCPTs to keep their place lose it to one that has mail. Many idle hosts then
churn among themselves while a client that talks keeps its place. Either refusal is logged as
a Rejection of the CONNECT.

A client must wait for the greeting (RFC 5321 3.1, 4.3.1); spam software often does not (it
pipelines its whole conversation at once, as Postfix's postscreen "pregreet" test knows). One
outside `relay_networks` whose bytes are there before the greeting is written (looked for
without reading them, when the connection is taken; or arrived while an async `on_connect` hook
holds the greeting) gets 554 in its place (a greeting's, without an enhanced code) and is
disconnected, logged as a Rejection of the CONNECT.
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
from pigeon.listener.auth_throttle import AuthLimits, InFlight, Lockout
from pigeon.listener.auth_turns import AuthTurns
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
from pigeon.smtp.address import is_postmaster, same_mailbox_key
from pigeon.smtp.commands import VERBS
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
_GOODBYE: Final = 1.0  # seconds a session closed at the end of a stop has to take its 421 (`SmtpListener.drain`)
_MAX_BUFFERED = 1024 * 1024  # bytes a client may send ahead while a command is being decided
AUTH_WAIT: Final = 10.0
"""Longest an AUTH waits for other checks in progress from its address (or for its user) to be
counted before its own may begin (`AuthThrottle.begin`); past it, 454 4.7.0 (`AUTH_BUSY`)."""
_AUTH_LOOK_AGAIN: Final = 0.05  # seconds: a check that ends on another worker is not signalled here
_SESSION_PREFIX = secrets.token_hex(4)  # session ids: unique per process run, cheap to make
_session_numbers = itertools.count(1)


def _next_session_id() -> str:
    return f"{_SESSION_PREFIX}{next(_session_numbers):06x}"


class _SaidEvery:
    """An ERROR a spool that cannot store (full, or failing) would repeat for every message, said
    at most once per `every` seconds with how many more came meanwhile: a full disk under load
    made 70,000 lines a minute, which journald drops, and other lines with them. (The client
    gets its 451 and a Rejection record each time all the same.)"""

    __slots__ = ("_said", "_unsaid", "every")

    def __init__(self, every: float) -> None:
        self.every = every
        self._said = -every
        self._unsaid = 0

    def say(self, session: str, error: Exception) -> None:
        now = time.monotonic()
        if now - self._said < self.every:
            self._unsaid += 1
            return
        more = f" ({self._unsaid} more messages not stored in the last {now - self._said:.0f}s)" if self._unsaid else ""
        _log.error("session %s: message not stored: %s%s", session, error, more)
        self._said, self._unsaid = now, 0


_spool_refusals = _SaidEvery(10.0)


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
        envelope_timeout: float = 120.0,
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
        self.auth_wait = AUTH_WAIT
        self.auth_turns = AuthTurns()
        """Where an AUTH waits for checks in progress to be counted (`AuthLimits.begin`: `InFlight`)."""
        self.idle_timeout = idle_timeout
        self.command_timeout = command_timeout
        self.envelope_timeout = envelope_timeout
        """Longest a transaction's envelope may take, from MAIL to DATA or BDAT (or RSET), our own
        decisions' time left out."""
        self.long_envelope = min(10.0, envelope_timeout / 2)
        """An envelope open longer than this (an outsider's) may make room for a newcomer."""
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
        """Stop accepting; let open transactions finish for up to `grace` seconds; close the rest.

        Every session closed is told `421 4.3.2` first (RFC 5321 3.8): an idle one at once, one
        in a transaction when it ends, and one still in it after `grace` (a client stalled
        mid-DATA, say: its partial message is not accepted) then. Only one in its TLS
        handshake is closed without a word (there is no TLS yet to say it in), and one that
        does not take the 421 within `_GOODBYE` seconds (it reads nothing) is cut."""
        self.draining = True
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.close_when_idle()
        if not await self._all_closed_within(grace):
            for connection in list(self.connections):
                connection.shut_down()
            if not await self._all_closed_within(_GOODBYE):
                for connection in list(self.connections):
                    connection.abort()
        for server in self._servers:
            await server.wait_closed()
        self.password_checker.close()

    async def _all_closed_within(self, seconds: float) -> bool:
        # (No await in an except block: mypyc compiles this module, see test_compiled_awaits.)
        try:
            await asyncio.wait_for(self._all_closed.wait(), seconds)
        except TimeoutError:
            return False
        return True

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
            if idle is not None:
                self.intake.metrics.counts.smtp_connections_evicted += 1
                idle.evict(replies.idle_evicted(hostname))
                return None
            slow = self._longest_envelope(connection._loop.time())
            if slow is None:
                return replies.too_many_connections(hostname)
            self.intake.metrics.counts.smtp_connections_evicted += 1
            slow.evict(replies.envelope_evicted(hostname))
        return None

    def _longest_envelope(self, now: float) -> SmtpConnection | None:
        """The outsider whose envelope has been open longest, if for `long_envelope` or more."""
        oldest = None
        oldest_since = now - self.long_envelope
        for connection in self.connections:
            since = connection.outsider_envelope_since()
            if since is not None and since <= oldest_since:
                oldest, oldest_since = connection, since
        return oldest

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

    def set_passwords(self, passwords: PasswordFile | None) -> None:
        """A reload's SMTP users (None: AUTH no more): new AUTHs are checked against them, and
        an open session authenticated as a user they no longer hold, or hold with another
        password, loses its authentication at once (`SmtpConnection.judge_again`)."""
        self.passwords = passwords
        for connection in list(self.connections):
            connection.judge_again()

    def set_relay_networks(self, networks: list[IpNetwork]) -> None:
        """A reload's `relay_networks`: new connections are judged by them, and so are open ones,
        from their next command (`SmtpConnection.judge_again`): a network taken out relays no
        more, on connections opened before the reload too."""
        self.relay_networks = networks
        self._relay_cache.clear()
        for connection in list(self.connections):
            connection.judge_again()

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
        self._taken: _Taken | None = None  # `_recipients` as on_rcpt_to is told them (`_accepted`)
        self._blocked = False
        self._closed = False
        self._close_when_idle = False
        self._timer: asyncio.TimerHandle | None = None
        self._last_bytes = 0.0
        self._last_progress = 0.0
        self._data_deadline: float | None = None  # while the client owes a message's content
        self._envelope_deadline: float | None = None  # while a transaction is before its content
        self._blocked_at = 0.0  # when the decision being waited for began
        self._tls: str | None = None
        self.id = _next_session_id()
        self.peer = ""
        self.peer_ip = ""
        self._relay = False
        self._held: Held | None = None  # where this connection is counted against its client's limit
        self._paused = False
        self._tls_early: bytearray | None = None
        self._arrival: Arrival | None = None
        self._auth_binding: frozenset[str] | None = None  # the tenants of the AUTH user, as its AUTH found them
        self._talked_first = False  # an outsider sent bytes before its greeting
        self._auth_entry: str | None = None  # the users file's entry the session authenticated with
        self._revoked: str | None = None
        """The user whose credentials a reload revoked while this session was authenticated as
        it: its MAIL and RCPT get 530 until it authenticates again (see `judge_again`)."""
        self._trust_lost: Reply | None = None
        """What DATA, or the end of a message, gets in a transaction begun under an authorization
        a reload withdrew since (AUTH, `relay_networks`). Cleared by the next MAIL."""

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
        if refusal is None and not self._relay and _bytes_waiting(self._transport):
            self._refuse_early_talker()
            return
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
        refusal = self._policy_reply(_verdict(future), "CONNECT")
        if refusal is None and self._talked_first:
            self._refuse_early_talker()
            return
        self._session.greet(refusal)
        self._pump()

    def _refuse_early_talker(self) -> None:
        self._close_with(replies.talked_before_greeting(self._listener.session_config.hostname), "CONNECT")

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
        if not session.greeted and not self._relay:
            self._talked_first = True
        session.receive_data(data)
        if not self._blocked:
            self._pump()
        elif not self._paused and session.buffered > _MAX_BUFFERED and self._transport is not None:
            # A client pipelining far ahead while we wait: stop reading until we catch up.
            # (Pausing on every wait would cost two system calls per message.)
            self._transport.pause_reading()
            self._paused = True

    def eof_received(self) -> bool:
        """The client sends no more. Over plain TCP that may be a half-close (`nc -N`, probes,
        libraries that shut down their side once the transaction is sent): the transport is kept
        open for writing, and the session answers all the client sent (the end of a message
        once it is stored) and then closes. A client that is really gone shows itself when a
        write fails (RST), which closes the connection as ever (`connection_lost`)."""
        if self._tls is not None or self._tls_early is not None:
            # asyncio's TLS layer shuts the connection down after the client's EOF whatever
            # this returns, so nothing more could be answered: the client is gone, as ever.
            self._closed = True
            if self._transport is not None:
                self._transport.close()
            return False
        self._session.receive_data(b"")
        if not self._blocked:
            self._pump()
        return True

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
        phase = session.phase
        in_envelope = phase is Phase.MAIL or phase is Phase.RCPT
        if in_envelope != (self._envelope_deadline is not None):
            self._envelope_changed(in_envelope)
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
        self,
        reply: Reply,
        command: str,
        message_id: str | None = None,
        *,
        recipient: str | None = None,
        sender: str | None = None,
    ) -> None:
        """`sender`: a refused MAIL's (no transaction is open to take it from)."""
        if reply.code >= 400:
            sender = sender if sender is not None else self._open_sender()
            self._log_rejection(command, reply, message_id, recipient=recipient, sender=sender)
        self._session.respond(reply)

    def _wait(
        self, future: asyncio.Future[Any], then: Callable[[asyncio.Future[Any]], None], *, what: str = ""
    ) -> None:
        """Handle no more commands until `future` is done, then call `then(future)` and carry on.
        `what` the future is, for the log if the client is gone by then and it failed."""
        self._blocked = True
        self._blocked_at = self._loop.time()
        self._flush()
        future.add_done_callback(lambda f: self._resume(f, then, what))

    def _resume(self, future: asyncio.Future[Any], then: Callable[[asyncio.Future[Any]], None], what: str) -> None:
        self._blocked = False
        # The wait was ours: the client's time for its next command starts with our answer,
        # and the envelope's clock did not run meanwhile.
        self._last_bytes = self._last_progress = now = self._loop.time()
        if self._envelope_deadline is not None:
            self._envelope_deadline += now - self._blocked_at
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
        self._trust_lost = None  # no transaction is open: this one is judged by what holds now
        if self._revoked is not None:
            self._close_with(replies.credentials_revoked(self._revoked), "MAIL", sender=event.sender)
            return
        if event.size:
            # RFC 1870 6.1: a declared size under the maximum (larger ones got 552 5.3.4 from
            # the parser) that this worker's spool shard cannot store now gets 452 at once,
            # rather than a 452 after the client has sent it all.
            room = self._listener.intake.spool.room()
            if 0 <= room < event.size:
                self._respond(replies.no_room_now(event.size), "MAIL", sender=event.sender)
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
                self._wait(verdict, lambda done: self._decided(_verdict(done), "MAIL", given=event.sender))
                return
            if verdict is not None:
                self._decided(verdict, "MAIL", given=event.sender)
                return
        self._session.accept()

    def _decided(
        self, verdict: Refuse | HookFailed | None, command: str, recipient: Recipient | None = None, given: str = ""
    ) -> None:
        """Answer MAIL or RCPT as the policy decided: a RCPT taken adds `recipient`, a MAIL or
        RCPT refused is logged with the address as the client `given` it."""
        reply = self._policy_reply(verdict, command)
        if reply is not None:
            if command == "MAIL":
                self._respond(reply, command, sender=given)
            else:
                self._respond(reply, command, recipient=given)
            return
        if recipient is not None:
            self._recipients.append(recipient)
        self._session.accept()

    def _on_rcpt(self, event: RcptTo) -> None:
        if self._revoked is not None:  # (in a transaction begun before the reload)
            self._close_with(replies.credentials_revoked(self._revoked), "RCPT", recipient=event.recipient)
            return
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
        if (reserved := self._reserved_refusal(recipient)) is not None:
            self._respond(reserved, "RCPT", recipient=event.recipient)
            return
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
                    self._accepted(),
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

    def _accepted(self) -> tuple[str, ...]:
        """The recipients taken so far, as `on_rcpt_to` is told them: each mailbox once, as
        it was first written (found from outside: a client's RCPT TO:<b@d.test> twice, then
        <b@D.TEST>, were told as three, where on_message and HTTP have one; the intake's
        duplicate filter delivers it once, by the same key). Worked out once a recipient:
        a reset starts a new list, and so a new count."""
        recipients = self._recipients
        taken = self._taken
        if taken is None or taken.of is not recipients:
            taken = self._taken = _Taken(recipients)
        for recipient in recipients[taken.count :]:
            key = same_mailbox_key(recipient.address)  # (a postmaster is `[smtp] postmaster` by now)
            if key not in taken.keys:
                taken.keys.add(key)
                taken.addresses.append(recipient.address)
        taken.count = len(recipients)
        return tuple(taken.addresses)

    def _reserved_refusal(self, recipient: Recipient) -> Reply | None:
        """550 5.7.1 for a recipient whose domain's `[[route]]` is reserved for other tenants
        than any the AUTH user's mail can be of (`[[route]] tenants`): its binding's one tenant,
        or, bound to several (or none), one of them or none. An unbound client's mail names its
        tenant in its header section: the intake judges it at the end of DATA. The postmaster
        and an `[[inbound]]` route's recipients go by no `[[route]]`."""
        intake = self._listener.intake
        reserved = intake.route_tenants
        if not reserved.any:
            return None
        bound = self._binding(self._session.authenticated)
        if bound is None or recipient.address == self._listener.postmaster:
            return None
        routes = intake.inbound_routes
        if routes is not None and routes.target(recipient.address) is not None:
            return None
        possible: frozenset[str | None] = frozenset(bound) if len(bound) == 1 else frozenset({*bound, None})
        return reserved.refusal(recipient.domain, possible)

    def _is_postmaster(self, address: str) -> bool:
        """<postmaster> (the parser lower-cases it without a domain), or postmaster at our own
        hostname, in any case."""
        return is_postmaster(address, self._listener.session_config.hostname)

    def _on_data(self, event: Data) -> None:
        if self._trust_lost is not None:
            self._respond(self._trust_lost, "DATA")
            return
        self._session.accept()
        self._draft = self._new_draft()

    def _on_chunk(self, event: DataChunk) -> None:
        if self._draft is None:
            self._draft = self._new_draft()
        self._draft.write(event.data)

    def _on_message_end(self, event: MessageEnd) -> None:
        if self._trust_lost is not None:
            # Begun under an authorization withdrawn since: a temporary refusal, so the client
            # keeps the message and sends it again under what holds now. (A message whose end
            # came before the reload is being stored, and gets its 250.)
            if self._draft is not None:
                self._draft.discard()
                self._draft = None
            self._respond(self._trust_lost, "BDAT" if event.chunked else "DATA")
            self._recipients = []
            return
        draft = self._draft or self._new_draft()
        self._draft = None
        # (`_wait`, with the 250 sent from the callback that completes the commit: commit's `then`)
        self._blocked = True
        self._blocked_at = self._loop.time()
        self._flush()
        verb = "BDAT" if event.chunked else "DATA"
        # The draft asks `_present` before it stores the message (a client that hung up while a
        # hook or the signing ran is not answered: it will send the message again) and once the
        # commit ends (one that went meanwhile has its message kept, its 250 not given).
        draft.commit(then=lambda stored: self._committed(stored, draft.id, verb), present=self._present)

    def _present(self) -> bool:
        """Whether the client can still be answered: the connection not closed, by us, by a
        write that failed (it is gone) or over TLS by its EOF (a half-close over plain TCP
        leaves it open: see `eof_received`)."""
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
                _spool_refusals.say(self.id, error)
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

    async def _start_tls(self) -> bool:
        """Whether the handshake succeeded; a failure is logged here, naming the client and
        which side gave up (a failed handshake closes the connection, so `_tls_done` is not
        called for it: see `_resume`)."""
        transport = self._transport
        context = self._listener.tls_context
        assert transport is not None and context is not None
        # From here on the transport hands its bytes to the TLS layer, so whatever reaches
        # data_received() is decrypted. Plaintext that came before was dropped by the session.
        self._tls_early = bytearray()
        # The handshake is the rest of the STARTTLS command: it gets `command_timeout`, the
        # documented bound, not asyncio's own (60 s, given here only as a backstop).
        limit = self._listener.command_timeout
        new: asyncio.Transport | None = None
        try:
            async with asyncio.timeout(limit):
                new = await self._loop.start_tls(
                    transport, self, context, server_side=True, ssl_handshake_timeout=limit + 1.0
                )
        except TimeoutError:
            why = f"TLS handshake failed: not done within {limit:g}s ([smtp] command_timeout)"
        except ssl.SSLEOFError as error:
            why = f"TLS handshake failed: the client closed the connection ({error})"
        except ssl.SSLError as error:
            # An alert is the client's refusal (our certificate, say); any other error is ours
            # (a protocol version or cipher we do not take, bytes that are no TLS).
            if "ALERT" in (error.reason or ""):
                why = f"TLS handshake failed: the client refused it ({error})"
            else:
                why = f"TLS handshake refused: {error}"
        except OSError as error:
            why = f"TLS handshake failed: the client closed the connection ({error.strerror or type(error).__name__})"
        else:
            why = "TLS handshake failed: the client closed the connection"
        if new is None:
            _log.info("session %s from %s: %s", self.id, self.peer, why)
            return False
        self._transport = new
        self._tls = describe(new.get_extra_info("ssl_object"))
        return True

    def _tls_done(self, future: asyncio.Future[Any]) -> None:
        error = future.exception()
        if error is not None:
            _log.info("session %s from %s: TLS handshake failed: %s", self.id, self.peer, error)
        if error is not None or not future.result():
            self.abort()
            return
        self._session.tls_established()
        self._revoked = None  # the session starts over, unauthenticated, and knows it
        early, self._tls_early = self._tls_early, None
        if early:
            self._session.receive_data(bytes(early))

    def _on_auth(self, event: AuthCredentials, deadline: float | None = None) -> None:
        """`deadline`: set when this AUTH has been waiting for checks in progress (loop time)."""
        listener = self._listener
        passwords = listener.passwords
        if passwords is None:
            self._respond(replies.AUTH_FAILED, "AUTH")
            return
        throttle = listener.auth_throttle
        username = event.username
        if throttle is not None:
            now = self._loop.time()
            verdict = throttle.begin(self.peer_ip, username, now)
            if isinstance(verdict, InFlight):
                # Checks in progress could take the rest of the allowance: wait until one has
                # been counted rather than refuse a password that may well be right (parallel
                # logins of one client). Nothing is held meanwhile, so a client that leaves
                # costs nothing.
                if deadline is None:
                    deadline = now + listener.auth_wait
                if now >= deadline:
                    self._respond(replies.AUTH_BUSY, "AUTH")
                    return
                turn = listener.auth_turns.turn(min(deadline, now + _AUTH_LOOK_AGAIN))
                self._wait(turn, lambda _: self._on_auth(event, deadline))
                return
            if verdict is not None:
                # Refused before the check: a guesser learns nothing and costs us no hashing.
                self._respond(replies.AUTH_LOCKED_OUT, "AUTH")
                return
        entry = passwords.entry(username)
        try:
            check = listener.password_checker.check(passwords, username, event.password)
        except CheckerBusy:
            if throttle is not None:
                throttle.abandoned(self.peer_ip, username)
                listener.auth_turns.counted()
            self._respond(replies.AUTH_BUSY, "AUTH")
            return
        # Counted when the check ends, whether or not the client is still there to hear it:
        # a guesser that hangs up after AUTH is counted all the same.
        check.add_done_callback(lambda future: self._count_auth(future, username))
        self._wait(check, lambda done: self._auth_checked(done, username, entry))

    @staticmethod
    def _passed(future: asyncio.Future[Any]) -> bool:
        return not future.cancelled() and future.exception() is None and bool(future.result())

    def _count_auth(self, future: asyncio.Future[Any], username: str) -> None:
        throttle = self._listener.auth_throttle
        if throttle is None:
            return
        if self._passed(future):
            throttle.succeeded(self.peer_ip, username, self._loop.time())
        else:
            for lockout in throttle.failed(self.peer_ip, username, self._loop.time()):
                self._log_lockout(lockout, username)
        self._listener.auth_turns.counted()

    def _auth_checked(self, future: asyncio.Future[Any], username: str, entry: str | None) -> None:
        """`entry`: the user's in the users file the password was checked against."""
        if self._passed(future):
            passwords = self._listener.passwords
            if passwords is None or passwords.entry(username) != entry:
                # A reload removed the user, or changed its password, while the check ran.
                _log.warning("session %s: AUTH as %r refused: the user's credentials were revoked by a reload "
                             "during the check", self.id, username)  # fmt: skip
                self._respond(replies.AUTH_FAILED, "AUTH")
                return
            self._auth_entry = entry
            self._revoked = None
            self._auth_binding = passwords.binding(username)  # (the file's now: the entry is the same)
            self._session.accept()
            return
        self._respond(replies.AUTH_FAILED, "AUTH")

    def judge_again(self) -> None:
        """A reload brought other SMTP users or `relay_networks`: what this session may do is
        judged by them from now on. Authenticated as a user removed, or given another password,
        it is unauthenticated: its next MAIL or RCPT gets `421 4.7.0` and the connection closes
        (temporary: a client on a cached connection comes back on a new one and authenticates
        with what it holds now, rather than bounce its mail), unless it relays from
        `relay_networks` anyway.
        From an address no longer in `relay_networks`, it is an outsider. Either way, a
        transaction it has open, begun under what was withdrawn, is refused at DATA or at its
        end with `451 4.7.0` (the client keeps the message); a message whose end came before
        is stored and answered as ever."""
        if self._closed:
            return
        listener = self._listener
        session = self._session
        user = session.authenticated
        relay = listener.relay_allowed(self.peer_ip)
        if user is not None:
            passwords = listener.passwords
            entry = passwords.entry(user) if passwords is not None else None
            if entry is None or entry != self._auth_entry:
                session.revoke_authentication()
                self._auth_entry = None
                self._arrival = None
                how = "removed" if entry is None else "changed"
                if relay and self._relay:
                    # It needs no AUTH to relay: it goes on as the relay_networks client it is.
                    _log.warning("session %s: authenticated as %r, whose credentials the reload %s: it goes on "
                                 "unauthenticated, from relay_networks", self.id, user, how)  # fmt: skip
                else:
                    self._revoked = user
                    shown_user = user.encode("ascii", "backslashreplace").decode("ascii")
                    self._trust_lost = replies.authorization_lost(f"the credentials of {shown_user} were revoked")
                    _log.warning(
                        "session %s: authenticated as %r, whose credentials the reload %s: its next MAIL or RCPT "
                        "is answered 421 4.7.0 and the connection closed, to authenticate again on a new one%s",
                        self.id,
                        user,
                        how,
                        ", and its open transaction is refused at its end (451 4.7.0)"
                        if session.mail is not None
                        else "",
                    )
        if relay == self._relay:
            return
        self._relay = relay
        self._arrival = None  # (it says whether the mail is trusted)
        if relay:
            return
        # An outsider now: its RCPTs to other domains get 550 5.7.1, as on a new connection.
        trusted_still = session.authenticated is not None
        if not trusted_still and self._trust_lost is None:
            self._trust_lost = replies.authorization_lost("this client's permission to relay was withdrawn")
        _log.warning(
            "session %s: client %s is no longer in [smtp] relay_networks after the reload: it relays no more%s",
            self.id,
            self.peer_ip,
            ", and its open transaction is refused at its end (451 4.7.0)"
            if session.mail is not None and not trusted_still
            else "",
        )

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
        tenants = self._binding(session.authenticated)
        if (
            arrival is None
            or arrival.helo != envelope.helo
            or arrival.protocol != envelope.protocol
            or arrival.auth_user != session.authenticated
            or arrival.tenants != tenants
        ):
            # Built once per connection and kept while HELO, TLS, AUTH and the user's tenants stay the same.
            arrival = self._arrival = Arrival(
                listener="smtp",
                session=self.id,
                peer=self.peer,
                peer_ip=self.peer_ip,
                helo=envelope.helo,
                protocol=envelope.protocol,
                tls=self._tls,
                auth_user=session.authenticated,
                # (else its recipients are all the postmaster's or [[inbound]] routes': _on_rcpt)
                trusted=self._relay or session.authenticated is not None,
                tenants=tenants,
            )
        return self._listener.intake.draft(envelope, arrival)

    def _binding(self, user: str | None) -> frozenset[str] | None:
        """The tenants the AUTH user may send as (None: any), as the users file read last says
        (a SIGHUP's change holds from the next message on); as at its AUTH for a user no longer
        in it (`judge_again` revokes such a session: this is the binding it must never lose)."""
        if user is None:
            return None
        passwords = self._listener.passwords
        if passwords is not None and user in passwords:
            return passwords.binding(user)
        return self._auth_binding

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
        """`command`: the verb the client gave, as it gave it (escaped here, as `recipient` is;
        "": the reply answered no command, a timeout say, and the record names none); the
        metrics name it only as `_counted_as` says.
        `recipient`: the address a refused RCPT gave, as the client sent it (escaped here).
        A message refused whole (DATA, BDAT: by the policy's on_message, the content checks,
        the spool) names the sender and recipients it was for: the record is all an operator
        has to find whose mail was turned away, since nothing is stored under its id.
        `sender`: the transaction's (None: no transaction was open)."""
        session = self._session
        recipients = [shown(recipient)] if recipient is not None else None
        if recipient is None and command in ("DATA", "BDAT") and self._recipients:
            recipients = [shown(r.address) for r in self._recipients]
        # (A verb that is not UTF-8 holds surrogate escapes, which JSON could not carry: escaped,
        # it is printable and names the bytes it was.)
        verb = shown(command)
        self._listener.intake.metrics.rejections.labels(self._counted_as(verb), str(reply.code)).inc()
        self._listener.intake.log.write(
            Rejection(
                timestamp=time.time(),
                session=self.id,
                peer=self.peer,
                command=verb or None,
                # A refusal before the banner is the greeting, sent without its enhanced code.
                response=Response.of(reply, enhanced=session.greeted),
                helo=session.helo,
                sender=shown(sender) if sender is not None else None,  # a refused MAIL's: as given
                recipients=recipients,
                tls=self._tls,
                auth_user=session.authenticated,
                id=message_id,
            )
        )

    def _counted_as(self, verb: str) -> str:
        """The `command` label of `pigeon_rejections_total` for a rejection of `verb` (escaped):
        a verb Pigeon knows, CONNECT for a greeting refused, "-" for no command, and "other"
        for anything else. Each value is a series the worker keeps and /metrics shows for good,
        so a client's made-up verbs (and text of its choosing) must not become values of their
        own; its Rejection record names what it sent."""
        if verb in VERBS:
            return verb
        if verb == "CONNECT" and not self._session.greeted:
            return verb  # (a client's "CONNECT host:443", an HTTP proxy probe, is "other")
        return "other" if verb else "-"

    def close_when_idle(self) -> None:
        """Shutdown: close now if no transaction is open, else right after it ends."""
        self._close_when_idle = True
        if not self._blocked and self._session.phase in (Phase.GREETED, Phase.READY, Phase.AUTH, Phase.CLOSED):
            self._say_goodbye()

    def shut_down(self) -> None:
        """Shutdown, and the transaction did not end in time: `421 4.3.2` now, whatever the
        session is doing (a message's content half received is dropped, never accepted), and
        close. In the TLS handshake it cannot be said (see `evict`): closed all the same."""
        if self._closed or self._transport is None:
            return
        if self._session.phase is Phase.TLS:
            self._closed = True
            self.abort()
            return
        phase = self._session.phase
        command = "DATA" if phase is Phase.DATA else "BDAT" if phase is Phase.BDAT else ""
        self._close_with(replies.shutting_down(self._listener.session_config.hostname), command)

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

    def outsider_envelope_since(self) -> float | None:
        """When the envelope of this outsider's open transaction began (our decisions' time left
        out), if it may make room for a newcomer: not in `relay_networks`, not authenticated, and
        nothing being decided for it. None otherwise."""
        deadline = self._envelope_deadline
        if deadline is None or self._closed or self._blocked or self._relay or self._session.authenticated is not None:
            return None
        return deadline - self._listener.envelope_timeout

    def evict(self, reply: Reply) -> None:
        """Close with `reply` (a 421) to make room for a newcomer (see `SmtpListener.admit`)."""
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

    def _close_with(
        self, reply: Reply, command: str = "", *, sender: str | None = None, recipient: str | None = None
    ) -> None:
        """Say `reply` (logged as a rejection of `command`, of `sender` or the open transaction's
        and of `recipient`) after whatever is queued, and close."""
        self._log_rejection(
            command, reply, sender=self._open_sender() if sender is None else sender, recipient=recipient
        )
        self._flush()
        if self._transport is not None:
            self._transport.write(reply.encode(enhanced=self._session.greeted))
            self._transport.close()
        self._closed = True

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # --- timeouts ------------------------------------------------------------------------
    # Four clocks. `idle_timeout`: no bytes at all for that long. `command_timeout`: one
    # command line, from our last answer (or the previous command) to its CRLF, so a line
    # dribbled a byte at a time ends, while NOOPs answered at once do not (the session limits
    # those by number: `max_junk_commands`). A message's content (DATA's up to the final dot,
    # or a BDAT sequence up to the end of its LAST chunk) has a deadline of its own:
    # `command_timeout` from its start, pushed back by 1/`min_data_rate` seconds for every byte
    # that arrives, but never past `command_timeout` from now (Postfix's smtpd_min_data_rate).
    # A sender at least that fast never meets it, however large its message; a trickle of a
    # line or a byte a second (or of one-byte chunks) meets it about `command_timeout` after
    # the content began. A transaction's envelope (from MAIL accepted to DATA's 354, the first
    # BDAT, or RSET) has `envelope_timeout` in all, our own decisions' time (policy hooks) left
    # out: RCPTs dripped each within `command_timeout` would otherwise hold the connection for
    # `2 x max_recipients + max_junk_commands` command timeouts (a week, on the defaults).

    def _data_received(self, size: int, now: float) -> None:
        listener = self._listener
        deadline = self._data_deadline
        assert deadline is not None
        if listener.min_data_rate > 0:
            deadline += size / listener.min_data_rate
        self._data_deadline = min(deadline, now + listener.command_timeout)

    def _envelope_changed(self, in_envelope: bool) -> None:
        # Only an outsider's envelope is bounded: a trusted client that does not pipeline (Python's
        # smtplib) takes a round trip a recipient, 150 s for 1,000 across an ocean, and holds a
        # slot no stranger can take from it.
        if not in_envelope or self._relay or self._session.authenticated is not None:
            self._envelope_deadline = None
            return
        self._envelope_deadline = deadline = self._loop.time() + self._listener.envelope_timeout
        timer = self._timer
        if timer is not None and timer.when() > deadline:
            timer.cancel()
            self._arm_timer()

    def _arm_timer(self) -> None:
        listener = self._listener
        deadline = self._data_deadline
        if deadline is None:
            deadline = self._last_progress + listener.command_timeout
        if self._envelope_deadline is not None:
            deadline = min(deadline, self._envelope_deadline)
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
        elif self._envelope_deadline is not None and now >= self._envelope_deadline:
            self._close_with(replies.envelope_timeout(listener.session_config.hostname, listener.envelope_timeout))
            return
        elif now - self._last_bytes >= listener.idle_timeout or (
            self._data_deadline is None and now - self._last_progress >= listener.command_timeout
        ):
            self._close_with(replies.timeout(listener.session_config.hostname))
            return
        self._arm_timer()


def _bytes_waiting(transport: asyncio.Transport) -> bool:
    """Whether the client has sent something already (peeked at: left for the session to read)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    # The transport's socket is a wrapper that cannot peek: a socket object on the same
    # descriptor can, and is detached before it could close it.
    try:
        peek = socket.socket(sock.family, sock.type, sock.proto, sock.fileno())
    except OSError:
        return False
    try:
        return bool(peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # nothing there (EAGAIN), or the connection is gone already
        return False
    finally:
        peek.detach()


class _Taken:
    """A transaction's recipients as `on_rcpt_to` is told them (`SmtpConnection._accepted`)."""

    __slots__ = ("addresses", "count", "keys", "of")

    def __init__(self, of: list[Recipient]) -> None:
        self.of = of  # the list they are of
        self.count = 0  # how many of it are counted
        self.addresses: list[str] = []
        self.keys: set[str] = set()


def _verdict(future: asyncio.Future[Refuse | HookFailed | None]) -> Refuse | HookFailed | None:
    """A hook's answer; a call cancelled (the loop is closing) counts as failed, and so does
    one that ended in an error (the hook's own failures are verdicts: this is a bug of ours,
    which must not leave the client unanswered)."""
    if future.cancelled():
        return HookFailed(POLICY_ERROR)
    if (error := future.exception()) is not None:
        _log.error("a policy hook's call failed unexpectedly: %s", error, exc_info=error)
        return HookFailed(POLICY_ERROR)
    return future.result()


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
