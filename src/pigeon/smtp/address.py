"""Mailbox addresses: the one check that every door applies (SMTP MAIL and RCPT, HTTP injection).

Pure functions, no I/O. What one door refuses, every door refuses, with the same text:
SMTP puts it in a 501 or 553 reply, the HTTP API in a 400 naming the field.

An address is `local@domain` (RFC 5321 4.1.2), with UTF-8 where the transaction allows it
(RFC 6531), and:

- at most 254 octets in all (RFC 5321 4.5.3.1.3: a path is 256 with its angle brackets) and
  64 in its local part (4.5.3.1.1), counted in UTF-8 octets, not characters; each label of
  its domain at most 63 octets (RFC 1035 2.3.4; a U-label as its A-label, the form DNS and
  the next hop see), as config globs require too: no DNS name has a longer one;
- an address literal is `[IPv4]` or `[IPv6:...]` (4.1.3), without an IPv6 zone (`%eth0`:
  it names an interface of the sender's machine, nothing the next hop could reach);
- a domain that is not ASCII is valid IDNA2008 once in lower case and NFC (RFC 5891 5.4):
  UTS #46 would map `Ⅳ.example` to `iv.example`, another domain than the one written. An
  ASCII domain, A-labels included, goes out as written, so nothing maps it: whether it is
  a name is the DNS's answer (`xn--ls8h.la`, registered under IDNA2003, has an MX);
- no control character (C0, DEL, C1), nor format character (Unicode category Cf: the bidi
  overrides and isolates U+202A-U+202E and U+2066-U+2069, zero-width characters, the BOM),
  line or paragraph separator, or surrogate, anywhere. Such characters make an address
  display as another one, or break the log line and the terminal it is read on.
"""

from __future__ import annotations

import array
import contextlib
import functools
import ipaddress
import itertools
import re
import sys
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

import idna

MAX_ADDRESS: Final = 254  # octets, RFC 5321 4.5.3.1.3 (256 with the angle brackets)
MAX_LOCAL: Final = 64  # octets, RFC 5321 4.5.3.1.1
MAX_LABEL: Final = 63  # octets, RFC 1035 2.3.4 (an A-label's too, RFC 5890 2.3.2.1)

# Categories refused anywhere in an address: controls, format characters (bidi, zero-width),
# surrogates, line and paragraph separators.
_REFUSED_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

_ATEXT: Final = r"A-Za-z0-9!#$%&'*+\-/=?^_`{|}~"
_LET_DIG: Final = "A-Za-z0-9"
_LDH: Final = "A-Za-z0-9-"
_QTEXT: Final = r"\x20\x21\x23-\x5b\x5d-\x7e"

Ranges = Sequence[tuple[int, int]]
"""Characters as runs: the first and last code point of each, in order."""
BEYOND_ASCII: Final[Ranges] = ((0x80, 0x10FFFF),)
"""Every character beyond ASCII: what UTF-8 (RFC 6531) adds to each character class."""


class Kind(Enum):
    """What is wrong: the SMTP reply code follows from it."""

    SYNTAX = "syntax"  # not local@domain: 501
    LENGTH = "length"  # over a limit: 501
    LITERAL = "literal"  # an address literal that is no IP address: 501
    CHARACTER = "character"  # a refused character, whatever the syntax: 553
    IDNA = "idna"  # a domain that is no IDNA2008 name: 553

    @property
    def smtp_code(self) -> int:
        """501 (syntax error in parameters) or 553 (mailbox name not allowed, RFC 5321 4.2.3)."""
        return 553 if self is Kind.CHARACTER or self is Kind.IDNA else 501


@dataclass(frozen=True, slots=True)
class Problem:
    """Why an address is refused. `text` is for a person and never repeats the address."""

    kind: Kind
    text: str


