"""Whether a DKIM key is the one its domain publishes (`pigeon dkim check`).

A key file replaced without a DNS update signs mail that fails verification, and nothing
in the node notices: the signer cannot know what verifiers will find. This asks the DNS
for `<selector>._domainkey.<domain>` (through the node's resolver, `[dns] nameservers`),
reads the key record (RFC 6376 3.6.1, RFC 8463 4) and compares its key with the one the
private key gives. A record that holds the key but that verifiers pass over (an h= without
sha256, an s= without email, a k= in capitals, a tag given twice, a part that is no tag=value,
a v= after another tag) is said to be unusable, not ok: mail signed with the key fails
verification all the same.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from enum import Enum
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from pigeon.delivery.mx import DnsFailure, Resolver
from pigeon.dkim.keys import PrivateKey


class Status(Enum):
    """What the DNS says of a key, as `pigeon dkim check` prints it."""

    OK = "ok"
    MISMATCH = "MISMATCH"
    REVOKED = "revoked"
    NO_RECORD = "no record"
    ALGORITHM = "algorithm mismatch"
    UNUSABLE = "unusable record"
    FAILED = "lookup failed"


@dataclass(frozen=True, slots=True)
class Finding:
    status: Status
    detail: str


_WHITESPACE: Final = str.maketrans("", "", " \t\r\n")
_TAG_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # ALPHA *ALNUMPUNC (RFC 6376 3.2)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A DKIM key record: its tags (the first of each name), the names given more than once, the
    parts that are no tag=value (white space around them taken out: "" is an empty part), and
    whether a v= comes after another part."""

    tags: dict[str, str]
    repeated: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()
    misplaced_version: bool = False


def key_record(text: str) -> KeyRecord | None:
    """The tags of a DKIM key record (white space around them and in p= taken out), or None
    when the text is no key record: no p= tag, or a v= other than DKIM1 (RFC 6376 3.6.1).
    Names and values are kept as written: both are case-sensitive (RFC 6376 3.2), so `P=` is
    not `p=` to a verifier, nor `k=RSA` `k=rsa`. A part that is no tag=value is kept aside, not
    skipped: a verifier refuses the whole record for it; a last part that is empty is none (the
    list may end with ";")."""
    tags: dict[str, str] = {}
    repeated: list[str] = []
    invalid: list[str] = []
    misplaced_version = False
    parts = text.split(";")
    if not parts[-1].strip():
        parts.pop()  # a tag-list may end with ";" (RFC 6376 3.2)
    for index, part in enumerate(parts):
        name, equals, value = part.partition("=")
        name = name.strip()
        if not equals or not _TAG_NAME.fullmatch(name):
            invalid.append(part.strip())
            continue
        misplaced_version |= name == "v" and index > 0
        if name in tags:
            repeated.append(name)
            continue
        tags[name] = value.strip()
    if "p" not in tags:
        return None
    if tags.get("v", "DKIM1") != "DKIM1":
        return None
    tags["p"] = tags["p"].translate(_WHITESPACE)
    return KeyRecord(tags, tuple(dict.fromkeys(repeated)), tuple(invalid), misplaced_version)


def _kind(key: PrivateKey) -> str:
    return "ed25519" if isinstance(key, ed25519.Ed25519PrivateKey) else "rsa"


def _public(key: PrivateKey) -> bytes:
    """The key's public half, as the record's p= decoded should be: the 32 raw bytes (Ed25519),
    or DER SubjectPublicKeyInfo (RSA)."""
    public = key.public_key()
    if isinstance(public, ed25519.Ed25519PublicKey):
        return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _published(p: str, kind: str) -> bytes | None:
    """p= decoded, in `_public`'s form (an RSA key published as PKCS#1 RSAPublicKey, as some
    tools write it, is read too); None when it is not such a key."""
    try:
        raw = base64.b64decode(p, validate=True)
    except (binascii.Error, ValueError):
        return None
    if kind == "ed25519":
        return raw if len(raw) == 32 else None
    try:
        public = serialization.load_der_public_key(raw)
    except (ValueError, TypeError):
        return None
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def compare(texts: list[str], key: PrivateKey) -> Finding:
    """What the TXT records `texts` of a key's name say of `key`: OK when one of them is
    its key (several records: a verifier may take any, RFC 6376 3.6.2.2), else what the first
    key record says."""
    kind = _kind(key)
    records = [record for record in map(key_record, texts) if record is not None]
    if not records:
        return Finding(Status.NO_RECORD, "the name has TXT records, but none is a DKIM key record (v=DKIM1; p=...)")
    findings = [_one(record, key, kind) for record in records]
    return next((f for f in findings if f.status is Status.OK), findings[0])


