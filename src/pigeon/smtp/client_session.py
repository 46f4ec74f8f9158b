"""The SMTP client session, sans-IO: one connection from the banner to QUIT.

Three verbs, as in h11 and `pigeon.smtp.server`:

    session.receive_data(data)                   # b"" means the server closed its side
    event = session.next_event()                 # an Event, or NEED_DATA
    transport.write(session.send(Deliver(env)))  # or Quit(): every byte due now
    transport.write(session.data_to_send())      # what the session said by itself

Between the application's commands the session speaks for itself: EHLO after a 220 banner,
HELO when EHLO is refused (not when it is answered 421: the server is closing), STARTTLS
when the TLS policy wants it and the server offers it, EHLO again once TLS is up, AUTH when
the route authenticates (`pigeon.smtp.client_auth`: once per connection, after the EHLO on
TLS, before the first transaction, never pipelined), the next command of a lock-step
transaction, the content after 354. The application writes what it
is given, upgrades the transport on `StartTls` (then calls `tls_established()` or
`tls_failed()`), sends a message on `Ready` or `TransactionDone`, and closes the connection
on `Unusable` or `Closed`.

The whole order of a session is `_NEXT` below: for each phase, what may happen and the phase
it leads to. A phase waits for the reply to one command (`_EXPECTS` gives the code that lets
the session go on); `GREETED` waits for nothing, it is where the TLS policy decides. A mail
transaction is a `pigeon.smtp.client.Transaction`, which owns its own order (pipelined or
lock-step, DATA or BDAT); a transaction that left the server holding an unfinished one has
the next transaction begin with RSET, in the same write.

Errors say who is to blame. `ClientProtocolError` (from `next_event()`): the server's bytes
are not SMTP, answer no command, or follow its 220 to STARTTLS in plaintext (RFC 3207 4.2:
an injection). `SmtpUsageError` (from `send()`, `tls_established()`, `tls_failed()`): Pigeon
asked for something out of order, which is a bug in Pigeon. After either, the session is
closed. A server that legitimately turns us away (a 554 banner, EHLO and HELO refused, a 421
before the session is ready, no TLS where TLS is required, AUTH refused or not to be had) is
not an error but an `Unusable` event. When the server's own reply decided, and it is a 4xx,
that reply is what the attempt records (`Unusable.explain`), so the log and the
`[[reaction]]` rules read the server's words.

This module never imports asyncio; `pigeon.delivery.session` is its I/O layer.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Final

from pigeon.smtp.client import Capabilities, ClientProtocolError, Envelope, ReplyReader, Result, Transaction
from pigeon.smtp.client_auth import Credentials, Exchange
from pigeon.smtp.errors import SmtpUsageError
from pigeon.smtp.events import NEED_DATA, _NeedData
from pigeon.smtp.replies import Reply

__all__ = [
    "NEED_DATA",
    "ClientSession",
    "Closed",
    "Deliver",
    "Event",
    "Phase",
    "PlaintextAfterStartTls",
    "Quit",
    "Ready",
    "Reason",
    "StartTls",
    "Step",
    "TlsPolicy",
    "TransactionDone",
    "Unusable",
    "greeting_name_problem",
]


class TlsPolicy(enum.Enum):
    """When to use STARTTLS (RFC 3207). The values are those of `[[route]] tls`."""

    OPPORTUNISTIC = "opportunistic"  # when offered; in the clear if not offered, refused or failing
    REQUIRED = "required"  # STARTTLS or no mail on this connection
    DISABLED = "disabled"  # never
    IMPLICIT = "implicit"  # on TLS from the first byte (RFC 8314, port 465): the I/O layer's handshake, no STARTTLS


# --- what the application tells the session ---------------------------------------------------
@dataclass(frozen=True, slots=True)
class Deliver:
    """Send one message: MAIL, RCPT for each recipient, then its content."""

    envelope: Envelope


@dataclass(frozen=True, slots=True)
class Quit:
    """Say goodbye (QUIT); the session closes on the reply."""


# --- what the session tells the application ---------------------------------------------------
@dataclass(frozen=True, slots=True)
class StartTls:
    """The server said 220 to STARTTLS: upgrade the transport now, then call
    `tls_established()`, or `tls_failed()` if the handshake did not complete."""


@dataclass(frozen=True, slots=True)
class Ready:
    """Greeted, on TLS if the policy asked for it and it worked: messages may go now.

    `capabilities` is what the last EHLO offered (`Capabilities.helo_only()` after HELO).
    """

    capabilities: Capabilities
    tls: bool


@dataclass(frozen=True, slots=True)
class TransactionDone:
    """Every reply of the message's transaction arrived; the session is ready for the next."""

    result: Result


