"""Strict command-line parser: one line (without its CRLF) in, one command out.

Errors raise `SmtpProtocolError` with the reply to send. Nothing here knows the session's
phase; `server.py` decides whether a well-formed command may come now.

Addresses follow RFC 5321 4.1.2 (Mailbox = Local-part "@" ( Domain / address-literal )),
extended by RFC 6531 to UTF-8 when the transaction uses SMTPUTF8. Source routes
(`<@a,@b:user@c>`) are accepted and dropped, as RFC 5321 4.1.1.3 asks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pigeon.smtp import address, replies
from pigeon.smtp.errors import SmtpProtocolError
from pigeon.smtp.events import Data, Ehlo, Helo, MailFrom, RcptTo, StartTls
from pigeon.smtp.extensions import Offer, parse_mail_parameters, parse_rcpt_parameters
from pigeon.smtp.replies import Reply


@dataclass(frozen=True, slots=True)
class Rset:
    verb = "RSET"


@dataclass(frozen=True, slots=True)
class Noop:
    verb = "NOOP"


@dataclass(frozen=True, slots=True)
class Quit:
    verb = "QUIT"


@dataclass(frozen=True, slots=True)
class Vrfy:
    verb = "VRFY"


@dataclass(frozen=True, slots=True)
class Help:
    verb = "HELP"


@dataclass(frozen=True, slots=True)
class Bdat:
    size: int
    last: bool
    verb = "BDAT"


@dataclass(frozen=True, slots=True)
class Auth:
    mechanism: str
    initial: str | None  # base64 initial response, "=" for an empty one
    verb = "AUTH"


Command = Ehlo | Helo | MailFrom | RcptTo | Data | StartTls | Rset | Noop | Quit | Vrfy | Help | Bdat | Auth
Parser = Callable[[str, Offer], Command]

MAX_CLIENT_DOMAIN: Final = 255
"""The longest EHLO or HELO argument taken, in octets."""
_BDAT_SIZE: Final = re.compile(r"[0-9]{1,18}")


def parse_command(line: bytes | bytearray, offer: Offer) -> Command:
    """Parse one command line (CRLF already removed)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise SmtpProtocolError(replies.COMMAND_NOT_UTF8) from None
    verb, _, arg = text.partition(" ")
    verb = verb.upper()
    parser = _PARSERS.get(verb)
    if parser is None:
        if verb == "EXPN":
            raise SmtpProtocolError(replies.NOT_IMPLEMENTED)
        raise SmtpProtocolError(replies.UNRECOGNIZED)
    return parser(arg.strip(" "), offer)


def _ehlo(arg: str, offer: Offer) -> Command:
    return Ehlo(_client_domain(arg, "EHLO"))


def _helo(arg: str, offer: Offer) -> Command:
    return Helo(_client_domain(arg, "HELO"))


def _client_domain(arg: str, verb: str) -> str:
    # Lenient by design: clients announce all sorts of names. We only need one token.
    if not arg or " " in arg or not arg.isprintable():
        raise SmtpProtocolError(replies.syntax(f"Syntax: {verb} hostname", "5.5.4"))
    if len(arg.encode("utf-8")) > MAX_CLIENT_DOMAIN:
        # No domain is longer (RFC 1035 2.3.4), nor an address literal: a longer name would
        # only make our greeting's reply line and the Received field we write over-long.
        raise SmtpProtocolError(
            replies.syntax(
                f"{verb} name is longer than {MAX_CLIENT_DOMAIN} octets; no domain or address literal is that long"
            )
        )
    return arg


def _mail(arg: str, offer: Offer) -> Command:
    rest = _after_keyword(arg, "FROM:", "Syntax: MAIL FROM:<address> [parameters]")
    path, params = _split_path(rest, replies.BAD_ADDRESS_SYNTAX_SENDER)
    parsed = parse_mail_parameters(params, offer)
    smtputf8 = parsed[2]
    # A control or bidi character is refused as such, SMTPUTF8 or not: it is no matter of
    # encoding, and the client should hear what is wrong.
    if (problem := address.refused_character(path)) is not None:
        bad = replies.BAD_ADDRESS_SYNTAX_SENDER
        raise SmtpProtocolError(replies.r(problem.kind.smtp_code, bad.enhanced, problem.text))
    if not smtputf8 and not path.isascii():
        raise SmtpProtocolError(replies.NON_ASCII_WITHOUT_SMTPUTF8)
    sender = "" if path == "" else _mailbox(path, smtputf8, replies.BAD_ADDRESS_SYNTAX_SENDER)
    return MailFrom(sender, *parsed)


def _rcpt(arg: str, offer: Offer) -> Command:
    rest = _after_keyword(arg, "TO:", "Syntax: RCPT TO:<address> [parameters]")
    path, params = _split_path(rest, replies.BAD_ADDRESS_SYNTAX_RCPT)
    parsed = parse_rcpt_parameters(params, offer)
    if path.lower() in ("postmaster", '"postmaster"'):
        # RFC 5321 4.5.1: <Postmaster> with no domain; a quoted local part means the same
        # mailbox (4.1.2: quoting is only syntax), so <"Postmaster"> is it too.
        recipient = "postmaster"
    else:
        # Whether UTF-8 is allowed depends on MAIL; the session re-checks with that context.
        recipient = _mailbox(path, True, replies.BAD_ADDRESS_SYNTAX_RCPT)
    return RcptTo(recipient, *parsed)


