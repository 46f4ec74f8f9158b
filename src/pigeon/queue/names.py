"""Queue names.

Scheduled queue: `campaign:tenant@domain` (KumoMTA's convention, so its users find their
way): missing parts are left out, giving `tenant@domain`, `campaign:@domain` or `domain`.

Ready queue: `source->site`, shared by every domain whose MX hosts are the site's, or
`source->domain@site` for a domain a `[[shaping]]` block (other than `domain = "*"`) gives a
queue of its own; either may end in the TLS policy (`Destination.security`).

A policy hook may name a queue outright, and an `[[inbound]]` route's mail is in
`inbound:<target>`.

A name an operator gives (`pigeon rebind --to-queue`) must be one queue, typed whole:
`QUEUE_NAME_TEXT` says what that is, and the README and the OpenAPI document quote it.

An admin selector's `tenant`, `campaign` and `domain` name the parts of the queue a message is
in now (`queue_parts`), as KumoMTA's do: mail an operator or a policy moved to another
`campaign:tenant@domain` is that queue's mail. A name without "@" may be a domain's queue or one
named outright (`bulk`): its mail is matched by its envelope, as before it was moved.
"""

from __future__ import annotations

import array
import functools
import itertools
import re
import sys
from collections.abc import Iterator
from typing import Final

from pigeon.smtp.address import a_label, bmp_ranges, control_or_format_character

MAX_QUEUE_NAME: Final = 255
"""Longest queue name an operator or a policy may give: it is written into every log record,
metric label and spool row of its messages."""
QUEUE_NAME_TEXT: Final = (
    f"1 to {MAX_QUEUE_NAME} printable characters, without white space, the glob characters * and ?, "
    "the -> of ready queues, and not starting inbound: (the [[inbound]] routes' queues)"
)
MAX_PART: Final = 255
"""The longest tenant or campaign, in characters, however it is given (the JSON of an injection,
a routing header at any door, a policy's answer): it names the message's queue."""
PART_PATTERN: Final = r"[^\t-\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff:@]*"
"""A tenant or campaign, as a regex that Python and JSON Schema (ECMA-262) read alike: no white
space character of either (their `\\s` differ), ':' or '@'. Its length and control characters
are `queue_part_problem`'s to refuse, and the OpenAPI document says so: an admin selector's
glob of one is made of `part_refused` (`config.patterns`), an injection's is the stricter
`part_value_pattern`."""
_HEADER_SEPARATORS: Final = re.compile(r"[^\S\x00-\x1f\x7f-\x9f\u2028\u2029]+|[:@]")
"""What a routing header's value has that a tenant or campaign may not, made `_` there: runs of
white space (not the control characters among it, which are refused) and each ':' and '@'."""
_INBOUND_PREFIX: Final = "inbound:"  # the queues of [[inbound]] routes' mail (inbound/routes.py)
_READY_SEPARATOR: Final = "->"  # ready queues are source->site: a scheduled queue never looks like one


def scheduled_queue(domain: str, tenant: str | None = None, campaign: str | None = None) -> str:
    """The scheduled queue of a message for `domain`."""
    name = domain.lower()
    if tenant:
        name = f"{tenant}@{name}"
    elif campaign:
        name = f"@{name}"
    if campaign:
        name = f"{campaign}:{name}"
    return name


def queue_parts(name: str) -> tuple[str, str, str] | None:
    """The (tenant, campaign, domain) of a queue name of a form `scheduled_queue` writes with
    a domain part, "" for a part left out: `campaign:tenant@domain`, `tenant@domain` or
    `campaign:@domain`. None for any other name, which says no more than itself: a domain's
    queue (`example.net`) and one a policy or an operator named (`bulk`) look alike, and
    `inbound:<target>`, `@x`, `a:b:c@x` or `a@b@x` are no `scheduled_queue` name. The domain
    is an A-label (`a_label`), as a recipient's and a selector's are.

    Asked per message and rule as mail falls due (`Rules.intercept`): string splits, no regex."""
    local, at, domain = name.rpartition("@")
    if not at or not domain or "@" in local or name.startswith(_INBOUND_PREFIX):
        return None
    campaign, colon, tenant = local.partition(":")
    if not colon:
        campaign, tenant = "", local
    # What a part cannot hold (':'), or a separator with nothing before it (`:t@x`, `@x`),
    # scheduled_queue never writes: such a name is one named outright.
    if ":" in tenant or not (campaign if colon else tenant):
        return None
    return tenant, campaign, a_label(domain)  # (of an ASCII name, only `lower`: written so already)


