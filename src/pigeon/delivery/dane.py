"""DANE for outbound SMTP (RFC 7672, with RFC 7671 and RFC 6698): TLSA records and what they
make of a connection to an MX host.

With `[dane] enabled` and a validating resolver, mail for a domain whose MX records are secure
(the nameserver set AD: `Resolver.exchangers_secure`) has each MX host's TLSA records looked up
at `_<port>._tcp.<host>` once its addresses are known to be secure too (RFC 7672 2.2); when they
came through a CNAME chain, at `_<port>._tcp.<the chain's end>` first, and at the MX host name
only if that has none, securely (RFC 7672 2.2.2). Then (`host_policy`):

* secure TLSA records, some usable (usage DANE-TA 2 or DANE-EE 3; selector 0 or 1; matching
  type 0, 1 or 2): the host must do STARTTLS and its certificate must match one of them
  (`check`), or it is not delivered to;
* secure TLSA records, none usable (PKIX-TA 0 and PKIX-EE 1 are not for SMTP, RFC 7672 3.1.3;
  unknown parameters): TLS is mandatory (RFC 7672 2.2), and the certificate is checked as
  without DANE (PKIX, if the route or MTA-STS asks): only usable records replace that;
* no records (NXDOMAIN, NODATA), or an insecure answer: no DANE for the host;
* the lookup failed (SERVFAIL, a timeout: with a validating resolver, perhaps a bogus answer):
  the host is not used for this attempt (RFC 7672 2.2: as if unreachable), `LookupFailed`.

The match (`check`), after a handshake that verified nothing itself (PKIX has no say): a
DANE-EE record matches the leaf certificate, and that is all (no name, no expiry: RFC 7672
3.1.1); a DANE-TA record matches a certificate of the chain the server presented, to which the
leaf must chain, valid now, and which must name the MX host or the end of its CNAME chain
(RFC 7672 3.1.2, 3.2.2), checked by
`cryptography`'s verifier. Python's `ssl` gives the presented chain only through a private
method (`_sslobj.get_unverified_chain()`, public from 3.13): without it, a DANE-TA record
matches nothing, and only DANE-EE records can be met (`presented_chain`).

No I/O but the TLSA lookup (through the resolver, cached per its TTL).
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pigeon.delivery.mx import DnsFailure, Resolver
from pigeon.smtp.replies import Reply

PKIX_TA: Final = 0
PKIX_EE: Final = 1
DANE_TA: Final = 2
DANE_EE: Final = 3
_USAGES: Final = {PKIX_TA: "PKIX-TA", PKIX_EE: "PKIX-EE", DANE_TA: "DANE-TA", DANE_EE: "DANE-EE"}
_DIGESTS: Final = {1: "sha256", 2: "sha512"}  # matching types (RFC 6698 2.1.3); 0 is the data itself


@dataclass(frozen=True, slots=True)
class Record:
    """A TLSA record (RFC 6698 2.1): usage, selector, matching type and its certificate data."""

    usage: int
    selector: int
    mtype: int
    data: bytes

    @property
    def usable(self) -> bool:
        """Whether RFC 7672 has SMTP use it: DANE-TA or DANE-EE, a known selector and matching
        type, and data of the digest's length (a record of the wrong length matches nothing)."""
        if self.usage not in (DANE_TA, DANE_EE) or self.selector not in (0, 1):
            return False
        if self.mtype == 0:
            return bool(self.data)
        digest = _DIGESTS.get(self.mtype)
        return digest is not None and len(self.data) == hashlib.new(digest).digest_size

    def describe(self) -> str:
        """How records and replies name it: "DANE-EE 3 1 1"."""
        usage = _USAGES.get(self.usage, "usage")
        return f"{usage} {self.usage} {self.selector} {self.mtype}"

    def matches(self, certificate: bytes) -> bool:
        """Whether the DER `certificate` (selector 0) or its SubjectPublicKeyInfo (selector 1),
        as is (matching type 0) or digested (1: SHA-256, 2: SHA-512), is the record's data."""
        if self.selector == 0:
            selected = certificate
        else:
            try:
                selected = subject_public_key_info(certificate)
            except ValueError:
                return False
        if self.mtype == 0:
            return selected == self.data
        digest = _DIGESTS.get(self.mtype)
        return digest is not None and hashlib.new(digest, selected).digest() == self.data


def parse(rdata: bytes) -> Record:
    """A TLSA record from its wire form (RFC 6698 2.1). ValueError when it is too short."""
    if len(rdata) < 3:
        raise ValueError("a TLSA record has at least 3 octets")
    return Record(rdata[0], rdata[1], rdata[2], bytes(rdata[3:]))


