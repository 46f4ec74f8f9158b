"""Globs in the configuration: what each kind may hold, checked and normalised at load.

Domain and site globs (`[[route]] domain`, `[[shaping]] domain`, `[[reaction]] site`, ...)
are matched, with fnmatch's case-sensitive matching, against names Pigeon has lower-cased
and stripped of a final dot: recipient domains, MX host names. A pattern written as
`"Example.COM."` would therefore never match anything. So each is normalised the same way
here, and one that no name could ever match (white space, an `@` in a domain, an empty label
as in `a..b`, a character no host name holds) is refused, naming the setting, rather than
matching nothing for ever in silence.

The glob syntax is fnmatch's: `*` any run of characters (dots too), `?` one character,
`[...]` one of a set (`[!...]`: none of it). `GLOB_SETTINGS` lists every glob setting of the
schema and the kind of each; `config.load` applies it.

Sharp edge: `[[queue]] name` globs match whole queue names, whose tenant and campaign come
from headers or a policy and keep their case: only their domain part (after the last `@`)
is lower-cased.
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import re
from collections.abc import Callable
from typing import Final

from pigeon.queue.names import PART_PATTERN, part_refused, printable_beyond_ascii, queue_glob_refused
from pigeon.smtp.address import a_label, canonical_literal

_METAS: Final = frozenset("*?")
_NAME_PUNCTUATION: Final = frozenset("-_")
_MAX_LABEL: Final = 63  # RFC 1035 2.3.4
_MAX_NAME: Final = 253  # RFC 1035 2.3.4, less the final dot
_MAX_PORT: Final = 65535  # RFC 793: a port is 16 bits, and 0 is none


class PatternError(ValueError):
    """A glob no name can match; the message says why, for a person."""


@functools.cache
def api_patterns() -> dict[str, str]:
    """The shapes the admin API takes, as regexes that Python and JSON Schema (ECMA-262) read
    alike, so the server's check and the OpenAPI document's pattern are one string:
    `domain` (a domain glob), `site` (a site glob), `routing_domain` (a domain name, or
    empty), `glob` (any text whose sets are closed), `queue_glob` (an admin request's queue glob:
    the same without white space, control or format characters, which no queue name made at any
    door holds) and `part_glob` (a tenant or
    campaign glob: the same, of the characters a tenant or campaign may hold). A
    finer flaw they let through (a label over 63 characters) is the glob functions' to find."""
    beyond = printable_beyond_ascii()
    # A label of a glob: letters, digits, - _, `*` `?`, and `[...]` sets of what a host name
    # holds (a "." too: a set may stand for a label's end), each closed: a "[" left open would
    # be read by fnmatch as itself, which no host name holds, and match nothing for ever.
    host_set = rf"\[!?[A-Za-z0-9_\-.{beyond}]+\]"
    label = rf"(?:[A-Za-z0-9_\-*?{beyond}]|{host_set})+"
    host = rf"{label}(?:\.{label})*\.?"
    ipv6 = r"\[[0-9A-Fa-f:.]+\]"
    # A port is 1 to 65535, as a site writes it (no leading zero); or a glob: a meta in it,
    # its sets closed as a host's are.
    number = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
    port_set = r"\[!?[0-9\-]+\]"
    port = rf"(?:{number}|(?:[0-9!\-]|{port_set})*(?:[*?]|{port_set})(?:[0-9*?!\-]|{port_set})*)"
    # fnmatch's `[...]` set: "]" first ("[]]", "[!]]") is a member; a "[" with no "]" is itself.
    closed_set = r"\[(?:!?\]|![^\]]|[^!\]])[^\]]*\]"
    name_label = rf"[A-Za-z0-9_\-{beyond}]{{1,63}}"
    no_part = part_refused()  # what no tenant or campaign holds: control and format characters too
    white = PART_PATTERN.removeprefix("[^").removesuffix(":@]*")  # white space, as Python and ECMA-262 both see it
    # What no queue name holds (`queue_glob_refused`: the server refuses it), white space as both see it too.
    no_queue = queue_glob_refused() + white
    return {
        "domain": host,
        "site": rf"(?:{host}|{ipv6})(?:,(?:{host}|{ipv6}))*(?::{port})?",
        "routing_domain": rf"(?:{name_label}(?:\.{name_label})*\.?)?",
        "glob": rf"(?:[^\[]|{closed_set})*",
        "queue_glob": rf"(?:[^\[{no_queue}]|\[(?:!?\]|![^\]{no_queue}]|[^!\]{no_queue}])[^\]{no_queue}]*\])*",
        "part_glob": rf"(?:[^{no_part}\[]|\[(?:!?\]|![^{no_part}\]]|[^{no_part}!\]])[^{no_part}\]]*\])*",
    }


@functools.cache
def api_pattern(kind: str) -> re.Pattern[str]:
    """`api_patterns()[kind]`, compiled."""
    return re.compile(api_patterns()[kind])