SYNTAX_TEXT: Final = "Not a valid mailbox address (local@domain)"
SOURCE_ROUTE: Final = re.compile(r"@[^,:@\s]+(?:,@[^,:@\s]+)*:")
"""A source route ahead of a mailbox in an SMTP path (`<@a,@b:local@domain>`, RFC 5321 4.1.2
A-d-l): SMTP takes it and ignores it (4.1.1.3, appendix C); no address holds one."""
SOURCE_ROUTE_TEXT: Final = (
    "A source route (@host:) is SMTP path syntax, no part of an address: give local@domain alone (RFC 5321 4.1.1.3)"
)


def dot_string_and_domain(extra: Ranges, *, negated: bool = False, max_label: int | None = None) -> tuple[str, str]:
    """The regex sources of a dot-string local part and a domain (RFC 5321 4.1.2), with the
    characters `extra` (UTF-8, RFC 6531) allowed too. The HTTP API's JSON Schema pattern is
    built from these, so it describes the same addresses as the SMTP server accepts.

    `negated`: each character class written as the characters it leaves out (`[^...]`), which
    matches the same text and which `re` compiles in microseconds where it takes milliseconds
    for a class that lists most of the Basic Multilingual Plane. Not for JSON Schema (ECMA-262
    has no escape for the characters beyond the BMP that such a class may name).

    `max_label`: the most characters a label may have (None: any number, and `check` names a
    label over `MAX_LABEL` octets after the match, as only a count of octets can)."""
    atom = f"{char_class(_ATEXT, extra, negated=negated)}+"
    let_dig, ldh = (char_class(ascii, extra, negated=negated) for ascii in (_LET_DIG, _LDH))
    inside = f"{ldh}*" if max_label is None else f"{ldh}{{0,{max_label - 2}}}"
    label = f"{let_dig}(?:{inside}{let_dig})?"
    return f"{atom}(?:\\.{atom})*", f"{label}(?:\\.{label})*"


def mailbox_pattern(extra: Ranges, *, negated: bool = False) -> str:
    """The regex source of a whole mailbox as `check` takes it, for a schema to admit what SMTP
    admits: a dot-string or a quoted string of at most 64 characters, `@`, and a domain of
    labels of at most 63 characters or an address literal whose inside is an IPv4 address or
    "IPv6:" and an IPv6 address (RFC 5321 4.1.2, 4.1.3; RFC 1035 2.3.4). Read alike by Python
    and JSON Schema (ECMA-262); `extra` and `negated` as for `dot_string_and_domain`. Lengths
    are in characters here, octets in `check` (a U-label's as its A-label's, which no pattern
    can count: a U-label within 63 characters may still be refused)."""
    dot_string, domain = dot_string_and_domain(extra, negated=negated, max_label=MAX_LABEL)
    quoted = f'"(?:{char_class(_QTEXT, extra, negated=negated)}|\\\\[\\x20-\\x7e])*"'
    # A quoted local part may hold "@": its length is up to the last one (the domain has none),
    # so the pattern stands for a whole string.
    quoted = f"(?=[\\s\\S]{{2,64}}@[^@]*$){quoted}"
    return f"(?:(?=[^@]{{1,64}}@){dot_string}|{quoted})@(?:{domain}|\\[(?:{_IPV4}|[Ii][Pp][Vv]6:{_IPV6})\\])"


def _ipv6_pattern() -> str:
    """RFC 3986 3.2.2's IPv6address (the grammar `ipaddress` reads, less a zone) as a regex."""
    h16, ls32 = "[0-9A-Fa-f]{1,4}", f"(?:[0-9A-Fa-f]{{1,4}}:[0-9A-Fa-f]{{1,4}}|{_IPV4})"
    forms = [f"(?:{h16}:){{6}}{ls32}"]
    # "::" with at most `before` groups ahead of it and `after` groups (then ls32) behind.
    for before, after in ((0, 5), (1, 4), (2, 3), (3, 2), (4, 1), (5, 0)):
        ahead = f"(?:(?:{h16}:){{0,{before - 1}}}{h16})?" if before else ""
        forms.append(f"{ahead}::(?:{h16}:){{{after}}}{ls32}")
    forms += [f"(?:(?:{h16}:){{0,5}}{h16})?::{h16}", f"(?:(?:{h16}:){{0,6}}{h16})?::"]
    return f"(?:{'|'.join(forms)})"


