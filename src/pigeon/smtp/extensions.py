"""ESMTP extensions: which ones a session offers, the EHLO reply, and MAIL/RCPT parameters.

Each parameter is checked against the extension that defines it, so a client cannot use
an extension we did not advertise (RFC 5321 4.1.1.11: answer 555).

| keyword             | RFC        | parameters                     |
|---------------------|------------|--------------------------------|
| SIZE                | 1870       | MAIL SIZE=                     |
| 8BITMIME            | 6152       | MAIL BODY=7BIT / 8BITMIME      |
| SMTPUTF8            | 6531       | MAIL SMTPUTF8                  |
| DSN                 | 3461       | MAIL RET= ENVID=, RCPT NOTIFY= ORCPT= |
| AUTH                | 4954       | MAIL AUTH=                     |
| PIPELINING, CHUNKING, ENHANCEDSTATUSCODES, STARTTLS | 2920, 3030, 2034, 3207 | none |
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Final

from pigeon.smtp import replies
from pigeon.smtp.errors import SmtpProtocolError
from pigeon.smtp.events import BodyType, Notify, Ret
from pigeon.smtp.replies import Reply

# RFC 3461 4: xtext is printable ASCII except "+" and "=", with "+HH" for anything else.
_XTEXT: Final = re.compile(r"(?:[\x21-\x2a\x2c-\x3c\x3e-\x7e]|\+[0-9A-F]{2})*")
_XTEXT_ESCAPE: Final = re.compile(r"\+([0-9A-F]{2})")
_UTF8_ESCAPE: Final = re.compile(r"\\x\{([0-9A-Fa-f]{1,6})\}")
_ADDR_TYPE: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?")
_MAX_SIZE_DIGITS: Final = 20
_MAX_ENVID: Final = 100  # RFC 3461 4.4
_MAX_ECHO: Final = 40  # of a refused value, in its reply: enough to recognise it


@dataclass(frozen=True, slots=True)
class Offer:
    """What a session offers. Built per session: STARTTLS and AUTH depend on TLS state."""

    max_message_size: int
    pipelining: bool = True
    chunking: bool = True
    eight_bit_mime: bool = True
    smtputf8: bool = True
    dsn: bool = True
    enhanced_status_codes: bool = True
    starttls: bool = False
    auth_mechanisms: tuple[str, ...] = ()
    extensions: bool = True
    """False for a session that began with HELO: no service extension, and so no MAIL or RCPT
    parameter, applies (RFC 5321 4.1.1.1, RFC 1869 4.5; RFC 6531 3.4 for SMTPUTF8)."""

    def ehlo_reply(self, hostname: str, client_domain: str) -> Reply:
        lines = [f"{hostname} greets {client_domain}"]
        if self.pipelining:
            lines.append("PIPELINING")
        lines.append(f"SIZE {self.max_message_size}")
        if self.eight_bit_mime:
            lines.append("8BITMIME")
        if self.smtputf8:
            lines.append("SMTPUTF8")
        if self.enhanced_status_codes:
            lines.append("ENHANCEDSTATUSCODES")
        if self.chunking:
            lines.append("CHUNKING")
        if self.dsn:
            lines.append("DSN")
        if self.starttls:
            lines.append("STARTTLS")
        if self.auth_mechanisms:
            lines.append("AUTH " + " ".join(self.auth_mechanisms))
        return Reply(250, None, tuple(lines))


def _echo(value: str) -> str:
    """A client's value as a reply may name it: printable ASCII (RFC 5321 replies are ASCII
    text on one line; an escape sequence or 8-bit octet sent back could break the line or the
    reader's screen), each other character as a backslash escape, cut after _MAX_ECHO."""
    shown = value[:_MAX_ECHO].encode("ascii", "backslashreplace").decode("ascii")
    shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in shown)
    return shown + "..." if len(value) > _MAX_ECHO else shown