def domain_glob(pattern: str) -> str:
    """A domain glob ("example.com", "*.example.net", "mx?.example.org", "*"), lower-cased and
    without a final dot. Raises PatternError for one no domain can match."""
    text = _outer(pattern).lower()
    if "@" in text:
        raise PatternError('holds \'@\': a domain glob matches a domain alone, like "example.com" or "*.example.com"')
    return _host(text)


def domain_name(name: str) -> str:
    """A domain name to route mail by as if its recipients were there (a policy's `Changes(route=...)`
    and `Reroute`), read as a `[[route]] domain` is (`domain_glob`: lower-cased, without a final
    dot, each label that is not ASCII as its A-label) and refused for what no domain holds (an
    empty label, one over 63 characters, a name over 253), and for a glob's `*`, `?`, `[`: it
    names one domain. Or an address literal ("[192.0.2.1]"), as a recipient's domain may be one:
    the mail then goes to that host. Raises PatternError."""
    if name.startswith("[") and canonical_literal(name) is not None:
        return a_label(name)
    text = _outer(name).lower()
    if any(char in _METAS or char == "[" for char in text):
        raise PatternError(
            "holds '*', '?' or '[': a route is one domain name, not a glob (or an address literal, like [192.0.2.1])"
        )
    return _host(text)


def site_glob(pattern: str) -> str:
    """A site glob: a site is its MX hosts, sorted and joined by ",", with ":port" when not 25
    ("mx1.example.net,mx2.example.net", "*.google.com", "relay.example:2525"); each host
    lower-cased and without a final dot. Raises PatternError for one no site can match."""
    text = _outer(pattern).lower()
    if "@" in text:
        raise PatternError('holds \'@\': a site is MX host names, like "*.mx.example.net" or "relay.example:2525"')
    host, colon, port = text.rpartition(":") if ":" in text and "]" not in text.rpartition(":")[2] else (text, "", "")
    if colon and not port:
        raise PatternError("ends with ':' but no port")
    if colon and not all(char.isdigit() or char in "*?[]!-" for char in port):
        raise PatternError(f"port {port!r} is not a number")
    if port.isdigit() and not 1 <= int(port) <= _MAX_PORT:
        raise PatternError(f"port {port} is out of range: a port is 1 to {_MAX_PORT}")
    if port.isdigit() and port != str(int(port)):  # a site's port is written without one
        raise PatternError(f"port {port} has a leading zero: write {int(port)}")
    if colon:
        closed_sets(port)
    hosts = host.split(",")
    if "" in hosts:
        raise PatternError("has an empty host between commas")
    if any(":" in name for name in hosts):  # an IPv6 literal of a next hop ("[::1]:2525"): as written
        return closed_sets(text)  # ("[::1" is no site: its "[" would match only itself)
    return ",".join(_host(name) for name in hosts) + (f":{port}" if colon else "")


_IPV6_LITERAL: Final = re.compile(r"\[([0-9a-f.]*:[0-9a-f:.]*)\]")
_BARE_IPV6_HOP: Final = re.compile(r"(?P<before>^|site:|->)(?P<address>[0-9A-Fa-f]*:[0-9A-Fa-f:.]*):(?P<port>[0-9]+)$")


