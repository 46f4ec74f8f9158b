"""Redaction: configured URLs and DSNs without the credentials in them.

A Redis URL, a PostgreSQL DSN or a webhook URL often carries a password or a token, and the
text that names one (an error, a log line, `/healthz`, `pigeon inspect`) is read by people
and probes that must not learn it. Everything that lets such a value out goes through
`redact` (free text) or `redact_url` (one URL), which keep what an operator needs to tell
what failed (scheme, user name, host, port, path) and replace the secret with `***`:

- URL userinfo: `redis://:pw@host` becomes `redis://:***@host`, `postgresql://app:pw@db/x`
  becomes `postgresql://app:***@db/x`; a userinfo without a colon is usually a token
  (`https://TOKEN@host`) and goes whole: `https://***@host`;
- query or fragment parameters whose name ends in a word that says secret (token, key, code,
  secret, password, sig, auth, credential, ...): `?token=abc&page=2` becomes
  `?token=***&page=2`, `?api_key=x` `?api_key=***`;
- path segments that look like a token (16 characters or more, letters and digits mixed,
  as in Slack's `/services/T0/B0/<token>` or Discord's `/api/webhooks/<id>/<token>`): the
  segment goes whole, `https://hooks.example/services/T01/B02/***`;
- `name=value` pairs in free text whose name can mean nothing but a secret (password,
  secret, token, api_key, ...), which covers libpq's keyword DSN form
  (`host=db password='s3 cret' dbname=x` becomes `host=db password=*** dbname=x`).

The userinfo is what comes before the authority's last `@` (as `urllib` and the Redis and
PostgreSQL clients read it), so a password holding an unencoded `@`, `:` or space goes whole.
A password holding a character that ends the authority (`/`, `?`, `#`) breaks the URL's syntax:
what stands before the first of them is then no host and port (`redis://:SEC/RET@h/0` would have
the port "SEC"), and the userinfo is taken to run to the last `@` that a host follows
(`redis://:***@h/0`). The authority of a URL that parses as another one is believed: in
`https://h:8443/@me` the `@` is the path's.

Sharp edge: this works on the text's shape. A password broken by a `/` that still leaves a
host and a port (`https://user:123/x@h`, which connects to the host "user"), a URL in free text
cut by a space in its password, or a secret under an innocent-looking name can still get
through; do not put secrets anywhere but in the userinfo or a parameter named for what it is,
and percent-encode what the URL's syntax reserves (`%2F` `%3F` `%23` `%40` `%20`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Final

from pigeon.logs.peer_text import escape_unprintable

MASK: Final = "***"

HARMLESS_HEADERS: Final = frozenset(
    {
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "cache-control",
        "content-language",
        "content-type",
        "pragma",
        "user-agent",
    }
)
"""Request header fields whose value is shown (`redact_headers`): they say how to read a request
or what sends it, never who may. Any other's value may be a credential under a name of its own
(X-Credentials, X-Jwt, Sessionid, X-Access...), which no list of words would all catch."""

# A URL parameter holds a credential when its name ends in a word that says so: token,
# access_token, key, api_key, X-Amz-Signature, client_secret, sslpassword, ...
_SECRET_PARAMETER: Final = re.compile(
    r"[A-Za-z0-9_.\-]*(?:pass|passwd|password|pwd|secret|token|key|apikey|sig|signature|auth"
    r"|authorization|credential|credentials|code)",  # code: Azure Functions' function key
    re.IGNORECASE,
)
# In free text only names that can mean nothing else (a "dedupe_key=" in a log line is no secret).
_SECRET_PAIR_NAMES: Final = (
    "password|sslpassword|passwd|pwd|secret|client_secret|token|access_token|refresh_token|auth_token|api_key|apikey"
)
_SECRET_PAIR_FIRST: Final = "".join(sorted({name[0] for name in _SECRET_PAIR_NAMES.split("|")}))
# scheme://, then anything but what ends a URL in prose or a repr ('...', "...", <...>),
# less a trailing colon or full stop (the prose's, as in "Redis at redis://r:6379/0: ...").
# The scheme is looked for only from the start of a run of scheme characters (then from its
# first letter: the leftmost match, as ever): tried from every letter of a long run that holds
# no "://", each try would read to the run's end, quadratic time on text anyone can put in a
# log line (an admin's reason, a server's reply).
_URL: Final = re.compile(
    r"(?<![A-Za-z0-9+.\-])[0-9+.\-]*+(?P<url>[A-Za-z][A-Za-z0-9+.\-]*+://(?:[^\s'\"<>`]*[^\s'\"<>`.,:;)\]])?)"
)
# A path segment that is a token: long, and letters mixed with digits (a word or a number is not).
_TOKEN_SEGMENT: Final = re.compile(r"(?=[A-Za-z0-9_\-.~%]*[0-9])(?=[A-Za-z0-9_\-.~%]*[A-Za-z])[A-Za-z0-9_\-.~%]{16,}")
# A URL's host (a name or IPv4 address, a bracketed IPv6 one) and port, as RFC 3986 3.2.2-3
# spells them: what follows a userinfo's `@`.
_HOST_PORT: Final = re.compile(r"(?:\[[0-9A-Za-z:.%_~-]+\]|[A-Za-z0-9._~%!$&'()*+,;=-]+)(?::[0-9]*)?")
_AUTHORITY_END: Final = re.compile(r"[/?#]")
_PARAMETER: Final = re.compile(r"([?&#;])([^=&#;?]*)=([^&#;]*)")
# key=value in free text (libpq's keyword DSN, log lines): a quoted value, or up to a space.
# Every log line goes through it, whatever its length: the lookahead on the names' first letters
# lets the search skip the other positions fast, and the possessive runs never give back what
# cannot end a match (what a quote or `=` follows is read once, not once per try).
_PAIR: Final = re.compile(
    rf"(?=[{_SECRET_PAIR_FIRST}])(?<![A-Za-z0-9_.\-])"
    rf"({_SECRET_PAIR_NAMES})(\s*+=\s*+)('(?:[^'\\]++|\\.)*+'|\"(?:[^\"\\]++|\\.)*+\"|[^\s,;&'\"]++)",
    re.IGNORECASE,
)


def redact_url(url: str) -> str:
    """`url` with its userinfo password (or lone userinfo token) and secret parameters masked."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return _PAIR.sub(_mask_pair, url)  # libpq's keyword form
    userinfo_end = _userinfo_end(rest)
    shown_userinfo = ""
    if userinfo_end is not None:
        user, colon, _ = rest[:userinfo_end].partition(":")
        shown_userinfo = f"{user}:{MASK}@" if colon else f"{MASK}@"
        rest = rest[userinfo_end + 1 :]
    end = _authority_end(rest)
    authority, tail = rest[:end], rest[end:]
    path_end = min((at for at in (tail.find("?"), tail.find("#")) if at >= 0), default=len(tail))
    path = "/".join(MASK if _TOKEN_SEGMENT.fullmatch(part) else part for part in tail[:path_end].split("/"))
    tail = path + tail[path_end:]
    before, hash_, fragment = tail.partition("#")
    if fragment and "=" not in fragment:
        fragment = MASK  # a bare fragment is never sent to the server: if it is there, it is a key
    return f"{scheme}://{shown_userinfo}{authority}{_PARAMETER.sub(_mask_parameter, before + hash_ + fragment)}"