class PlaintextAfterStartTls(ClientProtocolError):
    """The server's 220 to STARTTLS came with more after it, before the TLS handshake (RFC 3207
    4.2): plaintext that whoever is on the path could have put there to be read as if it came
    over TLS (a reply injection, CVE-2011-0411). A broken protocol, and, where TLS is required,
    a failure of the host's TLS (`Reason.TLS_INJECTED`)."""


class Reason(enum.Enum):
    """Why a server cannot be used on this connection."""

    BANNER = "banner"  # it greeted with something other than 220
    GREETING = "greeting"  # it refused EHLO, then HELO
    CLOSING = "closing"  # it answered EHLO, HELO or STARTTLS with 421: it is closing (RFC 5321 3.8)
    TLS_NOT_OFFERED = "tls-not-offered"  # TLS is required and STARTTLS is not in its EHLO reply
    TLS_REFUSED = "tls-refused"  # TLS is required and it refused STARTTLS
    TLS_FAILED = "tls-failed"  # it accepted STARTTLS but the handshake failed
    # Plaintext followed its 220 to STARTTLS, before the handshake (RFC 3207 4.2; CVE-2011-0411).
    # The session raises `PlaintextAfterStartTls` for it (a broken protocol); the I/O layer
    # says it with this reason, so that a policy requiring TLS counts it as the host's TLS failure.
    TLS_INJECTED = "tls-injected"
    AUTH_FAILED = "auth-failed"  # it refused our AUTH (535 bad credentials, 454, 504 ...)
    AUTH_NOT_OFFERED = "auth-not-offered"  # the route authenticates, and AUTH is not in its EHLO reply
    AUTH_NO_MECHANISM = "auth-no-mechanism"  # it offers AUTH, but none of the route's mechanisms
    AUTH_NEEDS_TLS = "auth-needs-tls"  # the route authenticates, and the connection is not on TLS


# How each reason reads in a log record: the enhanced code, and the text ({peer} is the server,
# {detail} the command a CLOSING answered, or the AUTH mechanism; {user} who the route
# authenticates as).
AUTH_NEEDS_TLS_CODE: Final = "4.7.11"
"""The enhanced code of AUTH not attempted for want of TLS (RFC 4954 6: encryption required):
how the dispatcher tells a TLS problem from a refused password in what it logs."""

_EXPLAIN: Final[dict[Reason, tuple[str, str]]] = {
    Reason.BANNER: ("4.4.1", "{peer} greeted with: {reply}"),
    Reason.GREETING: ("4.4.1", "{peer} refused EHLO and HELO: {reply}"),
    Reason.CLOSING: ("4.4.1", "{peer} answered {detail} with: {reply}"),
    # RFC 3463 3.8: X.7.4 "security features not supported" where the server has no TLS to
    # give, X.7.5 "cryptographic failure" where it tried and the handshake failed.
    Reason.TLS_NOT_OFFERED: ("4.7.4", "TLS required, but {peer} does not offer STARTTLS"),
    Reason.TLS_REFUSED: ("4.7.4", "TLS required, {peer} refused STARTTLS: {reply}"),
    Reason.TLS_FAILED: ("4.7.5", "TLS handshake with {peer} failed: {detail}"),
    Reason.TLS_INJECTED: ("4.5.0", "{peer} broke the protocol: {detail}"),  # (as any broken protocol is said)
    # Authentication is the operator's business, never the recipients': whatever the server's
    # code (535 5.7.8 bad credentials), the attempt's reply is a 4xx, so no mail bounces for a
    # wrong password, and it says what Pigeon was doing. (AUTH_FAILED's enhanced code is the
    # server's, made transient: `Unusable.explain`.) RFC 4954 6: X.7.11 "encryption required".
    Reason.AUTH_FAILED: ("4.7.0", "authentication as {user} failed: {peer} answered AUTH {detail} with: {reply}"),
    Reason.AUTH_NOT_OFFERED: ("4.7.0", "authentication as {user} failed: {peer} does not offer AUTH"),
    Reason.AUTH_NO_MECHANISM: ("4.7.0", "authentication as {user} failed: {peer} {detail}"),
    # An opportunistic route whose TLS was not to be had ({detail}: STARTTLS not offered, or
    # refused). Not the password's fault, and `allow_plaintext_auth` is no cure (refused at load
    # but with tls = "disabled"): the server's TLS is, or implicit TLS on a port that starts with it.
    Reason.AUTH_NEEDS_TLS: (
        AUTH_NEEDS_TLS_CODE,
        "authentication as {user} not attempted: {peer} {detail}, and a route that authenticates sends its "
        'password only over TLS: fix the server\'s STARTTLS, or give the route tls = "implicit" if its port '
        "starts with TLS (465)",
    ),
}
_WITH_REPLY: Final = frozenset({Reason.BANNER, Reason.GREETING, Reason.CLOSING, Reason.TLS_REFUSED, Reason.AUTH_FAILED})
_AUTH_REASONS: Final = frozenset(
    {Reason.AUTH_FAILED, Reason.AUTH_NOT_OFFERED, Reason.AUTH_NO_MECHANISM, Reason.AUTH_NEEDS_TLS}
)