_OCTET: Final = "(?:25[0-5]|2[0-4][0-9]|[01]?[0-9]?[0-9])"  # RFC 5321 4.1.3 Snum: 1*3DIGIT, at most 255
_IPV4: Final = rf"(?:{_OCTET}\.){{3}}{_OCTET}"
_IPV6: Final = _ipv6_pattern()


def char_class(ascii: str, extra: Ranges, *, negated: bool = False) -> str:
    """A regex character class of the ASCII characters `ascii` (a class's contents, any hyphen
    last) and the characters `extra`; `negated`: written as `[^...]` of the characters it
    leaves out (see `dot_string_and_domain`)."""
    if not negated:
        hyphen = "-" if ascii.endswith("-") else ""  # last, where it stands for itself
        return f"[{ascii.removesuffix('-')}{_escaped(extra)}{hyphen}]"
    taken = re.compile(f"[{ascii}]")
    left_out = [(point, point) for point in range(0x80) if not taken.match(chr(point))]
    return f"[^{_escaped(_merged([*left_out, *_complement(extra, 0x80, 0x10FFFF)]))}]"


def _escaped(ranges: Ranges) -> str:
    """`ranges` as the contents of a character class, escaped as Python and, within the BMP,
    JSON Schema (ECMA-262) read alike."""

    def escape(point: int) -> str:
        return f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"

    return "".join(escape(first) if first == last else f"{escape(first)}-{escape(last)}" for first, last in ranges)


def _complement(ranges: Ranges, first: int, last: int) -> list[tuple[int, int]]:
    """The runs from `first` to `last` that the sorted `ranges` leave out."""
    gaps: list[tuple[int, int]] = []
    for start, end in ranges:
        if start > first:
            gaps.append((first, start - 1))
        first = end + 1
    if first <= last:
        gaps.append((first, last))
    return gaps


def _merged(ranges: Ranges) -> list[tuple[int, int]]:
    """The sorted `ranges` with adjacent ones joined."""
    merged: list[tuple[int, int]] = []
    for first, last in ranges:
        if merged and merged[-1][1] + 1 >= first:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _mailbox_pattern(utf8: bool) -> re.Pattern[str]:
    # UTF-8 in negated classes: written as the ranges they list, the pattern takes `re` some
    # 60 ms to compile, which every process would spend at start.
    extra: Ranges = BEYOND_ASCII if utf8 else ()
    dot_string, domain = dot_string_and_domain(extra, negated=utf8)
    quoted = f'"(?:{char_class(_QTEXT, extra, negated=utf8)}|\\\\[\\x20-\\x7e])*"'
    literal = r"\[[^\[\]\\\s]+\]"
    return re.compile(f"(?P<local>{dot_string}|{quoted})@(?P<domain>{domain}|{literal})")


_MAILBOX_ASCII: Final = _mailbox_pattern(utf8=False)
_MAILBOX_UTF8: Final = _mailbox_pattern(utf8=True)


def refused_character(text: str) -> Problem | None:
    """The first character of `text` that no address may hold, as a Problem naming it, or None."""
    named = control_or_format_character(text)
    if named is None:
        return None
    return Problem(Kind.CHARACTER, f"Address contains {named}: no control or format characters allowed")