def host_port(host: str, port: int) -> str:
    """`host:port` as Pigeon writes it everywhere (sites, queue names, log lines, the API), an
    IPv6 address in brackets as in the configuration: "[::1]:2525", never the ambiguous
    "::1:2525"."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def current_site(text: str) -> str:
    """A site, or a key ending with one (`site:<site>`, `path:<source>-><site>`), as written
    now: a next hop's IPv6 address in brackets. Before, a next hop `[::1]:2525` was written
    `::1:2525`; what was kept in that form (a shaping effect in the run directory or Redis)
    is read as the same site. (Only a next hop had such a site: an MX site is host names, an
    address literal's was bracketed already.)"""
    match = _BARE_IPV6_HOP.search(text)
    if match is None:
        return text
    try:
        ipaddress.IPv6Address(match["address"])
    except ValueError:
        return text
    return f"{text[: match.start('address')]}[{match['address']}]:{match['port']}"


def site_matches(site: str, pattern: str) -> bool:
    """Whether `site` is one the site glob `pattern` names, an IPv6 literal's brackets in it
    read as themselves: fnmatch would read `[::1]` as a set of ':' and '1', so a next hop
    written `[::1]:2525` could never be named (a set never holds a colon in a host name).
    A glob written for the form such a site had before it was bracketed (`::1:2525`, a
    `[[reaction]] site` or a standing rule) still names it.

    A glob that names one host of a site of several MX hosts names that site too: an operator
    who writes `mx2.example.net*` means every connection to that host, and the site string
    `mx1.example.net,mx2.example.net` begins with another (a glob against the whole string
    would hold only the domains that have mx2 alone, while those that list it second kept
    connecting to it)."""
    if fnmatch.fnmatchcase(site, _IPV6_LITERAL.sub(r"[[]\1[]]", pattern)):
        return True
    if "[" in site:
        return fnmatch.fnmatchcase(_IPV6_LITERAL.sub(r"\1", site), pattern)
    if "," not in site or "," in pattern:
        return False
    hosts, colon, port = site.rpartition(":")
    if not colon or not port.isdigit():
        hosts, colon, port = site, "", ""
    return any(fnmatch.fnmatchcase(host + colon + port, pattern) for host in hosts.split(","))


def address_glob(pattern: str) -> str:
    """A recipient address glob ("support@app.example", "reply+*@app.example"), its domain
    lower-cased and without a final dot (the whole address is matched in lower case)."""
    text = _outer(pattern).lower()
    local, at, domain = text.rpartition("@")
    if not at:
        if "*" not in text:
            raise PatternError('names no domain: write local@domain, like "support@app.example"')
        return text
    if not local:
        raise PatternError('has nothing before "@" (for any address of a domain: "*@app.example")')
    return f"{local}@{_host(domain)}"


def queue_glob(pattern: str) -> str:
    """A scheduled queue name glob ("*@example.net", "newsletter:*", "acme@*"): queue names
    are `campaign:tenant@domain`, whose domain part is lower-cased and without a final dot."""
    # Not _outer(): mail spooled before routing headers' white space became `_` may still be
    # in a queue `acme corp@...`, and a glob for it must still load.
    if not pattern or pattern != pattern.strip() or not pattern.isprintable():
        raise PatternError("is empty, or holds a control character or white space at an end")
    text = closed_sets(pattern)
    name, at, domain = text.rpartition("@")
    if at and domain and ":" not in domain:
        return f"{name}@{_host(domain.lower())}"
    return text


def closed_sets(pattern: str) -> str:
    """`pattern`, if each `[` in it opens a set that a `]` closes (`api_patterns()["glob"]`).
    fnmatch reads an unclosed `[` as itself, so `c[12:*` would match only names holding "c[12:":
    surely a slip, refused (a `[` itself is written `[[]`). Raises PatternError otherwise."""
    if not api_pattern("glob").fullmatch(pattern):
        raise PatternError("has a '[' set that is not closed with ']' (for a '[' itself, write '[[]')")
    return pattern


GLOB_SETTINGS: Final[tuple[tuple[str, str, Callable[[str], str]], ...]] = (
    ("route", "domain", domain_glob),
    ("queue", "name", queue_glob),
    ("shaping", "domain", domain_glob),
    ("reaction", "site", site_glob),
    ("reaction", "domain", domain_glob),
    ("inbound", "recipient", address_glob),
    ("inbound", "domain", domain_glob),
    ("dkim", "domain", domain_glob),
)
"""Every glob setting of the schema: the array of tables, the key, and its kind."""


def _outer(pattern: str) -> str:
    """What every glob may not hold: emptiness, white space, control characters."""
    if not pattern:
        raise PatternError('is empty (for everything: "*")')
    if any(char.isspace() for char in pattern):
        raise PatternError("holds white space")
    if not pattern.isprintable():
        raise PatternError("holds a control character")
    return pattern


def _host(text: str) -> str:
    """A host name glob, lower-cased already: checked, its one final dot taken off, and each
    label that is not ASCII written as its A-label, as recipient domains are matched
    (`a_label`): `[[shaping]] domain = "bücher.example"` names xn--bcher-kva.example's mail."""
    if text.endswith(".") and text != ".":
        text = text[:-1]
    text = a_label(text)
    labels = _labels(text)
    if "" in labels:
        raise PatternError("has an empty label (a dot at the start, or two in a row, as in 'a..b')")
    for label in labels:
        literal = not any(char in _METAS or char == "\x00" for char in label)
        if literal and len(label) > _MAX_LABEL:
            raise PatternError(f"has a label of {len(label)} characters; a host name's are at most {_MAX_LABEL}")
    if "*" not in text and len(text) > _MAX_NAME:
        raise PatternError(f"is {len(text)} characters long; a host name is at most {_MAX_NAME}")
    return text


def _labels(text: str) -> list[str]:
    """The dot-separated labels of a host glob, each `[...]` set counted as one character
    (written "\\0"); raises for a character no host name holds, or a set left open."""
    out: list[str] = []
    label: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "[":
            end = text.find("]", index + 2 if text[index + 1 : index + 2] in ("!", "]") else index + 1)
            if end < 0:
                raise PatternError("has a '[' set that is not closed with ']'")
            members = text[index + 1 : end].lstrip("!")
            for member in members:
                if not (member.isalnum() or member in _NAME_PUNCTUATION or member == "."):
                    raise PatternError(f"holds {member!r}, which no host name holds")
            label.append("\x00")
            index = end + 1
            continue
        if char == ".":
            out.append("".join(label))
            label = []
        elif char.isalnum() or char in _NAME_PUNCTUATION or char in _METAS:
            label.append(char)
        else:
            raise PatternError(f"holds {char!r}, which no host name holds")
        index += 1
    out.append("".join(label))
    return out