def given_recipient(line: bytes | bytearray) -> str | None:
    """The address a RCPT line names, as given, however malformed the line; None for another
    command. For the log record of a refusal: the path between its angle brackets when it has
    both, else the argument's first word (after "TO:" when it is there). Bytes that are not
    UTF-8 come back as surrogate escapes."""
    return _given(line, "RCPT", "TO:")


def given_sender(line: bytes | bytearray) -> str | None:
    """The sender a MAIL line names, as given, however malformed the line (`given_recipient`)."""
    return _given(line, "MAIL", "FROM:")


def _given(line: bytes | bytearray, verb: str, keyword: str) -> str | None:
    text = line.decode("utf-8", "surrogateescape")
    given_verb, _, arg = text.partition(" ")
    if given_verb.upper() != verb:
        return None
    arg = arg.strip(" ")
    if arg[: len(keyword)].upper() == keyword:
        arg = arg[len(keyword) :].lstrip(" ")
    if arg.startswith("<"):
        end = _closing_bracket(arg)
        if end > 0:
            return arg[1:end]
    return arg.split(" ", 1)[0]


def _after_keyword(arg: str, keyword: str, usage: str) -> str:
    if arg[: len(keyword)].upper() != keyword:
        raise SmtpProtocolError(replies.syntax(usage, "5.5.4"))
    # Many clients put a space after the colon; RFC 5321 does not, but it harms nothing.
    return arg[len(keyword) :].lstrip(" ")


def _split_path(rest: str, bad: Reply) -> tuple[str, str]:
    """`<path> params` into the path (without brackets or source route) and the params."""
    if not rest.startswith("<"):
        raise SmtpProtocolError(bad)
    if '"' not in rest:
        end = rest.find(">")
    else:
        end = _closing_bracket(rest)
    if end < 0:
        raise SmtpProtocolError(bad)
    path = rest[1:end]
    after = rest[end + 1 :]
    if after and not after.startswith(" "):
        raise SmtpProtocolError(bad)
    if path.startswith("@"):
        route = address.SOURCE_ROUTE.match(path)
        if route is None:
            raise SmtpProtocolError(bad)
        path = path[route.end() :]
    return path, after


def _closing_bracket(rest: str) -> int:
    quoted = escaped = False
    for i, ch in enumerate(rest):
        if escaped:
            escaped = False
        elif ch == "\\" and quoted:
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == ">" and not quoted:
            return i
    return -1


def _mailbox(path: str, utf8: bool, bad: Reply) -> str:
    """`path` if it is a mailbox (`pigeon.smtp.address`, the check every door shares), else
    the refusal: `bad` for a syntax error, else 501 or 553 with the problem's text."""
    problem = address.check(path, utf8=utf8)
    if problem is None:
        return path
    if problem.kind is address.Kind.SYNTAX:
        raise SmtpProtocolError(bad)
    raise SmtpProtocolError(replies.r(problem.kind.smtp_code, bad.enhanced or "5.1.3", problem.text))


def _no_argument(command: Command, verb: str) -> Parser:
    def parse(arg: str, offer: Offer) -> Command:
        if arg:
            raise SmtpProtocolError(replies.syntax(f"Syntax: {verb} takes no arguments", "5.5.4"))
        return command

    return parse


def _any_argument(command: Command) -> Parser:
    def parse(arg: str, offer: Offer) -> Command:
        return command

    return parse


def _vrfy(arg: str, offer: Offer) -> Command:
    if not arg:
        raise SmtpProtocolError(replies.syntax("Syntax: VRFY address", "5.5.4"))
    return Vrfy()


def _bdat(arg: str, offer: Offer) -> Command:
    size, _, last = arg.partition(" ")
    if not _BDAT_SIZE.fullmatch(size) or last.upper() not in ("", "LAST"):
        # Without a size we cannot find where the chunk ends: the framing is lost.
        raise SmtpProtocolError(replies.syntax("Syntax: BDAT size [LAST]", "5.5.4"), close=True)
    return Bdat(int(size), bool(last))


def _auth(arg: str, offer: Offer) -> Command:
    mechanism, _, initial = arg.partition(" ")
    if not mechanism:
        raise SmtpProtocolError(replies.syntax("Syntax: AUTH mechanism [initial-response]", "5.5.4"))
    return Auth(mechanism.upper(), initial or None)


_PARSERS: Final[dict[str, Parser]] = {
    "EHLO": _ehlo,
    "HELO": _helo,
    "MAIL": _mail,
    "RCPT": _rcpt,
    "DATA": _no_argument(Data(), "DATA"),
    "BDAT": _bdat,
    "RSET": _no_argument(Rset(), "RSET"),
    "NOOP": _any_argument(Noop()),
    "QUIT": _no_argument(Quit(), "QUIT"),
    "VRFY": _vrfy,
    "HELP": _any_argument(Help()),
    "STARTTLS": _no_argument(StartTls(), "STARTTLS"),
    "AUTH": _auth,
}

VERBS: Final[frozenset[str]] = frozenset({*_PARSERS, "EXPN"})
"""The verbs the server recognises (EXPN to refuse as not implemented rather than unknown): the
only ones a metric may name (`pigeon_rejections_total`), where each is a series kept for good."""