def split_parameters(text: str) -> dict[str, str | None]:
    """`KEY=VALUE KEY2` into {"KEY": "VALUE", "KEY2": None}; keys upper-cased, no duplicates."""
    params: dict[str, str | None] = {}
    for item in text.split(" "):
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.upper()
        if not key or not key.isascii() or not key.replace("-", "").isalnum():
            raise SmtpProtocolError(replies.syntax(f"Malformed parameter '{_echo(item)}'", "5.5.4"))
        if key in params:
            raise SmtpProtocolError(replies.syntax(f"Parameter {key} given twice", "5.5.4"))
        if eq and not value:
            raise SmtpProtocolError(replies.syntax(f"Parameter {key} has an empty value", "5.5.4"))
        params[key] = value if eq else None
    return params


MailParameters = tuple[int | None, BodyType | None, bool, Ret | None, str | None, str | None]
"""SIZE, BODY, SMTPUTF8, RET, ENVID, AUTH: the fields of `MailFrom` after its sender, in order."""


def parse_mail_parameters(text: str, offer: Offer) -> MailParameters:
    size: int | None = None
    body: BodyType | None = None
    smtputf8 = False
    ret: Ret | None = None
    envid: str | None = None
    auth: str | None = None
    parameters = split_parameters(text)
    _refuse_without_ehlo(parameters, offer)
    for key, value in parameters.items():
        if key == "SIZE":
            if value is None or not value.isdigit() or not value.isascii() or len(value) > _MAX_SIZE_DIGITS:
                raise SmtpProtocolError(replies.syntax("SIZE needs a number of octets", "5.5.4"))
            size = int(value)
            if size > offer.max_message_size:
                raise SmtpProtocolError(replies.message_too_big(offer.max_message_size))
        elif key == "BODY":
            if not offer.eight_bit_mime:
                raise SmtpProtocolError(replies.bad_parameter("BODY is not offered (8BITMIME)"))
            try:
                body = BodyType((value or "").upper())
            except ValueError:
                raise SmtpProtocolError(
                    replies.bad_parameter(f"BODY={_echo(value or '')} is not supported; use 7BIT or 8BITMIME")
                ) from None
        elif key == "SMTPUTF8":
            if not offer.smtputf8:
                raise SmtpProtocolError(replies.SMTPUTF8_NOT_OFFERED)
            if value is not None:
                raise SmtpProtocolError(replies.syntax("SMTPUTF8 takes no value", "5.5.4"))
            smtputf8 = True
        elif key == "RET":
            _require_dsn(offer, key)
            try:
                ret = Ret((value or "").upper())
            except ValueError:
                raise SmtpProtocolError(replies.syntax("RET must be FULL or HDRS", "5.5.4")) from None
        elif key == "ENVID":
            _require_dsn(offer, key)
            envid = decode_xtext(value, key)
            if len(value or "") > _MAX_ENVID:
                raise SmtpProtocolError(replies.syntax("ENVID is longer than 100 characters", "5.5.4"))
            # RFC 3461 4.4 (RFC 6531 and 6533 leave ENVID as it was): taken, anything else
            # came back in a DSN's Original-Envelope-Id otherwise than the client gave it.
            _require_printable_ascii(envid, "ENVID must be printable ASCII once decoded (RFC 3461 4.4)")
        elif key == "AUTH":
            # RFC 4954 5: accepted and kept for the record; we never trust it for relaying.
            auth = decode_xtext(value, key)
        else:
            raise SmtpProtocolError(replies.bad_parameter(f"Unsupported MAIL parameter {key}"))
    return size, body, smtputf8, ret, envid, auth