def queue_part_problem(value: str) -> str | None:
    """Why `value` cannot be a tenant or campaign (a part of a scheduled queue name, `PART_TEXT`):
    over `MAX_PART` characters; a control or format character would be written into every log
    record, metric label and admin listing of its queue (an ESC drives the terminal); white
    space, ':' or '@' would make a queue name that no selector or `[[queue]] name` reads back."""
    if len(value) > MAX_PART:
        return f"is {len(value)} characters long: at most {MAX_PART}"
    named = control_or_format_character(value)
    if named is not None:
        return f"contains {named}: no control or format characters allowed"
    found = next((char for char in value if char.isspace() or char in ":@"), None)
    return None if found is None else f"contains {found!r}: no white space, ':' or '@' allowed"


INBOUND_CAMPAIGN: Final = _INBOUND_PREFIX[:-1]
"""The campaign no message may have, in any case: its queues (`inbound:tenant@domain`,
`inbound:@domain`) would read as the `[[inbound]]` routes' own (`inbound:<target>`), and
`pigeon retry --queue 'inbound:*'` or `bounce` would take them with those."""


def campaign_problem(value: str) -> str | None:
    """Why `value` cannot be a campaign, at every door (an injection's `campaign`, a routing
    header, a policy's `Changes`): `queue_part_problem`'s reasons, and `INBOUND_CAMPAIGN`."""
    if (problem := queue_part_problem(value)) is not None:
        return problem
    if value.lower() == INBOUND_CAMPAIGN:
        return (
            f"is {value!r}: its queues ({_INBOUND_PREFIX}...) would be taken for the [[inbound]] routes' own,"
            " which are named so"
        )
    return None


def queue_part_from_header(value: str) -> str:
    """A routing header's value (`X-Tenant: acme corp`), unfolded and trimmed, as the tenant
    or campaign it names: each run of white space and each ':' and '@' made `_` ("acme_corp").
    A header cannot be refused for them without refusing the whole message (its sender may not
    even know of the header), so every door that reads one does the same."""
    return _HEADER_SEPARATORS.sub("_", value)


def ready_queue(source: str, site: str, domain: str | None = None, security: str = "") -> str:
    """The ready queue of mail from `source` to `site`; `domain`: that domain's own queue."""
    return f"{source}->{domain}@{site}{security}" if domain else f"{source}->{site}{security}"


@functools.cache
def queue_name_pattern() -> str:
    """`QUEUE_NAME_TEXT` as a regex that Python and JSON Schema (ECMA-262) read alike: the
    server's check and the OpenAPI document's pattern are this one string."""
    # Globs are refused because a name given where one queue is meant (a rebind's destination)
    # that holds `*` is almost surely a selector typed in the wrong place, not a queue.
    inbound = "".join(f"[{c.upper()}{c}]" if c.isalpha() else c for c in _INBOUND_PREFIX)
    allowed = r"\x21-\x29\x2b-\x3e\x40-\x7e" + printable_beyond_ascii()
    return f"(?!{inbound})(?!.*{_READY_SEPARATOR})[{allowed}]{{1,{MAX_QUEUE_NAME}}}"


@functools.cache
def part_value_pattern() -> str:
    """A tenant or campaign (not a glob) for the OpenAPI document, as a regex that Python and
    JSON Schema (ECMA-262) read alike: printable ASCII but the space, ':' and '@', and the Basic
    Multilingual Plane's printable characters that are not white space. So no control or format
    character, which `queue_part_problem` refuses (`PART_PATTERN` lets them by). Beyond the BMP,
    which the two have no common escape for, the document errs on the side of refusing (an emoji
    is taken by the server)."""
    return rf"[\x21-\x39\x3b-\x3f\x41-\x7e{printable_beyond_ascii()}]*"


