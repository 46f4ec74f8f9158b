"""Mailbox addresses: the one check that every door applies (SMTP MAIL and RCPT, HTTP injection).

Pure functions, no I/O. What one door refuses, every door refuses, with the same text:
SMTP puts it in a 501 or 553 reply, the HTTP API in a 400 naming the field.

An address is `local@domain` (RFC 5321 4.1.2), with UTF-8 where the transaction allows it
(RFC 6531), and:

- at most 254 octets in all (RFC 5321 4.5.3.1.3: a path is 256 with its angle brackets) and
  64 in its local part (4.5.3.1.1), counted in UTF-8 octets, not characters;
- an address literal is `[IPv4]` or `[IPv6:...]` (4.1.3), without an IPv6 zone (`%eth0`:
  it names an interface of the sender's machine, nothing the next hop could reach);
- no control character (C0, DEL, C1), nor format character (Unicode category Cf: the bidi
  overrides and isolates U+202A-U+202E and U+2066-U+2069, zero-width characters, the BOM),
  line or paragraph separator, or surrogate, anywhere. Such characters make an address
  display as another one, or break the log line and the terminal it is read on.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Final

MAX_ADDRESS: Final = 254  # octets, RFC 5321 4.5.3.1.3 (256 with the angle brackets)
MAX_LOCAL: Final = 64  # octets, RFC 5321 4.5.3.1.1

# Categories refused anywhere in an address: controls, format characters (bidi, zero-width),
# surrogates, line and paragraph separators.
_REFUSED_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

_ATEXT: Final = r"A-Za-z0-9!#$%&'*+\-/=?^_`{|}~"
_UTF8: Final = "\u0080-\U0010ffff"


class Kind(Enum):
    """What is wrong: the SMTP reply code follows from it."""

    SYNTAX = "syntax"  # not local@domain: 501
    LENGTH = "length"  # over a limit: 501
    LITERAL = "literal"  # an address literal that is no IP address: 501
    CHARACTER = "character"  # a refused character, whatever the syntax: 553

    @property
    def smtp_code(self) -> int:
        """501 (syntax error in parameters) or 553 (mailbox name not allowed, RFC 5321 4.2.3)."""
        return 553 if self is Kind.CHARACTER else 501


@dataclass(frozen=True, slots=True)
class Problem:
    """Why an address is refused. `text` is for a person and never repeats the address."""

    kind: Kind
    text: str


SYNTAX_TEXT: Final = "Not a valid mailbox address (local@domain)"


def dot_string_and_domain(extra: str) -> tuple[str, str]:
    """The regex sources of a dot-string local part and a domain (RFC 5321 4.1.2), with the
    character range `extra` (UTF-8, RFC 6531) allowed too. The HTTP API's JSON Schema pattern
    is built from these, so it describes the same addresses as the SMTP server accepts."""
    atom = f"[{_ATEXT}{extra}]+"
    label = f"[A-Za-z0-9{extra}](?:[A-Za-z0-9{extra}-]*[A-Za-z0-9{extra}])?"
    return f"{atom}(?:\\.{atom})*", f"{label}(?:\\.{label})*"


def _mailbox_pattern(utf8: bool) -> re.Pattern[str]:
    extra = _UTF8 if utf8 else ""
    dot_string, domain = dot_string_and_domain(extra)
    quoted = f'"(?:[\\x20\\x21\\x23-\\x5b\\x5d-\\x7e{extra}]|\\\\[\\x20-\\x7e])*"'
    literal = r"\[[^\[\]\\\s]+\]"
    return re.compile(f"(?P<local>{dot_string}|{quoted})@(?P<domain>{domain}|{literal})")


_MAILBOX_ASCII: Final = _mailbox_pattern(utf8=False)
_MAILBOX_UTF8: Final = _mailbox_pattern(utf8=True)


def refused_character(text: str) -> Problem | None:
    """The first character of `text` that no address may hold, as a Problem naming it, or None."""
    if text.isascii() and text.isprintable():  # the usual case, at C speed
        return None
    for char in text:
        point = ord(char)
        if point < 0x20 or 0x7F <= point < 0xA0 or unicodedata.category(char) in _REFUSED_CATEGORIES:
            name = unicodedata.name(char, "")  # controls have none
            named = f"U+{point:04X} {name}" if name else f"U+{point:04X}"
            return Problem(Kind.CHARACTER, f"Address contains {named}: no control or format characters allowed")
    return None


def check(address: str, *, utf8: bool = True) -> Problem | None:
    """Why `address` (without angle brackets, not empty) is refused, or None if it is a mailbox.
    `utf8`: whether non-ASCII characters are allowed (SMTPUTF8, RFC 6531)."""
    problem = refused_character(address)
    if problem is not None:
        return problem
    if len(address.encode("utf-8", "surrogatepass")) > MAX_ADDRESS:
        return Problem(Kind.LENGTH, f"Address is longer than {MAX_ADDRESS} octets (RFC 5321 4.5.3.1.3)")
    match = (_MAILBOX_UTF8 if utf8 else _MAILBOX_ASCII).fullmatch(address)
    if match is None:
        return Problem(Kind.SYNTAX, SYNTAX_TEXT)
    if len(match.group("local").encode("utf-8")) > MAX_LOCAL:
        return Problem(Kind.LENGTH, f"Local part is longer than {MAX_LOCAL} octets (RFC 5321 4.5.3.1.1)")
    domain = match.group("domain")
    if domain.startswith("[") and not valid_literal(domain[1:-1]):
        return Problem(Kind.LITERAL, "Not a valid address literal: [IPv4] or [IPv6:...] (RFC 5321 4.1.3)")
    return None


def valid_literal(literal: str) -> bool:
    """Whether the inside of an address literal is an IPv4 address or "IPv6:" and an IPv6
    address. A zone ("%eth0"), which Python's parser takes, is refused."""
    if "%" in literal:
        return False
    try:
        if literal[:5].upper() == "IPV6:":
            ipaddress.IPv6Address(literal[5:])
        else:
            ipaddress.IPv4Address(literal)
    except ValueError:
        return False
    return True


def json_schema_extra() -> str:
    """The non-ASCII characters allowed in an address, as a JSON Schema (ECMA-262) character
    range: the Basic Multilingual Plane less the refused categories and the surrogates."""
    return bmp_ranges(lambda char: unicodedata.category(char) not in _REFUSED_CATEGORIES)


def bmp_ranges(allowed: Callable[[str], bool]) -> str:
    """The characters of the Basic Multilingual Plane from U+00A0 that `allowed` takes, as the
    ranges of a regex character class that Python and JSON Schema (ECMA-262) read alike."""
    ranges: list[str] = []
    start: int | None = None
    for point in range(0xA0, 0x10001):
        wanted = point < 0x10000 and allowed(chr(point))
        if wanted and start is None:
            start = point
        elif not wanted and start is not None:
            ranges.append(f"\\u{start:04x}" if start == point - 1 else f"\\u{start:04x}-\\u{point - 1:04x}")
            start = None
    return "".join(ranges)


def same_mailbox_key(address: str) -> str:
    """What two addresses that name one mailbox have in common: the local part as it is (RFC
    5321 2.4: only the receiving host may fold its case) and the domain in lower case."""
    local, at, domain = address.rpartition("@")
    return f"{local}{at}{domain.lower()}" if at else address