def _der(data: bytes, at: int) -> tuple[int, int, int]:
    """The DER element at `at`: (its tag, where its content starts, where it ends)."""
    if at + 2 > len(data):
        raise ValueError("DER: cut short")
    tag, length = data[at], data[at + 1]
    start = at + 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 4 or start + count > len(data):
            raise ValueError("DER: a length we do not read")
        length = int.from_bytes(data[start : start + count], "big")
        start += count
    end = start + length
    if end > len(data):
        raise ValueError("DER: an element past the end")
    return tag, start, end


def subject_public_key_info(certificate: bytes) -> bytes:
    """The DER SubjectPublicKeyInfo of a DER certificate, as it is in the certificate (RFC 5280
    4.1: the seventh field of tbsCertificate, the sixth without the optional version): what
    selector 1 matches, whatever the key's algorithm. ValueError for what is no certificate."""
    tag, start, _ = _der(certificate, 0)
    if tag != 0x30:
        raise ValueError("not a certificate")
    tag, at, end = _der(certificate, start)  # tbsCertificate
    if tag != 0x30:
        raise ValueError("not a certificate")
    tag, _, field_end = _der(certificate, at)
    if tag == 0xA0:  # [0] version
        at = field_end
    for _ in range(5):  # serialNumber, signature, issuer, validity, subject
        _, _, at = _der(certificate, at)
    tag, _, spki_end = _der(certificate, at)
    if tag != 0x30 or spki_end > end:
        raise ValueError("not a certificate")
    return certificate[at:spki_end]


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """DANE for one MX host: TLS is mandatory. `records` its usable TLSA records, which the
    certificate must match; none: TLS without DANE's authentication (RFC 7672 2.2), the
    certificate checked as the route or MTA-STS asks (PKIX), as it would be without DANE.
    `expanded`: the end of the CNAME chain the host's addresses came through, if any."""

    host: str
    name: str  # where the records are: "_25._tcp.mx.example.net", or at the expanded name
    records: tuple[Record, ...]
    expanded: str | None = None
    # Every record found, usable or not: what a TLS report (RFC 8460) names as the policy
    # when none is usable (`tlsa-invalid`).
    published: tuple[Record, ...] = field(default=(), compare=False)

    @property
    def base(self) -> str:
        """The TLSA base domain (RFC 7672 2.2.2): the name whose records these are, what SNI
        says (RFC 7672 8.1)."""
        return self.name.split(".", 2)[2]

    @property
    def names(self) -> tuple[str, ...]:
        """The reference identifiers a DANE-TA leaf may name (RFC 7672 3.2.2): the MX host
        name, and the name its CNAME chain ends at."""
        return (self.host,) if self.expanded is None else (self.expanded, self.host)

    def describe(self) -> str:
        """What a reply adds: why TLS (authenticated) was required of the host."""
        if self.records:
            return f"(TLS authenticated by DANE required: TLSA {self.name})"
        return f"(TLS required by DANE: TLSA {self.name}, none usable)"


