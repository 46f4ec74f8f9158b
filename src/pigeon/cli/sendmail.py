"""`pigeon sendmail`: the sendmail(1) command line that cron, PHP's mail(), logwatch and the like
call, for a machine whose sendmail Pigeon replaces (`ln -s "$(command -v pigeon)"
/usr/sbin/sendmail`: invoked as `sendmail`, `pigeon` is this command).

It submits over SMTP to the node's own listener on loopback, which `[smtp] relay_networks`
lets relay by default: any local user may send without a token or root (cron jobs run as their
users), and the mail goes through the same door as any other, with its checks (SIZE, the
policy hooks, SMTPUTF8) and a 250 only once it is in the spool. Nothing is queued here: when
the node cannot take the message now, the caller hears so (75, EX_TEMPFAIL).

The node leaves a relay client's header section as it came, so what it checks only in a
submission (an empty From, a Date or Message-ID not of its syntax) is checked here, with its
functions and words; and SMTPUTF8 is asked for by the rule every door follows
(`pigeon.smtp.client.needs_smtputf8`, `utf8_header`). What this command adds (its Received
field, and the From, Date and Message-ID a message lacks) the node cannot tell from the
caller's octets: it counts them against `[smtp] max_message_size` (`Added`).
"""

from __future__ import annotations

import contextlib
import email.header
import email.utils
import os
import pwd
import re
import secrets
import select
import smtplib
import socket
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pigeon.cli.common import os_reason
from pigeon.config.load import ConfigError, load_keys, read_text
from pigeon.config.schema import split_endpoint
from pigeon.header_section import author_missing_in, malformed_field_in
from pigeon.logs.peer_text import shown, shown_value
from pigeon.smtp import replies
from pigeon.smtp.address import check, control_or_format_character, with_a_label
from pigeon.smtp.client import Recipient, needs_smtputf8, utf8_header

# sysexits.h, as sendmail and Postfix's sendmail exit.
OK: Final = 0
USAGE: Final = 64  # EX_USAGE: a bad option, no recipient
DATAERR: Final = 65  # EX_DATAERR: the node refused the sender or the message for good
NOUSER: Final = 67  # EX_NOUSER: the node refused a recipient for good
UNAVAILABLE: Final = 69  # EX_UNAVAILABLE: the node refuses service for good (a 5xx greeting)
SOFTWARE: Final = 70  # EX_SOFTWARE: a fault of this command
TEMPFAIL: Final = 75  # EX_TEMPFAIL: nothing sent; the node is down or answered 4xx: try again
PROTOCOL: Final = 76  # EX_PROTOCOL: the connection went after the message was sent, before the answer
NOPERM: Final = 77  # EX_NOPERM: the node refused the sender or the message by policy (5.7.x)
CONFIG: Final = 78  # EX_CONFIG: the configuration file given cannot be read or names no address

DEFAULT_CONFIG: Final = Path("/etc/pigeon/pigeon.toml")
"""Read when neither -C nor $PIGEON_CONFIG names a file, if it exists (the README's place)."""
UNREADABLE_CONFIG_ADDRESS: Final = "127.0.0.1:25"
"""Where a user who may not read the default config file (0640, it holds token secrets)
submits: the SMTP port on loopback, where the node that replaces the machine's MTA listens."""
TIMEOUT: Final = 300.0
"""Seconds for each SMTP exchange (RFC 5321 4.5.3.2's are 5 to 10 minutes)."""

USAGE_TEXT: Final = """\
usage: pigeon sendmail [options] [--] [recipient ...] < message
       sendmail [options] [recipient ...] < message      (pigeon invoked as `sendmail`)

The sendmail(1) interface: the message on stdin, submitted over SMTP to the node's own listener.
  -t            recipients also from the message's To, Cc and Bcc (the Bcc field is removed)
  -f ADDRESS    envelope sender (-r too; "<>" or "" for the null sender; of "Name <addr>"
                the address; "user" is user@[smtp] hostname); default: the invoking user
  -F NAME       the full name for the From field added to a message without one
  -i, -oi       a line with a lone "." is text, not the end of the message
  -C FILE       Pigeon's configuration file (-c too; default: $PIGEON_CONFIG, else
                /etc/pigeon/pigeon.toml if it exists, else the built-in defaults)
  -N DSN        NOTIFY= for each recipient (never, or success,delay,failure)
  -R RET        RET= for the message (full or hdrs); -V ENVID: ENVID=
  -v            show the SMTP dialogue on stderr
  -bs           speak SMTP on stdin and stdout (relayed to the node's listener)
  -bi           newaliases: nothing to do (no aliases here); -bp (mailq): see `pigeon queue list`
  ignored, as Postfix's sendmail ignores them: -bm, -m, -n, -U, -G, -oXXX (but -oi),
                and with an argument -B, -L, -h, -O, -X
exit status (sysexits.h): 0 sent, 64 usage, 65 sender or message refused, 67 a recipient
  refused, 69 service refused, 70 internal error, 75 try again later (node down, 4xx),
  76 connection lost after the message went (it may have been accepted), 77 refused by
  policy (5.7.x), 78 configuration
"""

_FLAGS: Final = frozenset("timnUG")
"""Options without an argument (-i and -t mean something; the others are ignored)."""
_WITH_ARGUMENT: Final = frozenset("frFCcNRVBLhOXo")
"""Options that take an argument, attached (-fme@x) or as the next word (-f me@x)."""
_MODES: Final = {"m": "mail", "s": "smtp", "i": "aliases", "p": "queue"}
"""-bm (the default), -bs, -bi (newaliases) and -bp (mailq)."""
_UNSUPPORTED: Final = {
    "b": "only -bm (deliver mail, the default), -bs, -bi and -bp are supported: no daemon here",
    "q": "there is no queue to run here: the node delivers on its own (see `pigeon queue`)",
    "I": "there are no aliases here (newaliases)",
}


class UsageError(Exception):
    """A command line sendmail would refuse (EX_USAGE)."""


