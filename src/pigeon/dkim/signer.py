"""DKIM signatures (RFC 6376, and RFC 8463 for Ed25519): which signers apply, and signing.

A `Signer` is one `[[dkim]]` block with its key loaded. `Signers.prepare` does everything
but the private-key operation: it picks the signers that apply to a message (its author
domain, its tenant, or the names a policy chose), hashes the body once per body
canonicalization, and builds each DKIM-Signature header up to its `b=`, with the hash to
sign. `Unsigned.sign` then does the key operation: about a millisecond for RSA-2048, which
`cryptography` runs without the GIL, so it belongs in a thread (`pigeon.dkim.signing`).

What is signed is what is delivered: the header fields named in `h=` and the body are
exactly the bytes the SMTP client sends. Pigeon's own headers (X-Tenant, X-Campaign), taken
off on the way out, are never in `h=` (the configuration refuses them), so taking them
off does not break a signature.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ed25519, padding
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed

from pigeon.config.schema import DKIM_OVER_SIGNED, DkimConfig
from pigeon.dkim.canonical import Field, body_hash, relaxed_header
from pigeon.dkim.keys import Algorithm, PrivateKey

_FOLD: Final = 72  # h= is folded before it passes this many characters on a line
_PREHASHED: Final = Prehashed(hashes.SHA256())
_PKCS1: Final = padding.PKCS1v15()


@dataclass(frozen=True, slots=True)
class Signer:
    """One `[[dkim]]` block, its key loaded."""

    domain: str  # lower-case glob on the author domain
    selector: str
    algorithm: Algorithm
    key: PrivateKey
    headers: tuple[bytes, ...]  # lower-case, in h= order, no repeats
    over_signed: frozenset[bytes]
    relaxed_header: bool
    relaxed_body: bool
    signing_domain: str | None = None
    tenant: str | None = None
    name: str | None = None

    @classmethod
    def from_config(cls, config: DkimConfig, key: PrivateKey) -> Signer:
        header_c, _, body_c = config.canonicalization.partition("/")
        over = DKIM_OVER_SIGNED if config.over_sign is True else (config.over_sign or [])
        names = [h.strip().lower() for h in config.headers] + [h.strip().lower() for h in over]
        return cls(
            domain=config.domain.lower(),
            selector=config.selector,
            algorithm=config.algorithm,
            key=key,
            headers=tuple(dict.fromkeys(n.encode("ascii") for n in names)),
            over_signed=frozenset(h.strip().lower().encode("ascii") for h in over),
            relaxed_header=header_c == "relaxed",
            relaxed_body=body_c == "relaxed",
            signing_domain=config.signing_domain.lower() if config.signing_domain else None,
            tenant=config.tenant,
            name=config.name,
        )

    @property
    def c(self) -> str:
        """The c= tag: header/body canonicalization."""
        return f"{'relaxed' if self.relaxed_header else 'simple'}/{'relaxed' if self.relaxed_body else 'simple'}"

    def applies(self, author_domain: str | None, tenant: str | None) -> bool:
        if self.tenant is not None and self.tenant != tenant:
            return False
        return author_domain is not None and fnmatch.fnmatchcase(author_domain, self.domain)

    def d(self, author_domain: str | None) -> str | None:
        """The signing domain: the configured one, else the author domain (as an A-label)."""
        if self.signing_domain is not None:
            return self.signing_domain
        if author_domain is None:
            return None
        try:
            return author_domain if author_domain.isascii() else author_domain.encode("idna").decode("ascii")
        except UnicodeError:
            return None


class Unsigned:
    """A DKIM-Signature header field up to its `b=`, and the hash its signature signs."""

    __slots__ = ("digest", "header", "key")

    def __init__(self, header: bytes, digest: bytes, key: PrivateKey) -> None:
        self.header = header
        self.digest = digest
        self.key = key

    def sign(self) -> bytes:
        """The whole header field, CRLF-terminated. The key operation: call it off the loop."""
        key = self.key
        if isinstance(key, ed25519.Ed25519PrivateKey):
            signature = key.sign(self.digest)  # RFC 8463 3: Ed25519 signs the SHA-256 hash
        else:
            signature = key.sign(self.digest, _PKCS1, _PREHASHED)
        return self.header + base64.b64encode(signature) + b"\r\n"


class Signers:
    """Every configured signer, in configuration order."""

    __slots__ = ("all",)

    def __init__(self, signers: Sequence[Signer]) -> None:
        self.all = tuple(signers)

    def __len__(self) -> int:
        return len(self.all)

    def choose(self, fields: Sequence[Field], tenant: str | None, names: Sequence[str] | None = None) -> list[Signer]:
        """The signers for a message with these header fields. `names`: a policy's choice,
        taken as it is (no domain or tenant test); None: by author domain and tenant."""
        if names is not None:
            return [s for s in self.all if s.name is not None and s.name in names]
        author = author_domain(fields)
        return [s for s in self.all if s.applies(author, tenant)]

    def prepare(
        self, fields: Sequence[Field], body: bytes, signers: Sequence[Signer], timestamp: int
    ) -> list[Unsigned]:
        """Everything but the key operation, for a message as it will be sent: its header
        fields (`header_fields`) and its body (`split_message` gives both)."""
        author = author_domain(fields)
        body_hashes: dict[bool, str] = {}
        by_name: dict[bytes, list[Field]] = {}
        for field in fields:
            by_name.setdefault(field.name, []).append(field)
        prepared = []
        for signer in signers:
            d = signer.d(author)
            if d is None:
                continue
            relaxed = signer.relaxed_body
            bh = body_hashes.get(relaxed)
            if bh is None:
                bh = body_hashes[relaxed] = base64.b64encode(body_hash(body, relaxed=relaxed)).decode("ascii")
            unsigned = _unsigned(signer, by_name, d, bh, timestamp)
            if unsigned is not None:
                prepared.append(unsigned)
        return prepared


def author_domain(fields: Sequence[Field]) -> str | None:
    """The lower-case domain of the first address of the first From: field, or None."""
    for field in fields:
        if field.name == b"from":
            value = field.raw[field.raw.find(b":") + 1 :].decode("utf-8", "replace")
            return _address_domain(value)
    return None


def _address_domain(value: str) -> str | None:
    value = " ".join(value.split())
    while "(" in value:  # comments go first (not nested): they may hold anything, "<" too
        start = value.find("(")
        end = value.find(")", start)
        if end < 0:
            break
        value = value[:start] + " " + value[end + 1 :]
    open_at = value.rfind("<")
    if open_at >= 0:  # "Name" <user@domain>: the angle-addr, which comes last
        close_at = value.find(">", open_at)
        address = value[open_at + 1 : close_at if close_at >= 0 else len(value)]
    else:  # user@domain, or a list of them: the first
        address = value.split(",", 1)[0]
    _, at, domain = address.strip().rpartition("@")
    domain = domain.strip().rstrip(".").lower()
    if not at or not domain or any(c in domain for c in ' "<>;:,[]\\'):
        return None
    return domain


def _unsigned(signer: Signer, by_name: dict[bytes, list[Field]], d: str, bh: str, timestamp: int) -> Unsigned | None:
    names: list[bytes] = []
    signed: list[bytes] = []
    canon = relaxed_header if signer.relaxed_header else _simple
    over_signed = signer.over_signed
    for name in signer.headers:  # ~30 names, of which a message has a handful
        present = by_name.get(name)
        if present is None:
            if name in over_signed:
                names.append(name)  # "no such field": one added on the way breaks the signature
            continue
        # Verifiers take repeated fields from the bottom up (RFC 6376 5.4.2); an over-signed
        # name, once more than present, stands for "no further such field".
        names += [name] * (len(present) + (name in over_signed))
        signed += [canon(f) for f in reversed(present)]
    if b"from" not in by_name:
        return None  # RFC 6376 5.4: a signature must cover From; a message without one is not signed
    # h= folded at colons (FWS is allowed around them), to keep lines short.
    h = b":".join(names).decode("ascii") + ";"
    folded = []
    while len(h) > _FOLD:
        cut = h.rfind(":", 0, _FOLD) + 1 or len(h)
        folded.append(h[:cut])
        h = h[cut:]
    folded.append(h)
    h = "\r\n\t".join(folded)
    text = (
        f"DKIM-Signature: v=1; a={signer.algorithm}; c={signer.c}; d={d}; s={signer.selector};\r\n"
        f"\tt={timestamp}; h={h}\r\n\tbh={bh};\r\n\tb="
    )
    header = text.encode("ascii")
    if signer.relaxed_header:
        own = relaxed_header(Field(b"dkim-signature", header))[:-2]  # without its CRLF (RFC 6376 3.7)
    else:
        own = header
    signed.append(own)
    return Unsigned(header, hashlib.sha256(b"".join(signed)).digest(), signer.key)


def _simple(field: Field) -> bytes:
    return field.raw
