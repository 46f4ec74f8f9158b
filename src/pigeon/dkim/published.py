"""Whether a DKIM key is the one its domain publishes (`pigeon dkim check`).

A key file replaced without a DNS update signs mail that fails verification, and nothing
in the node notices: the signer cannot know what verifiers will find. This asks the DNS
for `<selector>._domainkey.<domain>` (through the node's resolver, `[dns] nameservers`),
reads the key record (RFC 6376 3.6.1, RFC 8463 4) and compares its key with the one the
private key gives. A record that holds the key but that verifiers pass over (an h= without
sha256, an s= without email, a k= in capitals, a tag given twice) is said to be unusable,
not ok: mail signed with the key fails verification all the same.
"""

from __future__ import annotations

import base64
import binascii
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


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A DKIM key record: its tags (the first of each name) and the names given more than once."""

    tags: dict[str, str]
    repeated: tuple[str, ...] = ()


def key_record(text: str) -> KeyRecord | None:
    """The tags of a DKIM key record (white space around them and in p= taken out), or None
    when the text is no key record: no p= tag, or a v= other than DKIM1 (RFC 6376 3.6.1).
    Names and values are kept as written: both are case-sensitive (RFC 6376 3.2), so `P=` is
    not `p=` to a verifier, nor `k=RSA` `k=rsa`."""
    tags: dict[str, str] = {}
    repeated: list[str] = []
    for part in text.split(";"):
        name, equals, value = part.partition("=")
        name = name.strip()
        if not equals or not name:
            continue
        if name in tags:
            repeated.append(name)
            continue
        tags[name] = value.strip()
    if "p" not in tags:
        return None
    if tags.get("v", "DKIM1") != "DKIM1":
        return None
    tags["p"] = tags["p"].translate(_WHITESPACE)
    return KeyRecord(tags, tuple(dict.fromkeys(repeated)))


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


def _one(record: KeyRecord, key: PrivateKey, kind: str) -> Finding:
    tags = record.tags
    if record.repeated:
        # RFC 6376 3.2: a tag must not be duplicated; dkimpy refuses the record whole.
        names = ", ".join(f"{name}=" for name in record.repeated)
        return Finding(
            Status.UNUSABLE,
            f"{names} is given twice, which makes the record invalid: publish each tag once (RFC 6376 3.2)",
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