# Where the server's reply alone turned us away, a 4xx of its own is the attempt's reply, with
# where it came from after its text: the reactions and the log then read "421 4.7.0 ..." as the
# server sent it. (A 5xx stays in a 451: a host that will not talk says nothing of the message,
# and the next host, or a later try, may take it. Under a TLS policy the verdict is Pigeon's.)
_OWN_WORDS: Final[dict[Reason, str]] = {
    Reason.BANNER: "greeting of {peer}",
    Reason.GREETING: "answer of {peer} to HELO, EHLO refused",
    Reason.CLOSING: "answer of {peer} to {detail}",
}


@dataclass(frozen=True, slots=True)
class Unusable:
    """The server turned us away, or cannot be used under the TLS policy: close the connection.

    `reply` is the server's reply that decided it (for BANNER, GREETING, CLOSING,
    TLS_REFUSED and AUTH_FAILED); `detail` what the TLS handshake said (TLS_FAILED), the
    command that a CLOSING answered ("EHLO", "HELO", "STARTTLS", "AUTH"), the mechanism an
    AUTH_FAILED used, or what the server offers (AUTH_NO_MECHANISM). `user`: who the route
    authenticates as (the AUTH reasons; never a password). `retry_in_clear` says that a new
    connection without TLS may work (a failed handshake under opportunistic TLS).
    """

    reason: Reason
    reply: Reply | None = None
    detail: str = ""
    retry_in_clear: bool = False
    user: str = ""

    def __post_init__(self) -> None:
        if (self.reply is not None) != (self.reason in _WITH_REPLY):
            raise ValueError(f"{self.reason.name} {'needs' if self.reply is None else 'takes no'} server reply")
        if self.retry_in_clear and self.reason is not Reason.TLS_FAILED:
            raise ValueError("only a failed TLS handshake may be retried in the clear")
        if bool(self.user) != (self.reason in _AUTH_REASONS):
            raise ValueError(f"{self.reason.name} {'takes no' if self.user else 'needs the'} user")

    @property
    def authentication(self) -> bool:
        """Whether authentication is what failed (the route's credentials, or a server without
        what they need): the operator's business, which a WARNING names."""
        return self.reason in _AUTH_REASONS

    @property
    def said_by_server(self) -> bool:
        """Whether `explain` gives the server's own reply (a 4xx that alone turned us away),
        not Pigeon's words about it."""
        reply = self.reply
        return self.reason in _OWN_WORDS and reply is not None and reply.is_transient

    def explain(self, peer: str) -> Reply:
        """The transient reply a delivery attempt records: the server's own 4xx when it alone
        decided (`421 4.7.0 Try again later, closing connection. (greeting of mx [192.0.2.1]:25)`),
        else Pigeon's (`451 4.7.4 TLS required, ...`)."""
        reply = self.reply
        own = _OWN_WORDS.get(self.reason)
        if own is not None and reply is not None and reply.is_transient:
            note = own.format(peer=peer, detail=self.detail)
            return Reply(reply.code, reply.enhanced, (*reply.lines[:-1], f"{reply.lines[-1]} ({note})"))
        enhanced, text = _EXPLAIN[self.reason]
        if self.reason is Reason.AUTH_FAILED and reply is not None and reply.enhanced is not None:
            enhanced = "4" + reply.enhanced[1:]  # 535 5.7.8 -> 4.7.8: the server's class of trouble, transient
        return Reply(451, enhanced, (text.format(peer=peer, reply=reply, detail=self.detail, user=self.user),))


@dataclass(frozen=True, slots=True)
class Closed:
    """The conversation is over: close the connection.

    `reply` is the server's last word: its answer to QUIT, a 421 it sent while idle (RFC 5321
    3.8), or a 421 that ended a transaction (right after its `TransactionDone`, whose
    recipients without an answer of their own got it). None when it closed without one, or
    when the session ended it: after a transaction whose BDAT the server did not understand
    (`Result.bdat_not_understood`), QUIT is written and no reply awaited.
    """

    reply: Reply | None


