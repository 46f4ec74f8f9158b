"""MTA-STS (RFC 8461), the pure part: the TXT record, the policy, and which MX hosts it allows.

A domain that publishes `_mta-sts.<domain> TXT "v=STSv1; id=..."` and a policy at
`https://mta-sts.<domain>/.well-known/mta-sts.txt` says: mail for me goes only to MX hosts
matching these patterns, over STARTTLS with a certificate valid for the MX host's name. This
module parses both texts and answers the questions delivery asks of a policy; fetching and
caching them is `pigeon.delivery.mta_sts_store`'s business, applying them the router's
(`pigeon.delivery.routes`) and the connection's (`pigeon.delivery.session`).

No I/O here: texts in, values or `PolicyError` out.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pigeon.delivery.warning_pace import WarningPace

MAX_AGE_CAP: Final = 31_557_600
"""RFC 8461 3.2: a `max_age` over a year is taken as a year."""
MAX_POLICY_SIZE: Final = 64 * 1024
"""RFC 8461 3.3: a policy body larger than 64 KiB is no policy."""

# RFC 8461 3.1: sts-id = 1*32(ALPHA / DIGIT); an extension's name and value.
_ID: Final = re.compile(r"[A-Za-z0-9]{1,32}")
_EXT_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
_EXT_VALUE: Final = re.compile(r"[\x21-\x3a\x3c\x3e-\x7e]+")
# RFC 8461 3.2: an mx pattern is 1*(ALPHA / DIGIT / "_" / "-" / "."), which may begin "*.".
_MX: Final = re.compile(r"(\*\.)?[A-Za-z0-9_.-]+")
_MAX_AGE: Final = re.compile(r"[0-9]{1,10}")
_POLICY_VALUE: Final = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


class PolicyError(ValueError):
    """A TXT record or policy that is not valid: the domain has no policy (RFC 8461 3.1, 3.2).
    The text says why, for the WARNING that names the domain."""


class Mode(enum.Enum):
    ENFORCE = "enforce"
    TESTING = "testing"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Policy:
    """A parsed policy (RFC 8461 3.2). `mx` are the patterns, lower-case, without a final dot."""

    mode: Mode
    mx: tuple[str, ...]
    max_age: int

    def allows(self, host: str) -> bool:
        """Whether the MX host `host` matches one of the policy's patterns (RFC 8461 4.1)."""
        return any(matches(pattern, host) for pattern in self.mx)

    def describe(self) -> str:
        """How a reply or a log names it: "mode enforce, mx mail.example.net, *.example.org"."""
        return f"mode {self.mode.value}, mx {', '.join(self.mx) or '(none)'}"


def matches(pattern: str, host: str) -> bool:
    """RFC 8461 4.1: `host` (an MX record's name) matches `pattern` exactly, or, for a pattern
    "*.example.net", has one more label, leftmost, than "example.net" (not "example.net" itself,
    nor "a.b.example.net"). Case and a final dot do not matter."""
    host = host.lower().rstrip(".")
    pattern = pattern.lower().rstrip(".")
    if pattern.startswith("*."):
        first, dot, rest = host.partition(".")
        return bool(first) and bool(dot) and rest == pattern[2:]
    return host == pattern


def parse_record(texts: Sequence[str]) -> str:
    """The policy id of a domain's `_mta-sts` TXT records (each a record's strings joined).
    Records that do not begin with "v=STSv1" are not ours (RFC 8461 3.1); there must be exactly
    one that does, and it must be valid. Raises PolicyError otherwise (the domain has no policy:
    `NoRecord` when none begins so)."""
    ours = [text for text in texts if text.startswith("v=STSv1") and text[7:8] in ("", ";", " ", "\t")]
    if not ours:
        raise NoRecord("no TXT record begins with v=STSv1")
    if len(ours) > 1:
        raise PolicyError(f"{len(ours)} TXT records begin with v=STSv1 (one is allowed)")
    text = ours[0]
    # sts-text-record = sts-version 1*(*WSP %x3B *WSP sts-field) [%x3B]
    fields = text.split(";")
    if fields[0].rstrip(" \t") != "v=STSv1":
        raise PolicyError("the record does not begin with v=STSv1;")
    if fields[-1].strip(" \t") == "":
        fields = fields[:-1]  # a final ";" (and white space before it)
    policy_id: str | None = None
    for field in fields[1:]:
        field = field.strip(" \t")
        name, equals, value = field.partition("=")
        if not equals:
            raise PolicyError(f"a field is not name=value: {field!r}")
        if name == "id":
            if not _ID.fullmatch(value):
                raise PolicyError(f"id must be 1 to 32 letters and digits: {value!r}")
            if policy_id is None:
                policy_id = value
        elif not _EXT_NAME.fullmatch(name) or not _EXT_VALUE.fullmatch(value):
            raise PolicyError(f"a field is not valid: {field!r}")
    if policy_id is None:
        raise PolicyError("the record has no id")
    return policy_id


