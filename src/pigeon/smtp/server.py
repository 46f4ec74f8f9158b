"""The SMTP server session: bytes in, events out, replies queued for one write.

Three verbs, as in h11:

    session.receive_data(data)          # b"" means the peer closed
    event = session.next_event()        # an Event, or NEED_DATA
    session.respond(reply)              # answer a Decision event (or session.accept())
    transport.write(session.data_to_send())

The whole order of a session is `_NEXT` below: for each phase, which commands may come and
the phase a *positive* reply moves to. A command missing from the table gets a 503 (or the
more precise reply `_out_of_sequence` picks); commands in `_ANYTIME` are answered by the
session itself in any phase. The phase only moves when the application's reply is
positive, so a refused MAIL leaves no transaction behind.

The session never reads ahead of an unanswered decision: pipelined commands wait in the
buffer until the reply to the previous one is known, which keeps replies in command order
(RFC 2920 3.1) and lets the I/O layer await the spool before answering end-of-data.
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
from collections import deque
from dataclasses import dataclass, field
from typing import Final, cast

from pigeon.smtp import replies
from pigeon.smtp.address import ascii_name, is_postmaster, same_mailbox_key
from pigeon.smtp.commands import (
    Auth,
    Bdat,
    Command,
    Help,
    Noop,
    Quit,
    Rset,
    Vrfy,
    given_recipient,
    given_sender,
    parse_command,
)
from pigeon.smtp.errors import SmtpProtocolError, SmtpUsageError
from pigeon.smtp.events import (
    NEED_DATA,
    AuthCredentials,
    Closing,
    Data,
    DataChunk,
    Decision,
    DecisionEvent,
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
from pigeon.smtp.extensions import Offer
from pigeon.smtp.framing import BareLinefeeds, ContentChecker, DotReader, Violation
from pigeon.smtp.replies import Reply


class Phase(enum.Enum):
    GREETED = "greeted"  # banner sent, no EHLO/HELO yet
    READY = "ready"  # greeted, no transaction
    MAIL = "mail"  # MAIL accepted, no recipient yet
    RCPT = "rcpt"  # at least one recipient accepted
    DATA = "data"  # 354 sent: reading dot-terminated content
    BDAT = "bdat"  # inside a BDAT sequence (after a non-LAST chunk)
    AUTH = "auth"  # inside a SASL exchange: the next line is a response, not a command
    TLS = "tls"  # 220 sent to STARTTLS: waiting for the handshake
    CLOSED = "closed"

    # Members are singletons compared by identity: hash them by identity too, in C, instead
    # of Enum's Python-level hash of the name (phases are looked up several times a command).
    __hash__ = object.__hash__


_NEXT: Final[dict[Phase, dict[type[Command], Phase]]] = {
    Phase.GREETED: {Ehlo: Phase.READY, Helo: Phase.READY},
    Phase.READY: {Ehlo: Phase.READY, Helo: Phase.READY, MailFrom: Phase.MAIL, StartTls: Phase.TLS, Auth: Phase.READY},
    Phase.MAIL: {Ehlo: Phase.READY, Helo: Phase.READY, RcptTo: Phase.RCPT},
    Phase.RCPT: {Ehlo: Phase.READY, Helo: Phase.READY, RcptTo: Phase.RCPT, Data: Phase.DATA, Bdat: Phase.BDAT},
    Phase.BDAT: {Bdat: Phase.BDAT},
}
_ANYTIME: Final = frozenset({Rset, Noop, Quit, Vrfy, Help})
_SEQUENCED: Final[dict[str, type[Command]]] = {"MAIL": MailFrom, "RCPT": RcptTo, "DATA": Data, "BDAT": Bdat}
"""The transaction's commands by verb: one out of sequence is refused as such (503) even when
its line is malformed too."""
_IN_TRANSACTION: Final = frozenset({Phase.MAIL, Phase.RCPT, Phase.DATA, Phase.BDAT})

MIN_COMMAND_LINE_LENGTH: Final = 998
"""The shortest command line limit, in octets without the CRLF, however low `max_line_length`
is set. That setting is about message lines (RFC 5322 2.1.1); a command has RFC 5321's own
limit, 512 octets with its CRLF (4.5.3.1.4), raised by the extensions offered (RFC 3461 4:
500 more for RCPT's NOTIFY and ORCPT, RFC 4954 5: AUTH= on MAIL). Lowered to 100, it refused a
valid 254-octet address's `RCPT TO:<...>` line that HTTP and `pigeon inject` take."""
_OVERLONG_HEAD: Final = 1024
"""How much of a line refused for its length is kept to name its command and address in the
Rejection record (an address is cut at 256 characters there)."""

MAX_AUTH_LINE_LENGTH: Final = 12_288
"""The longest AUTH command line or SASL response taken, in octets without the CRLF (RFC 4954 4);
`max(ServerConfig.max_line_length, MIN_COMMAND_LINE_LENGTH)` for every other command."""

_STANDARD_REPLIES: Final[dict[type, Reply]] = {
    MailFrom: replies.SENDER_OK,
    RcptTo: replies.RECIPIENT_OK,
    Data: replies.START_DATA,
    StartTls: replies.READY_TLS,
    AuthCredentials: replies.AUTH_OK,
}
_SASL_USERNAME: Final = Reply(334, None, ("VXNlcm5hbWU6",))  # base64 "Username:"
_SASL_PASSWORD: Final = Reply(334, None, ("UGFzc3dvcmQ6",))  # base64 "Password:"
_SASL_EMPTY: Final = Reply(334, None, ("",))


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything the session needs to know about this server. Limits cite their RFC."""

    hostname: str
    max_message_size: int = 25 * 1024 * 1024
    max_recipients: int = 1000  # RFC 5321 4.5.3.1.8: at least 100
    max_messages_per_connection: int = 10_000
    max_errors: int = 20
    max_junk_commands: int = 100  # commands that move no mail between messages (see _junk); 0: no limit
    max_line_length: int = 998  # RFC 5322 2.1.1, without CRLF
    bare_linefeeds: BareLinefeeds = BareLinefeeds.REFUSE
    pipelining: bool = True
    chunking: bool = True
    smtputf8: bool = True
    dsn: bool = True
    tls_available: bool = False
    auth_mechanisms: tuple[str, ...] = ()
    auth_requires_tls: bool = True
    banner: str = "ESMTP Pigeon"  # the greeting's text after the hostname ([smtp] banner)
    offers: tuple[Offer, Offer] = field(init=False, repr=False, compare=False, hash=False)
    """What a session offers without TLS (offers[False]) and with it (offers[True])."""
    helo_offer: Offer = field(init=False, repr=False, compare=False, hash=False)
    """What a session that began with HELO may use: no extension (RFC 5321 4.1.1.1), so no
    MAIL or RCPT parameter."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "offers", (self._offer(tls_active=False), self._offer(tls_active=True)))
        nothing = Offer(
            max_message_size=self.max_message_size,
            pipelining=False,
            chunking=False,
            eight_bit_mime=False,
            smtputf8=False,
            dsn=False,
            enhanced_status_codes=False,
            extensions=False,
        )
        object.__setattr__(self, "helo_offer", nothing)

    def _offer(self, tls_active: bool) -> Offer:
        auth_ok = bool(self.auth_mechanisms) and (tls_active or not self.auth_requires_tls)
        return Offer(
            max_message_size=self.max_message_size,
            pipelining=self.pipelining,
            chunking=self.chunking,
            smtputf8=self.smtputf8,
            dsn=self.dsn,
            starttls=self.tls_available and not tls_active,
            auth_mechanisms=self.auth_mechanisms if auth_ok else (),
        )


class ServerSession:
    """One SMTP server conversation, from banner to close. Knows nothing of sockets."""

    def __init__(self, config: ServerConfig, *, tls_active: bool = False) -> None:
        self.config = config
        self.tls_active = tls_active
        self.phase = Phase.GREETED
        self.esmtp = False
        self.greeted = False
        """Whether the banner was queued. It carries no enhanced code, nor does what the I/O
        layer says in its place (a 421 at connect); every reply after it does (RFC 2034 4:
        whether the client said EHLO, HELO or nothing yet)."""
        self.helo: str | None = None
        self.authenticated: str | None = None
        self.mail: MailFrom | None = None
        self.recipients = 0
        """Mailboxes taken in this transaction: what max_recipients bounds."""
        self._mailboxes: set[str] = set()  # their `_mailbox` keys
        self._last_mailbox: tuple[str, str] | None = None
        self.messages = 0
        self.errors = 0
        self.commands = 0
        """Command lines read (SASL responses and refused lines too): the I/O layer's measure of
        a client making progress between commands."""
        self.junk = 0
        """Commands that moved no mail since the last message accepted (or the start): see `_junk()`."""
        self._overshoot = 0  # RCPTs refused in this transaction for being past max_recipients
        self._buf = bytearray()
        self._out = bytearray()
        self._events: deque[Event] = deque()
        self._pending: DecisionEvent | None = None
        self._awaiting = False  # the pending decision was handed out and is unanswered
        self._closing: Closing | None = None
        self._eof = False  # the peer sends no more: close once what it sent is worked through
        self._line_overlong: Reply | None = None  # the reply to the line being dropped for its length
        self._dropped_cr = False  # the part of that line dropped last ended in CR
        self._refused_verb = ""  # the verb of the line `_read_line` last refused, for its Rejection
        self._line_limit = max(config.max_line_length, MIN_COMMAND_LINE_LENGTH) + 2  # with CRLF
        self._overlong_head = b""  # the start of the line being dropped for its length (its Rejection)
        self._checker: ContentChecker | None = None
        self._dot: DotReader | None = None
        self._chunk_left = 0
        self._chunk_last = False
        self._chunk_discard = False
        self._chunked = False
        self._chunk_total = 0  # octets of all BDAT chunks of this transaction (RFC 3030 reply)
        self._sasl: tuple[str, str] | None = None  # (mechanism, username so far)

    # --- the three verbs ---------------------------------------------------------------
    def greet(self, reply: Reply | None = None) -> None:
        """Queue the banner. A 421/554 banner refuses the connection."""
        reply = reply or replies.greeting(self.config.hostname, self.config.banner)
        # Not through `_queue`: a refused banner answers no command of the client's, so it is no
        # error of its (max_errors); with max_errors = 1 it would get a 421 "too many errors"
        # after its 554, a second and contradictory last word (RFC 2034 3: no enhanced code).
        self._out += reply.encode(enhanced=False)
        self.greeted = True
        if reply.code >= 400:
            self._close(reply)

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the peer; b"" means it will send no more (its EOF).

        An EOF is not the peer gone: a client that half-closes its side once it has sent a
        whole transaction (`nc -N`, monitoring probes) still reads. So what came before it is
        worked through and answered as ever (the end of a message still waits for its decision)
        and only then does the session close (`Closing(None)`), dropping a transaction left
        open: a message whose end never came is not one. A peer that is really gone is the
        I/O layer's to see (its writes fail), not the session's."""
        if self.phase is Phase.CLOSED:
            return
        if not data:
            self._eof = True
            return
        if self.phase is Phase.TLS:
            return  # RFC 3207 4.2: plaintext after STARTTLS is an injection; drop it
        self._buf += data

    def next_event(self) -> Event | _NeedData:
        """The next event, or NEED_DATA. Raises SmtpUsageError while a decision is open."""
        if self._awaiting:
            raise SmtpUsageError(f"answer {type(self._pending).__name__} with respond() first")
        while not self._events:
            if self._closing is not None:
                return self._closing
            if not self._buf or not self._step():  # with nothing buffered no step can progress
                if not self._eof:
                    return NEED_DATA
                self._close(None)  # all the peer sent before its EOF is answered: the end
        event = self._events.popleft()
        if event is self._pending:
            self._awaiting = True
        return event

    def respond(self, reply: Reply) -> None:
        """Answer the open decision. Positive replies advance the phase."""
        pending = self._pending
        if pending is None or not self._awaiting:
            raise SmtpUsageError("there is no decision to answer")
        self._pending = None
        self._awaiting = False
        self._queue(reply, verb=_decision_verb(pending))
        if self._closing is not None:
            return  # too many errors: the session already said goodbye
        if reply.code == 421:
            self._close(reply)
        elif reply.is_positive:
            self._accepted(pending)
        else:
            self._refused(pending)

    def accept(self) -> None:
        """Answer the open decision with its standard positive reply."""
        pending = self._pending
        reply = _STANDARD_REPLIES.get(type(pending))
        if reply is None:
            # The client's name echoed as our Received field writes it: ASCII (see `ascii_name`).
            if isinstance(pending, Ehlo):
                reply = self.offer().ehlo_reply(self.config.hostname, ascii_name(pending.domain))
            elif isinstance(pending, Helo):
                reply = _helo_reply(self.config.hostname, ascii_name(pending.domain))
            else:
                reply = replies.OK
        self.respond(reply)

    def data_to_send(self) -> bytes:
        """Every reply queued since the last call, ready for one write."""
        if not self._out:
            return b""
        out = bytes(self._out)
        self._out.clear()
        return out

    def tls_established(self) -> None:
        """The TLS handshake after STARTTLS succeeded: start over (RFC 3207 4.2)."""
        if self.phase is not Phase.TLS:
            raise SmtpUsageError("tls_established() without an accepted STARTTLS")
        self.tls_active = True
        self.phase = Phase.GREETED
        self.esmtp = False
        self.helo = None
        self.authenticated = None

    def revoke_authentication(self) -> None:
        """The credentials the session authenticated with hold no more (a reload removed or
        changed them): unauthenticated from now on, it may AUTH again (outside a transaction,
        as ever). What it asks meanwhile is refused by the I/O layer, which knows why."""
        self.authenticated = None

    def offer(self) -> Offer:
        """The extensions this session advertises right now."""
        return self.config.offers[self.tls_active]

    @property
    def buffered(self) -> int:
        """Bytes received and not yet processed."""
        return len(self._buf)

    @property
    def receiving_content(self) -> bool:
        """True while the peer owes message content: from 354 to DATA's final dot, from the
        first BDAT to the end of the LAST chunk (the BDAT commands between chunks included),
        and through a BDAT chunk being discarded. The I/O layer bounds such a block as a whole
        (tiny chunks must not make a trickle look like progress); other commands one by one."""
        if self._chunk_left:
            return True
        phase = self.phase
        return (phase is Phase.DATA or phase is Phase.BDAT) and self._pending is None

    @property
    def pending(self) -> DecisionEvent | None:
        """The decision waiting for `respond()`, if any."""
        return self._pending

    # --- stepping through input ----------------------------------------------------------
    def _step(self) -> bool:
        """Consume some input. False when nothing could be done without more bytes."""
        if self._chunk_left:
            return self._read_chunk()
        if self.phase is Phase.DATA:
            return self._read_data()
        line = self._read_line()
        if line is None:
            return False
        self.commands += 1
        if isinstance(line, Reply):
            if self.phase is Phase.AUTH:
                self._sasl = None  # a broken response line ends the SASL exchange too
                self.phase = Phase.READY
                if not self._refused_verb:  # a response too long (`_head_of` kept none of it)
                    self._refused_verb = "AUTH"
            head, self._overlong_head = self._overlong_head, b""
            if head:
                # An overlong line names its command and address as any refused one does.
                verb = _verb_of(head)
                sender = given_sender(head) if verb == "MAIL" else None
                if sender is not None and sender.startswith("<"):
                    sender = sender[1:]
                recipient = given_recipient(head) if verb == "RCPT" else None
                if recipient is not None and recipient.startswith("<"):
                    recipient = recipient[1:]  # its ">" was past the head kept, or never came
                self._reject(verb, line, recipient, sender)
            else:
                self._reject(self._refused_verb, line)
            self._refused_verb = ""
            if line.code == 421:  # a bare LF (see `_read_line`): the session ends with its reply
                self._close(line)
            return True
        if self.phase is Phase.AUTH:
            self._sasl_response(line)
            return True
        # MAIL and RCPT parameters are read against what the client was offered: after HELO,
        # nothing (before any greeting, MAIL and RCPT get 503 whatever they carry).
        offer = self.config.offers[self.tls_active] if self.esmtp or self.helo is None else self.config.helo_offer
        try:
            command = parse_command(line, offer)
        except SmtpProtocolError as error:
            verb = _verb_of(line)
            reply = error.reply
            # A transaction command out of sequence gets its 503 whatever its argument, as
            # from Postfix (RFC 5321 4.3.2): `RCPT TO:<bad@@x>` before MAIL is out of order
            # first, and a client told of its syntax would fix that and still be refused.
            kind = _SEQUENCED.get(verb)
            if kind is not None and kind not in _NEXT.get(self.phase, {}):
                reply = self._out_of_sequence(kind)
            sender = given_sender(line) if verb == "MAIL" else None
            self._reject(verb, reply, given_recipient(line) if verb == "RCPT" else None, sender)
            if error.close and self._closing is None:  # (not closed already: too many errors)
                # The command's own reply says what was wrong with it; the 421 says why the
                # session ends with it, rather than the client finding the connection gone.
                final = replies.framing_lost(self.config.hostname, verb)
                self._queue(final)
                self._close(final)
            return True
        self._dispatch(command)
        return True

    def _read_line(self) -> bytearray | Reply | None:
        """The next command line without its CRLF, a Reply saying why it is refused, or None.

        A line ended by a bare LF gets a 421 that ends the session, and what follows it is
        dropped unread: a proxy in front that frames commands by CRLF (as RFC 5321 2.3.8 has
        it) would take that for the rest of the same line, and a command it never saw must not
        run here (the command-line twin of SMTP smuggling). Postfix's
        `smtpd_forbid_bare_newline` does the same."""
        buf = self._buf
        end = buf.find(b"\n")
        limit = self._line_limit
        if end < 0:
            if len(buf) > limit:
                if self._line_overlong is None:  # (else `buf` holds the rest of a line being dropped)
                    longest, reply = self._longest_line(buf)
                    if len(buf) <= longest:
                        return None
                    self._line_overlong = reply
                    self._overlong_head = self._head_of(buf, len(buf))
                self._dropped_cr = buf[-1] == 13  # its LF, in the next bytes, would end the line properly
                buf.clear()  # drop it now; answer when the line finally ends
            return None
        if end:
            bare = buf[end - 1] != 13  # 13 is CR
        else:  # the LF opens `buf`: only the last part dropped of an overlong line could hold its CR
            bare = self._line_overlong is None or not self._dropped_cr
        if bare:
            # (Not the rest of a line dropped for its length: that has no verb of its own.)
            self._refused_verb = self._refused_line_verb(buf[:end]) if self._line_overlong is None else ""
            self._overlong_head = b""
            buf.clear()
            self._line_overlong = None
            return replies.bare_lf_in_command(self.config.hostname)
        overlong = self._line_overlong
        if overlong is None and end >= limit:
            longest, reply = self._longest_line(buf)
            if end >= longest:
                overlong = reply
                self._overlong_head = self._head_of(buf, end)
        if overlong is not None:
            self._line_overlong = None
            del buf[: end + 1]
            return overlong
        line = buf[: end - 1]
        del buf[: end + 1]
        bare_cr = b"\r" in line
        nul = b"\0" in line
        if bare_cr or nul:
            self._refused_verb = self._refused_line_verb(line)
            if not nul:
                return replies.COMMAND_BARE_CR
            return replies.COMMAND_BARE_CR_AND_NUL if bare_cr else replies.COMMAND_NUL
        return line

    def _refused_line_verb(self, line: bytes | bytearray) -> str:
        """The verb of a line refused before it was parsed, for its Rejected event: AUTH for a
        SASL response, whose start is a credential's (base64 of a password), never to be logged."""
        if self.phase is Phase.AUTH:
            return "AUTH"
        return _verb_of(line)

    def _head_of(self, buf: bytearray, end: int) -> bytes:
        """The start of an overlong line (`end`: its LF, or what there is of it), for its
        Rejection: none of a SASL response, whose start would be a credential's."""
        if self.phase is Phase.AUTH:
            return b""
        return bytes(buf[: min(end, _OVERLONG_HEAD)]).rstrip(b"\r")

    def _longest_line(self, buf: bytearray) -> tuple[int, Reply]:
        """For the line at the start of `buf`, once past `max_line_length`: the most octets it
        may have (with its CRLF) and the reply beyond them. An AUTH command and a SASL response
        may have 12,288 (RFC 4954 4: a SASL response holding a long password, a Kerberos or
        OAuth token, is longer than 998), and are refused with RFC 4954's 500 5.5.6."""
        if self.phase is Phase.AUTH or buf[:5].upper() == b"AUTH ":
            return MAX_AUTH_LINE_LENGTH + 2, replies.AUTH_LINE_TOO_LONG
        return self._line_limit, replies.LINE_TOO_LONG

    def _dispatch(self, command: Command) -> None:
        # A command's verb is read from its class (`kind.verb`, `type(command).verb`): a class
        # attribute of the commands' frozen dataclasses, which compiled (mypyc) code cannot
        # read through an instance of a union type.
        kind = type(command)
        if kind in _ANYTIME:
            self._anytime(command)
            return
        allowed = _NEXT.get(self.phase, {})
        if kind not in allowed:
            recipient = command.recipient if isinstance(command, RcptTo) else None
            sender = command.sender if isinstance(command, MailFrom) else None
            self._reject(kind.verb, self._out_of_sequence(kind), recipient, sender)
            if isinstance(command, Bdat):
                self._discard_chunk(command)
            return
        if isinstance(command, MailFrom):
            if self.messages >= self.config.max_messages_per_connection:
                reply = replies.too_many_messages(self.config.hostname)
                self._reject(kind.verb, reply, sender=command.sender)
                self._close(reply)
                return
        elif isinstance(command, RcptTo):
            again = self._mailbox(command.recipient) in self._mailboxes
            # A mailbox the transaction holds already, named again, moves no mail: free of
            # max_recipients (it adds no recipient), so it must count as junk, or a client
            # could name it for ever, each RCPT answered and handed on.
            if again and self._junk("RCPT", command.recipient):
                return
            problem = self._check_recipient(command, again)
            if problem is not None:
                if problem is replies.TOO_MANY_RECIPIENTS:
                    # Not an error (see `_queue`), but no mail either. A pipelining client
                    # sends its whole batch before it hears the first 452 (RFC 2920), so as
                    # many again as max_recipients are let be; each one after that is junk
                    # (Postfix: smtpd_recipient_overshoot_limit, by default the same 1000).
                    self._overshoot += 1
                    if self._overshoot > self.config.max_recipients and self._junk("RCPT", command.recipient):
                        return
                self._reject(kind.verb, problem, command.recipient)
                return
        elif isinstance(command, (Ehlo, Helo)):
            # A greeting again (TLS aside, which starts the session over) moves no mail and
            # resets the transaction: EHLO, MAIL, EHLO, MAIL, ... would otherwise go on for ever.
            if self.phase is not Phase.GREETED and self._junk(kind.verb):
                return
        elif isinstance(command, StartTls):
            if self.tls_active:
                self._reject(kind.verb, replies.ALREADY_TLS)
                return
            if not self.config.tls_available:
                self._reject(kind.verb, replies.NOT_IMPLEMENTED)
                return
        elif isinstance(command, Auth):
            self._start_auth(command)
            return
        elif isinstance(command, Bdat):
            self._start_chunk(command)
            return
        self._decide(cast(DecisionEvent, command))  # every other command returned above

    def _anytime(self, command: Command) -> None:
        if isinstance(command, Quit):
            reply = replies.closing(self.config.hostname)
            self._queue(reply)
            self._reset_transaction()
            self._close(reply)
            return
        if self._junk(type(command).verb):
            return
        if isinstance(command, Rset):
            self._reset_transaction()
            self._queue(replies.RESET_OK)
        elif isinstance(command, Noop):
            self._queue(replies.OK)
        elif isinstance(command, Vrfy):
            self._queue(replies.VRFY_CANNOT)
        elif isinstance(command, Help):
            self._queue(replies.HELP)

    def _junk(self, verb: str, recipient: str | None = None) -> bool:
        """Count a command that moves no mail; True when that was one too many and the session
        ended. Answered at once and never an error, such commands (NOOP, RSET, VRFY, HELP, a
        repeated EHLO or HELO, RCPTs far past max_recipients) could otherwise keep a session,
        and the transaction it holds, open for ever. The count starts over with each message
        accepted (Postfix's smtpd_junk_command_limit), so a client that sends mail never runs
        out."""
        self.junk += 1
        limit = self.config.max_junk_commands
        if not limit or self.junk <= limit:
            return False
        reply = replies.too_many_junk_commands(self.config.hostname)
        self._reject(verb, reply, recipient)
        self._close(reply)
        return True

    def _out_of_sequence(self, kind: type[Command]) -> Reply:
        """The refusal of a command of class `kind` that may not come in this phase."""
        phase = self.phase
        if phase is Phase.GREETED:
            return replies.NEED_HELO
        if phase is Phase.BDAT:
            return replies.MIXED_DATA_BDAT if kind is Data else replies.BDAT_IN_PROGRESS
        if kind is MailFrom:
            return replies.NESTED_MAIL
        if kind is RcptTo:
            return replies.NEED_MAIL
        if kind is Data or kind is Bdat:
            return replies.NEED_MAIL if phase is Phase.READY else replies.NO_VALID_RECIPIENTS
        if kind is StartTls:
            return replies.TLS_IN_TRANSACTION
        if kind is Auth:
            return replies.AUTH_IN_TRANSACTION
        return Reply(503, "5.5.1", (f"{kind.verb} not allowed now",))

    def _check_recipient(self, command: RcptTo, again: bool) -> Reply | None:
        """`again`: the RCPT names a mailbox the transaction holds already. That is no more
        recipients, so max_recipients does not refuse it: it is answered as the first was
        (250), and delivered once (the intake's duplicate filter), as an injection refuses
        a repeat without counting it."""
        if self.recipients >= self.config.max_recipients and not again:
            return replies.TOO_MANY_RECIPIENTS
        mail = self.mail
        if not command.recipient.isascii() and not (mail is not None and mail.smtputf8):
            return replies.NON_ASCII_WITHOUT_SMTPUTF8
        return None

    def _mailbox(self, recipient: str) -> str:
        """What names one mailbox however a RCPT writes it, as the intake's duplicate filter
        and an injection's find a repeat (`same_mailbox_key`); every postmaster of ours is one."""
        # Each RCPT asks twice, as it is read and as it is accepted: the last answer is kept.
        last = self._last_mailbox
        if last is not None and last[0] == recipient:
            return last[1]
        key = "postmaster" if is_postmaster(recipient, self.config.hostname) else same_mailbox_key(recipient)
        self._last_mailbox = (recipient, key)
        return key

    # --- DATA ----------------------------------------------------------------------------
    def _read_data(self) -> bool:
        dot, checker = self._dot, self._checker
        assert dot is not None and checker is not None
        content, ended = dot.read(self._buf)
        if dot.overlong:
            checker.violations.add(Violation.LINE_TOO_LONG)
        out = checker.feed(content) if content else b""
        if ended:
            self._end_message("DATA", out)
            return True
        self._chunk_out(out)
        return bool(content)

    def _chunk_out(self, data: bytes) -> None:
        if data:
            self._events.append(DataChunk(data))

    def _end_message(self, verb: str, last: bytes = b"") -> None:
        """The message is complete. `last` is its final content, fed to the checker but not yet
        emitted: only `finish()` knows whether the message passes (a CR ending it is bare; a
        final line without CRLF may be too long), so `last` goes out only if it does. Emitted
        first, its DataChunk would be read after the refusal had already ended the transaction
        (events are queued, the phase moves at once), when there is no transaction to add it to."""
        checker = self._checker
        assert checker is not None
        tail = checker.finish()
        refusal = checker.refusal()
        if refusal is not None:
            self._reject(verb, refusal)
            self._reset_transaction()
            return
        self._chunk_out(last)
        self._chunk_out(tail)
        self._decide(MessageEnd(checker.size, self._chunked))

    def _new_checker(self) -> ContentChecker:
        config = self.config
        return ContentChecker(
            max_size=config.max_message_size,
            max_line_length=config.max_line_length,
            bare_linefeeds=config.bare_linefeeds,
        )

    # --- BDAT (RFC 3030) -------------------------------------------------------------------
    def _start_chunk(self, command: Bdat) -> None:
        if not self.config.chunking or not self.esmtp:
            # After HELO, CHUNKING was not offered (RFC 3030 3: after EHLO only): its chunk is
            # read and dropped, as ever, and the transaction stays open for DATA.
            self._reject(type(command).verb, replies.NOT_IMPLEMENTED if self.esmtp else replies.BDAT_AFTER_HELO)
            self._discard_chunk(command)
            return
        if not self._chunked:
            self._chunked = True
            self._checker = self._new_checker()
        self.phase = Phase.BDAT
        self._chunk_total += command.size
        self._chunk_left = command.size
        self._chunk_last = command.last
        self._chunk_discard = False
        if command.size == 0:
            self._finish_chunk()

    def _discard_chunk(self, command: Bdat) -> None:
        self._chunk_left = command.size
        self._chunk_discard = True

    def _read_chunk(self) -> bool:
        buf = self._buf
        if not buf:
            return False
        take = min(len(buf), self._chunk_left)
        data = bytes(buf[:take])
        del buf[:take]
        self._chunk_left -= take
        if self._chunk_discard:
            if self._chunk_left == 0:
                self._chunk_discard = False
            return True
        checker = self._checker
        assert checker is not None
        out = checker.feed(data)
        if self._chunk_left == 0:
            self._finish_chunk(out)
        else:
            self._chunk_out(out)
        return True

    def _finish_chunk(self, out: bytes = b"") -> None:
        """A chunk is complete; `out` is what the checker passed of its last bytes."""
        checker = self._checker
        assert checker is not None
        if self._chunk_last:
            self._end_message("BDAT", out)
            return
        if (refusal := checker.refusal()) is not None:
            # Refuse now rather than buffer more of a message we will not take.
            self._reject("BDAT", refusal)
            self._reset_transaction()
        else:
            self._chunk_out(out)
            self._queue(replies.chunk_received(self._chunk_total))

    # --- AUTH (RFC 4954) ---------------------------------------------------------------
    def _start_auth(self, command: Auth) -> None:
        config = self.config
        if self.authenticated is not None:
            self._reject("AUTH", replies.ALREADY_AUTHENTICATED)
            return
        if not config.auth_mechanisms:
            self._reject("AUTH", replies.AUTH_NOT_OFFERED)
            return
        if config.auth_requires_tls and not self.tls_active:
            self._reject("AUTH", replies.AUTH_NEEDS_TLS)
            return
        if command.mechanism not in config.auth_mechanisms:
            self._reject("AUTH", replies.AUTH_UNKNOWN_MECHANISM)
            return
        initial = command.initial
        if initial == "*":
            self._reject("AUTH", replies.AUTH_CANCELLED)
            return
        if command.mechanism == "PLAIN":
            if initial is None:
                self._sasl_continue("PLAIN", "", _SASL_EMPTY)
            else:
                self._sasl_plain(initial)
        else:  # LOGIN
            if initial is None:
                self._sasl_continue("LOGIN", "", _SASL_USERNAME)
            else:
                self._sasl_login_username(initial)

    def _sasl_continue(self, mechanism: str, username: str, challenge: Reply) -> None:
        self._sasl = (mechanism, username)
        self.phase = Phase.AUTH
        self._queue(challenge)

    def _sasl_response(self, line: bytearray) -> None:
        assert self._sasl is not None
        mechanism, username = self._sasl
        self._sasl = None
        self.phase = Phase.READY
        text = line.decode("ascii", "replace").strip()
        if text == "*":
            self._reject("AUTH", replies.AUTH_CANCELLED)
        elif mechanism == "PLAIN":
            self._sasl_plain(text)
        elif not username:
            self._sasl_login_username(text)
        else:
            password = _b64decode(text)
            if password is None:
                self._reject("AUTH", replies.AUTH_BAD_ENCODING)
            else:
                self._decide(AuthCredentials("LOGIN", username, password))

    def _sasl_plain(self, text: str) -> None:
        decoded = _b64decode(text)
        parts = decoded.split("\0") if decoded is not None else []
        if len(parts) != 3 or not parts[1]:
            self._reject("AUTH", replies.AUTH_BAD_ENCODING)
            return
        authzid, username, password = parts
        if authzid and authzid != username:
            # RFC 4616 2: a non-empty authzid asks to act as another user once authenticated.
            # Pigeon has no proxy authorization, so that is refused whatever the password
            # (which is not checked, and so not counted as a guess).
            self._reject("AUTH", replies.AUTH_FAILED)
            return
        self._decide(AuthCredentials("PLAIN", username, password, authzid))

    def _sasl_login_username(self, text: str) -> None:
        username = _b64decode(text)
        if not username:
            self._reject("AUTH", replies.AUTH_BAD_ENCODING)
            return
        self._sasl_continue("LOGIN", username, _SASL_PASSWORD)

    def _decide(self, event: DecisionEvent) -> None:
        self._pending = event
        self._events.append(event)

    # --- transitions -------------------------------------------------------------------
    def _accepted(self, decision: Decision) -> None:
        if isinstance(decision, (Ehlo, Helo)):
            self._reset_transaction()
            self.esmtp = isinstance(decision, Ehlo)
            self.helo = decision.domain
        elif isinstance(decision, MailFrom):
            self.mail = decision
            self.recipients = 0
            self._mailboxes.clear()
            self._overshoot = 0
        elif isinstance(decision, RcptTo):
            mailbox = self._mailbox(decision.recipient)
            if mailbox not in self._mailboxes:
                self._mailboxes.add(mailbox)
                self.recipients += 1
        elif isinstance(decision, Data):
            self._checker = self._new_checker()
            self._dot = DotReader(self.config.max_line_length)
        elif isinstance(decision, MessageEnd):
            self.messages += 1
            self.junk = 0
            self._clear_transaction()
            self.phase = Phase.READY
            return
        elif isinstance(decision, StartTls):
            self._buf.clear()  # anything pipelined after STARTTLS is plaintext injection
        elif isinstance(decision, AuthCredentials):
            self.authenticated = decision.username
            return
        self.phase = _NEXT[self.phase][type(decision)]  # type: ignore[index]

    def _refused(self, decision: Decision) -> None:
        if isinstance(decision, MessageEnd):
            self._clear_transaction()
            self.phase = Phase.READY

    def _reset_transaction(self) -> None:
        if self.phase in _IN_TRANSACTION:
            self._events.append(TransactionReset())
            self.phase = Phase.READY
        self._clear_transaction()

    def _clear_transaction(self) -> None:
        self.mail = None
        self.recipients = 0
        self._mailboxes.clear()
        self._overshoot = 0
        self._checker = None
        self._dot = None
        self._chunked = False
        self._chunk_last = False
        self._chunk_total = 0

    # --- output --------------------------------------------------------------------------
    def _queue(self, reply: Reply, *, verb: str = "") -> None:
        """Queue the answer to a command of the client's (the banner is `greet`'s), counting it
        towards max_errors. `verb`: the command `reply` answers, which the 421 after the error
        past max_errors names (the command that went over the limit)."""
        # Enhanced codes whatever the client greeted with (RFC 2034 4, 5: "regardless of
        # whether or not EHLO is employed"); `greet` alone goes without (RFC 2034 3).
        self._out += reply.encode()
        # Only the client's errors count towards max_errors. 452 for recipients past our limit
        # is no fault of the client's: RFC 5321 4.5.3.1.10 has it send the rest in a new
        # transaction, and a pipelining client learns of the limit only after it has sent them
        # all. Nor is a failure of our own (4.3.x: a spool that cannot store fails every
        # message, and closing with "too many errors" would blame the client).
        if (
            reply.code >= 400
            and reply.code != 421
            and reply is not replies.TOO_MANY_RECIPIENTS
            and not reply.is_server_failure
        ):
            self.errors += 1
            # The max_errors-th error is the last: it gets its reply, then 421 (as documented).
            if self.errors >= self.config.max_errors and self._closing is None:
                final = replies.too_many_errors(self.config.hostname)
                self._out += final.encode()
                self._events.append(Rejected(verb, final))
                self._close(final)

    def _reject(self, verb: str, reply: Reply, recipient: str | None = None, sender: str | None = None) -> None:
        """`sender`: a refused MAIL's own (as given); else the open transaction's is taken."""
        if sender is None and self.mail is not None:
            sender = self.mail.sender
        self._events.append(Rejected(verb, reply, recipient, sender))
        self._queue(reply, verb=verb)

    def _close(self, reply: Reply | None) -> None:
        """End the session with `reply` (already queued), or None: the peer's EOF."""
        if self._closing is not None:
            return  # already closing: the first goodbye stands
        if self.phase in _IN_TRANSACTION:
            self._events.append(TransactionReset())
        self.phase = Phase.CLOSED
        self._closing = Closing(reply)
        self._pending = None
        self._awaiting = False


def _b64decode(text: str) -> str | None:
    if text == "=":
        return ""
    try:
        return base64.b64decode(text, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


def _verb_of(line: bytes | bytearray) -> str:
    """The verb a refused line gave, for its Rejected event: its first word, at most 16 octets,
    ASCII letters in capitals, other bytes as they came (those that are not UTF-8 as surrogate
    escapes, as a refused RCPT's address: escaped where it is shown, `pigeon.logs.peer_text`)."""
    return line.split(b" ", 1)[0][:16].upper().decode("utf-8", "surrogateescape")


def _decision_verb(decision: DecisionEvent) -> str:
    """The command a decision answers: BDAT for the end of a chunked message."""
    if isinstance(decision, MessageEnd) and decision.chunked:
        return "BDAT"
    return type(decision).verb


@functools.lru_cache(maxsize=256)
def _helo_reply(hostname: str, client: str) -> Reply:
    return Reply(250, None, (f"{hostname} greets {client}",))