Event = StartTls | Ready | TransactionDone | Unusable | Closed


# --- the order of a session -------------------------------------------------------------------
class Phase(enum.Enum):
    BANNER = "banner"  # connected: waiting for the server's greeting
    EHLO = "ehlo"  # EHLO sent
    HELO = "helo"  # HELO sent, EHLO having been refused
    GREETED = "greeted"  # EHLO or HELO accepted: the TLS policy decides (no I/O, never seen outside)
    STARTTLS = "starttls"  # STARTTLS sent
    HANDSHAKE = "handshake"  # 220 to STARTTLS: the I/O layer negotiates TLS
    AUTH = "auth"  # AUTH sent: 334 challenges answered until 235 (or a refusal)
    READY = "ready"  # idle: a message may go
    MAIL = "mail"  # a transaction is under way
    QUIT = "quit"  # QUIT sent
    CLOSED = "closed"

    __hash__ = object.__hash__  # identity hash, in C (see pigeon.smtp.server.Phase)


class Step(enum.Enum):
    """What moves a session on."""

    ACCEPTED = "accepted"  # the server answered the phase's command with the code in _EXPECTS
    REFUSED = "refused"  # it answered with another
    CLOSING = "closing"  # it answered 421 before the session was ready: it is going away
    STARTTLS = "starttls"  # the policy wants TLS and the server offers it
    CLEAR = "clear"  # go on without TLS (not wanted, already up, or opportunistic and unavailable)
    NO_TLS = "no-tls"  # TLS is required and unavailable
    AUTH = "auth"  # the TLS policy is satisfied, and the route authenticates: AUTH now
    NO_AUTH = "no-auth"  # the route authenticates, and it cannot be done here (no TLS, nothing offered)
    TLS_UP = "tls-up"  # tls_established()
    TLS_FAILED = "tls-failed"  # tls_failed()
    MAIL = "mail"  # send(Deliver(...))
    DONE = "done"  # the transaction's last reply arrived
    QUIT = "quit"  # send(Quit())

    __hash__ = object.__hash__


_NEXT: Final[dict[Phase, dict[Step, Phase]]] = {
    Phase.BANNER: {Step.ACCEPTED: Phase.EHLO, Step.REFUSED: Phase.CLOSED},
    Phase.EHLO: {Step.ACCEPTED: Phase.GREETED, Step.REFUSED: Phase.HELO, Step.CLOSING: Phase.CLOSED},
    Phase.HELO: {Step.ACCEPTED: Phase.GREETED, Step.REFUSED: Phase.CLOSED, Step.CLOSING: Phase.CLOSED},
    Phase.GREETED: {
        Step.STARTTLS: Phase.STARTTLS,
        Step.CLEAR: Phase.READY,
        Step.NO_TLS: Phase.CLOSED,
        Step.AUTH: Phase.AUTH,
        Step.NO_AUTH: Phase.CLOSED,
    },
    Phase.STARTTLS: {Step.ACCEPTED: Phase.HANDSHAKE, Step.REFUSED: Phase.GREETED, Step.CLOSING: Phase.CLOSED},
    Phase.HANDSHAKE: {Step.TLS_UP: Phase.EHLO, Step.TLS_FAILED: Phase.CLOSED},
    Phase.AUTH: {Step.ACCEPTED: Phase.READY, Step.REFUSED: Phase.CLOSED, Step.CLOSING: Phase.CLOSED},
    Phase.READY: {Step.MAIL: Phase.MAIL, Step.QUIT: Phase.QUIT},
    Phase.MAIL: {Step.DONE: Phase.READY},
    Phase.QUIT: {Step.ACCEPTED: Phase.CLOSED, Step.REFUSED: Phase.CLOSED},
}
"""Any time: the server closing (b"") moves every phase to CLOSED with `Closed(None)`."""

_EXPECTS: Final[dict[Phase, int]] = {
    Phase.BANNER: 220,  # RFC 5321 4.2.5 / 3.1: 554 (or 421) means "not here"
    Phase.EHLO: 250,  # RFC 5321 4.1.4: refused EHLO, try HELO (but a 421 closes: _OPENING)
    Phase.HELO: 250,
    Phase.STARTTLS: 220,  # RFC 3207 4: 454 or 501 means no TLS on this connection
    Phase.AUTH: 235,  # RFC 4954 4 and 6: 334 asks for more (handled apart), any error ends it
    Phase.QUIT: 221,  # whatever it says, the session ends
}
"""The phases that wait for the reply to one command, and the code that answers it positively."""