def _listed(value: str) -> list[str]:
    """The entries of an h= or s= list: colon-separated, white space around each (RFC 6376 3.6.1)."""
    return [entry.strip() for entry in value.split(":")]


def _not_a_tag(part: str) -> str:
    """Why `part` of a tag-list is no tag-spec (tag-name "=" tag-value, RFC 6376 3.2)."""
    if not part:
        return 'an empty part (";;") makes the record invalid: publish one ";" between two tags'
    shown = part if len(part) <= 40 else f"{part[:37]}..."
    if "=" not in part:
        return f'"{shown}" is no tag=value, which makes the record invalid: take it out, or write it as tag=value'
    return (
        f'"{shown}" has no tag name (a letter, then letters, digits or _), which makes the record invalid: '
        "take it out, or name its tag so"
    )


def _one(record: KeyRecord, key: PrivateKey, kind: str) -> Finding:
    tags = record.tags
    if record.invalid:
        # dkimpy and OpenDKIM refuse the record whole (RFC 6376 3.2).
        return Finding(Status.UNUSABLE, f"{_not_a_tag(record.invalid[0])} (RFC 6376 3.2)")
    if record.repeated:
        # RFC 6376 3.2: a tag must not be duplicated; dkimpy refuses the record whole.
        names = ", ".join(f"{name}=" for name in record.repeated)
        return Finding(
            Status.UNUSABLE,
            f"{names} is given twice, which makes the record invalid: publish each tag once (RFC 6376 3.2)",
        )
    if record.misplaced_version:
        # RFC 6376 3.6.1: v= "MUST be the first tag in the record" if present; a verifier that
        # holds to it refuses the record (dkimpy 1.1 and OpenDKIM 2.11 take it all the same).
        return Finding(
            Status.UNUSABLE,
            f"v={tags['v']} comes after another tag, and v= must be first: publish v={tags['v']} first, or no v= "
            "(strict verifiers refuse the record, RFC 6376 3.6.1)",
        )
    if not tags["p"]:
        return Finding(Status.REVOKED, "the record's p= is empty: the key was withdrawn (RFC 6376 3.6.1)")
    published = tags.get("k", "rsa")  # (k= defaults to rsa)
    if published != kind:
        if published.lower() == kind:
            # Values are case-sensitive (RFC 6376 3.2): dkimpy knows no key type "RSA".
            return Finding(
                Status.UNUSABLE,
                f"k={published} is no key type (tag values are case-sensitive): publish k={kind} (RFC 6376 3.2)",
            )
        return Finding(Status.ALGORITHM, f"the record says k={published}, the configured key is {kind}")
    # Both algorithms Pigeon signs with hash with SHA-256 (rsa-sha256, ed25519-sha256); a
    # verifier must ignore a record whose h= does not list it (RFC 6376 3.6.1).
    if "h" in tags and "sha256" not in _listed(tags["h"]):
        return Finding(
            Status.UNUSABLE,
            f"h={tags['h']} leaves out sha256, the hash the signatures use: publish h=sha256, or no h= "
            "(verifiers ignore the record, RFC 6376 3.6.1)",
        )
    # s= names the services the key is for; mail needs "email" or "*" (RFC 6376 3.6.1).
    if "s" in tags and not {"email", "*"} & set(_listed(tags["s"])):
        return Finding(
            Status.UNUSABLE,
            f"s={tags['s']} leaves out email: publish s=email, or no s= (verifiers ignore the record, RFC 6376 3.6.1)",
        )
    if _published(tags["p"], kind) == _public(key):
        return Finding(Status.OK, f"k={kind}, the configured key")
    return Finding(Status.MISMATCH, "the DNS publishes another key: mail signed with this one fails verification")


async def check(resolver: Resolver, name: str, key: PrivateKey) -> Finding:
    """Look up the TXT records of `name` ("s1._domainkey.example.com") and compare them with `key`."""
    try:
        texts = await resolver.texts(name)
    except DnsFailure as failure:
        if failure.not_found:
            return Finding(Status.NO_RECORD, f"{name} does not exist (NXDOMAIN)")
        return Finding(Status.FAILED, " ".join(failure.reply.lines))
    if texts is None:
        return Finding(Status.NO_RECORD, "the name has no TXT record")
    return compare(texts, key)
