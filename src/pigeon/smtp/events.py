"""Events the server session emits. Frozen, slotted, validated on creation.

Two kinds:

* **Decisions** (`Ehlo`, `Helo`, `MailFrom`, `RcptTo`, `Data`, `MessageEnd`, `StartTls`,
  `AuthCredentials`): the session waits until the application answers with
  `ServerSession.respond()`. A positive reply (2xx/3xx) moves the session on; a negative
  one leaves it where it was.
* **Notices** (`DataChunk`, `Rejected`, `TransactionReset`, `Closing`): information only.

Commands the session answers by itself (NOOP, RSET, VRFY, HELP, QUIT, every syntax and
sequence error) produce no decision: a `Rejected` notice reports each error reply it sent,
so the application can log it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, Final

from pigeon.smtp.replies import Reply


class BodyType(enum.Enum):
    """The BODY parameter of MAIL (RFC 6152)."""

    SEVEN_BIT = "7BIT"
    EIGHT_BIT_MIME = "8BITMIME"


class Ret(enum.Enum):
    """DSN RET (RFC 3461 4.3): what a bounce should carry of the original message."""

    FULL = "FULL"
    HDRS = "HDRS"


class Notify(enum.Enum):
    """DSN NOTIFY values (RFC 3461 4.1)."""

    NEVER = "NEVER"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    DELAY = "DELAY"


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()
"""Returned by `next_event()` when the session needs more bytes from the peer."""


class Decision:
    """Base of the events that the application must answer with `respond()`."""

    __slots__ = ()
    verb: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class Ehlo(Decision):
    domain: str
    verb = "EHLO"


@dataclass(frozen=True, slots=True)
class Helo(Decision):
    domain: str
    verb = "HELO"


@dataclass(frozen=True, slots=True)
class MailFrom(Decision):
    """MAIL FROM. `sender` is "" for the null reverse-path."""

    sender: str
    size: int | None = None
    body: BodyType | None = None
    smtputf8: bool = False
    ret: Ret | None = None
    envid: str | None = None
    auth: str | None = None
    verb = "MAIL"

    def __post_init__(self) -> None:
        if self.size is not None and self.size < 0:
            raise ValueError("SIZE must not be negative")


@dataclass(frozen=True, slots=True)
class RcptTo(Decision):
    recipient: str
    notify: frozenset[Notify] | None = None
    orcpt: str | None = None
    verb = "RCPT"

    def __post_init__(self) -> None:
        if self.notify is not None and Notify.NEVER in self.notify and len(self.notify) > 1:
            raise ValueError("NOTIFY=NEVER cannot be combined with other values")

    @property
    def domain(self) -> str:
        """The domain part, lower-cased ("" for a bare postmaster)."""
        _, at, domain = self.recipient.rpartition("@")
        return domain.lower() if at else ""


@dataclass(frozen=True, slots=True)
class Data(Decision):
    """The DATA command: answer 354 to receive the content, or refuse."""

    verb = "DATA"


@dataclass(frozen=True, slots=True)
class MessageEnd(Decision):
    """The whole message arrived and passed the content checks. Answer after storing it."""

    size: int
    chunked: bool
    verb = "DATA"


@dataclass(frozen=True, slots=True)
class StartTls(Decision):
    """STARTTLS: answer 220, then upgrade the transport and call `tls_established()`."""

    verb = "STARTTLS"


@dataclass(frozen=True, slots=True)
class AuthCredentials(Decision):
    """A complete SASL PLAIN or LOGIN exchange: check the password, answer 235 or 535."""

    mechanism: str
    username: str
    password: str = ""
    authzid: str = ""
    verb = "AUTH"

    def __repr__(self) -> str:  # never print a password
        return f"AuthCredentials(mechanism={self.mechanism!r}, username={self.username!r})"


@dataclass(frozen=True, slots=True)
class DataChunk:
    """Message content, already unstuffed and checked. Append it to the message."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Rejected:
    """The session answered a command with an error reply by itself.

    `command`: the verb the client gave (at most 16 octets, ASCII letters in capitals; bytes
    that are not UTF-8 as surrogate escapes, as `recipient`); AUTH for a SASL response, none of
    which is kept. The 421 after the error past max_errors names the command of that error.

    `recipient`: for a refused RCPT, the address as the client gave it, so that the refusal
    can name whom it refused, even when the line did not parse (then the path between its
    angle brackets, or the argument's first word). Bytes that are not UTF-8 are kept as
    surrogate escapes: escape it before showing it (`pigeon.logs.peer_text`).

    `sender`: for a refused MAIL, the sender it gave (as `recipient`, as given, however
    malformed the line); else the open transaction's sender when the command was refused
    (None: none was open), taken then because a refused message (bare LF, a line or the
    whole too long) ends the transaction before the event is read."""

    command: str
    reply: Reply
    recipient: str | None = None
    sender: str | None = None


@dataclass(frozen=True, slots=True)
class TransactionReset:
    """The open mail transaction is gone (RSET, EHLO, a refused message): drop its data."""


@dataclass(frozen=True, slots=True)
class Closing:
    """The session is over: write what `data_to_send()` holds, then close the connection.

    `reply` is the last reply sent (221, 421, ...), or None when the peer closed first.
    """

    reply: Reply | None


Event = (
    Ehlo
    | Helo
    | MailFrom
    | RcptTo
    | Data
    | MessageEnd
    | StartTls
    | AuthCredentials
    | DataChunk
    | Rejected
    | TransactionReset
    | Closing
)
DecisionEvent = Ehlo | Helo | MailFrom | RcptTo | Data | MessageEnd | StartTls | AuthCredentials
"""The events that wait for `ServerSession.respond()`."""