# The commands of the opening, whose replies are read strictly:
# * RFC 5321 3.8 / 4.2.2: 421 is the server closing the channel, in answer to any command.
#   Before the session is ready its words are the connection's outcome: no HELO after it, nor a
#   session in the clear that the server has already left.
# * RFC 5321 4.3.2 (RFC 3207 4 for STARTTLS): each has one positive reply (`_EXPECTS`). Another
#   positive one (a 354 to EHLO, a 250 to STARTTLS) is neither a yes nor a no to fall back from
#   (to HELO, to the clear): what the server expects next, TLS or content, is anyone's guess, so
#   it is a broken protocol, and nothing more is said on the connection.
# (Whatever the banner, a host that does not greet with 220 is turned from with QUIT; whatever
# QUIT is answered, the session ends.)
_OPENING: Final = {Phase.EHLO: "EHLO", Phase.HELO: "HELO", Phase.STARTTLS: "STARTTLS", Phase.AUTH: "AUTH"}

_APPLICATION_STEPS: Final = frozenset({Step.MAIL, Step.QUIT, Step.TLS_UP, Step.TLS_FAILED})


def greeting_name_problem(name: str) -> str | None:
    """Why `name` cannot follow EHLO or HELO on the wire (None: it can): it must be one
    non-empty ASCII word, with no white space or control character that would end the
    command early or add another. The configuration applies this same check at load to
    every name Pigeon greets or answers with, so a name this refuses never starts a node."""
    if not name:
        return "is empty"
    if not name.isascii():
        return "holds a character that is not ASCII"
    if any(char.isspace() or not char.isprintable() for char in name):
        return "holds white space or a control character"
    return None