@dataclass
class Options:
    recipients: list[str] = field(default_factory=list)
    extract: bool = False  # -t
    dots: bool = True  # a lone "." ends the message (cleared by -i, -oi)
    sender: str | None = None
    full_name: str | None = None
    config: Path | None = None
    notify: str | None = None
    ret: str | None = None
    envid: str | None = None
    verbose: bool = False
    mode: str = "mail"  # -bs: "smtp", -bi: "aliases", -bp: "queue"


def parse(argv: Sequence[str]) -> Options:
    """The options and recipients of a sendmail command line (POSIX getopt: options first,
    `--` or the first word that is none ends them)."""
    options = Options()
    words = list(argv)
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":
            break
        if not word.startswith("-") or word == "-":
            index -= 1
            break
        letters = word[1:]
        while letters:
            letter, letters = letters[0], letters[1:]
            if letter in _WITH_ARGUMENT:
                if letters:
                    value, letters = letters, ""
                elif index < len(words):
                    value, index = words[index], index + 1
                else:
                    raise UsageError(f"option -{letter} needs an argument")
                _take(options, letter, value)
            elif letter in _FLAGS:
                if letter == "t":
                    options.extract = True
                elif letter == "i":
                    options.dots = False
            elif letter == "b" and letters in _MODES:
                options.mode, letters = _MODES[letters], ""
            elif letter == "v":
                options.verbose = True
            elif letter in _UNSUPPORTED:
                raise UsageError(f"-{letter}{letters}: {_UNSUPPORTED[letter]}")
            else:
                raise UsageError(f"unknown option -{letter}")
    for word in words[index:]:
        _no_control(word, "a recipient")
    options.recipients = [address for word in words[index:] for address in _split_list(word)]
    return options


_NOTIFY: Final = re.compile(r"NEVER|(?:SUCCESS|DELAY|FAILURE)(?:,(?:SUCCESS|DELAY|FAILURE))*")
"""RFC 3461 4.1: NEVER alone, or a list of SUCCESS, DELAY and FAILURE."""


def _take(options: Options, letter: str, value: str) -> None:
    if letter not in "Cc":  # (a file name is the system's business)
        # A CR or LF would end the SMTP command it goes into, or the field it fills (-F):
        # what follows would be a command or a header field of the caller's choosing.
        _no_control(value, f"-{letter}")
    if letter in "fr":
        options.sender = envelope_sender(value)
    elif letter == "F":
        options.full_name = value
    elif letter in "Cc":
        options.config = Path(value)
    elif letter == "N":
        if not _NOTIFY.fullmatch(value.upper().replace(" ", "")):
            raise UsageError(f"-N {value!r}: give never, or one or more of success,delay,failure")
        options.notify = value.upper().replace(" ", "")
    elif letter == "R":
        if value.upper() not in ("FULL", "HDRS"):
            raise UsageError(f"-R {value!r}: give full or hdrs")
        options.ret = value.upper()
    elif letter == "V":
        if not value.isascii():
            raise UsageError("-V: an envelope id is printable ASCII (RFC 3461 4.4)")
        options.envid = value
    elif letter == "o" and value == "i":
        options.dots = False  # -oi; every other -o option is ignored, as Postfix ignores them
    # -B (body type: told by the message's bytes), -L, -h, -O, -X: ignored


def _no_control(value: str, what: str) -> None:
    named = control_or_format_character(value)
    if named is not None:
        raise UsageError(f"{what} '{shown(value)}' holds {named}: no control characters allowed")


def envelope_sender(value: str) -> str:
    """The address of -f's argument, as Postfix's sendmail takes it: "<>" or nothing is the
    null sender; of "Name <addr>" or "addr (comment)" the address; blanks around are no part
    of it. Anything else than one address is refused (an "a@b> ENVID=x" would otherwise add
    a parameter of its own to MAIL FROM). Returned unqualified: `run` adds the domain."""
    value = value.strip()
    if value in ("", "<>"):
        return ""
    # Read as a recipient is, not with email.utils.getaddresses: of "John Doe" (no address)
    # that made "John", sent as MAIL FROM:<John@host>, where bounces would go to nobody meant.
    pieces = [piece for piece in _pieces(value) if piece.strip()]
    address = _address_in(pieces[0]) if len(pieces) == 1 else None
    if address is None:
        raise UsageError(f"-f {value!r}: not an address (give one: user@example.org, or Name <user@example.org>)")
    return address


def _split_list(word: str) -> list[str]:
    """The addresses of a recipient argument, read as Postfix's sendmail reads one (an address
    list): "a@x, b@y" is two; of "Name <a@x>" or "a@x (comment)" the address; a source route
    ("@relay:a@x", "<@r1,@r2:a@x>", RFC 5321 4.1.2 and C) is dropped, as Postfix drops it.
    What is no address is refused naming it (UsageError): sent as it was, the node would get
    a part of it ("a@b@x" gave RCPT TO:<@x>), or refuse it with a reply that names no argument."""
    addresses: list[str] = []
    for piece in _pieces(word):
        text = piece.strip()
        if not text:
            continue  # ("a@x," or "a@x,,b@y": as Postfix, nothing between commas is nothing)
        address = _address_in(text)
        if address is None:
            shown_piece = "" if text == word.strip() else f": {shown(text)!r} is not an address"
            raise UsageError(
                f"recipient '{shown(word)}'{shown_piece or ' is not an address'} (give user@example.org,"
                " Name <user@example.org>, or several separated by commas)"
            )
        addresses.append(address)
    return addresses


def _address_in(text: str) -> str | None:
    """The address `text` (one piece of an address list, comments gone) names, or None if it
    names none: of "Name <a@x>" the address, a source route dropped; a local part alone
    ("root") is one, which `run` qualifies."""
    text = text.strip()
    address = text
    if text.endswith(">") and "<" in text:  # (a display name before it is no part of it)
        address = text[text.rindex("<") + 1 : -1].strip()
    if address.startswith("@") and ":" in address:
        address = address.split(":", 1)[1].strip()
    # (A local part alone is checked with a domain: `check` wants a mailbox.)
    if not address or check(address if "@" in address else f"{address}@example.org") is not None:
        return None
    return address


