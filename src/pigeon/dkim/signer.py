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
from pigeon.dkim.keys import Algorithm, PrivateKey, public_value
from pigeon.smtp.address import a_label

_LINE: Final = 78
"""The longest line of a DKIM-Signature field, without its CRLF (RFC 5322 2.1.1's "SHOULD"):
`[smtp] max_line_length` is at least this, so a next hop with the same limit takes it."""
_B_FIRST: Final = _LINE - len("\tb=")  # of the signature's characters, on b='s own line

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
        """Whether this block signs mail of this author domain (an A-label) and tenant."""
        if self.tenant is not None and self.tenant != tenant:
            return False
        return author_domain is not None and fnmatch.fnmatchcase(author_domain, self.domain)

    def refusal(self, author_domain: str | None, tenant: str | None, author: str | None) -> str | None:
        """Why this block, named by a policy, cannot sign this message (None: it can).

        A name chooses among the blocks; it never widens one. Without `signing_domain`, d= is
        the author domain, and a key published for the glob's domains does not verify for
        another, nor is there a d= at all where From names no domain (`undisclosed-recipients`,
        a group `list:;`, an empty From); and a `tenant` block's key is that tenant's alone.
        `author`: the From field's value as written, None when the message has none (RFC 6376
        5.4: a signature covers From, so no block can sign it)."""
        which = f"DKIM signer {self.name!r}"
        if self.tenant is not None and self.tenant != tenant:
            whose = f"tenant {tenant!r}" if tenant is not None else "no tenant"
            return f"{which} signs only the mail of tenant {self.tenant!r}, not of {whose}"
        if author is None:
            return f"{which} cannot sign a message without a From field (RFC 6376 5.4: a signature covers From)"
        if self.signing_domain is not None:
            return None
        if author_domain is None:
            shown = " ".join(author.split())
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            return (
                f"{which} (domain {self.domain!r}, no signing_domain) cannot sign: the From field "
                f"({shown!r}) names no author domain to sign as d="
            )
        if not fnmatch.fnmatchcase(author_domain, self.domain):
            return (
                f"{which} (domain {self.domain!r}, no signing_domain) cannot sign for the author domain "
                f"{author_domain!r}: d={author_domain} would not verify with its key"
            )
        return None

    def d(self, author_domain: str | None) -> str | None:
        """The signing domain: the configured one, else the author domain (an A-label)."""
        return self.signing_domain if self.signing_domain is not None else author_domain


class SignerRefused(LookupError):
    """A signer a policy named cannot sign the message; the message says why."""


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
        # Folded after signing: a verifier takes out b='s value with its FWS (RFC 6376 3.5,
        # 3.7), so the lines it is folded into are not signed. RSA-2048's 344 characters on
        # one "\tb=" line passed every `max_line_length` under 348.
        value = base64.b64encode(signature)
        lines = [value[:_B_FIRST]]
        lines += [b"\t" + value[at : at + _LINE - 1] for at in range(_B_FIRST, len(value), _LINE - 1)]
        return self.header + b"\r\n".join(lines) + b"\r\n"


class Signers:
    """Every configured signer, in configuration order."""

    __slots__ = ("_keys", "all")

    def __init__(self, signers: Sequence[Signer]) -> None:
        self.all = tuple(signers)
        # Each key by its public value, so that two files holding one key are one key (as the
        # configuration finds them): keys read from one file are one object, valued once.
        values: dict[int, str] = {}
        for signer in self.all:
            if id(signer.key) not in values:
                values[id(signer.key)] = public_value(signer.key)
        self._keys = values

    def __len__(self) -> int:
        return len(self.all)

    def choose(self, fields: Sequence[Field], tenant: str | None, names: Sequence[str] | None = None) -> list[Signer]:
        """The signers for a message with these header fields. `names`: a policy's choice,
        which must each be able to sign it (else `SignerRefused`, naming the first that
        cannot: see `Signer.refusal`); None: by author domain and tenant."""
        author = author_domain(fields)
        if names is None:
            # (Mail whose From names no domain, or that has none, matches no block: unsigned.)
            return self._distinct([s for s in self.all if s.applies(author, tenant)], author)
        chosen = [s for s in self.all if s.name is not None and s.name in names]
        if chosen:
            written = author_field(fields)
            for signer in chosen:
                if (reason := signer.refusal(author, tenant, written)) is not None:
                    raise SignerRefused(reason)
        return self._distinct(chosen, author)

    def _distinct(self, signers: list[Signer], author: str | None) -> list[Signer]:
        """`signers` less each that would sign as one before it does: the same d=, selector,
        algorithm and key. Blocks that overlap (`domain = "*"` and `domain = "example.com"`,
        or one for every tenant and one for a tenant) may share a key and selector, and each
        that matches signs: the message would carry that one signature twice, which says
        nothing more and looks broken. The first block's is kept."""
        if len(signers) < 2:
            return signers
        seen: set[tuple[str | None, str, str, str]] = set()
        kept = []
        for signer in signers:
            same = (signer.d(author), signer.selector.lower(), signer.algorithm, self._keys[id(signer.key)])
            if same not in seen:
                seen.add(same)
                kept.append(signer)
        return kept

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
    """The domain of the first mailbox of the first From: field, lower-case and as an A-label
    (IDNA: `[[dkim]] domain` is written so, and d= must be), or None.

    RFC 6376 signs for the author; with several (a mailbox-list), the first is the one
    taken. Commas and `<` inside quoted display names and comments are not separators."""
    for field in fields:
        if field.name == b"from":
            value = field.raw[field.raw.find(b":") + 1 :].decode("utf-8", "replace")
            domain = _address_domain(_first_mailbox(value))
            if domain is None or domain.isascii():
                return domain
            alabel = a_label(domain)
            return alabel if alabel.isascii() else None
    return None


