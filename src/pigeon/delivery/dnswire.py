"""A plain DNS question over UDP, for the common answer: what `mx.Resolver` asks first.

dnspython's async resolver costs about a millisecond of CPU per query (a datagram endpoint
set up and torn down, every name and record built as objects, the message parsed whole).
Measured on the realistic relay bench, that was an eighth of the worker's time: 1,000
domains mean an MX, an A and an AAAA query per domain or MX host. This module asks the
question itself: one non-blocking socket per query (connected, so the kernel drops what
does not come from the server, and with its own random source port, like dnspython's),
a random query id, the answer read with nothing but slicing.

It answers only the plain cases, and says so (`None`) for everything else, which the
caller hands to dnspython as before: a truncated answer (TCP), a CNAME or DNAME in the
answer (a chain to follow), YXDOMAIN, a name that is not plain letters, digits, "-" and "_" (dnspython's text
escapes), a malformed packet, or a socket error (an ICMP port unreachable). A truncated
answer (TC) it says as such (`Answer.truncated`): the caller asks again over TCP at once, not
over UDP first. Like dnspython as Pigeon configures it, it asks for recursion and sends an
EDNS0 OPT record offering 1232-octet UDP answers (RFC 6891; the DNS flag day 2020's size),
so that an answer over 512 octets needs no TCP; with `dnssec` (`[dane] enabled`) the OPT
record has the DO bit (RFC 3225), so that a validating resolver says in the AD bit whether it
validated the answer (RFC 4035 3.2.3). A server that answers FORMERR to EDNS (one older than
RFC 6891) is asked again without it (RFC 6891 7). An answer that does not echo the question
(id, flags, name, type, class) is ignored and the wait goes on.

A negative answer (NXDOMAIN, or no record of the type) carries the zone's SOA in its
authority section: its `negative_ttl` is how long it may be cached (RFC 2308 5: the lesser of
the SOA record's TTL and its MINIMUM field).
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from typing import Final, NamedTuple

A: Final = 1
CNAME: Final = 5
MX: Final = 15
TXT: Final = 16
AAAA: Final = 28
DNAME: Final = 39
SOA: Final = 6
TLSA: Final = 52
TYPES: Final = {"A": A, "MX": MX, "TXT": TXT, "AAAA": AAAA, "TLSA": TLSA}
NOERROR: Final = 0
FORMERR: Final = 1
NXDOMAIN: Final = 3
YXDOMAIN: Final = 6
_PLAIN: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
# The OPT pseudo-record (RFC 6891 6.1.2): the root name, type 41, a UDP payload of 1232 octets
# (the DNS flag day 2020's size, under any path's MTU), no extended rcode, version 0, DO set
# or not, no options.
_OPT: Final = b"\x00" + (41).to_bytes(2, "big") + (1232).to_bytes(2, "big") + b"\x00\x00\x00\x00\x00\x00"
_OPT_DO: Final = b"\x00" + (41).to_bytes(2, "big") + (1232).to_bytes(2, "big") + b"\x00\x00\x80\x00\x00\x00"
_AD: Final = 0x20  # the header's AD bit (RFC 4035 3.2.3), in its fourth octet


class Answer(NamedTuple):
    """`rcode` the server's (NOERROR, NXDOMAIN, or a failure such as SERVFAIL); `records` the
    answer's records of the type asked (empty: NODATA), as `mx.Resolver` keeps them:
    (preference, host) for MX, the text (its strings joined) for TXT, (usage, selector,
    matching type, data) for TLSA, an address otherwise; `ttl` the lowest of theirs. `secure`:
    the server set the AD bit (it validated the answer with DNSSEC; worth something only from a
    validating resolver on this host, see `[dane]`). `truncated`: the server said the answer
    did not fit (TC): ask over TCP. `negative_ttl`: for an answer without records, how long it
    may be cached by the SOA record in its authority section (None: it had none)."""

    rcode: int
    records: list[object]
    ttl: int
    secure: bool = False
    truncated: bool = False
    negative_ttl: int | None = None


def question(name: str, kind: int, *, dnssec: bool = False, edns: bool = True) -> tuple[int, bytes] | None:
    """(query id, packet) asking `kind` records of `name` (no final dot), with recursion
    desired and, with `edns`, an OPT record after the question (with the DO bit: `dnssec`);
    None for a name that is not plain (see the module docstring)."""
    wire = bytearray()
    for label in name.encode("ascii", "replace").split(b"."):
        if not label or len(label) > 63 or not _PLAIN.issuperset(label):
            return None
        wire.append(len(label))
        wire += label
    wire.append(0)
    if len(wire) > 255:
        return None
    ident = secrets.randbits(16)
    additional = b"\x00\x01" if edns else b"\x00\x00"
    header = ident.to_bytes(2, "big") + b"\x01\x00\x00\x01\x00\x00\x00\x00" + additional
    packet = header + bytes(wire) + kind.to_bytes(2, "big") + b"\x00\x01"
    if not edns:
        return ident, packet
    return ident, packet + (_OPT_DO if dnssec else _OPT)


def _name(packet: bytes, at: int) -> tuple[bytes, int]:
    """The name at `at` (compression pointers followed) as dotted lower-case bytes, and where
    the data after it starts. ValueError for a malformed or unplain name."""
    labels: list[bytes] = []
    end = -1
    jumps = 0
    while True:
        length = packet[at]
        if length == 0:
            at += 1
            break
        if length >= 0xC0:
            if end < 0:
                end = at + 2
            jumps += 1
            if jumps > 32:
                raise ValueError("a compression loop")
            at = ((length & 0x3F) << 8) | packet[at + 1]
            continue
        if length > 63:
            raise ValueError("a label type we do not read")
        label = packet[at + 1 : at + 1 + length]
        if len(label) != length or not _PLAIN.issuperset(label):
            raise ValueError("not a plain name")
        labels.append(label)
        at += 1 + length
    return b".".join(labels).lower(), end if end >= 0 else at


class NotOurs(ValueError):
    """A datagram that is no answer to the question asked: ignored, the wait goes on."""


def parse(packet: bytes, ident: int, sent: bytes) -> Answer | None:
    """The answer in `packet` to the question `sent` (with id `ident`; its OPT record, if any,
    is not echoed: see `_question_end`); None when it is not a plain one (the caller asks
    dnspython); NotOurs when it answers something else."""
    if sent[11]:  # (an OPT record after the question)
        sent = sent[: _question_end(sent)]
    question_end = len(sent)
    if len(packet) < 12 or int.from_bytes(packet[:2], "big") != ident:
        raise NotOurs("not our id")
    flags = packet[2]
    if not flags & 0x80 or (flags >> 3) & 0x0F:  # QR, and opcode QUERY
        raise NotOurs("not a response to a query")
    if packet[3] & 0x0F == FORMERR and packet[4:6] == b"\x00\x00":
        return Answer(FORMERR, [], 0)  # (a server that cannot read the question need not echo it)
    if len(packet) < question_end:
        raise NotOurs("not our question")
    if packet[4:6] != b"\x00\x01" or packet[12:question_end].lower() != sent[12:].lower():
        raise NotOurs("not our question")
    if flags & 0x02:  # TC: truncated, the caller asks again over TCP (dnspython's)
        return Answer(NOERROR, [], 0, truncated=True)
    rcode = packet[3] & 0x0F
    if rcode == YXDOMAIN:
        return None
    if rcode not in (NOERROR, NXDOMAIN):
        return Answer(rcode, [], 0)  # the server failed (SERVFAIL, REFUSED...): the caller says what next
    try:
        return _records(packet, sent, rcode, secure=bool(packet[3] & _AD))
    except (ValueError, IndexError):
        return None  # malformed: dnspython says how


def _question_end(sent: bytes) -> int:
    """Where the question of a packet made by `question` ends (the OPT record follows it)."""
    at = 12
    while sent[at]:
        at += 1 + sent[at]
    return at + 5


def _records(packet: bytes, sent: bytes, rcode: int, *, secure: bool) -> Answer | None:
    question_end = len(sent)
    qname, _ = _name(sent, 12)
    kind = int.from_bytes(sent[question_end - 4 : question_end - 2], "big")
    records: list[object] = []
    ttl = 0x7FFFFFFF
    at = question_end
    for _ in range(int.from_bytes(packet[6:8], "big")):
        owner, at = _name(packet, at)
        rtype = int.from_bytes(packet[at : at + 2], "big")
        rclass = int.from_bytes(packet[at + 2 : at + 4], "big")
        rttl = int.from_bytes(packet[at + 4 : at + 8], "big")
        length = int.from_bytes(packet[at + 8 : at + 10], "big")
        start, at = at + 10, at + 10 + length
        if at > len(packet):
            raise ValueError("a record past the end")
        if rtype in (CNAME, DNAME):
            return None  # a chain to follow: dnspython's
        if rtype != kind or rclass != 1 or owner != qname:
            continue
        record: object
        if rtype == MX:
            host, _ = _name(packet, start + 2)
            record = (int.from_bytes(packet[start : start + 2], "big"), host.decode() or ".")
        elif rtype == A and length == 4:
            record = socket.inet_ntop(socket.AF_INET, packet[start:at])
        elif rtype == AAAA and length == 16:
            record = socket.inet_ntop(socket.AF_INET6, packet[start:at])
        elif rtype == TXT:
            record = _text(packet[start:at])
        elif rtype == TLSA and length >= 3:
            record = (packet[start], packet[start + 1], packet[start + 2], bytes(packet[start + 3 : at]))
        else:
            raise ValueError("a record of the wrong length")
        if record not in records:  # a record set holds each record once
            records.append(record)
        ttl = min(ttl, 0 if rttl & 0x80000000 else rttl)  # RFC 2181 8: the top bit set means 0
    if rcode == NXDOMAIN and records:
        return None  # an answer for a name that does not exist: dnspython refuses it
    if records:
        return Answer(rcode, records, ttl, secure)
    return Answer(rcode, records, 0, secure, negative_ttl=_negative_ttl(packet, at))


def _negative_ttl(packet: bytes, at: int) -> int | None:
    """RFC 2308 5: how long the negative answer whose authority section starts at `at` may be
    cached, the lesser of its SOA record's TTL and MINIMUM field; None without an SOA."""
    for _ in range(int.from_bytes(packet[8:10], "big")):
        at = _skip_name(packet, at)
        rtype = int.from_bytes(packet[at : at + 2], "big")
        rttl = int.from_bytes(packet[at + 4 : at + 8], "big")
        length = int.from_bytes(packet[at + 8 : at + 10], "big")
        at += 10 + length
        if at > len(packet):
            raise ValueError("a record past the end")
        if rtype == SOA and length >= 22:  # (two names of one octet at least, then five numbers)
            minimum = int.from_bytes(packet[at - 4 : at], "big")
            return min(0 if rttl & 0x80000000 else rttl, 0 if minimum & 0x80000000 else minimum)
    return None