def _pieces(word: str) -> list[str]:
    """`word` split at its commas that separate addresses (not those in a quoted string, in
    angle brackets (a source route's) or in a comment), its comments made a space."""
    pieces: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    depth = 0  # of comments
    angle = False
    for char in word:
        if escaped:
            escaped = False
            if not depth:
                current.append(char)
        elif char == "\\" and (quoted or depth):
            escaped = True
            if not depth:
                current.append(char)
        elif depth:
            depth += {"(": 1, ")": -1}.get(char, 0)
            if not depth:
                current.append(" ")
        elif quoted:
            quoted = char != '"'
            current.append(char)
        elif char == "(":
            depth = 1
        elif char == "," and not angle:
            pieces.append("".join(current))
            current = []
        else:
            quoted = char == '"'
            angle = (angle or char == "<") and char != ">"
            current.append(char)
    pieces.append("".join(current))
    return pieces


@dataclass
class Node:
    """Where to submit, and the domain of an address without one."""

    host: str
    port: int
    domain: str
    max_line: int = 998
    """`[smtp] max_line_length`: the longest line the node takes (RFC 5322 2.1.1's 998)."""


def find_node(options: Options) -> Node:
    """The node's SMTP listener from the configuration: -C, else $PIGEON_CONFIG, else the
    default file if it exists; a loopback address of `[smtp] listen` first (a wildcard is
    reached on loopback), since loopback is what `relay_networks` lets relay by default."""
    given = options.config or (Path(os.environ["PIGEON_CONFIG"]) if os.environ.get("PIGEON_CONFIG") else None)
    path = given or (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    hostname = socket.gethostname()  # ([smtp] hostname's default)
    if path is None:
        return Node("127.0.0.1", 2525, hostname)  # (the built-in [smtp] listen)
    try:
        read_text(path)
    except ConfigError as error:
        if given is not None or not isinstance(error.__context__, PermissionError):
            raise
        # The README's config is 0640 (it holds secrets): a cron job's user may not read it.
        host, port = split_endpoint(UNREADABLE_CONFIG_ADDRESS)
        return Node(host, port, hostname)
    config = load_keys(path, [("smtp", "listen"), ("smtp", "hostname"), ("smtp", "max_line_length")])
    if config is None:
        raise ConfigError(f"{path}: [smtp] listen or [smtp] hostname does not load: see `pigeon serve --check`")
    endpoints = [(e.host, e.port) for e in config.smtp.listen]
    endpoints.sort(key=lambda endpoint: not _loopback_or_wildcard(endpoint[0]))
    host, port = endpoints[0]
    if port == 0:
        raise ConfigError(f"{path}: [smtp] listen {config.smtp.listen[0]!r} has port 0: no port to submit to")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    # ("[192.0.2.1]" too: user@[192.0.2.1] is an address)
    return Node(host, port, config.smtp.hostname, config.smtp.max_line_length)


def _loopback_or_wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::", "::1", "localhost") or host.startswith("127.")


_FIELD_NAME: Final = re.compile(rb"[!-9;-~]+[ \t]*:")


@dataclass
class Message:
    """A message as read from stdin: its header fields (each with its folded lines, as read)
    and its body, lines ending in CRLF."""

    fields: list[bytes]
    body: bytes

    def named(self, name: str) -> list[bytes]:
        """The values of the fields called `name`, unfolded."""
        wanted = name.lower().encode()
        return [
            re.sub(rb"\r\n[ \t]", b" ", line.split(b":", 1)[1]).strip()
            for line in self.fields
            if line.split(b":", 1)[0].strip().lower() == wanted
        ]

    def without(self, name: str) -> None:
        wanted = name.lower().encode()
        self.fields = [line for line in self.fields if line.split(b":", 1)[0].strip().lower() != wanted]

    def content(self, max_line: int = 998) -> bytes:
        """The message as submitted: a line over `max_line` octets is broken (see `_fitted`)."""
        fields = b"".join(_fitted(line, max_line, b" ") for lines in self.fields for line in lines.split(b"\r\n")[:-1])
        body = b"".join(_fitted(line, max_line, b"") for line in self.body.split(b"\r\n")[:-1])
        return fields + b"\r\n" + body


def _fitted(line: bytes, limit: int, continuation: bytes) -> bytes:
    """`line` (without its CRLF) with its CRLF, broken into lines of at most `limit` octets,
    which the node refuses longer (554 5.6.0, RFC 5322 2.1.1), as Postfix's smtp client breaks
    them (`smtp_line_length_limit`). In the header section (`continuation` b" ") a field is
    folded, at its last white space that fits, else anywhere with a space put in; in the body
    the line goes on on the next one. Never inside a UTF-8 character."""
    lines: list[bytes] = []
    while len(line) > limit:
        cut = limit
        if continuation:
            cut = max(line.rfind(b" ", 1, limit + 1), line.rfind(b"\t", 1, limit + 1))
            if cut <= 0 or not line[cut:].strip():  # (no continuation line of white space only)
                cut = limit
        while cut > 1 and 0x80 <= line[cut] < 0xC0:  # a UTF-8 continuation octet
            cut -= 1
        lines.append(line[:cut])
        line = line[cut:] if line[cut : cut + 1] in (b" ", b"\t") else continuation + line[cut:]
    lines.append(line)
    return b"".join(line + b"\r\n" for line in lines)


def read_message(stream: Iterable[bytes], dots: bool) -> Message:
    """The message from its lines; with `dots`, a line with a lone "." ends it (what follows is
    not read, as sendmail reads it). Line ends become CRLF, as SMTP sends them; a first line
    "From sender date" (mbox's envelope line) is dropped, as sendmail drops it.

    What the node refuses (554 5.6.0), and sendmail's callers write (cron mails a job's output
    whatever it is), is made valid here: a bare CR ends a line as a LF does (a progress bar's
    " 10%\r 50%\r100%" is three lines, where a terminal showed the last over the others; in
    a header field it folds the field), and a NUL is dropped. Long lines are broken by
    `Message.content`."""
    lines: list[list[bytes]] = []  # each line read, split at its bare CRs
    for number, raw in enumerate(stream):
        line = raw.removesuffix(b"\n").removesuffix(b"\r")
        if dots and line == b".":
            break
        if number == 0 and line.startswith(b"From ") and not _FIELD_NAME.match(line):
            continue
        lines.append(line.replace(b"\0", b"").split(b"\r"))
    fields: list[bytes] = []
    at = 0
    while at < len(lines):
        first, *more = lines[at]
        if fields and first[:1] in (b" ", b"\t"):
            fields[-1] += _header_lines(first, more)
        elif _FIELD_NAME.match(first):
            fields.append(_header_lines(first, more))
        else:
            break
        at += 1
    if at < len(lines) and lines[at] == [b""]:
        at += 1  # the blank line that ends the header section (added back by `content`)
    return Message(fields, b"".join(b"\r\n".join(pieces) + b"\r\n" for pieces in lines[at:]))


def _header_lines(first: bytes, more: list[bytes]) -> bytes:
    """A header line split at bare CRs, as folded lines: each one after the first starts with
    white space (RFC 5322 2.2.3), and none is white space only."""
    folded = [piece if piece[:1] in (b" ", b"\t") else b" " + piece for piece in more if piece.strip()]
    return b"".join(line + b"\r\n" for line in [first, *folded])


def complete(message: Message, sender: str, full_name: str, domain: str) -> list[bytes]:
    """Add the From, Date and Message-ID a message lacks (Pigeon adds a Date and a Message-ID
    only to mail submitted with AUTH, and refuses one without From); remove its Bcc and
    Resent-Bcc (RFC 5322 3.6.6: "Resent-Bcc" as "Bcc"). The fields added: the node counts
    them against `[smtp] max_message_size` (`Added`)."""
    message.without("bcc")
    message.without("resent-bcc")
    added: list[bytes] = []
    if not message.named("from"):
        author = f"{_display_name(full_name)} <{sender}>" if full_name else sender
        added.append(f"From: {author}\r\n".encode())
    if not message.named("date"):
        added.append(f"Date: {email.utils.formatdate(localtime=True)}\r\n".encode())
    if not message.named("message-id"):
        added.append(f"Message-ID: <{secrets.token_hex(11)}@{domain}>\r\n".encode())
    message.fields += added
    return added


def _display_name(name: str) -> str:
    """`name` as a display name: an RFC 2047 encoded word if it is not ASCII, quoted if it
    holds specials (what `email.utils.formataddr` does, which cannot take a non-ASCII
    address: SMTPUTF8 sends one, RFC 6532)."""
    if not name.isascii():
        return email.header.Header(name, "utf-8").encode()
    if re.search(r'[][\\()<>@,:;".]', name):
        return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return name


def trace_field(hostname: str, uid: int) -> bytes:
    """The Received field that says which local user submitted the message (any user may give
    any -f), as Postfix's "(Postfix, from userid 33)", in the form of the node's own for mail
    it makes itself (RFC 5322 3.6.7); the node adds its own above it."""
    date = email.utils.formatdate(localtime=True)
    return f"Received: by {hostname} (Pigeon sendmail, from userid {uid});\r\n\t{date}\r\n".encode()


_ADDRESS_FIELD_NAMES: Final = ("from", "sender", "reply-to", "to", "cc")
_ADDRESS_FIELDS: Final = frozenset([*_ADDRESS_FIELD_NAMES, *(f"resent-{name}" for name in _ADDRESS_FIELD_NAMES)])


def qualify_fields(message: Message, domain: str) -> None:
    """Add @domain to the bare addresses ("root", cron's `From: root (Cron Daemon)`) of the
    message's address fields, as Postfix's cleanup does for local submissions
    (`append_at_myorigin`): a next hop may refuse such a field (RFC 5322 3.4.1 wants a domain).
    Only the addresses change: names, comments and the rest of the field stay as they are."""
    if not domain:
        return
    for index, line in enumerate(message.fields):
        name, _, value = line.partition(b":")
        if name.strip().lower().decode("ascii", "replace") not in _ADDRESS_FIELDS:
            continue
        text = value.decode("utf-8", "surrogateescape")
        qualified = _qualified_list(text, domain)
        if qualified != text:
            message.fields[index] = name + b":" + qualified.encode("utf-8", "surrogateescape")


def _qualified_list(text: str, domain: str) -> str:
    """An address list (RFC 5322 3.4) with "@domain" after each address that has no "@".
    Each mailbox's address is what is in its angle brackets, else its text outside comments;
    quoted strings and comments are skipped over, a group's name too."""
    at_ends: list[int] = []  # where "@domain" goes

    class Part:  # the address of a mailbox, or its display name until a "<"
        def __init__(self) -> None:
            self.text: list[str] = []
            self.end = 0  # after its last character that is no white space

    part, in_angle, after_angle = Part(), False, False
    depth, quoted, escaped = 0, False, False

    def mailbox_ends() -> None:
        address = "".join(part.text).strip()
        if address and "@" not in address and not any(c.isspace() for c in address):
            at_ends.append(part.end)

    for at, char in enumerate(text):
        if escaped or quoted or depth:
            if depth:
                depth += {"(": 1, ")": -1}.get(char, 0) if not escaped else 0
            elif not after_angle:
                part.text.append(char)
                part.end = at + 1
                quoted = quoted and (escaped or char != '"')
            escaped = not escaped and char == "\\"
            continue
        if char == "(":
            depth = 1
        elif char in ",;":
            mailbox_ends()
            part, in_angle, after_angle = Part(), False, False
        elif char == ":" and not in_angle:
            part = Part()  # what came before was a group's name
        elif char == "<" and not in_angle and not after_angle:
            part, in_angle = Part(), True  # what came before was the display name
        elif char == ">" and in_angle:
            in_angle, after_angle = False, True
        elif not after_angle:
            part.text.append(char)
            if not char.isspace():
                part.end = at + 1
            quoted = char == '"'
    mailbox_ends()
    for end in reversed(at_ends):
        text = f"{text[:end]}@{domain}{text[end:]}"
    return text


def header_recipients(message: Message) -> list[str]:
    """The addresses of the message's To, Cc and Bcc fields (groups' members included)."""
    values = [v.decode("utf-8", "replace") for name in ("to", "cc", "bcc") for v in message.named(name)]
    return [address for _, address in email.utils.getaddresses(values) if address]


@dataclass(frozen=True)
class Added:
    """What this command put in the message it submits, which the node counts against `[smtp]
    max_message_size` as the caller's own octets: it cannot tell them from the caller's (a
    field recognised by its look, any client could write), so they count, and a refusal for
    size names each (`size_refused`). The other doors count neither our Received field nor the
    Date and Message-ID the node adds to a submission: there the node knows them for its own."""

    received: int
    """The octets of the Received field put first (`trace_field`)."""
    fields: tuple[str, ...] = ()
    """The names of the fields the message lacked and got (`complete`), in their order."""
    octets: int = 0
    """Theirs, as submitted."""


class Refused(Exception):
    """The submission failed: `status` to exit with, `reason` to print."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _reply(code: int, text: bytes) -> str:
    return shown(f"{code} {text.decode('utf-8', 'replace')}".replace("\n", " "), None)


def _status_of(code: int, text: bytes, permanent: int) -> int:
    if 400 <= code < 500:
        return TEMPFAIL
    return NOPERM if text.startswith(b"5.7.") else permanent


def submit(
    node: Node, sender: str, recipients: list[str], options: Options, data: bytes, own: Added = Added(0)
) -> list[str]:
    """Send the message; the recipients refused for good (with their replies). Raises `Refused`
    when nothing was sent, or it is not known whether it was; when one recipient is refused for
    now (4xx) nothing is sent, so that the caller's retry sends it to no one twice.

    It goes in one SMTP transaction, or, when the node takes fewer recipients in one (`452
    4.5.3`, `[smtp] max_recipients`), in as many as it needs, as RFC 5321 4.5.3.1.10 asks: each
    on a connection of its own, every envelope taken before any message is sent, so that a 4xx
    in the last one still leaves nothing sent. `own`: what this command wrote in `data` (its
    Received field first, and the fields it completed the message with). The node counts them
    against `[smtp] max_message_size`, so SIZE= declares them too: a message the node will
    refuse is refused at MAIL, before its content is sent, and the error says that they were
    counted (`size_refused`)."""
    where = f"[{node.host}]:{node.port}" if ":" in node.host else f"{node.host}:{node.port}"
    clients: list[smtplib.SMTP] = []
    sent: list[str] = []
    try:
        return _submit(node, where, clients, sender, recipients, options, data, own, sent)
    except Refused as error:
        if not sent:
            raise
        # (An earlier transaction's message was taken: say to whom, so that it is not sent
        # to them again.)
        unsent = [r for r in recipients if r not in sent]
        raise Refused(
            error.status,
            f"{error.reason}; sent to {_named(sent)}, not to {_named(unsent)} (send it again to those only)",
        ) from None
    finally:
        for client in clients:
            if client.sock is not None:
                with contextlib.suppress(smtplib.SMTPException, OSError):
                    client.quit()
            client.close()


def _named(addresses: list[str]) -> str:
    return ", ".join(f"<{shown(address)}>" for address in addresses)


def _submit(
    node: Node,
    where: str,
    clients: list[smtplib.SMTP],
    sender: str,
    recipients: list[str],
    options: Options,
    data: bytes,
    own: Added,
    sent: list[str],
) -> list[str]:
    transactions: list[tuple[smtplib.SMTP, list[str]]] = []
    refused: list[str] = []
    later: list[str] = []
    left = recipients
    try:
        while left and not later:
            client = _connected(node, where, options)
            clients.append(client)
            accepted, left = _envelope(client, sender, left, options, data, own, refused, later)
            transactions.append((client, accepted))
        if later:
            raise Refused(TEMPFAIL, "; ".join(later + refused) + ": nothing sent, try again later")
        if not any(accepted for _, accepted in transactions):
            raise Refused(NOUSER, "; ".join(refused) + ": nothing sent")
        for client, accepted in transactions:
            if accepted:
                _message(client, data, own)
                sent += accepted
        return refused
    except smtplib.SMTPServerDisconnected as error:  # (before the message went: `_message`)
        raise Refused(TEMPFAIL, f"the Pigeon node at {where} closed the connection ({error})") from None
    except OSError as error:
        raise Refused(TEMPFAIL, f"the connection to the Pigeon node at {where} failed ({os_reason(error)})") from None


def _connected(node: Node, where: str, options: Options) -> smtplib.SMTP:
    """A connection to the node, greeted and past EHLO."""
    # (Not `with`: its QUIT raises on a reply other than 221, which would hide why it failed.)
    client = smtplib.SMTP(timeout=TIMEOUT, local_hostname=node.domain or "localhost")
    client.set_debuglevel(1 if options.verbose else 0)
    try:
        code, text = client.connect(node.host, node.port)
    except OSError as error:
        client.close()
        raise Refused(
            TEMPFAIL, f"cannot reach the Pigeon node at {where} ({os_reason(error)}): nothing sent, try again later"
        ) from None
    if code != 220:
        client.close()
        raise Refused(TEMPFAIL if code < 500 else UNAVAILABLE, f"{where} greeted with {_reply(code, text)}")
    code, text = client.ehlo()
    if code != 250:
        client.close()
        raise Refused(TEMPFAIL if code < 500 else UNAVAILABLE, f"{where} answered EHLO {_reply(code, text)}")
    return client


def _too_many(code: int, text: bytes) -> bool:
    """A RCPT's reply that says the transaction has all the recipients it takes (RFC 5321
    4.5.3.1.10): the rest go in another."""
    return code == 452 and text.startswith(b"4.5.3")


def _envelope(
    client: smtplib.SMTP,
    sender: str,
    recipients: list[str],
    options: Options,
    data: bytes,
    own: Added,
    refused: list[str],
    later: list[str],
) -> tuple[list[str], list[str]]:
    """MAIL and RCPTs of one transaction: the recipients taken, and those left for another
    (after a `452 4.5.3`). Those refused go in `refused` (for good) and `later` (for now)."""
    # Pigeon's one rule, as every other door asks (README): SMTPUTF8 for an address that is
    # not ASCII once its domain is an A-label (as it goes: `with_a_label`), or for UTF-8 in
    # the header section where offered; Latin-1 there is legacy 8-bit mail (BODY=8BITMIME).
    needed = needs_smtputf8(sender, [Recipient(recipient) for recipient in recipients])
    mail = [f"SIZE={len(data)}"] if client.has_extn("size") else []
    if not data.isascii() and client.has_extn("8bitmime"):
        mail.append("BODY=8BITMIME")
    if (needed or utf8_header(data)) and client.has_extn("smtputf8"):
        mail.append("SMTPUTF8")
        client.command_encoding = "utf-8"
    elif needed:
        raise Refused(DATAERR, "the node does not offer SMTPUTF8, which a non-ASCII address needs")
    dsn = client.has_extn("dsn")
    if dsn and options.ret:
        mail.append(f"RET={options.ret}")
    if dsn and options.envid:
        mail.append(f"ENVID={_xtext(options.envid)}")
    code, text = client.docmd("MAIL", f"FROM:<{with_a_label(sender)}>{''.join(' ' + m for m in mail)}")
    if code != 250:
        if _too_big(code, text):  # (SIZE=: the sender is not the matter)
            raise Refused(_status_of(code, text, DATAERR), _refused_for_size(client, len(data), own, code, text))
        raise Refused(_status_of(code, text, DATAERR), f"sender <{shown(sender)}> refused: {_reply(code, text)}")
    rcpt = f" NOTIFY={options.notify}" if dsn and options.notify else ""
    accepted: list[str] = []
    for index, recipient in enumerate(recipients):
        code, text = client.docmd("RCPT", f"TO:<{with_a_label(recipient)}>{rcpt}")
        if code in (250, 251):
            accepted.append(recipient)
        elif _too_many(code, text) and accepted:
            return accepted, recipients[index:]
        else:
            (later if 400 <= code < 500 else refused).append(f"<{shown(recipient)}>: {_reply(code, text)}")
    return accepted, []


def _too_big(code: int, text: bytes) -> bool:
    """A reply that refuses the message for its size (RFC 1870 6, RFC 3463 X.3.4)."""
    return code == 552 or text.startswith((b"5.3.4", b"4.3.4"))


def size_refused(submitted: int, own: Added, limit: int | None) -> str:
    """Why a message was refused for its size, for the one who sent it through this command:
    the size it went in with, the node's limit, and that the limit counts what this command
    put in (`own`): the Received field it puts first, as Postfix counts what its sendmail
    adds, and the From, Date or Message-ID it added, with the size without them. Without that
    a message the caller measured at the limit seems refused for nothing."""
    over = f"over the node's limit of {limit} octets" if limit else "over the node's limit"
    why = (
        f"{submitted} octets as submitted, {over} ([smtp] max_message_size), which counts the Received"
        f" field sendmail puts first ({own.received} octets), as Postfix counts its sendmail's"
    )
    if not own.fields:
        return why
    names = " and ".join([", ".join(own.fields[:-1]), own.fields[-1]] if len(own.fields) > 1 else own.fields)
    fields = "fields" if len(own.fields) > 1 else "field"
    without = submitted - own.received - own.octets
    return f"{why}, and the {names} {fields} it added ({own.octets} octets): {without} octets without them"


def _refused_for_size(client: smtplib.SMTP, submitted: int, own: Added, code: int, text: bytes) -> str:
    offered = client.esmtp_features.get("size", "")
    limit = int(offered) if offered.isdigit() and int(offered) > 0 else None  # (SIZE 0: no limit given)
    return f"the message refused for its size: {size_refused(submitted, own, limit)}: {_reply(code, text)}"


def _message(client: smtplib.SMTP, data: bytes, own: Added) -> None:
    """DATA, the message, and the node's answer to it."""
    client.putcmd("data")
    code, text = client.getreply()
    if code != 354:
        raise Refused(TEMPFAIL if code < 500 else UNAVAILABLE, f"DATA refused: {_reply(code, text)}")
    body = re.sub(rb"(?m)^\.", b"..", data)
    client.send(body + (b"" if body.endswith(b"\r\n") else b"\r\n") + b".\r\n")
    try:
        code, text = client.getreply()
    except smtplib.SMTPServerDisconnected:
        raise Refused(
            PROTOCOL,
            "the connection was lost after the message was sent, before the node answered: it may have"
            " been accepted (sending it again may deliver it twice; the node's Reception records say)",
        ) from None
    if code != 250:
        if _too_big(code, text):  # (a node that offers no SIZE, or one that counts more)
            raise Refused(_status_of(code, text, DATAERR), _refused_for_size(client, len(data), own, code, text))
        raise Refused(_status_of(code, text, DATAERR), f"the message refused: {_reply(code, text)}")