class ClientSession:
    """One SMTP client conversation, from banner to close. Knows nothing of sockets."""

    def __init__(
        self,
        helo_name: str,
        *,
        tls: TlsPolicy = TlsPolicy.OPPORTUNISTIC,
        pipelining: bool = True,
        chunking: bool = True,
        credentials: Credentials | None = None,
    ) -> None:
        if greeting_name_problem(helo_name) is not None:
            raise ValueError(f"not a name to greet with: {helo_name!r}")
        self.helo_name = helo_name
        self.tls_policy = tls
        self.pipelining = pipelining  # used when the server offers PIPELINING
        self.chunking = chunking  # used when the server offers CHUNKING
        self.credentials = credentials  # AUTH once greeted (on TLS, unless they allow the clear)
        self.auth_user: str | None = None  # who the server took us for (235), once it did
        self.phase = Phase.BANNER
        self.capabilities = Capabilities()
        # IMPLICIT: the I/O layer made the connection on TLS before the banner (RFC 8314 3).
        self.tls_active = tls is TlsPolicy.IMPLICIT
        self.transactions = 0  # completed: every reply arrived
        self.needs_reset = False  # the server holds an unfinished transaction: RSET first
        self.replies_received = 0  # a progress counter for the I/O layer's reply timeout
        self._commands = {
            Phase.EHLO: b"EHLO %s\r\n" % helo_name.encode("ascii"),
            Phase.HELO: b"HELO %s\r\n" % helo_name.encode("ascii"),
            Phase.STARTTLS: b"STARTTLS\r\n",
        }
        self._reader = ReplyReader()
        self._received: list[bytes] = []  # fed to the reader by next_event(), which may raise
        self._replies: deque[Reply] = deque()
        self._eof = False
        self._events: deque[Event] = deque()
        self._out: list[bytes] = []
        self._transaction: Transaction | None = None
        self._starttls_refusal: Reply | None = None
        self._exchange: Exchange | None = None
        self._final: Unusable | Closed | None = None
        self._closed_at_end_of_data = False  # it closed with the end of data in doubt (`end_of_data_unanswered`)
        self._cut: Transaction | None = None  # the transaction under way when the server closed (`settled`)
        self._unanswered_at_close: str | None = None  # what `unanswered` said when the session closed

    # --- the three verbs ---------------------------------------------------------------------
    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the server; b"" means it closed its side."""
        if self.phase is Phase.CLOSED:
            return
        if data:
            self._received.append(data)
        else:
            self._eof = True

    def next_event(self) -> Event | _NeedData:
        """The next event, or NEED_DATA. Raises ClientProtocolError if the server broke SMTP.

        Once closed, the session keeps answering with the event that closed it.
        """
        events = self._events
        while not events:
            if self._replies:
                if self.phase is Phase.MAIL:
                    self._transaction_replies()  # the hot path: every reply of a message
                else:
                    self._on_reply(self._replies.popleft())
            elif self._received:
                self._read()
            elif self._eof and self.phase is not Phase.CLOSED:
                self._close(Closed(None))
            elif self._final is not None:
                return self._final
            else:
                return NEED_DATA
        return events.popleft()

    def send(self, command: Deliver | Quit) -> bytes:
        """Start a transaction or say QUIT; returns every byte to write now."""
        if isinstance(command, Deliver):
            self._move(Step.MAIL)
            transaction = self._transaction = Transaction(
                command.envelope,
                self.capabilities,
                pipelining=self.pipelining,
                chunking=self.chunking,
                reset_first=self.needs_reset,
            )
            if not self._out:
                return transaction.start()  # the usual case: nothing else to say
            self._out.append(transaction.start())
        elif isinstance(command, Quit):
            self._move(Step.QUIT)
            self._out.append(b"QUIT\r\n")
        else:
            raise SmtpUsageError(f"cannot send {command!r}")
        return self.data_to_send()

    def data_to_send(self) -> bytes:
        """Everything the session wrote since the last call (b"" if nothing), for one write."""
        out = self._out
        if not out:
            return b""
        data = b"".join(out)  # one element: the very same object, not a copy of the content
        out.clear()
        return data

    # --- TLS, told by the I/O layer ----------------------------------------------------------
    def tls_established(self) -> None:
        """The handshake after `StartTls` succeeded: greet again (RFC 3207 4.2)."""
        self._move(Step.TLS_UP)
        self.tls_active = True
        # RFC 3207 4.2: discard what the server said before TLS, its extensions included.
        self.capabilities = Capabilities()
        self._reader = ReplyReader()
        self._drop_input()  # plaintext that arrived during the handshake: never read it

    def tls_failed(self, detail: str) -> None:
        """The handshake after `StartTls` failed: the connection is unusable (`Unusable`)."""
        # Opportunistic TLS may go on in the clear, but never a route that authenticates: a
        # server (or whoever is on the path) that says 220 to STARTTLS and breaks the handshake
        # would get the password otherwise (STARTTLS stripping).
        retry = self.tls_policy is TlsPolicy.OPPORTUNISTIC and self.credentials is None
        self._move(Step.TLS_FAILED, Unusable(Reason.TLS_FAILED, detail=detail, retry_in_clear=retry))

    # --- questions -----------------------------------------------------------------------------
    def is_ready(self) -> bool:
        """A message may go now."""
        return self.phase is Phase.READY

    def awaits_end_of_data(self) -> bool:
        """The reply the session waits for is the one to the end of a message's content
        (`Transaction.ending`), which the I/O layer gives longer than the others."""
        transaction = self._transaction
        return transaction is not None and transaction.ending

    def end_of_data_unanswered(self) -> bool:
        """The end of a message's content went out, and its reply has not come: it still
        awaits it (a timeout, a reset the I/O layer saw), or the server closed the connection
        first. The server may have taken the message all the same (RFC 5321 6.1: it sends
        the reply once the message is safe), so a try again may deliver it twice. Not when
        the replies before it say the server had nobody to deliver to (`Transaction.end_in_doubt`)."""
        return self._closed_at_end_of_data or self._end_in_doubt()

    def _end_in_doubt(self) -> bool:
        transaction = self._transaction
        return transaction is not None and transaction.end_in_doubt

    def unanswered(self) -> str | None:
        """The command whose reply the session awaits ("EHLO", "MAIL FROM", "RCPT TO", the
        end of data: `Transaction.unanswered`), or awaited when the server closed the
        connection; None when it awaits none, or only the greeting (`phase` is BANNER then).
        What a timeout or a close cut short, for the I/O layer to say (Postfix: "lost
        connection with mx while sending RCPT TO")."""
        if self.phase is Phase.CLOSED:
            return self._unanswered_at_close
        transaction = self._transaction
        if transaction is not None:
            return transaction.unanswered()
        if self.phase is Phase.QUIT:
            return "QUIT"
        return _OPENING.get(self.phase)

    def settled(self) -> list[Reply | None]:
        """Of the transaction under way (the I/O layer gave up waiting: a timeout, a reset), or
        the one the server's close cut short, each recipient's own outcome so far, None where
        it has none (`Transaction.settled`): a recipient the server refused keeps its refusal
        when the connection breaks later. [] when no transaction was cut, or the server broke
        the protocol in it: then nothing it said counts (`Transaction.on_reply`)."""
        transaction = self._transaction if self._transaction is not None else self._cut
        return transaction.settled() if transaction is not None else []

    # --- replies -------------------------------------------------------------------------------
    def _read(self) -> None:
        received, self._received = self._received, []
        reader = self._reader
        replies = self._replies
        before = len(replies)
        try:
            for data in received:
                replies.extend(reader.feed(data))
        except ClientProtocolError:
            self._broken()
            raise
        self.replies_received += len(replies) - before

    def _transaction_replies(self) -> None:
        """Hand replies to the transaction until it is done or they run out."""
        transaction = self._transaction
        assert transaction is not None
        replies, out = self._replies, self._out
        while replies:
            reply = replies.popleft()
            try:
                data = transaction.on_reply(reply)
            except ClientProtocolError:
                self._broken()
                raise
            if data:
                out.append(data)
            if transaction.done:
                self._transaction = None
                result = transaction.result()
                self.needs_reset = result.needs_reset
                self.transactions += 1
                self._move(Step.DONE)
                self._events.append(TransactionDone(result))
                if transaction.closing is not None:
                    # RFC 5321 3.8: after a 421 the server closes the connection, and the
                    # client does not wait to see it (nor says QUIT into what it left behind).
                    self._close(Closed(transaction.closing))
                elif result.bdat_not_understood is not None:
                    # A server that does not know BDAT may have read the chunk's octets as
                    # commands, and be answering them: no reply it sends on this connection can
                    # be matched to a command of ours any more. Goodbye, without waiting for
                    # an answer; DATA goes on a new connection (`pigeon.delivery.session`).
                    self._out.append(b"QUIT\r\n")
                    self._close(Closed(None))
                return

    def _on_reply(self, reply: Reply) -> None:
        """A reply outside a transaction: to the banner, EHLO, HELO, STARTTLS, AUTH or QUIT."""
        phase = self.phase
        expected = _EXPECTS.get(phase)
        if expected is None:
            self._unasked(reply)
            return
        if phase is Phase.AUTH and reply.code == 334:
            exchange = self._exchange
            assert exchange is not None
            try:
                self._out.append(exchange.answer(reply))  # the next response, alone (RFC 4954 4: no pipelining)
            except ClientProtocolError:
                self._broken()
                raise
            return
        step = Step.ACCEPTED if reply.code == expected else Step.REFUSED
        if step is Step.REFUSED and reply.code < 400 and phase in _OPENING:
            self._broken()
            verb = _OPENING[phase]
            raise ClientProtocolError(f"answered {verb} with {reply}, where only {expected} or an error may come")
        if reply.code == 421 and phase in _OPENING:
            self._move(Step.CLOSING, Unusable(Reason.CLOSING, reply, detail=_OPENING[phase]))
        elif phase is Phase.BANNER:
            self._move(step, Unusable(Reason.BANNER, reply) if step is Step.REFUSED else None)
        elif phase is Phase.EHLO:
            if step is Step.ACCEPTED:
                self.capabilities = Capabilities.from_ehlo(reply)
            self._move(step)
        elif phase is Phase.HELO:
            if step is Step.ACCEPTED:
                self.capabilities = Capabilities.helo_only()
            self._move(step, Unusable(Reason.GREETING, reply) if step is Step.REFUSED else None)
        elif phase is Phase.AUTH:
            credentials, exchange = self.credentials, self._exchange
            assert credentials is not None and exchange is not None
            self._exchange = None
            if step is Step.ACCEPTED:
                self.auth_user = credentials.username
                self._move(step)
            else:
                refused = Unusable(Reason.AUTH_FAILED, reply, detail=exchange.mechanism, user=credentials.username)
                self._move(step, refused)
        elif phase is Phase.STARTTLS:
            if step is Step.ACCEPTED and (self._replies or self._received or self._reader.buffered):
                # RFC 3207 4.2: nothing may follow the 220 before the handshake. What did is
                # plaintext that an attacker could have put there (a reply injection).
                self._broken()
                raise PlaintextAfterStartTls("data after the 220 reply to STARTTLS, before the TLS handshake")
            if step is Step.REFUSED:
                self._starttls_refusal = reply
            self._move(step)
        else:  # Phase.QUIT
            self._move(step, Closed(reply))

    def _unasked(self, reply: Reply) -> None:
        """A reply while the session waits for none (idle, or negotiating TLS)."""
        if self.phase is Phase.CLOSED:
            return
        if reply.code == 421 and self.phase is Phase.READY:
            self._close(Closed(reply))  # RFC 5321 3.8: the server is going away (idle timeout, shutdown)
            return
        handshake = self.phase is Phase.HANDSHAKE  # (it came after the 220, before the I/O layer began the handshake)
        self._broken()
        if handshake:
            raise PlaintextAfterStartTls(f"data after the 220 reply to STARTTLS, before the TLS handshake: {reply}")
        raise ClientProtocolError(f"a reply to no command: {reply}")

    # --- transitions ---------------------------------------------------------------------------
    def _move(self, step: Step, final: Unusable | Closed | None = None) -> None:
        """Take `step` from the current phase (`_NEXT`), then do what the new phase does."""
        try:
            phase = _NEXT[self.phase][step]
        except KeyError:
            if step in _APPLICATION_STEPS:
                raise SmtpUsageError(f"{step.name} is not possible in phase {self.phase.name}") from None
            raise AssertionError(f"no transition for {step.name} from {self.phase.name}") from None
        self.phase = phase
        if step is Step.DONE or step is Step.MAIL:
            return  # between messages and into one: nothing to say or tell
        command = self._commands.get(phase)
        if command is not None:
            self._out.append(command)
        elif phase is Phase.GREETED:
            self._move_by_tls_policy()
        elif phase is Phase.READY:
            self._events.append(Ready(self.capabilities, self.tls_active))
        elif phase is Phase.HANDSHAKE:
            self._events.append(StartTls())
        elif phase is Phase.AUTH:
            exchange = self._exchange
            assert exchange is not None
            self._out.append(exchange.start())
        elif phase is Phase.CLOSED:
            assert final is not None
            self._close(final)

    def _move_by_tls_policy(self) -> None:
        policy = self.tls_policy
        if self.tls_active or policy is TlsPolicy.DISABLED:
            self._go_on()
        elif "STARTTLS" in self.capabilities and self._starttls_refusal is None:
            self._move(Step.STARTTLS)
        elif policy is TlsPolicy.OPPORTUNISTIC:
            self._go_on()
        elif self._starttls_refusal is not None:
            self._move(Step.NO_TLS, Unusable(Reason.TLS_REFUSED, self._starttls_refusal))
        else:
            self._move(Step.NO_TLS, Unusable(Reason.TLS_NOT_OFFERED))

    def _go_on(self) -> None:
        """TLS is settled: ready, or AUTH first if the route authenticates and it may be done here."""
        credentials = self.credentials
        if credentials is None:
            self._move(Step.CLEAR)
            return
        user = credentials.username
        if not self.tls_active and not (credentials.plaintext and self.tls_policy is TlsPolicy.DISABLED):
            # Never the password in clear but where the route asked for no TLS at all
            # (`allow_plaintext_auth` with tls = "disabled"): an opportunistic route whose TLS
            # was not to be had (not offered, refused, the handshake failed) does not
            # authenticate, and the session ends here, the mail deferred.
            refusal = self._starttls_refusal
            if refusal is not None:
                detail = f"refused STARTTLS ({refusal})"
            elif "STARTTLS" not in self.capabilities and self.tls_policy is not TlsPolicy.DISABLED:
                detail = "does not offer STARTTLS"
            else:
                detail = "is not reached over TLS"  # (tls = "disabled" without allow_plaintext_auth: refused at load)
            self._move(Step.NO_AUTH, Unusable(Reason.AUTH_NEEDS_TLS, detail=detail, user=user))
            return
        offered = self.capabilities.auth
        if "AUTH" not in self.capabilities:
            self._move(Step.NO_AUTH, Unusable(Reason.AUTH_NOT_OFFERED, user=user))
            return
        mechanism = credentials.choose(offered)
        if mechanism is None:
            ours = ", ".join(credentials.mechanisms)
            what = f"offers AUTH {' '.join(offered) or 'without a mechanism'}, none of {ours}"
            self._move(Step.NO_AUTH, Unusable(Reason.AUTH_NO_MECHANISM, detail=what, user=user))
            return
        self._exchange = Exchange(credentials, mechanism)
        self._move(Step.AUTH)

    def _close(self, final: Unusable | Closed) -> None:
        if isinstance(final, Unusable) and final.reason is not Reason.TLS_FAILED:
            # RFC 5321 3.1 / 4.1.1.10: say goodbye even when turned away. The I/O layer writes
            # it and closes without waiting for the reply.
            self._out.append(b"QUIT\r\n")
        self._unanswered_at_close = self.unanswered()  # (before the phase says CLOSED)
        self._closed_at_end_of_data = self._end_in_doubt()
        self._cut = self._transaction  # (None but when the server closed mid-transaction: `settled`)
        self.phase = Phase.CLOSED
        self._final = final
        self._events.append(final)
        self._drop_input()

    def _broken(self) -> None:
        """The server broke the protocol: nothing more will be read or sent."""
        self._closed_at_end_of_data = self._end_in_doubt()
        self.phase = Phase.CLOSED
        self._final = Closed(None)
        self._out.clear()
        self._drop_input()

    def _drop_input(self) -> None:
        self._replies.clear()
        self._received.clear()
        self._transaction = None
