"""SMTP replies: one value type and the catalogue of every reply Pigeon's server sends.

A `Reply` is a code, an optional RFC 3463 enhanced status code and one or more text lines.
Formatting follows RFC 5321 §4.2: continuation lines use `code-`, the last `code `, and
(RFC 2034 4) every line repeats the enhanced code: in every reply but the greeting, whether
the client said EHLO or HELO or nothing yet (a server that offers ENHANCEDSTATUSCODES sends
them "regardless of whether or not EHLO is employed by the client").

Keeping the catalogue here, rather than inline strings at each call site, is what lets the
tests assert that every error carries the right code and enhanced code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Final


@dataclass(frozen=True, slots=True)
class Reply:
    """One SMTP reply. `lines` holds at least one line of text (without CRLF)."""

    code: int
    enhanced: str | None
    lines: tuple[str, ...]
    # The wire forms, without and with the enhanced code: built on first use, then reused.
    _wire: list[bytes | None] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not 200 <= self.code <= 599:
            raise ValueError(f"reply code {self.code} is outside 200..599")
        if not self.lines:
            raise ValueError("a reply needs at least one line of text")
        for line in self.lines:
            if "\r" in line or "\n" in line:
                raise ValueError("reply text must not contain CR or LF")
        object.__setattr__(self, "_wire", [None, None])

    @classmethod
    def of(cls, code: int, enhanced: str | None, *lines: str) -> Reply:
        return cls(code, enhanced, lines)

    @property
    def is_positive(self) -> bool:
        """2xx and 3xx: the command was accepted (or the server awaits more input). For the
        server's own answers; a client reading a peer's reply asks what that command allows
        (`is_success`, or 354 to DATA alone: `pigeon.smtp.client`), since a 3xx where a 2xx
        is due, or a 2xx where 354 is, is no success but a broken protocol."""
        return self.code < 400

    @property
    def is_success(self) -> bool:
        """2xx: the command was done (RFC 5321 4.2.1: "Positive Completion reply")."""
        return 200 <= self.code < 300

    @property
    def is_transient(self) -> bool:
        return 400 <= self.code < 500

    @property
    def is_server_failure(self) -> bool:
        """A transient failure of our own mail system (RFC 3463 class 4, subject 3: 4.3.x,
        e.g. 451 4.3.0 when the spool cannot store): nothing the client did wrong."""
        return self.is_transient and self.enhanced is not None and self.enhanced.startswith("4.3.")

    @property
    def text(self) -> str:
        """All lines joined with a space: the form used in log records."""
        return " ".join(self.lines)

    def encode(self, *, enhanced: bool = True) -> bytes:
        """The reply on the wire. `enhanced=False` drops the enhanced code (the greeting, or what
        is said in its place)."""
        wire = self._wire[enhanced]
        if wire is None:
            wire = self._wire[enhanced] = self._format(enhanced)
        return wire

    def _format(self, enhanced: bool) -> bytes:
        prefix = f"{self.enhanced} " if enhanced and self.enhanced else ""
        last = len(self.lines) - 1
        out = []
        for i, line in enumerate(self.lines):
            sep = " " if i == last else "-"
            out.append(f"{self.code}{sep}{prefix}{line}\r\n")
        return "".join(out).encode("utf-8")

    def __str__(self) -> str:
        return f"{self.code} {self.enhanced + ' ' if self.enhanced else ''}{self.text}"


def r(code: int, enhanced: str | None, text: str) -> Reply:
    return Reply(code, enhanced, (text,))


# --- positive replies -----------------------------------------------------------------------
OK: Final = r(250, "2.0.0", "Ok")
SENDER_OK: Final = r(250, "2.1.0", "Sender ok")
RECIPIENT_OK: Final = r(250, "2.1.5", "Recipient ok")
START_DATA: Final = r(354, None, "End data with <CR><LF>.<CR><LF>")
RESET_OK: Final = r(250, "2.0.0", "Reset ok")
VRFY_CANNOT: Final = r(252, "2.5.0", "Cannot VRFY user, but will accept message and attempt delivery")
READY_TLS: Final = r(220, "2.0.0", "Ready to start TLS")
AUTH_OK: Final = r(235, "2.7.0", "Authentication successful")
HELP: Final = Reply(
    214,
    "2.0.0",
    (
        "Commands: EHLO HELO MAIL RCPT DATA BDAT RSET NOOP QUIT VRFY HELP STARTTLS AUTH",
        "See RFC 5321 and https://www.rfc-editor.org/rfc/rfc5321",
    ),
)


@functools.lru_cache(maxsize=16)
def closing(hostname: str) -> Reply:
    return r(221, "2.0.0", f"{hostname} closing connection")


@functools.lru_cache(maxsize=16)
def greeting(hostname: str, banner: str = "ESMTP Pigeon") -> Reply:
    """The 220 banner: the hostname first (RFC 5321 4.3.1), then `[smtp] banner`, if any."""
    return r(220, None, f"{hostname} {banner}" if banner else hostname)


def chunk_received(size: int) -> Reply:
    return r(250, "2.0.0", f"{size} octets received")


def queued(ids: list[str]) -> Reply:
    return r(250, "2.0.0", f"Ok: queued as {' '.join(ids)}")


# --- 4xx: try again later -------------------------------------------------------------------
TOO_MANY_RECIPIENTS: Final = r(452, "4.5.3", "Too many recipients for this message; send the rest in a new transaction")
TLS_UNAVAILABLE: Final = r(454, "4.7.0", "TLS not available")
SPOOL_ERROR: Final = r(451, "4.3.0", "Local error in processing: message not stored, try again later")
# RFC 3463 X.3.1 and RFC 5321 4.3.2 (452 after the data): what MAIL ... SIZE= over the room
# gets (`no_room_now`), said at the end of the data too, rather than a "local error" that tells
# the client and the operator reading the Rejection record nothing of why.
SPOOL_FULL: Final = r(
    452, "4.3.1", "Insufficient system storage: the spool has no room for this message now, try again later"
)
# Never sent: what the Rejection record of a message says when its client hung up while the
# message was being checked (a policy hook, DKIM signing), before it was stored. RFC 3463 X.4.2:
# bad connection.
CLIENT_GONE: Final = r(451, "4.4.2", "Client gone before the message was stored: not stored, no reply given")
SERVER_SHUTTING_DOWN_TEXT: Final = "Service shutting down, try again later"


def timeout(hostname: str) -> Reply:
    return r(421, "4.4.2", f"{hostname} Error: timeout exceeded, closing connection")


def envelope_timeout(hostname: str, limit: float) -> Reply:
    return r(
        421,
        "4.4.2",
        f"{hostname} Error: transaction envelope not done within {limit:g}s (MAIL to DATA), closing connection",
    )


def framing_lost(hostname: str, verb: str) -> Reply:
    """After a command whose data cannot be told from the commands that follow (a BDAT without
    a size): the session must end, and RFC 5321 3.8 has a server say so with 421 first."""
    return r(421, "4.5.0", f"{hostname} Error: cannot tell where the data of that {verb} ends, closing connection")


def bare_lf_in_command(hostname: str) -> Reply:
    """A command line ended by a bare LF. Where the commands after it begin is then in doubt (a
    proxy that frames by CRLF reads them as the same line), so none is run: the session ends,
    and RFC 5321 3.8 has a server say so with 421. (Postfix's `smtpd_forbid_bare_newline`
    disconnects too.)"""
    return r(
        421,
        "4.5.2",
        f"{hostname} Error: bare <LF> received; command lines must end with <CR><LF> (RFC 5321 2.3.8), "
        "closing connection",
    )


def too_many_errors(hostname: str) -> Reply:
    return r(421, "4.7.0", f"{hostname} Error: too many errors, closing connection")


def too_many_junk_commands(hostname: str) -> Reply:
    # Not only NOOP and RSET: a repeated EHLO or RCPTs far past the recipient limit count too.
    return r(421, "4.7.0", f"{hostname} Error: too many commands that move no mail, closing connection")


def too_many_messages(hostname: str) -> Reply:
    return r(421, "4.7.0", f"{hostname} Error: too many messages in one connection, reconnect to send more")


def too_many_connections(hostname: str) -> Reply:
    return r(421, "4.7.0", f"{hostname} too many connections, try again later")


def too_many_connections_from_you(hostname: str) -> Reply:
    return r(421, "4.7.0", f"{hostname} too many connections from your address, try again later")


def idle_evicted(hostname: str) -> Reply:
    return r(421, "4.7.0", f"{hostname} too many connections: closing this idle one, reconnect when you have mail")


def envelope_evicted(hostname: str) -> Reply:
    return r(
        421,
        "4.7.0",
        f"{hostname} too many connections: closing this one, whose transaction has been open too long; "
        "reconnect when you have mail",
    )


def talked_before_greeting(hostname: str) -> Reply:
    return r(554, "5.5.0", f"{hostname} Error: you sent before the greeting (RFC 5321 4.3.1), closing connection")


def shutting_down(hostname: str) -> Reply:
    return r(421, "4.3.2", f"{hostname} {SERVER_SHUTTING_DOWN_TEXT}")


# --- 5xx: syntax and sequence ---------------------------------------------------------------
UNRECOGNIZED: Final = r(500, "5.5.1", "Command unrecognized")
LINE_TOO_LONG: Final = r(500, "5.5.2", "Line too long (RFC 5321 4.5.3.1.4)")
AUTH_LINE_TOO_LONG: Final = r(500, "5.5.6", "Authentication Exchange line is too long (RFC 4954 4)")
COMMAND_NOT_UTF8: Final = r(500, "5.5.2", "Command contains bytes that are not UTF-8")
NOT_IMPLEMENTED: Final = r(502, "5.5.1", "Command not implemented")
BDAT_AFTER_HELO: Final = r(
    502, "5.5.1", "BDAT is not offered: the session began with HELO, which offers no extensions; use DATA"
)
NEED_HELO: Final = r(503, "5.5.1", "Send EHLO or HELO first")
NESTED_MAIL: Final = r(503, "5.5.1", "Sender already given: send RSET to start a new transaction")
NEED_MAIL: Final = r(503, "5.5.1", "Send MAIL FROM first")
NO_VALID_RECIPIENTS: Final = r(554, "5.5.1", "No valid recipients")
MIXED_DATA_BDAT: Final = r(503, "5.5.1", "DATA and BDAT cannot be mixed in one transaction")
BDAT_IN_PROGRESS: Final = r(503, "5.5.1", "BDAT transfer in progress: send BDAT, RSET or QUIT")
ALREADY_TLS: Final = r(503, "5.5.1", "TLS already active")
TLS_IN_TRANSACTION: Final = r(503, "5.5.1", "STARTTLS not allowed during a mail transaction")
ALREADY_AUTHENTICATED: Final = r(503, "5.5.1", "Already authenticated")
AUTH_IN_TRANSACTION: Final = r(503, "5.5.1", "AUTH not allowed during a mail transaction")
AUTH_NOT_OFFERED: Final = r(503, "5.5.1", "AUTH not available")
AUTH_NEEDS_TLS: Final = r(538, "5.7.11", "Encryption required for requested authentication mechanism")
AUTH_UNKNOWN_MECHANISM: Final = r(504, "5.5.4", "Unrecognized authentication mechanism")
AUTH_CANCELLED: Final = r(501, "5.0.0", "Authentication cancelled")
AUTH_BAD_ENCODING: Final = r(501, "5.5.2", "Invalid base64 or SASL message")
AUTH_FAILED: Final = r(535, "5.7.8", "Authentication credentials invalid")
# RFC 4954 454 4.7.0: temporary. The lockout is not checked against the password at all.
AUTH_LOCKED_OUT: Final = r(454, "4.7.0", "Too many failed authentication attempts, try again later")
AUTH_BUSY: Final = r(454, "4.7.0", "Temporary authentication failure: too many checks waiting, try again later")


def credentials_revoked(user: str) -> Reply:
    """To MAIL or RCPT of a session whose user a reload removed or gave a new password, and
    then the connection closes. Not RFC 4954's 530: a 5xx to MAIL or RCPT makes a client on a
    cached connection bounce its mail, where a 421 makes it come back on a new connection and
    authenticate with the credentials it holds now."""
    shown = user.encode("ascii", "backslashreplace").decode("ascii")
    return r(421, "4.7.0", f"the credentials of {shown} were revoked: connect and authenticate again")


def authorization_lost(why: str) -> Reply:
    """To DATA, or the end of a message, of a transaction begun under an authorization (AUTH,
    `relay_networks`) that a reload withdrew meanwhile: temporary, so that the client keeps the
    message and sends it again under what holds now (RFC 3463 X.7.0: security or policy)."""
    return r(451, "4.7.0", f"Message not accepted: {why} during this transaction; send it again")


BAD_ADDRESS_SYNTAX_SENDER: Final = r(501, "5.1.7", "Bad sender address syntax")
BAD_ADDRESS_SYNTAX_RCPT: Final = r(501, "5.1.3", "Bad recipient address syntax")
NON_ASCII_WITHOUT_SMTPUTF8: Final = r(553, "5.6.7", "Non-ASCII address requires MAIL FROM with SMTPUTF8")
SMTPUTF8_NOT_OFFERED: Final = r(555, "5.5.4", "SMTPUTF8 is not offered by this server")
MESSAGE_TOO_BIG: Final = r(552, "5.3.4", "Message size exceeds fixed maximum message size")
# A command line (or SASL response) holding a CR that does not end it, or a NUL: refused, and
# the reply says which it found, so that a client's author knows what to look for.
COMMAND_BARE_CR: Final = r(501, "5.5.2", "Command contains a bare <CR>")
COMMAND_NUL: Final = r(501, "5.5.2", "Command contains a NUL")
COMMAND_BARE_CR_AND_NUL: Final = r(501, "5.5.2", "Command contains a bare <CR> and a NUL")
CONTENT_NUL: Final = r(554, "5.6.0", "Message contains a NUL octet (RFC 5322 2.3, RFC 6152 2)")
CONTENT_BARE_LF: Final = r(554, "5.6.0", "Message contains a bare <LF>; lines must end with <CR><LF> (RFC 5321 2.3.8)")
CONTENT_BARE_CR: Final = r(554, "5.6.0", "Message contains a bare <CR>; lines must end with <CR><LF> (RFC 5321 2.3.8)")
RELAY_DENIED: Final = r(550, "5.7.1", "Relay access denied")
# RFC 3463 3.2 X.1.1: a domain we receive mail for, an address there we do not (no route takes it).
UNKNOWN_RECIPIENT: Final = r(550, "5.1.1", "No such recipient here")
CANNOT_SIGN: Final = r(451, "4.3.0", "Cannot sign the message now (DKIM); try again later")
TOO_MANY_HOPS: Final = r(554, "5.4.6", "Too many hops: mail loop detected (RFC 5321 6.3)")
# A submission (after AUTH, or HTTP injection) that names no author: Pigeon completes one with
# its Date and Message-ID, but cannot know who wrote it, and Gmail and others refuse mail without.
CONTENT_NO_FROM: Final = r(
    554, "5.6.0", "Message has no From header field (RFC 5322 3.6 requires one): add From: with the author's address"
)


def syntax(text: str, enhanced: str = "5.5.2") -> Reply:
    """501: the arguments of a command are malformed. `text` says what is wrong."""
    return r(501, enhanced, text)


def bad_parameter(text: str) -> Reply:
    """555 (RFC 5321 4.1.1.11): a MAIL or RCPT parameter is not recognised or not allowed."""
    return r(555, "5.5.4", text)


def content_line_too_long(limit: int) -> Reply:
    return r(554, "5.6.0", f"Message has a line longer than {limit} octets (RFC 5322 2.1.1)")


def content_field_repeated(name: str) -> Reply:
    """A header section with a field RFC 5322 3.6 allows once there twice (two From: which one
    would DKIM and DMARC vouch for, which one would the reader see?)."""
    return r(554, "5.6.0", f"Message has more than one {name} header field (RFC 5322 3.6 allows one)")


def content_field_malformed(name: str, shown: str, problem: str) -> Reply:
    """A submission's Date or Message-ID field that is not of its RFC 5322 syntax (3.3, 3.6.4):
    a receiver refuses mail "missing a valid Message-ID" later, as a bounce. `shown` is its
    value made safe to show, `problem` what is wrong with it (`pigeon.header_section`)."""
    kind = "date" if name == "Date" else "msg-id"
    text = f'Message has a {name} header field that is not an RFC 5322 {kind}: "{shown}" {problem}'
    return r(554, "5.6.0", f"{text} (leave it out and Pigeon adds one)")


def no_room_now(size: int) -> Reply:
    """MAIL declared a SIZE the spool has no room for now, though it is under the maximum
    (RFC 1870 6.1: a temporary failure, the client tries again later)."""
    return r(452, "4.3.1", f"Insufficient system storage: no room for {size} octets now, try again later")


def message_too_big(limit: int) -> Reply:
    return r(552, "5.3.4", f"Message size exceeds fixed maximum message size of {limit} octets")