def _xtext(text: str) -> str:
    """RFC 3461 4's xtext: "+" and "=", and anything outside printable ASCII, as +XX."""
    return "".join(c if "!" <= c <= "~" and c not in "+=" else f"+{ord(c):02X}" for c in text)


def _qualified(address: str, domain: str) -> str:
    """`address`, with @domain when it has none ("root", cron's MAILTO), as Postfix's
    append_at_myorigin does."""
    return address if "@" in address or not address or not domain else f"{address}@{domain}"


def run(argv: Sequence[str]) -> int:
    """The sendmail command: read the message, submit it, exit with a sysexits.h status."""
    try:
        return _run(argv)
    except UsageError as error:
        print(f"sendmail: {error} (see `pigeon sendmail --help`)", file=sys.stderr)
        return USAGE
    except ConfigError as error:
        print(f"sendmail: configuration error: {error}", file=sys.stderr)
        return CONFIG
    except Refused as error:
        if error.reason:
            print(f"sendmail: {error.reason}", file=sys.stderr)
        return error.status
    except KeyboardInterrupt:
        return TEMPFAIL
    except Exception as error:  # (whatever it is, the caller hears of it as sendmail says it)
        print(f"sendmail: internal error: {type(error).__name__}: {error}", file=sys.stderr)
        return SOFTWARE