def parse_rcpt_parameters(text: str, offer: Offer) -> tuple[frozenset[Notify] | None, str | None]:
    """NOTIFY and ORCPT: the fields of `RcptTo` after its recipient, in order."""
    notify: frozenset[Notify] | None = None
    orcpt: str | None = None
    parameters = split_parameters(text)
    _refuse_without_ehlo(parameters, offer)
    for key, value in parameters.items():
        if key == "NOTIFY":
            _require_dsn(offer, key)
            notify = _parse_notify(value)
        elif key == "ORCPT":
            _require_dsn(offer, key)
            orcpt = _parse_orcpt(value)
        else:
            raise SmtpProtocolError(replies.bad_parameter(f"Unsupported RCPT parameter {key}"))
    return notify, orcpt


def _refuse_without_ehlo(parameters: dict[str, str | None], offer: Offer) -> None:
    """555 for the first of `parameters` when the session began with HELO: a HELO client was
    offered no extension, so it may use none of their parameters (RFC 5321 4.1.1.1 and
    4.1.1.11, RFC 1869 4.5, RFC 6531 3.4). Taken, SMTPUTF8 or BODY=8BITMIME would have the
    message go on as though the client had asked for what no one offered it."""
    if parameters and not offer.extensions:
        key = next(iter(parameters))
        raise SmtpProtocolError(
            replies.bad_parameter(f"{key} is not recognised: the session began with HELO, which offers no extensions")
        )


def _require_dsn(offer: Offer, key: str) -> None:
    if not offer.dsn:
        raise SmtpProtocolError(replies.bad_parameter(f"{key} is not offered (DSN)"))


def _parse_notify(value: str | None) -> frozenset[Notify]:
    if not value:
        raise SmtpProtocolError(replies.syntax("NOTIFY needs NEVER or a list of SUCCESS, FAILURE, DELAY", "5.5.4"))
    items = [v.upper() for v in value.split(",")]
    try:
        parsed = [Notify(v) for v in items]
    except ValueError:
        raise SmtpProtocolError(replies.syntax(f"NOTIFY={_echo(value)} has an unknown value", "5.5.4")) from None
    found = frozenset(parsed)
    if len(found) != len(parsed):
        raise SmtpProtocolError(replies.syntax("NOTIFY lists a value twice", "5.5.4"))
    if Notify.NEVER in found and len(found) > 1:
        raise SmtpProtocolError(replies.syntax("NOTIFY=NEVER cannot be combined with other values", "5.5.4"))
    return found


def _parse_orcpt(value: str | None) -> str:
    addr_type, semi, address = (value or "").partition(";")
    if not semi or not _ADDR_TYPE.fullmatch(addr_type) or not address:
        raise SmtpProtocolError(replies.syntax("ORCPT must be addr-type;xtext, e.g. rfc822;user@example.com", "5.5.4"))
    addr_type = addr_type.lower()
    if addr_type == "utf-8":
        # RFC 6533 utf-8-addr-xtext: printable UTF-8 with \x{HEX} escapes; kept as sent.
        if any(c in address for c in " +="):
            raise SmtpProtocolError(replies.syntax("ORCPT utf-8 address is malformed", "5.5.4"))
        decoded = _decode_utf8_addr(address)
        if any(ord(c) < 32 or ord(c) == 127 for c in decoded):
            # As decode_xtext refuses them in the rfc822 form: one rule, one reply, for both.
            raise SmtpProtocolError(replies.syntax("ORCPT must not contain control characters", "5.5.4"))
    else:
        # RFC 3461 4.2 wants printable ASCII here (UTF-8 is RFC 6533's utf-8 type, above), but
        # relays that predate RFC 6533 send an internationalised recipient as rfc822 xtext of its
        # UTF-8: refusing it would refuse the recipient, so its letters are taken (a DSN gives
        # them in the utf-8 form).
        decoded = decode_xtext(address, "ORCPT")
    # What a DSN could not show as it was given, in either form: the utf-8 form is no way
    # round it, so the reply names the character and offers no other form.
    for char in decoded:
        if not char.isascii() and unicodedata.category(char)[0] in "CZ":
            raise SmtpProtocolError(
                replies.syntax(
                    f"ORCPT {addr_type} address must hold no invisible or format characters once decoded:"
                    f" it holds {_named(char)}",
                    "5.5.4",
                )
            )
    return f"utf-8;{address}" if addr_type == "utf-8" else f"{addr_type};{decoded}"