@functools.cache
def part_refused() -> str:
    """The characters `queue_part_problem` refuses in a tenant or campaign (control and format
    characters, white space, ':' and '@'), as the ranges of a regex character class that Python
    and JSON Schema (ECMA-262) read alike: for a negated class, which takes the rest of Unicode.
    Of the Basic Multilingual Plane only, and not its surrogates: an ECMA-262 regex without the
    `u` flag reads a character beyond it as two surrogates, which the class must take for such a
    character (an emoji) to be taken, as the server takes it. The format characters beyond it
    (tags, U+E0001-U+E007F, ...; some 150), which the two have no common way to write, the server
    refuses and such a class lets by: a pattern cannot say everything `queue_part_problem` does."""
    return _refused(" :@")


def queue_glob_refused() -> str:
    """The characters an admin selector's queue glob may not hold (control and format
    characters, white space: what `queue_part_problem` refuses but ':' and '@', which join a
    queue name's parts), as `part_refused` writes them: what its OpenAPI pattern leaves out."""
    return _refused(" ")


def _refused(printable: str) -> str:
    # Each is unprintable but those of `printable` asked too: only the unprintable ones (a sixth
    # of the BMP, found at C speed) are asked, in 3 ms rather than 40 (`smtp.address.json_schema_extra`).
    bmp = array.array("I", range(0x10000)).tobytes().decode(f"utf-32-{sys.byteorder[0]}e", "surrogatepass")
    asked = [*itertools.filterfalse(str.isprintable, bmp), *printable]
    refused = {ord(char) for char in asked if not "\ud800" <= char <= "\udfff" and queue_part_problem(char)}
    return "".join(_ranges(sorted(refused)))


def _ranges(points: list[int]) -> Iterator[str]:
    """Sorted code points of the BMP as the ranges of a character class, escaped as Python and
    ECMA-262 read alike."""
    for _, run in itertools.groupby(enumerate(points), lambda pair: pair[1] - pair[0]):
        first, *rest = (point for _, point in run)
        yield f"\\u{first:04x}" + (f"-\\u{rest[-1]:04x}" if rest else "")


@functools.cache
def printable_beyond_ascii() -> str:
    """The Basic Multilingual Plane's printable characters that are not white space, as ranges
    of a regex character class that Python and JSON Schema (ECMA-262) read alike."""
    return bmp_ranges(lambda char: char.isprintable() and not char.isspace())


@functools.cache
def _queue_name() -> re.Pattern[str]:
    return re.compile(queue_name_pattern())


def queue_name_problem(name: object) -> str | None:
    """Why `name` cannot be a scheduled queue name an operator (`pigeon rebind --to-queue`) or
    a policy hook (`Changes(queue=...)`) gives, or None when it can (`QUEUE_NAME_TEXT`)."""
    if not isinstance(name, str):
        return f"a queue name is a string, not {type(name).__name__}"
    if _queue_name().fullmatch(name):
        return None
    if not name:
        return "a queue name cannot be empty"
    if len(name) > MAX_QUEUE_NAME:
        return f"a queue name is at most {MAX_QUEUE_NAME} characters, not {len(name)}"
    if any(char.isspace() or not char.isprintable() for char in name):
        return "a queue name holds no white space or control characters"
    if "*" in name or "?" in name:
        return "a queue name is one queue, not a glob (* and ? select queues, with queue)"
    if name.lower().startswith(_INBOUND_PREFIX):
        return f"queue names starting {_INBOUND_PREFIX!r} are the [[inbound]] routes' own"
    if _READY_SEPARATOR in name:
        return f"a queue name holds no {_READY_SEPARATOR!r} (ready queues are source->site)"
    return f"not a queue name: {QUEUE_NAME_TEXT}"  # only astral characters are left (BMP only)


def queue_name(name: str) -> str:
    """A queue name as its messages carry it: its domain part (after the last "@") in lower
    case, without a final dot and as an A-label (`a_label`), as `scheduled_queue` writes it
    and `[[queue]] name` reads it (`slow@bücher.example` is `slow@xn--bcher-kva.example`)."""
    local, at, domain = name.rpartition("@")
    if not at or not domain or ":" in domain:
        return name
    domain = domain.lower()
    return f"{local}@{a_label(domain[:-1] if domain.endswith('.') and domain != '.' else domain)}"