def _run(argv: Sequence[str]) -> int:
    if argv[:1] == ["--help"]:
        print(USAGE_TEXT, end="")
        return OK
    options = parse(argv)
    if options.mode == "aliases":
        return OK  # newaliases: there are no aliases to rebuild (nor does a script care)
    if options.mode == "queue":
        raise UsageError(
            "there is no local queue: `pigeon queue list` lists the node's (with a token that may read it)"
        )
    if options.mode == "mail" and not options.extract and not options.recipients:
        raise UsageError("no recipients: name them, or give -t to take them from the message")
    node = find_node(options)
    user = pwd.getpwuid(os.getuid())
    if options.mode == "smtp":
        return relay_smtp(node, trace_field(node.domain, user.pw_uid))
    sender = _qualified(options.sender if options.sender is not None else user.pw_name, node.domain)
    if sender and (problem := check(sender)) is not None:
        raise UsageError(f"-f {shown(sender)!r}: {problem.text}")
    message = read_message(sys.stdin.buffer, options.dots)
    recipients = list(options.recipients)
    if options.extract:
        recipients += header_recipients(message)  # (as Postfix: added to those given)
    recipients = list(dict.fromkeys(_qualified(r, node.domain) for r in recipients))
    if not recipients:
        raise UsageError("no recipients: the message has no To, Cc or Bcc address")
    added = complete(message, sender or _qualified(user.pw_name, node.domain), _full_name(options, user), node.domain)
    qualify_fields(message, node.domain)
    content = message.content(node.max_line)
    # What a submission at any other door is refused for (the node leaves a relay client's
    # header section as it came): said now, with the same words, and nothing sent.
    if author_missing_in(content):  # (an empty From: `complete` adds one where there is none)
        raise Refused(DATAERR, f"the message refused: {replies.CONTENT_NO_FROM}")
    if (malformed := malformed_field_in(content)) is not None:
        reply = replies.content_field_malformed(malformed.name, shown_value(malformed.value), malformed.problem)
        raise Refused(DATAERR, f"the message refused: {reply}")
    # Its Received field first, as folded as any field; it and the fields added are counted
    # by the node (`Added`).
    trace = Message([trace_field(node.domain, user.pw_uid)], b"").content(node.max_line)[:-2]
    names = tuple(field.split(b":", 1)[0].decode() for field in added)
    own = Added(len(trace), names, len(Message(added, b"").content(node.max_line)) - 2)
    refused = submit(node, sender, recipients, options, trace + content, own)
    if refused:
        print(f"sendmail: {'; '.join(refused)}: sent to the other recipients", file=sys.stderr)
        return NOUSER
    return OK