def _named(char: str) -> str:
    """`char` as "U+202E RIGHT-TO-LEFT OVERRIDE" (as "U+0085" if it has no name, as controls)."""
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X} {name}" if name else f"U+{ord(char):04X}"


def _require_printable_ascii(decoded: str, must: str) -> None:
    """Refuse (501 5.5.4) a decoded DSN parameter with anything but printable ASCII (space
    included), naming its first other character as "U+202E RIGHT-TO-LEFT OVERRIDE"."""
    for char in decoded:
        if not " " <= char <= "~":
            raise SmtpProtocolError(replies.syntax(f"{must}: it holds {_named(char)}", "5.5.4"))


def _decode_utf8_addr(address: str) -> str:
    """A utf-8-addr-xtext/unitext (RFC 6533 3) with its `\\x{HEX}` escapes decoded; refused if
    a `\\` starts no `\\x{HEX}` or an escape names no Unicode scalar value (a surrogate, past
    U+10FFFF): it is copied into a DSN's Original-Recipient and relayed onwards."""
    escapes = _UTF8_ESCAPE.split(address)
    if any("\\" in text for text in escapes[::2]):
        raise SmtpProtocolError(replies.syntax("ORCPT utf-8 address is malformed: \\ must start \\x{HEX}", "5.5.4"))
    for index in range(1, len(escapes), 2):
        hexpoint = escapes[index]
        point = int(hexpoint, 16)
        if point > 0x10FFFF or 0xD800 <= point <= 0xDFFF:
            raise SmtpProtocolError(
                replies.syntax(f"ORCPT \\x{{{hexpoint}}} is no Unicode character (RFC 6533)", "5.5.4")
            )
        escapes[index] = chr(point)
    return "".join(escapes)


def decode_xtext(value: str | None, key: str) -> str:
    if value is None or not value.isascii() or not _XTEXT.fullmatch(value):
        raise SmtpProtocolError(replies.syntax(f"{key} must be xtext (RFC 3461 4)", "5.5.4"))
    if "+" not in value:
        return value
    # "+HH" are octets: collect them as bytes, then read the whole as UTF-8 (encode_xtext's inverse).
    octets = bytearray()
    position = 0
    for match in _XTEXT_ESCAPE.finditer(value):
        octets += value[position : match.start()].encode("ascii")
        octets.append(int(match.group(1), 16))
        position = match.end()
    octets += value[position:].encode("ascii")
    try:
        decoded = octets.decode("utf-8")
    except UnicodeDecodeError:
        raise SmtpProtocolError(replies.syntax(f"{key} is not UTF-8 once decoded", "5.5.4")) from None
    if any(ord(c) < 32 or ord(c) == 127 for c in decoded):
        # CR, LF or other controls would end up inside DSN header fields (header injection).
        raise SmtpProtocolError(replies.syntax(f"{key} must not contain control characters", "5.5.4"))
    return decoded


def encode_utf8_addr_xtext(address: str) -> str:
    """An address as RFC 6533's utf-8-addr-xtext, which any server (and an ASCII delivery-status
    part) takes: a character outside printable ASCII, or "+", "=", "\\", as `\\x{HEX}`."""
    return "".join(c if "!" <= c <= "~" and c not in "+=\\" else f"\\x{{{ord(c):X}}}" for c in address)


def encode_xtext(value: str) -> str:
    """The inverse of `decode_xtext`, for relaying DSN parameters onwards."""
    out = []
    for ch in value:
        if "!" <= ch <= "~" and ch not in "+=":
            out.append(ch)
        else:
            out.extend(f"+{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)