def control_or_format_character(text: str) -> str | None:
    """The first control or format character of `text` (C0, DEL, C1, category Cf such as bidi
    overrides, surrogates, line and paragraph separators), named as "U+001B" or "U+202E RIGHT-TO-LEFT
    OVERRIDE", or None. What no address holds, nor a tenant or campaign (they name queues)."""
    if text.isascii() and text.isprintable():  # the usual case, at C speed
        return None
    for char in text:
        point = ord(char)
        if point < 0x20 or 0x7F <= point < 0xA0 or unicodedata.category(char) in _REFUSED_CATEGORIES:
            name = unicodedata.name(char, "")  # controls have none
            return f"U+{point:04X} {name}" if name else f"U+{point:04X}"
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
        # An API's address is no SMTP path: a route there is refused, saying what to send
        # (SMTP takes it off the path before the check, `commands._split_path`).
        if SOURCE_ROUTE.match(address) is not None:
            return Problem(Kind.SYNTAX, SOURCE_ROUTE_TEXT)
        return Problem(Kind.SYNTAX, SYNTAX_TEXT)
    if len(match.group("local").encode("utf-8")) > MAX_LOCAL:
        return Problem(Kind.LENGTH, f"Local part is longer than {MAX_LOCAL} octets (RFC 5321 4.5.3.1.1)")
    domain = match.group("domain")
    if domain.startswith("["):
        if not valid_literal(domain[1:-1]):
            return Problem(Kind.LITERAL, "Not a valid address literal: [IPv4] or [IPv6:...] (RFC 5321 4.1.3)")
    elif _longest_label(domain) > MAX_LABEL:
        return Problem(Kind.LENGTH, f"Domain has a label longer than {MAX_LABEL} octets (RFC 1035 2.3.4)")
    elif not domain.isascii() and (text := _idna_problem(domain)) is not None:
        return Problem(Kind.IDNA, text)
    return None


U_LABEL_TEXT: Final = "Domain is not a valid internationalized domain name (IDNA2008, RFC 5891 5.4)"


@functools.lru_cache(maxsize=4096)  # an IDN costs some 20 us; a client names the same few
def _idna_problem(domain: str) -> str | None:
    """Why IDNA2008 refuses `domain`, or None. Each label that is not ASCII must be a U-label
    once in lower case (each character's) and NFC (the only mapping taken: it changes no
    character for another), so `Ⅳ.example` (U+2163) and `Ａ.example` (fullwidth) are refused,
    not delivered to `iv.example` and `a.example` as UTS #46 would map them (RFC 5891 5.4:
    those characters are DISALLOWED). ASCII labels go out as written."""
    for label in domain.split("."):
        if not label.isascii() and not _valid_u_label(
            unicodedata.normalize("NFC", "".join([char.lower() for char in label]))
        ):
            # (each character lowered alone, as UTS #46 maps case: "aΣ" is "aσ", not "aς")
            return U_LABEL_TEXT
    return None


def _valid_u_label(label: str) -> bool:
    try:
        idna.alabel(label)
    except (idna.IDNAError, UnicodeError):
        return False
    return True


def _longest_label(domain: str) -> int:
    """Octets of the domain's longest label, a U-label counted as its A-label."""
    if domain.isascii():  # the usual case: no IDNA
        return max(map(len, domain.split(".")))
    return max(len(a_label(label).encode("utf-8")) for label in domain.split("."))


def valid_literal(literal: str) -> bool:
    """Whether the inside of an address literal is an IPv4 address or "IPv6:" and an IPv6
    address (`canonical_literal`)."""
    return canonical_literal(f"[{literal}]") is not None


def canonical_literal(domain: str) -> str | None:
    """An address literal (RFC 5321 4.1.3) in the one form each way of writing it has, or None
    when `domain` is none: `[127.000.0.1]` is `[127.0.0.1]` (4.1.3's Snum is 1*3DIGIT, decimal,
    at most 255: leading zeros are allowed, and mean no octal), `[ipv6:0::1]` is `[IPv6:::1]`
    (RFC 5952's compressed form). A zone ("%eth0"), which Python's parser takes, is refused."""
    if len(domain) < 3 or domain[0] != "[" or domain[-1] != "]" or "%" in domain:
        return None
    inside = domain[1:-1]
    if inside[:5].upper() != "IPV6:":
        ipv4 = _canonical_ipv4(inside)
        return f"[{ipv4}]" if ipv4 is not None else None
    ipv6 = inside[5:]
    if "." in ipv6:  # ends with an IPv4 address, whose Snums may have leading zeros too
        head, _, tail = ipv6.rpartition(":")
        ipv4 = _canonical_ipv4(tail)
        if ipv4 is None:
            return None
        ipv6 = f"{head}:{ipv4}"
    try:
        address = ipaddress.IPv6Address(ipv6)
    except ValueError:
        return None
    mapped = address.ipv4_mapped  # written ::ffff:192.0.2.1 (RFC 5952 5), whatever Python's version
    return f"[IPv6:::ffff:{mapped}]" if mapped is not None else f"[IPv6:{address.compressed}]"