def _full_name(options: Options, user: pwd.struct_passwd) -> str:
    """-F's name, else the GECOS one, "&" in it the login capitalised (as finger and Postfix
    read it); a GECOS name with a control character is none (-F's is refused by `parse`)."""
    if options.full_name is not None:
        return options.full_name
    name = user.pw_gecos.split(",")[0].replace("&", user.pw_name.capitalize())
    return "" if control_or_format_character(name) else name


class SmtpRelay:
    """-bs: the caller speaks SMTP (Symfony Mailer's and Laravel's default `sendmail -bs -i`),
    the node answers, and this passes the bytes between them, reading just enough of them to
    put the Received field that names the user (`trace_field`) before each message's content:
    after the 354 that answers DATA, or with the first BDAT chunk of a transaction (its size
    grown by the field's, and the node's "N octets received" for the transaction's chunks told
    the caller without them: its own octets). The node counts the field against `[smtp]
    max_message_size`, as Postfix counts what its sendmail adds, so a MAIL's SIZE= is grown by
    it too, and a refusal for size (`5.3.4`, at MAIL or at the content's end) says so
    (`size_refused`). After STARTTLS it passes bytes only (nothing to read then). Sans-IO:
    `client` and `server` take what each side sent and return what goes on."""

    def __init__(self, trace: bytes) -> None:
        self.trace = trace
        self.held = b""  # the caller's bytes not passed on yet
        self.replies_due = 1  # the greeting's
        self.added: list[int] = [0]  # for each reply due, the octets of ours its count holds
        self.sizes: list[int] = [0]  # for each reply due, the message's octets it answers (0: none)
        self.chunks_added = 0  # octets of ours in the open transaction's BDAT chunks
        self.content = 0  # octets of the open transaction's message passed on so far, ours too
        self.limit: int | None = None  # the node's SIZE (its EHLO reply), 0 taken as no limit
        self.reply_text = b""  # the node's unfinished reply line
        self.last_code = b""
        self.waiting_on = b""  # DATA or STARTTLS: the caller's bytes wait for its reply
        self.in_data = False  # passing a message's content, up to the lone "."
        self.chunk_left = 0  # octets of a BDAT chunk still to pass
        self.new_content = False  # a MAIL went; the content of its message has not begun
        self.raw = False  # after STARTTLS

    def client(self, data: bytes) -> bytes:
        """The caller sent `data`: what goes to the node now."""
        self.held += data
        return self._forward()

    def server(self, data: bytes) -> tuple[bytes, bytes]:
        """The node sent `data`: what goes to the caller (its whole lines), and the caller's
        bytes it lets go to the node."""
        if self.raw:
            return data, b""
        self.reply_text += data
        lines: list[bytes] = []
        while b"\n" in self.reply_text:
            line, self.reply_text = self.reply_text.split(b"\n", 1)
            if (offer := _SIZE_OFFERED.fullmatch(line)) is not None:
                self.limit = int(offer[1]) or None
            if line[3:4] != b"-":  # the last line of a reply
                self.replies_due -= 1
                self.last_code = line[:3]
                added = self.added.pop(0) if self.added else 0
                size = self.sizes.pop(0) if self.sizes else 0
                if added and (count := _CHUNK_RECEIVED.fullmatch(line)) is not None:
                    line = b"%s%d%s" % (count[1], int(count[2]) - added, count[3])
                elif size and line[4:9] in (b"5.3.4", b"4.3.4"):
                    why = size_refused(size, Added(len(self.trace)), self.limit).encode()
                    end = b"\r" if line.endswith(b"\r") else b""
                    line = line.removesuffix(b"\r") + b" (" + why + b")" + end
            lines.append(line + b"\n")
        to_node = self._forward()
        if self.raw:  # (after STARTTLS's 220: nothing is read any more)
            lines.append(self.reply_text)
            self.reply_text = b""
        return b"".join(lines), to_node

    def _due(self, added: int = 0, size: int = 0) -> None:
        self.replies_due += 1
        self.added.append(added)
        self.sizes.append(size)

    def _forward(self) -> bytes:
        out: list[bytes] = []
        while not self.raw:
            if self.waiting_on:
                if self.replies_due > 0:
                    break
                if self.waiting_on == b"DATA" and self.last_code == b"354":
                    self.in_data = True
                    if self.new_content:
                        out.append(self.trace)
                        self.content += len(self.trace)
                        self.new_content = False
                self.raw = self.waiting_on == b"STARTTLS" and self.last_code == b"220"
                self.waiting_on = b""
                continue
            if self.chunk_left:
                piece, self.held = self.held[: self.chunk_left], self.held[self.chunk_left :]
                self.chunk_left -= len(piece)
                out.append(piece)
                if self.chunk_left:
                    break
                continue
            end = self.held.find(b"\n")
            if end < 0:
                break
            line, self.held = self.held[: end + 1], self.held[end + 1 :]
            if self.in_data:
                self.in_data = line.rstrip(b"\r\n") != b"."
                if self.in_data:
                    self.content += len(line) - line.startswith(b".")  # (the node unstuffs a dot)
                else:
                    self._due(size=self.content)
                    self.content = 0
                out.append(line)
                continue
            words = line.split()
            verb = words[0].upper() if words else b""
            size = 0  # (the message's octets that the reply to this line answers for)
            if verb == b"MAIL":
                self.new_content = True
                self.chunks_added = 0
                self.content = 0
                line, size = self._mail_size_grown(line)
            elif verb in (b"RSET", b"EHLO", b"HELO"):
                self.new_content = False
                self.chunks_added = 0
                self.content = 0
            elif verb in (b"DATA", b"STARTTLS"):
                self.waiting_on = verb
            elif verb == b"BDAT" and len(words) > 1 and words[1].isdigit():
                self.chunk_left = int(words[1])
                if self.new_content:
                    line = b" ".join([b"BDAT", b"%d" % (self.chunk_left + len(self.trace)), *words[2:]]) + b"\r\n"
                    line += self.trace
                    self.new_content = False
                    self.chunks_added = len(self.trace)
                    self.content += len(self.trace)
                self.content += self.chunk_left
                size = self.content
                if len(words) > 2 and words[2].upper() == b"LAST":
                    self.content = 0
            self._due(self.chunks_added if verb == b"BDAT" else 0, size)
            out.append(line)
        if self.raw:
            out.append(self.held)
            self.held = b""
        return b"".join(out)

    def _mail_size_grown(self, line: bytes) -> tuple[bytes, int]:
        """A MAIL line with its SIZE= (RFC 1870) grown by the Received field this puts before
        the content, so that it declares the message as it will go; and that size (0: none)."""
        path = _MAIL_PATH.match(line)
        if path is None:
            return line, 0  # (the node answers it)
        size = _SIZE_PARAMETER.search(line, path.end())
        if size is None:
            return line, 0
        grown = int(size[2]) + len(self.trace)
        return line[: size.start(2)] + b"%d" % grown + line[size.end(2) :], grown