def _skip_name(packet: bytes, at: int) -> int:
    """Where the data after the name at `at` starts (the name itself not read: an SOA's owner
    need not be a plain one)."""
    while True:
        length = packet[at]
        if length == 0:
            return at + 1
        if length >= 0xC0:
            return at + 2
        if length > 63:
            raise ValueError("a label type we do not read")
        at += 1 + length


def _text(rdata: bytes) -> str:
    """A TXT record's character-strings (RFC 1035 3.3.14), joined as one text (RFC 7208 3.3,
    RFC 8461 3.1: a record longer than 255 octets comes in several); bytes that are not UTF-8
    are replaced, so such a record never parses as what it is not."""
    parts: list[bytes] = []
    at = 0
    while at < len(rdata):
        length = rdata[at]
        part = rdata[at + 1 : at + 1 + length]
        if len(part) != length:
            raise ValueError("a TXT string past the end of its record")
        parts.append(part)
        at += 1 + length
    return b"".join(parts).decode("utf-8", "replace")


async def ask(server: tuple[str, int], name: str, kind: str, *, dnssec: bool = False) -> Answer | None:
    """Ask `server` for `kind` records of `name` (with `dnssec`, the DO bit set); None: not a
    plain case (see the module docstring), ask dnspython. Waits for ever: the caller bounds the wait."""
    answer = await _ask(server, name, kind, dnssec=dnssec, edns=True)
    if answer is not None and answer.rcode == FORMERR:
        # A server that knows no EDNS says FORMERR to the OPT record: asked again without it,
        # as RFC 6891 7 has it (its answer then has no AD bit to read either).
        answer = await _ask(server, name, kind, dnssec=False, edns=False)
    return answer


async def _ask(server: tuple[str, int], name: str, kind: str, *, dnssec: bool, edns: bool) -> Answer | None:
    built = question(name, TYPES[kind], dnssec=dnssec, edns=edns)
    if built is None:
        return None
    ident, packet = built
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in server[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    answered: asyncio.Future[Answer | None] = loop.create_future()

    def readable() -> None:
        while not answered.done():
            try:
                data = sock.recv(65535)
            except BlockingIOError:
                return
            except OSError:
                answered.set_result(None)  # an ICMP error: dnspython tries the next server
                return
            try:
                answered.set_result(parse(data, ident, packet))
            except NotOurs:
                continue  # wait on for ours, as dnspython does

    fd = sock.fileno()
    reading = False
    try:
        sock.setblocking(False)
        sock.connect(server)
        sock.send(packet)
        loop.add_reader(fd, readable)
        reading = True
        return await answered
    except OSError:
        return None
    finally:
        if reading:
            loop.remove_reader(fd)
        sock.close()