_PROBE: Final = "pigeon0mask0probe"
"""What `masked` puts where a URL has the mask: a secret wherever `redact_url` looks (a
password, a parameter's value, a path segment that looks like a token)."""


def masked(url: str) -> bool:
    """Whether `url` is as `redact_url` gives it (as `pigeon config show` prints it): the mask,
    whole, where a secret goes (a password of "***"), and no secret of its own anywhere. A
    secret that holds `***` ("pass***word") is none."""
    if MASK not in url:
        return False
    probed = url.replace(MASK, _PROBE)
    redacted = redact_url(probed)
    # A probe masked (it stood where a secret goes), each whole, and nothing else masked.
    return redacted.count(_PROBE) < probed.count(_PROBE) and redacted.replace(_PROBE, MASK) == url


def _authority_end(rest: str) -> int:
    """Where the authority of the URL after its `://` ends (RFC 3986 3.2: at `/`, `?` or `#`)."""
    found = _AUTHORITY_END.search(rest)
    return found.start() if found is not None else len(rest)


def _userinfo_end(rest: str) -> int | None:
    """The index of the `@` that ends the userinfo of the URL after its `://`, or None: none.

    As the clients read it: the authority's last `@`. But when what the URL's syntax makes its
    host and port is none (an empty host, a port that is no number, a space), a password broke
    that syntax with a `/`, `?` or `#`, and the userinfo runs to the last `@` that a host (and
    port) follows, whatever it holds; to the last `@` at all, if none does."""
    end = _authority_end(rest)
    at = rest.rfind("@", 0, end)
    if at != -1 and _HOST_PORT.fullmatch(rest, at + 1, end):
        return at
    if "@" not in rest[end:] or (at == -1 and _HOST_PORT.fullmatch(rest, 0, end)):
        return None if at == -1 else at
    # In each run between two of `/?#`, only its last `@` can be followed by a host (a host
    # holds no `@`): one look at each run, from the right, keeps this linear in the URL's length.
    stops = [found.start() for found in _AUTHORITY_END.finditer(rest, end)]
    for run_start, run_end in reversed(list(zip(stops, [*stops[1:], len(rest)], strict=True))):
        last = rest.rfind("@", run_start + 1, run_end)
        if last != -1 and _HOST_PORT.fullmatch(rest, last + 1, run_end):
            return last
    return rest.rfind("@")


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` (configured request headers) with every value masked but a harmless field's
    (`HARMLESS_HEADERS`: Content-Type, Accept, User-Agent, ...; names in any case)."""
    return {name: value if name.lower() in HARMLESS_HEADERS else MASK for name, value in headers.items()}


def redact(text: str) -> str:
    """`text` (an error, a log line) with every URL's and `key=value` credential masked."""
    if "://" not in text and "=" not in text:
        return text  # the common case, checked without a regex
    parts, start = [], 0
    for match in _URL.finditer(text):
        parts += [_PAIR.sub(_mask_pair, text[start : match.start("url")]), redact_url(match["url"])]
        start = match.end()
    parts.append(_PAIR.sub(_mask_pair, text[start:]))
    return "".join(parts)


def _mask_parameter(match: re.Match[str]) -> str:
    if _SECRET_PARAMETER.fullmatch(match[2]) is None:
        return match[0]
    return f"{match[1]}{match[2]}={MASK}"


def _mask_pair(match: re.Match[str]) -> str:
    return f"{match[1]}{match[2]}{MASK}"


class RedactingFormatter(logging.Formatter):
    """A log formatter whose every line (traceback included) goes through `redact`.

    The last line of defence: a library's exception text may quote a URL we gave it. And,
    once for every line, text from others (a remote server's reply, an admin's reason or
    selector, a client's address) goes out with its control and bidirectional characters
    escaped (`pigeon.logs.peer_text.escape_unprintable`): an escape sequence would reach the
    operator's terminal, a newline would forge a line of its own. A traceback keeps its line
    breaks. (JSON event records escape themselves: they do not come through here.)"""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_unprintable(super().formatMessage(record))  # a message is one line

    def format(self, record: logging.LogRecord) -> str:
        # What follows the message's line (a traceback, a stack) keeps its line breaks.
        return redact(escape_unprintable(super().format(record), keep="\n"))