class NoRecord(PolicyError):
    """No TXT record of MTA-STS at all: the common case, no policy and nothing to warn about."""


def parse_policy(text: str) -> Policy:
    """A policy body (RFC 8461 3.2): lines "key: value", ended by CRLF or LF. `version` must be
    STSv1 and `mode` one of enforce, testing, none; `max_age` is capped at a year; `mx` may come
    many times (at least once, but in mode none). Of the other keys, the first of each counts,
    and unknown ones are ignored. Raises PolicyError."""
    version: str | None = None
    mode: str | None = None
    max_age: str | None = None
    mx: list[str] = []
    for number, line in enumerate(text.replace("\r\n", "\n").split("\n"), 1):
        line = line.rstrip(" \t")
        if not line:
            continue
        name, colon, value = line.partition(":")
        value = value.lstrip(" \t")
        if not colon or not _EXT_NAME.fullmatch(name) or not _POLICY_VALUE.fullmatch(value):
            raise PolicyError(f"line {number} is not 'key: value': {line[:80]!r}")
        if name == "version":
            version = value if version is None else version
        elif name == "mode":
            mode = value if mode is None else mode
        elif name == "max_age":
            max_age = value if max_age is None else max_age
        elif name == "mx":
            if not _MX.fullmatch(value) or "*" in value[1:]:
                raise PolicyError(f"mx {value!r} is not a host name or *.domain pattern")
            mx.append(value.lower().rstrip("."))
    if version != "STSv1":
        raise PolicyError(f"version is {version!r}, not 'STSv1'" if version is not None else "no version")
    if mode not in ("enforce", "testing", "none"):
        raise PolicyError(f"mode is {mode!r}, not enforce, testing or none" if mode is not None else "no mode")
    if max_age is None or not _MAX_AGE.fullmatch(max_age):
        raise PolicyError(f"max_age is {max_age!r}, not a number of seconds" if max_age is not None else "no max_age")
    if not mx and mode != "none":
        raise PolicyError(f"mode {mode} and no mx")
    return Policy(Mode(mode), tuple(dict.fromkeys(mx)), min(int(max_age), MAX_AGE_CAP))


def media_type_is_text(content_type: str | None) -> bool:
    """RFC 8461 3.3: the policy is served as `text/plain` (parameters such as charset allowed)."""
    if content_type is None:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "text/plain"


@dataclass(frozen=True, slots=True)
class Applied:
    """A policy as a destination carries it: whose it is (the recipient domain) and what it says."""

    domain: str
    policy: Policy
    policy_id: str

    @property
    def enforced(self) -> bool:
        return self.policy.mode is Mode.ENFORCE

    def describe(self) -> str:
        return f"{self.domain}'s MTA-STS policy (id {self.policy_id}, {self.policy.describe()})"

    def would_fail(self, host: str, verified: bool) -> str | None:
        """Of a connection made under a `testing` policy to the MX `host`, TLS `verified` (for
        that name, against the CAs) or not: why enforcing the policy would have refused it (None:
        it would not have)."""
        if not self.policy.allows(host):
            return f"MX host {host} matches no mx of the policy"
        if not verified:
            return f"MX host {host} gave no TLS with a certificate valid for its name"
        return None


WARNINGS: Final = WarningPace()
"""The process's: a warning about a domain's policy is given by whichever room meets it."""
