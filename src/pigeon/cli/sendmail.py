"""`pigeon sendmail`: the sendmail(1) command line that cron, PHP's mail(), logwatch and the like
call, for a machine whose sendmail Pigeon replaces (`ln -s "$(command -v pigeon)"
/usr/sbin/sendmail`: invoked as `sendmail`, `pigeon` is this command).

It submits over SMTP to the node's own listener on loopback, which `[smtp] relay_networks`
lets relay by default: any local user may send without a token or root (cron jobs run as their
users), and the mail goes through the same door as any other, with its checks (SIZE, the
policy hooks, SMTPUTF8) and a 250 only once it is in the spool. Nothing is queued here: when
the node cannot take the message now, the caller hears so (75, EX_TEMPFAIL).
"""

from __future__ import annotations

import contextlib
import email.utils
import os
import pwd
import re
import secrets
import smtplib
import socket
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pigeon.config.load import ConfigError, load_keys, read_text
from pigeon.config.schema import split_endpoint
from pigeon.logs.peer_text import shown

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
  -f ADDRESS    envelope sender (-r too; "<>" or "" for the null sender);
                default: the invoking user @ [smtp] hostname
  -F NAME       the full name for the From field added to a message without one
  -i, -oi       a line with a lone "." is text, not the end of the message
  -C FILE       Pigeon's configuration file (-c too; default: $PIGEON_CONFIG, else
                /etc/pigeon/pigeon.toml if it exists, else the built-in defaults)
  -N DSN        NOTIFY= for each recipient (never, or success,delay,failure)
  -R RET        RET= for the message (full or hdrs); -V ENVID: ENVID=
  -v            show the SMTP dialogue on stderr
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
_UNSUPPORTED: Final = {
    "b": "only -bm (deliver mail, the default) is supported: no daemon, queue listing or aliases here",
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
            elif letter == "b" and letters == "m":
                letters = ""  # -bm: deliver mail, what this command does anyway
            elif letter == "v":
                options.verbose = True
            elif letter in _UNSUPPORTED:
                raise UsageError(f"-{letter}{letters}: {_UNSUPPORTED[letter]}")
            else:
                raise UsageError(f"unknown option -{letter}")
    options.recipients = [address for word in words[index:] for address in _split_list(word)]
    return options


def _take(options: Options, letter: str, value: str) -> None:
    if letter in "fr":
        options.sender = "" if value in ("<>", "") else value.removeprefix("<").removesuffix(">")
    elif letter == "F":
        options.full_name = value
    elif letter in "Cc":
        options.config = Path(value)
    elif letter == "N":
        options.notify = value.upper()
    elif letter == "R":
        options.ret = value.upper()
    elif letter == "V":
        options.envid = value
    elif letter == "o" and value == "i":
        options.dots = False  # -oi; every other -o option is ignored, as Postfix ignores them
    # -B (body type: told by the message's bytes), -L, -h, -O, -X: ignored


def _split_list(word: str) -> list[str]:
    """A recipient argument may be a list ("a@x, b@y"), as sendmail takes it."""
    return [address for _, address in email.utils.getaddresses([word]) if address]


@dataclass
class Node:
    """Where to submit, and the domain of an address without one."""

    host: str
    port: int
    domain: str


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
    config = load_keys(path, [("smtp", "listen"), ("smtp", "hostname")])
    if config is None:
        raise ConfigError(f"{path}: [smtp] listen or [smtp] hostname does not load: see `pigeon serve --check`")
    endpoints = [(e.host, e.port) for e in config.smtp.listen]
    endpoints.sort(key=lambda endpoint: not _loopback_or_wildcard(endpoint[0]))
    host, port = endpoints[0]
    if port == 0:
        raise ConfigError(f"{path}: [smtp] listen {config.smtp.listen[0]!r} has port 0: no port to submit to")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return Node(host, port, config.smtp.hostname)  # ("[192.0.2.1]" too: user@[192.0.2.1] is an address)


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

    def content(self) -> bytes:
        return b"".join(self.fields) + b"\r\n" + self.body


def read_message(stream: Iterable[bytes], dots: bool) -> Message:
    """The message from its lines; with `dots`, a line with a lone "." ends it (what follows is
    not read, as sendmail reads it). Line ends become CRLF, as SMTP sends them; a first line
    "From sender date" (mbox's envelope line) is dropped, as sendmail drops it."""
    lines: list[bytes] = []
    for number, raw in enumerate(stream):
        line = raw.removesuffix(b"\n").removesuffix(b"\r")
        if dots and line == b".":
            break
        if number == 0 and line.startswith(b"From ") and not _FIELD_NAME.match(line):
            continue
        lines.append(line + b"\r\n")
    fields: list[bytes] = []
    at = 0
    while at < len(lines):
        line = lines[at]
        if fields and line[:1] in (b" ", b"\t"):
            fields[-1] += line
        elif _FIELD_NAME.match(line):
            fields.append(line)
        else:
            break
        at += 1
    if at < len(lines) and lines[at] == b"\r\n":
        at += 1  # the blank line that ends the header section (added back by `content`)
    return Message(fields, b"".join(lines[at:]))


def complete(message: Message, sender: str, full_name: str, domain: str) -> None:
    """Add the From, Date and Message-ID a message lacks (Pigeon adds a Date and a Message-ID
    only to mail submitted with AUTH, and refuses one without From); remove its Bcc."""
    message.without("bcc")
    added: list[bytes] = []
    if not message.named("from"):
        author = email.utils.formataddr((full_name, sender)) if full_name else sender
        added.append(f"From: {author}\r\n".encode())
    if not message.named("date"):
        added.append(f"Date: {email.utils.formatdate(localtime=True)}\r\n".encode())
    if not message.named("message-id"):
        added.append(f"Message-ID: <{secrets.token_hex(11)}@{domain}>\r\n".encode())
    message.fields += added


def header_recipients(message: Message) -> list[str]:
    """The addresses of the message's To, Cc and Bcc fields (groups' members included)."""
    values = [v.decode("utf-8", "replace") for name in ("to", "cc", "bcc") for v in message.named(name)]
    return [address for _, address in email.utils.getaddresses(values) if address]


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


def submit(node: Node, sender: str, recipients: list[str], options: Options, data: bytes) -> list[str]:
    """Send the message in one SMTP transaction; the recipients refused for good (with their
    replies). Raises `Refused` when nothing was sent, or it is not known whether it was; when
    one recipient is refused for now (4xx) nothing is sent, so that the caller's retry sends
    it to no one twice."""
    where = f"[{node.host}]:{node.port}" if ":" in node.host else f"{node.host}:{node.port}"
    # (Not `with`: its QUIT raises on a reply other than 221, which would hide why it failed.)
    client = smtplib.SMTP(timeout=TIMEOUT, local_hostname=node.domain or "localhost")
    client.set_debuglevel(1 if options.verbose else 0)
    try:
        try:
            code, text = client.connect(node.host, node.port)
        except OSError as error:
            raise Refused(
                TEMPFAIL, f"cannot reach the Pigeon node at {where} ({_why(error)}): nothing sent, try again later"
            ) from None
        if code != 220:
            raise Refused(TEMPFAIL if code < 500 else UNAVAILABLE, f"{where} greeted with {_reply(code, text)}")
        code, text = client.ehlo()
        if code != 250:
            raise Refused(TEMPFAIL if code < 500 else UNAVAILABLE, f"{where} answered EHLO {_reply(code, text)}")
        return _transaction(client, sender, recipients, options, data)
    except Refused:
        raise
    except smtplib.SMTPServerDisconnected as error:  # (before the message went: `_transaction`)
        raise Refused(TEMPFAIL, f"the Pigeon node at {where} closed the connection ({error})") from None
    except OSError as error:
        raise Refused(TEMPFAIL, f"the connection to the Pigeon node at {where} failed ({_why(error)})") from None
    finally:
        if client.sock is not None:
            with contextlib.suppress(smtplib.SMTPException, OSError):
                client.quit()
        client.close()


def _why(error: OSError) -> str:
    return error.strerror or str(error) or type(error).__name__


def _transaction(client: smtplib.SMTP, sender: str, recipients: list[str], options: Options, data: bytes) -> list[str]:
    unicode = not (sender + "".join(recipients)).isascii() or not data.split(b"\r\n\r\n", 1)[0].isascii()
    mail = [f"SIZE={len(data)}"] if client.has_extn("size") else []
    if not data.isascii() and client.has_extn("8bitmime"):
        mail.append("BODY=8BITMIME")
    if unicode and client.has_extn("smtputf8"):
        mail.append("SMTPUTF8")
        client.command_encoding = "utf-8"
    elif not (sender + "".join(recipients)).isascii():
        raise Refused(DATAERR, "the node does not offer SMTPUTF8, which a non-ASCII address needs")
    dsn = client.has_extn("dsn")
    if dsn and options.ret:
        mail.append(f"RET={options.ret}")
    if dsn and options.envid:
        mail.append(f"ENVID={_xtext(options.envid)}")
    code, text = client.docmd("MAIL", f"FROM:<{sender}>{''.join(' ' + m for m in mail)}")
    if code != 250:
        raise Refused(_status_of(code, text, DATAERR), f"sender <{shown(sender)}> refused: {_reply(code, text)}")
    rcpt = f" NOTIFY={options.notify}" if dsn and options.notify else ""
    accepted: list[str] = []
    refused: list[str] = []
    later: list[str] = []
    for recipient in recipients:
        code, text = client.docmd("RCPT", f"TO:<{recipient}>{rcpt}")
        if code in (250, 251):
            accepted.append(recipient)
        else:
            (later if 400 <= code < 500 else refused).append(f"<{shown(recipient)}>: {_reply(code, text)}")
    if later:
        client.rset()
        raise Refused(TEMPFAIL, "; ".join(later + refused) + ": nothing sent, try again later")
    if not accepted:
        raise Refused(NOUSER, "; ".join(refused) + ": nothing sent")
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
        raise Refused(_status_of(code, text, DATAERR), f"message refused: {_reply(code, text)}")
    return refused


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
    if not options.extract and not options.recipients:
        raise UsageError("no recipients: name them, or give -t to take them from the message")
    node = find_node(options)
    user = pwd.getpwuid(os.getuid())
    sender = options.sender if options.sender is not None else _qualified(user.pw_name, node.domain)
    message = read_message(sys.stdin.buffer, options.dots)
    recipients = list(options.recipients)
    if options.extract:
        recipients += header_recipients(message)  # (as Postfix: added to those given)
    recipients = list(dict.fromkeys(_qualified(r, node.domain) for r in recipients))
    if not recipients:
        raise UsageError("no recipients: the message has no To, Cc or Bcc address")
    full_name = options.full_name if options.full_name is not None else user.pw_gecos.split(",")[0]
    complete(message, sender or _qualified(user.pw_name, node.domain), full_name, node.domain)
    refused = submit(node, sender, recipients, options, message.content())
    if refused:
        print(f"sendmail: {'; '.join(refused)}: sent to the other recipients", file=sys.stderr)
        return NOUSER
    return OK