def author_field(fields: Sequence[Field]) -> str | None:
    """The value of the first From: field as written (unfolded), or None if there is none."""
    for field in fields:
        if field.name == b"from":
            return field.raw[field.raw.find(b":") + 1 :].decode("utf-8", "replace").strip()
    return None


def _first_mailbox(value: str) -> str:
    """The first mailbox of a mailbox-list (RFC 5322 3.4), quoted strings and comments taken
    out (a quoted string leaves `""`, so `"a@b" <c@d>` does not look like an address)."""
    if not any(char in value for char in '",('):
        return value  # one plain mailbox, the usual case: no loop over its characters
    out: list[str] = []
    depth = 0  # of comments, which nest (RFC 5322 3.2.2)
    quoted = angle = escaped = False
    for char in value:
        if escaped:
            escaped = False
            continue
        if char == "\\" and (quoted or depth):
            escaped = True
            continue
        if quoted:
            if char == '"':
                quoted = False
                out.append('"')
            continue
        if depth:
            depth += (char == "(") - (char == ")")
            continue
        if char == "(":
            depth = 1
            out.append(" ")
        elif char == '"':
            quoted = True
            out.append('"')
        elif char == "<":
            angle = True
            out.append(char)
        elif char == ">":
            angle = False
            out.append(char)
        elif char == "," and not angle:
            if "".join(out).strip():  # an empty item (obs-mbox-list: ", a@b") is none
                break
            out = []
        else:
            out.append(char)
    return "".join(out)


def _address_domain(mailbox: str) -> str | None:
    """The domain of one mailbox: `Name <user@domain>` or `user@domain`, comments gone."""
    mailbox = " ".join(mailbox.split())
    open_at = mailbox.find("<")
    if open_at >= 0:
        close_at = mailbox.find(">", open_at)
        address = mailbox[open_at + 1 : close_at if close_at >= 0 else len(mailbox)]
    else:
        address = mailbox
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
    # Folded as it is signed, into lines of at most `_LINE` octets (`[smtp] max_line_length`
    # is never less): between tags, and in h= at its colons (RFC 6376 3.5 allows FWS around
    # both). Only a single tag longer than a line (a d= of a 200-character domain) is left
    # whole: a value has no FWS of its own to fold at.
    h = "h=" + b":".join(names).decode("ascii") + ";"
    tags = ["v=1;", f"a={signer.algorithm};", f"c={signer.c};", f"d={d};", f"s={signer.selector};"]
    tags += [f"t={timestamp};", h, f"bh={bh};"]
    text = _folded("DKIM-Signature:", tags) + "\r\n\tb="  # b= on a line of its own (`Unsigned.sign`)
    header = text.encode("ascii")
    if signer.relaxed_header:
        own = relaxed_header(Field(b"dkim-signature", header))[:-2]  # without its CRLF (RFC 6376 3.7)
    else:
        own = header
    signed.append(own)
    return Unsigned(header, hashlib.sha256(b"".join(signed)).digest(), signer.key)


def _folded(line: str, tags: list[str]) -> str:
    """`line` and then each tag, after a space on the same line while it fits in `_LINE`
    octets, else on a line of its own ("\r\n\t"). A tag too long for any line is cut after
    a colon (the h= list, where FWS may follow one) where it has one."""
    out = [line]
    length = len(line)
    for tag in tags:
        if length + 1 + len(tag) <= _LINE:
            out += (" ", tag)
            length += 1 + len(tag)
            continue
        room, sep = _LINE - length - 1, " "
        while len(tag) > room:
            if cut := tag.rfind(":", 0, room) + 1:
                out += (sep, tag[:cut])
                tag = tag[cut:]
            elif sep != " ":
                break  # no colon to cut at on a line of its own: whole, however long
            room, sep = _LINE - 1, "\r\n\t"
        out += (sep, tag)
        length = (length + 1 if sep == " " else 1) + len(tag)
    return "".join(out)


def _simple(field: Field) -> bytes:
    return field.raw