def _canonical_ipv4(text: str) -> str | None:
    """Four Snums (1*3DIGIT, each at most 255) without their leading zeros, or None."""
    snums = text.split(".")
    if len(snums) != 4:
        return None
    for snum in snums:
        if not (0 < len(snum) <= 3 and snum.isascii() and snum.isdigit()) or int(snum) > 255:
            return None
    return ".".join(str(int(snum)) for snum in snums)


def json_schema_extra() -> list[tuple[int, int]]:
    """The non-ASCII characters allowed in an address as JSON Schema (ECMA-262) can write them:
    the Basic Multilingual Plane from U+00A0 less the refused categories and the surrogates."""
    # A walk of the BMP asking each character's category takes 25 ms. The refused categories
    # are all unprintable, so only the unprintable characters (a sixth), found at C speed in
    # a string of the whole BMP (itself built at C speed), are asked.
    bmp = array.array("I", range(0xA0, 0x10000)).tobytes().decode(f"utf-32-{sys.byteorder[0]}e", "surrogatepass")
    unprintable = list(itertools.filterfalse(str.isprintable, bmp))
    refused = [(ord(char),) * 2 for char in unprintable if unicodedata.category(char) in _REFUSED_CATEGORIES]
    return _complement(_merged(refused), 0xA0, 0xFFFF)


def bmp_ranges(allowed: Callable[[str], bool]) -> str:
    """The characters of the Basic Multilingual Plane from U+00A0 that `allowed` takes, as the
    ranges of a regex character class that Python and JSON Schema (ECMA-262) read alike."""
    taken = [(point, point) for point in range(0xA0, 0x10000) if allowed(chr(point))]
    return _escaped(_merged(taken))


_POSTMASTER_ANY_CASE: Final = "".join(f"[{c.upper()}{c}]" for c in "postmaster")
POSTMASTER_PATTERN: Final = f'(?:{_POSTMASTER_ANY_CASE}|"{_POSTMASTER_ANY_CASE}")'
"""A bare postmaster (`is_postmaster`), quoted or not, in any case, as a regex that Python
and JSON Schema (ECMA-262, which has no case-insensitive flag) read alike."""


def is_postmaster(address: str, hostname: str) -> bool:
    """Whether `address` is RFC 5321 4.5.1's postmaster: `postmaster` with no domain, or at
    our own `hostname`; its local part in any case (4.5.1 says so of it alone) and quoted or
    not (4.1.2: quoting is only syntax). Every door delivers it to `[smtp] postmaster`, and
    so a client naming it twice gets one copy."""
    local, at, domain = address.rpartition("@")
    if not at:
        local, domain = address, hostname
    return local.lower() in ("postmaster", '"postmaster"') and domain.lower() == hostname.lower()


def same_mailbox_key(address: str) -> str:
    """What two addresses that name one mailbox have in common: the local part as it is (RFC
    5321 2.4: only the receiving host may fold its case), but written as `plain_local` writes
    it (`"dd"` and `dd` are one local part), and the domain as `a_label` gives it."""
    local, at, domain = address.rpartition("@")
    return f"{plain_local(local)}{at}{a_label(domain)}" if at else address


_DOT_STRING: Final = re.compile(dot_string_and_domain(BEYOND_ASCII, negated=True)[0])


def plain_local(local: str) -> str:
    """A local part in the one form each way of writing it has: a quoted string whose content
    is a dot-string written bare (RFC 5321 4.1.2: `"dd"` is `dd`, and the bare form SHOULD be
    sent); any other quoted string with only the quoted pairs it needs (`"a\\ b"` is `"a b"`).
    A dot-string, or what is no quoted string, is returned as it is."""
    if not _quoted(local):
        return local
    content = local_value(local)
    if _DOT_STRING.fullmatch(content):
        return content
    return '"' + re.sub(r'(["\\])', r"\\\1", content) + '"'