_MAIL_PATH: Final = re.compile(rb'(?i)MAIL[ \t]+FROM:[ \t]*(?:<(?:"(?:[^"\\]|\\.)*"|[^">])*>|[^ \t\r\n]*)')
"""A MAIL line up to the end of its reverse-path (a quoted local part may hold " SIZE=")."""
_SIZE_PARAMETER: Final = re.compile(rb"(?i)([ \t]SIZE=)([0-9]{1,19})(?=[ \t\r\n])")
_SIZE_OFFERED: Final = re.compile(rb"(?i)250[ -]SIZE[ \t]+([0-9]{1,19})[ \t]*\r?")
"""The SIZE line of the node's EHLO reply (RFC 1870 4): its limit."""

_CHUNK_RECEIVED: Final = re.compile(rb"(250[ -]2\.0\.0 )([0-9]{1,19})( octets received\r?)")
"""The node's answer to a BDAT chunk (`pigeon.smtp.replies.chunk_received`)."""


def relay_smtp(node: Node, trace: bytes) -> int:
    """-bs: relay the SMTP session on stdin and stdout to the node (see `SmtpRelay`)."""
    where = f"[{node.host}]:{node.port}" if ":" in node.host else f"{node.host}:{node.port}"
    try:
        connection = socket.create_connection((node.host, node.port), timeout=TIMEOUT)
    except OSError as error:
        raise Refused(TEMPFAIL, f"cannot reach the Pigeon node at {where} ({os_reason(error)})") from None
    relay = SmtpRelay(trace)
    stdin, stdout = sys.stdin.buffer.fileno(), sys.stdout.buffer.fileno()
    reading, shut = True, False
    with connection:
        try:
            while True:
                ready, _, _ = select.select([connection, *([stdin] if reading else [])], [], [], TIMEOUT)
                if not ready:
                    raise Refused(TEMPFAIL, f"the SMTP session with {where} was silent for {TIMEOUT:.0f} seconds")
                if connection in ready:
                    data = connection.recv(65536)
                    if not data:
                        os.write(stdout, relay.reply_text)  # (a last line without its end)
                        return OK  # (what became of each message, the caller heard from the node)
                    to_caller, to_node = relay.server(data)
                    view = memoryview(to_caller)
                    while view:
                        view = view[os.write(stdout, view) :]
                    if to_node:
                        connection.sendall(to_node)
                if reading and stdin in ready:
                    data = os.read(stdin, 65536)
                    if to_node := relay.client(data):
                        connection.sendall(to_node)
                    reading = bool(data)
                # The caller's end, once what waited on a reply has gone too.
                if not reading and not relay.held and not shut:
                    connection.shutdown(socket.SHUT_WR)
                    shut = True
        except OSError as error:  # (the node went, or the caller stopped reading)
            raise Refused(TEMPFAIL, f"the SMTP session with {where} broke off ({os_reason(error)})") from None