class LookupFailed(Exception):
    """The TLSA lookup failed: the host is not used for this attempt. `reply` says why."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(str(reply))
        self.reply = reply


class Mismatch(Exception):
    """The server's certificate matches none of its host's usable TLSA records (the text says why)."""


async def host_policy(
    resolver: Resolver, host: str, port: int, addresses_secure: bool, expanded: str | None = None
) -> HostPolicy | None:
    """What DANE asks of `host` (an MX host of a domain whose MX records are secure) on `port`,
    the one connected to: None when DANE does not apply to it (its addresses or its TLSA
    records are insecure, or it has none). Raises `LookupFailed` when the lookup failed.

    `expanded`: the name at the end of the CNAME chain `host`'s addresses came through (secure,
    as `addresses_secure` says of the whole answer). Its TLSA records are looked up first, and
    only if it has none, securely (NXDOMAIN, NODATA), those of `host` (RFC 7672 2.2.2)."""
    if not addresses_secure:
        return None  # (no TLSA lookup for it: RFC 7672 2.2.2)
    expanded = expanded if expanded is not None and expanded != host else None
    if expanded is not None:
        found = await _records(resolver, host, f"_{port}._tcp.{expanded}")
        if found is None:
            return None  # (an insecure answer: no DANE, RFC 7672 2.2.2)
        if found:
            return _policy(host, f"_{port}._tcp.{expanded}", found[0], expanded)
    name = f"_{port}._tcp.{host}"
    found = await _records(resolver, host, name)
    if not found:
        return None
    return _policy(host, name, found[0], expanded)


async def _records(resolver: Resolver, host: str, name: str) -> tuple[list[tuple[int, int, int, bytes]], ...] | None:
    """The secure TLSA records of `name` as a 1-tuple; () for a secure denial of existence
    (NXDOMAIN, NODATA); None for an insecure answer. Raises `LookupFailed` when it failed."""
    try:
        found, secure = await resolver.tlsa(name)
    except DnsFailure as failure:
        if failure.permanent:
            return () if failure.secure else None  # NXDOMAIN: no records
        text = f"DANE: TLSA lookup of {name} failed ({failure.reply.text}): {host} not used (RFC 7672 2.2)"
        raise LookupFailed(Reply(451, "4.7.5", (text,))) from None
    if not secure:
        return None
    return () if found is None else (found,)


def _policy(host: str, name: str, found: list[tuple[int, int, int, bytes]], expanded: str | None) -> HostPolicy:
    records = tuple(Record(*record) for record in found)
    return HostPolicy(host, name, tuple(record for record in records if record.usable), expanded, records)


def presented_chain(ssl_object: Any) -> list[bytes]:
    """The DER certificates the server presented, its own first. The chain comes from
    `get_unverified_chain()` (public on 3.13's SSLObject, private on 3.11's, under `_sslobj`);
    when neither is there, the leaf alone (DANE-TA then matches nothing). Empty: none presented."""
    getter = getattr(ssl_object, "get_unverified_chain", None)
    if getter is None:
        getter = getattr(getattr(ssl_object, "_sslobj", None), "get_unverified_chain", None)
    chain: list[bytes] = []
    if getter is not None:
        try:
            for certificate in getter() or ():
                if isinstance(certificate, bytes):
                    chain.append(certificate)
                else:
                    chain.append(bytes(certificate.public_bytes(_DER_ENCODING)))
        except (AttributeError, TypeError, ValueError):
            chain = []
    if not chain:
        leaf = ssl_object.getpeercert(binary_form=True)
        if leaf:
            chain = [bytes(leaf)]
    return chain


_DER_ENCODING: Final = 2  # _ssl.ENCODING_DER, what `_ssl.Certificate.public_bytes` takes for DER


def check(policy: HostPolicy, chain: Sequence[bytes], now: datetime.datetime | None = None) -> Record:
    """The record of `policy` that the presented `chain` (DER, the server's own first) meets;
    Mismatch when none does. DANE-EE: the leaf matches. DANE-TA: a certificate of the chain
    other than the leaf matches, and the leaf chains to it through the certificates between,
    valid at `now` (default: the present), for one of `policy.names`."""
    if not chain:
        raise Mismatch("the server presented no certificate")
    leaf = chain[0]
    for record in policy.records:
        if record.usage == DANE_EE and record.matches(leaf):
            return record
    why = f"no TLSA record of {policy.name} matches the certificate"
    anchors = [record for record in policy.records if record.usage == DANE_TA]
    if anchors and len(chain) == 1:
        why += " (its chain, needed for DANE-TA, was not presented or cannot be read)"
    for index, certificate in enumerate(chain[1:], start=1):
        for record in anchors:
            if not record.matches(certificate):
                continue
            for name in policy.names:
                try:
                    _verify(leaf, chain[1:index], certificate, name, now)
                except ValueError as error:
                    why = f"the certificate does not chain to the trust anchor of {record.describe()}: {error}"
                    continue
                return record
    raise Mismatch(why)


def _verify(leaf: bytes, between: Sequence[bytes], anchor: bytes, host: str, now: datetime.datetime | None) -> None:
    """That `leaf` chains to `anchor` through `between`, valid at `now` and for `host`; raises
    ValueError saying why not."""
    # Imported here: a node that meets no DANE-TA record never loads `cryptography` (a tenth of
    # a second at start, and memory, for every node: DANE is off by default).
    from cryptography import x509
    from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

    builder = PolicyBuilder().store(Store([x509.load_der_x509_certificate(anchor)]))
    builder = builder.time(now or datetime.datetime.now(datetime.UTC))
    verifier = builder.build_server_verifier(x509.DNSName(host))
    try:
        verifier.verify(x509.load_der_x509_certificate(leaf), [x509.load_der_x509_certificate(der) for der in between])
    except VerificationError as error:
        raise ValueError(str(error)) from None
