"""The destinations of the realistic relay benchmark: a DNS zone, its server, and the SMTP sinks.

1,000 recipient domains, popular by a Zipf law (a few take most of the mail), have their MX
records on a few hundred host names, which resolve to 127.0.0.x addresses; a sink listens on
port 25 of each address. A sink answers most recipients 250, 10% 450 on their first attempt
(250 when retried) and 2% 550 every time. The choice is a hash of the recipient address, and
the injector gives each recipient of each message an address of its own (`u<message>.<n>@`),
so it is a choice per (Message-ID, recipient) that any process can repeat: the bench knows
what to expect. Sinks count what they take per (Message-ID, recipient): lost and duplicate
deliveries, and a recipient given another message's body, are seen. The sender domain's MX
is a sink of its own that takes the MTAs' bounces (DSNs) and counts the recipients they name.

DNS and sinks run in one process (asyncio on uvloop), `python bench/world.py`, started by the
bench: it prints "ready" once it listens, and answers "stats" (counts) and "final" (counts and
the recipients delivered and bounced) on stdin with a JSON line. The DNS server answers from
packets built at start: a query costs a dict lookup, so the MTA that asks most (Postfix has no
cache of its own) is not slowed by the server.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import re
import subprocess
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import uvloop

DNS_ADDRESS = "127.0.0.53"  # a loopback address nothing else here uses; Postfix's resolv.conf names it
BOUNCE_ADDRESS = "127.0.0.250"
SENDER = "news@src.test"
SENDER_DOMAIN = "src.test"
TTL = 300
HEAD = 16384  # bytes of each message a sink keeps: enough for the headers (Message-ID)
_DSN_LIMIT = 4 << 20

ACCEPT, DEFER_ONCE, REFUSE = 0, 4, 5


def fate(recipient: str) -> int:
    """What the sinks answer `recipient`: ACCEPT; DEFER_ONCE, 450 at its first RCPT and 250 at
    the next; or REFUSE, 550 every time. 10% and 2% of recipients, by a hash any process repeats."""
    roll = zlib.crc32(recipient.encode()) % 1000
    return REFUSE if roll < 20 else DEFER_ONCE if roll < 120 else ACCEPT


def message_id(number: int) -> str:
    return f"<{number}.bench@{SENDER_DOMAIN}>"


_RECIPIENT = re.compile(r"u(\d+)\.\d+@")


@dataclass
class Zone:
    """Recipient domains (most popular first) with their popularity, MX records and addresses."""

    domains: list[str]
    weights: list[float]
    mx: dict[str, list[tuple[int, str]]]
    addresses: dict[str, str]  # host name -> address

    @property
    def sink_addresses(self) -> list[str]:
        return sorted(set(self.addresses.values()) - {BOUNCE_ADDRESS}, key=lambda a: int(a.rsplit(".", 1)[1]))


def build_zone(domains: int = 1000, big: int = 40, providers: int = 220, addresses: int = 200) -> Zone:
    """The `big` most popular domains have two MX hosts of their own (equal preference); the
    rest are hosted on `providers` shared MX hosts, one in ten with a backup MX at another
    provider. Host names share `addresses` addresses (127.0.0.2 up, skipping DNS_ADDRESS)."""
    rng = random.Random(1)
    pool = [f"127.0.0.{n}" for n in range(2, 250) if f"127.0.0.{n}" != DNS_ADDRESS][:addresses]
    names = [f"d{i}.test" for i in range(domains)]
    mx: dict[str, list[tuple[int, str]]] = {}
    hosts: list[str] = []
    for i, name in enumerate(names):
        if i < big:
            own = [f"mx1.{name}", f"mx2.{name}"]
            hosts += own
            mx[name] = [(10, h) for h in own]
    shared = [f"mx{j}.provider{j // 20}.test" for j in range(providers)]
    hosts += shared
    for name in names[big:]:
        primary = rng.randrange(providers)
        mx[name] = [(10, shared[primary])]
        if rng.random() < 0.1:
            mx[name].append((20, shared[(primary + 1 + rng.randrange(providers - 1)) % providers]))
    where = {host: pool[k % len(pool)] for k, host in enumerate(hosts)}
    mx[SENDER_DOMAIN] = [(10, f"mx.{SENDER_DOMAIN}")]
    where[f"mx.{SENDER_DOMAIN}"] = BOUNCE_ADDRESS
    weights = [1 / (rank + 1) for rank in range(domains)]
    return Zone(names, weights, mx, where)


# --- DNS ----------------------------------------------------------------------------------------
def _wire_name(name: str) -> bytes:
    return b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"


def _text_name(wire: bytes) -> str:
    labels, at = [], 0
    while at < len(wire):
        labels.append(wire[at + 1 : at + 1 + wire[at]].decode("ascii", "replace"))
        at += wire[at] + 1
    return ".".join(labels)


def _record(kind: int, rdata: bytes) -> bytes:
    # The owner is a pointer to the question's name (offset 12): every answer names what was asked.
    fixed = kind.to_bytes(2, "big") + b"\x00\x01" + TTL.to_bytes(4, "big") + len(rdata).to_bytes(2, "big")
    return b"\xc0\x0c" + fixed + rdata


def _answers(zone: Zone) -> tuple[dict[bytes, tuple[int, bytes]], set[bytes]]:
    """(wire name + qtype) -> (answer count, answer records); and the names that exist."""
    answers: dict[bytes, tuple[int, bytes]] = {}
    for domain, records in zone.mx.items():
        rdata = [pref.to_bytes(2, "big") + _wire_name(host) for pref, host in records]
        answers[_wire_name(domain) + b"\x00\x0f"] = (len(rdata), b"".join(_record(15, r) for r in rdata))
    for host, address in zone.addresses.items():
        answers[_wire_name(host) + b"\x00\x01"] = (1, _record(1, bytes(int(o) for o in address.split("."))))
    return answers, {key[:-2] for key in answers}


class _Dns(asyncio.DatagramProtocol):
    """`delay`: seconds the first query for a name and type waits, as a caching resolver's
    recursion would; a query asked meanwhile is answered with it, later ones at once."""

    def __init__(self, zone: Zone, counts: Counts, delay: float = 0.0) -> None:
        self.answers, self.names = _answers(zone)
        self.counts = counts
        self.delay = delay
        self.ready: dict[bytes, float] = {}  # name and type -> when the "resolver" has it
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)  # uvloop's is not a subclass

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        end = 12
        while end < len(data) and 0 < data[end] < 64:
            end += data[end] + 1
        if end + 4 >= len(data) or data[end] != 0:
            return  # not a question we can read: no answer, as a server dropping junk
        name = data[12 : end + 1].lower()
        found = self.answers.get(name + data[end + 1 : end + 3])
        self.counts.dns_queries += 1
        if found is not None:
            ancount, records, rcode = found[0], found[1], 0
        elif name in self.names:
            ancount, records, rcode = 0, b"", 0  # NODATA: the name exists (AAAA of an MX host)
        else:
            ancount, records, rcode = 0, b"", 3  # NXDOMAIN: a name the bench never gave out
            if len(self.counts.dns_stray) < 20:
                self.counts.dns_stray.append(_text_name(data[12:end]))
        flags = bytes([0x84 | (data[2] & 0x79), 0x80 | rcode])  # QR AA (opcode, RD echoed), RA
        header = data[:2] + flags + b"\x00\x01" + ancount.to_bytes(2, "big") + b"\x00\x00\x00\x00"
        assert self.transport is not None
        packet = header + data[12 : end + 5] + records
        if self.delay:
            loop = asyncio.get_running_loop()
            ready = self.ready.setdefault(data[12 : end + 3].lower(), loop.time() + self.delay)
            if ready > loop.time():
                loop.call_at(ready, self.transport.sendto, packet, addr)
                return
        self.transport.sendto(packet, addr)


# --- sinks --------------------------------------------------------------------------------------
@dataclass
class Counts:
    attempts: dict[str, int] = field(default_factory=dict)  # recipient -> RCPTs seen
    delivered: Counter[tuple[str, str]] = field(default_factory=Counter)  # (Message-ID, recipient)
    bounced: Counter[str] = field(default_factory=Counter)  # recipient named "failed" in a DSN
    connections: int = 0
    transactions: int = 0
    rcpt_4xx: int = 0
    rcpt_5xx: int = 0
    refused_again: int = 0  # a 550 recipient asked for again: an MTA retrying a permanent failure
    mismatched: int = 0  # a recipient given another message (its Message-ID is not the recipient's)
    dsns: int = 0
    delayed_notices: int = 0
    dns_queries: int = 0
    dns_stray: list[str] = field(default_factory=list)
    deferred_at: dict[str, float] = field(default_factory=dict)  # recipient -> loop time of its 450
    retry_waits: list[float] = field(default_factory=list)  # seconds from a 450 to the recipient's next RCPT

    def summary(self) -> dict[str, object]:
        return {
            "delivered": len(self.delivered),
            "duplicates": sum(n - 1 for n in self.delivered.values()),
            "bounced": len(self.bounced),
            "bounce_duplicates": sum(n - 1 for n in self.bounced.values()),
            **{k: getattr(self, k) for k in ("connections", "transactions", "rcpt_4xx", "rcpt_5xx", "refused_again")},
            **{k: getattr(self, k) for k in ("mismatched", "dsns", "delayed_notices", "dns_queries", "dns_stray")},
            "retry_wait": _quantiles(self.retry_waits),
        }

    def final(self) -> dict[str, object]:
        return {
            **self.summary(),
            "delivered_recipients": sorted({r for _, r in self.delivered}),
            "bounced_recipients": sorted(self.bounced),
        }


def _quantiles(values: list[float]) -> list[float]:
    """Least, median, 90th percentile and most, or nothing."""
    ordered = sorted(values)
    n = len(ordered)
    return [ordered[0], ordered[n // 2], ordered[n * 9 // 10], ordered[-1]] if ordered else []


_EHLO = b"250-sink\r\n250-PIPELINING\r\n250-8BITMIME\r\n250-SIZE 104857600\r\n250 ENHANCEDSTATUSCODES\r\n"
_MESSAGE_ID = re.compile(rb"(?im)^message-id:[ \t]*(<[^>\r\n]*>)")
_DSN_FIELD = re.compile(rb"(?im)^(final-recipient|action):[ \t]*(?:rfc822;)?[ \t]*<?([^\s>]+)")


def _address(argument: bytes) -> str:
    start, end = argument.find(b"<"), argument.find(b">")
    return argument[start + 1 : end].decode("utf-8", "replace").lower()


class _Sink(asyncio.Protocol):
    """One SMTP session. Keeps the first HEAD bytes of a message (all of a DSN), never the rest."""

    def __init__(self, counts: Counts, bounces: bool) -> None:
        self.counts = counts
        self.bounces = bounces
        self.pending = bytearray()
        self.in_data = False
        self.mail = False
        self.recipients: list[str] = []
        self.head = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.counts.connections += 1
        self.transport.write(b"220 sink ESMTP\r\n")

    def data_received(self, data: bytes) -> None:
        self.pending += data
        out: list[bytes] = []
        while self.pending:
            if self.in_data:
                if not self._take_data():
                    break
                out.append(self._end_of_data())
                continue
            end = self.pending.find(b"\r\n")
            if end < 0:
                break
            line = bytes(self.pending[:end])
            del self.pending[: end + 2]
            reply = self._command(line)
            out.append(reply)
            if reply.startswith(b"221"):
                assert self.transport is not None
                self.transport.write(b"".join(out))
                self.transport.close()
                return
        if out:
            assert self.transport is not None
            self.transport.write(b"".join(out))

    def _take_data(self) -> bool:
        pending = self.pending
        end = pending.find(b"\r\n.\r\n")
        if end < 0:
            taken = len(pending) - 4  # the end marker may straddle two reads: keep its length back
            if taken > 0:
                self._keep(taken)
                del pending[:taken]
            return False
        self._keep(end + 2)
        del pending[: end + 5]
        return True

    def _keep(self, n: int) -> None:
        limit = _DSN_LIMIT if self.bounces else HEAD
        if len(self.head) < limit:
            self.head += self.pending[: min(n, limit - len(self.head))]

    def _end_of_data(self) -> bytes:
        counts = self.counts
        counts.transactions += 1
        found = _MESSAGE_ID.search(self.head)
        identity = found.group(1).decode("ascii", "replace") if found else "(none)"
        if self.bounces:
            counts.dsns += 1
            recipient = ""
            for name, value in _DSN_FIELD.findall(self.head):
                if name.lower() == b"final-recipient":
                    recipient = value.decode("ascii", "replace").lower()
                elif value.lower() == b"failed":
                    counts.bounced[recipient] += 1
                elif value.lower() == b"delayed":
                    counts.delayed_notices += 1
        else:
            for recipient in self.recipients:
                counts.delivered[(identity, recipient)] += 1
                number = _RECIPIENT.match(recipient)
                if number is None or message_id(int(number.group(1))) != identity:
                    counts.mismatched += 1
        self._reset()
        return b"250 2.0.0 Ok: queued\r\n"

    def _reset(self) -> None:
        self.in_data = self.mail = False
        self.recipients = []
        self.head = bytearray()

    def _command(self, line: bytes) -> bytes:
        verb = line[:4].upper()
        if verb == b"RCPT":
            return self._rcpt(_address(line[8:]))
        if verb == b"MAIL":
            self._reset()
            self.mail = True
            return b"250 2.1.0 Ok\r\n"
        if verb == b"DATA":
            if not self.recipients:
                return b"554 5.5.1 Error: no valid recipients\r\n"
            self.in_data = True
            return b"354 End data with <CR><LF>.<CR><LF>\r\n"
        if verb == b"EHLO":
            return _EHLO
        if verb in (b"HELO", b"NOOP"):
            return b"250 2.0.0 Ok\r\n"
        if verb == b"RSET":
            self._reset()
            return b"250 2.0.0 Ok\r\n"
        if verb == b"QUIT":
            return b"221 2.0.0 Bye\r\n"
        return b"502 5.5.2 Error: command not recognized\r\n"

    def _rcpt(self, recipient: str) -> bytes:
        if not self.mail:
            return b"503 5.5.1 Error: need MAIL command\r\n"
        if not self.bounces:
            counts = self.counts
            attempt = counts.attempts[recipient] = counts.attempts.get(recipient, 0) + 1
            what = fate(recipient)
            if what == REFUSE:
                counts.rcpt_5xx += 1
                counts.refused_again += attempt > 1
                return b"550 5.1.1 Recipient address rejected: User unknown\r\n"
            if what == DEFER_ONCE and attempt == 1:
                counts.rcpt_4xx += 1
                counts.deferred_at[recipient] = asyncio.get_running_loop().time()
                return b"450 4.2.1 Recipient address rejected: try again later\r\n"
            if what == DEFER_ONCE and attempt == 2:
                counts.retry_waits.append(asyncio.get_running_loop().time() - counts.deferred_at.pop(recipient))
        self.recipients.append(recipient)
        return b"250 2.1.5 Ok\r\n"


# --- the process ---------------------------------------------------------------------------------
async def serve(zone: Zone, dns_delay: float) -> None:
    loop = asyncio.get_running_loop()
    counts = Counts()
    await loop.create_datagram_endpoint(lambda: _Dns(zone, counts, dns_delay), local_addr=(DNS_ADDRESS, 53))
    for address in [*zone.sink_addresses, BOUNCE_ADDRESS]:
        await loop.create_server(functools.partial(_Sink, counts, address == BOUNCE_ADDRESS), address, 25, backlog=512)
    done = loop.create_future()
    buffered = bytearray()

    def command() -> None:
        chunk = os.read(0, 4096)
        if not chunk:
            done.set_result(None)
            loop.remove_reader(0)
            return
        buffered.extend(chunk)
        while b"\n" in buffered:
            line, _, rest = bytes(buffered).partition(b"\n")
            buffered[:] = rest
            answer = counts.final() if line.strip() == b"final" else counts.summary()
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()

    loop.add_reader(0, command)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await done


class World:
    """This module run as a process of its own (it binds port 25 and 53: run as root)."""

    def __init__(self, domains: int, dns_delay: float = 0.0) -> None:
        command = [sys.executable, __file__, "--domains", str(domains), "--dns-delay", str(dns_delay)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            self.process.wait(10)
            raise RuntimeError(f"the DNS server and sinks did not start (is {DNS_ADDRESS}:53 or port 25 taken?)")

    def ask(self, what: str = "stats") -> dict[str, Any]:
        """ "stats": the counts; "final": the counts and the recipients delivered and bounced."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(what + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domains", type=int, default=1000)
    parser.add_argument("--dns-delay", type=float, default=0.0, help="seconds a name's first query waits")
    args = parser.parse_args()
    uvloop.run(serve(build_zone(args.domains), args.dns_delay))


if __name__ == "__main__":
    main()