def local_value(local: str) -> str:
    """What a local part stands for: a quoted string's content with its quoted pairs resolved
    (`"reply+q z"` is `reply+q z`, `"a\\"b"` is `a"b`, `"dd"` is `dd`: RFC 5321 4.1.2, quoting is
    only syntax); anything else as it is. What a glob over addresses matches, never what is
    written onward: a value that is no dot-string needs its quotes back (`plain_local`)."""
    if not _quoted(local):
        return local
    return re.sub(r"\\(.)", r"\1", local[1:-1])  # a quoted pair stands for its character


def _quoted(local: str) -> bool:
    """Whether `local` is written as a quoted string (one quote alone is none)."""
    return len(local) >= 2 and local.startswith('"') and local.endswith('"')


@functools.lru_cache(maxsize=8192)  # an IDN costs ~20 us; a recipient's domain is asked for per rule and queue
def a_label(domain: str) -> str:
    """The domain in lower case, each label that is not ASCII as its A-label (IDNA, the form
    DNS knows it by): `bücher.example` and `xn--bcher-kva.example` are one domain, and must
    make one queue, one delivery and one suspension. A label IDNA refuses (or a glob's `*`
    within one) is kept as written. IDNA 2008 with UTS #46 mapping, as registries and
    browsers read names: `straße` is `xn--strae-oqa`, not IDNA 2003's `strasse` (which
    still names a label IDNA 2008 refuses). An address literal is in its one form
    (`canonical_literal`, lower case): `[127.000.0.1]` is `[127.0.0.1]`, `[IPv6:0::1]` is
    `[ipv6:::1]`, one host."""
    if domain.endswith("]") and (literal := canonical_literal(domain)) is not None:
        return literal.lower()  # one host, one form: [IPv6:0::1] is [ipv6:::1]
    domain = domain.lower()
    if domain.isascii():
        return domain
    labels = []
    for label in domain.split("."):
        if not label.isascii() and not any(c in label for c in "*?["):
            try:
                label = idna.encode(label, uts46=True).decode("ascii")
            except idna.IDNAError:
                # Outside IDNA 2008 (a symbol, say): IDNA 2003 still gives such names an
                # A-label, as some registries issued them.
                with contextlib.suppress(UnicodeError):
                    label = label.encode("idna").decode("ascii")
        labels.append(label)
    return ".".join(labels)


def ascii_name(name: str) -> str:
    """A client's EHLO or HELO name as Pigeon writes it back (its Received field, its reply to
    the greeting): as given if ASCII, else its A-labels (as `a_label` writes every domain), or,
    where a label has none (over 63 octets, empty), with what is left not ASCII escaped. Sent
    back raw, 8-bit octets would reach a client that may not read UTF-8 (no SMTPUTF8 yet)."""
    if name.isascii():
        return name
    return a_label(name).encode("ascii", "backslashreplace").decode("ascii")


def with_a_label(address: str) -> str:
    """An address as it goes on the wire (MAIL, RCPT, our Received header's `for`): with an
    ASCII local part, a domain that is not ASCII as its A-label, which every server takes
    (RFC 5890), so the address needs no SMTPUTF8. A UTF-8 local part has no ASCII form: the
    address is kept as it is. A quoted local part goes as `plain_local` writes it: bare when
    it is a dot-string (`"dd"@example.net` as `dd@example.net`, RFC 5321 4.1.2)."""
    if address.startswith('"'):
        local, at, domain = address.rpartition("@")
        if at:
            address = f"{plain_local(local)}@{domain}"
    if address.endswith("]"):
        # An address literal in its one form: `[127.000.0.010]` as `[127.0.0.10]`, the host
        # we connect to (`a_label`). Written as given, a next hop that reads leading zeros as
        # octal (inet_aton) or refuses them (Python's ipaddress) would not name that host.
        local, at, domain = address.rpartition("@")
        literal = canonical_literal(domain) if at else None
        return f"{local}@{literal}" if literal is not None else address
    if address.isascii():
        return address
    local, at, domain = address.rpartition("@")
    if not at or not local.isascii():
        return address
    return f"{local}@{a_label(domain)}"
