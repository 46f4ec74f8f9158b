"""One outbound SMTP connection: the asyncio layer around `pigeon.smtp.client_session`.

`ClientConnection.open()` walks the destination's hops in order (each host's addresses in
turn) until one greets it. `send()` runs one transaction; the connection is then free for
the next message of the same ready queue.

What to say and what a reply means is the sans-IO `ClientSession`'s business: the banner,
EHLO or HELO, whether to STARTTLS under the route's TLS policy, EHLO again on TLS, RSET
after an unfinished transaction, QUIT. This layer only moves bytes, starts TLS when the
session says so, enforces the timeouts, and turns failures into replies a log reader
understands: the server's own 4xx when it turned us away with one (a 421 banner, a 421 to
EHLO: what the reactions read; a 421 within a transaction is quoted so too), `451 4.4.1` for
a host that would not talk otherwise, `451 4.4.2` for a timeout or a dropped connection
(naming the command left unanswered), `451 4.5.0` for a server that broke the
protocol, `451 4.7.4` when TLS is required and not to be had (`4.7.5`: its handshake failed),
`451 4.7.x authentication as USER failed: ...` when a smart host's AUTH did not work (the
operator's business: a WARNING says so, and the mail is deferred, never bounced). A route with
`tls = "implicit"` has its TLS handshake right after the TCP connection, before the banner
(RFC 8314). The caller decides what they mean for the message. Under DANE (`Destination.dane`:
see `pigeon.delivery.dane`), a host with usable TLSA records must do STARTTLS, and its
certificate is matched against them after a handshake that verified nothing itself; one that
fails is passed over as an MTA-STS-refused host is, never tried in the clear. A server that offers CHUNKING and
answers BDAT as a command it does not know gets the message again at once, with DATA, on a new
connection (`ClientConnection._again_with_data`), and DATA for `NO_CHUNKING_FOR` after. A
connection used before that the server closes as the next MAIL comes, before answering any of
it, has the transaction sent again at once on a new connection (`ClientConnection.send`).

The glue is an `asyncio.Protocol`, not streams: bytes go to the session as they arrive, and
what it answers (the next command of a lock-step transaction, the content after 354) is
written from the same callback. The waiting task wakes only for what it must act on (the
end of a transaction, TLS to start, the end of the connection), and a wait costs one future
and one timer handle rather than a stream read under an `asyncio.timeout()` context.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import fcntl
import functools
import ipaddress
import logging
import os
import socket
import ssl
import struct
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast

from pigeon.delivery.dane import HostPolicy, LookupFailed, Mismatch, Record, check, host_policy, presented_chain
from pigeon.delivery.loops import Listeners
from pigeon.delivery.mta_sts import WARNINGS, Applied
from pigeon.delivery.mx import DnsFailure, Resolver, address_order
from pigeon.delivery.routes import Destination, Hop, connection_order
from pigeon.delivery.tls_report import Counts, classify, note_lookup_failed, note_opened, note_refused
from pigeon.delivery.warning_pace import WarningPace
from pigeon.listener.tls import describe
from pigeon.smtp.client import END_OF_DATA, Capabilities, ClientProtocolError, Envelope, Result
from pigeon.smtp.client_session import (
    NEED_DATA,
    ClientSession,
    Closed,
    Deliver,
    Event,
    Phase,
    PlaintextAfterStartTls,
    Quit,
    Ready,
    Reason,
    StartTls,
    TlsPolicy,
    TransactionDone,
    Unusable,
)
from pigeon.smtp.replies import Reply
from pigeon.tls import client_context

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClientOptions:
    helo_name: str
    bind: str | None = None  # the local address to connect from (an egress [[source]]); None: the OS's choice
    connect_timeout: float = 30.0
    reply_timeout: float = 300.0  # RFC 5321 4.5.3.2: 5 minutes for most replies ...
    data_done_timeout: float = 600.0  # ... and 10 for the one to the end of data (4.5.3.2.6)
    pipelining: bool = True
    chunking: bool = True
    try_next_mx: bool = False  # a recipient answered 4xx is tried at once at the site's next host (smtp_agent)
    mx_address_limit: int = 5  # addresses tried per connection opened (ClientConnection.open)
    mx_session_limit: int = 2  # sessions that got a greeting, per connection opened and its move (try_next_mx)
    tls_report: Counts | None = None  # `[tls_rpt] enabled`: sessions under a policy counted there (RFC 8460)


class ConnectFailed(Exception):
    """No hop of the destination could be used. `reply` is the last reason; `site_down`
    says that no host took a connection at all (each refused it, timed out, or ended it before
    a word of its greeting), as opposed
    to a host that answered and would not do (a 421, a failed TLS handshake), or one left
    untried for a lookup (of its addresses, of its TLSA records) that failed for now. `peer` is that
    host, when one answered (as `ClientConnection.peer` names it), and `tls` its TLS, when
    it was on TLS by then: a record of the failure names them as a delivery's would.
    `greeted`: that host greeted with 220 (a session began; `[delivery] mx_session_limit`).
    `server`: `reply` is that host's own (its 421, as sent), not Pigeon's words (a TLS failure,
    a broken connection): an expiry's DSN reports it as the server's. `by_policy`: the host was
    refused for an enforced MTA-STS policy's TLS (no STARTTLS, a certificate not verified for its
    name): RFC 8461 5 has the next host tried, so it is no session of `mx_session_limit`.
    `authentication`: the route's credentials were refused, or cannot be used there
    (`Unusable.authentication`): the operator's to fix, and the dispatcher holds the route's mail
    meanwhile. `final`: the failure is the route's, not the address's (its AUTH, the TLS it must
    have to authenticate), so no other address is tried: it is the attempt's reply.
    `tls_failure`: the host failed an MTA-STS policy's or DANE's TLS, as a TLS report (RFC 8460
    4.3) says it (its result type, and what the handshake said); `local` our address then.
    `tls_failed`: this failure is that of opportunistic TLS's fallback (the clear, or TLS
    unverified) after a STARTTLS handshake that failed, and this is what that failure said
    (as `ClientConnection.tls_failed`)."""

    def __init__(
        self,
        reply: Reply,
        *,
        site_down: bool = False,
        peer: str | None = None,
        tls: str | None = None,
        greeted: bool = False,
        server: bool = False,
        by_policy: bool = False,
        authentication: bool = False,
        final: bool = False,
        tls_failure: tuple[str, str] | None = None,
        local: str = "",
        tls_failed: str | None = None,
    ) -> None:
        super().__init__(str(reply))
        self.reply = reply
        self.site_down = site_down
        self.peer = peer
        self.tls = tls
        self.greeted = greeted
        self.server = server
        self.by_policy = by_policy
        self.authentication = authentication
        self.final = final
        self.tls_failure = tls_failure
        self.local = local
        self.tls_failed = tls_failed

    def noted(self, note: str, reply: Reply | None = None) -> ConnectFailed:
        """This failure with `; note` after its reply (or after `reply`, said instead): what
        the hosts tried did, then what else a record and a DSN should say (hosts left untried,
        the hosts tried). Its peer, TLS and whose words the reply is are kept."""
        said = self.reply if reply is None else reply
        return ConnectFailed(
            Reply(said.code, said.enhanced, (*said.lines[:-1], f"{said.lines[-1]}; {note}")),
            peer=self.peer,
            tls=self.tls,
            server=self.server,
            tls_failed=self.tls_failed,
        )


class LoopsBack(ConnectFailed):
    """No host of the destination is left to send to but this node itself (one of its SMTP
    listeners: see `pigeon.delivery.loops`): every host is, or this node is the domain's most
    preferred MX host (RFC 5321 5.1: the hosts it is, and all of its preference or higher, are
    not sent to), and connecting would hand the mail back to us. `reply` is a
    permanent `554 5.4.6` naming the first such host; `reply_for(domain)` says it of a domain."""

    def __init__(self, site: str, peer: str) -> None:
        self.looped = peer  # the first host found to be us, as "host [address]:port"
        super().__init__(self.reply_for(site))

    def reply_for(self, domain: str) -> Reply:
        return Reply(554, "5.4.6", (f"mail for {domain} loops back to myself ({self.looped} is this node)",))


async def _this_node_among(
    hops: tuple[Hop, ...], upto: int, resolver: Resolver, own: Listeners
) -> tuple[int, str] | None:
    """The lowest preference, up to `upto`, of a hop one of whose addresses is this node's
    listener, with that hop named as a peer is; None if none is (a hop whose lookup fails
    cannot be told: it is not taken for this node, and is tried as any other)."""
    for hop in sorted(hops, key=lambda hop: hop.preference):
        if hop.preference > upto:
            break
        if _is_ip(hop.host):
            addresses = [hop.host]
        else:
            try:
                addresses = await resolver.addresses(hop.host)
            except DnsFailure:
                continue
        mine = next((a for a in addresses if own.is_self(a, hop.port)), None)
        if mine is not None:
            return hop.preference, _peer(hop, mine)
    return None


class _NoConnection(ConnectFailed):
    """This address did not take the TCP connection (refused, unreachable, timed out), or ended
    it before a word of its greeting (reset, closed: a host that did not answer). `said`:
    where (the peer, and the address it was tried from) and why, for a reason naming several."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(Reply(451, "4.4.1", (f"cannot connect to {where}: {why}",)))
        self.said = (where, why)


# Addresses a reason names one by one when none took the connection; the rest are counted.
_NAMED_UNTAKEN: Final = 3


def _none_took_it(untaken: Sequence[tuple[str, str]]) -> Reply:
    """The reason for addresses of which none took the connection (`_NoConnection.said` of each,
    in the order tried): each, then (of many) how many more and what they did. The last alone
    would hide that the others were tried."""
    text = "; nor to ".join(f"{where}: {why}" for where, why in untaken[:_NAMED_UNTAKEN])
    rest = untaken[_NAMED_UNTAKEN:]
    if rest:
        text += f"; nor to {len(rest)} more: {', '.join(dict.fromkeys(why for _, why in rest))}"
    return Reply(451, "4.4.1", (f"cannot connect to {text}",))


class _HandshakeFailed(ConnectFailed):
    """STARTTLS was accepted, the TLS handshake failed, and the policy allows the clear."""


class ConnectionLost(Exception):
    """The connection broke during a transaction (timeout, reset, garbage), or was closed
    before it. (A 421 is no break: the transaction ends with it, as its recipients' reply.)

    `reply` is why (Pigeon's words), the reply of every recipient the server had given no
    answer of its own. `settled`, when the break cut a transaction, is each recipient's own
    outcome so far, None where it has none (`ClientSession.settled`): a recipient refused at
    RCPT keeps that refusal, and a 5xx is bounced, not deferred with the others until it
    expires. Empty: none has (the connection broke before, or the server broke the protocol)."""

    def __init__(self, reply: Reply, settled: Sequence[Reply | None] = ()) -> None:
        super().__init__(str(reply))
        self.reply = reply
        self.settled = tuple(settled)

    def replies(self, count: int) -> list[Reply]:
        """The reply of each of the transaction's `count` recipients: its own where the server
        gave it one, else `reply`."""
        settled = self.settled
        if len(settled) != count:
            return [self.reply] * count
        return [self.reply if own is None else own for own in settled]

    def unanswered(self, count: int) -> frozenset[int]:
        """The recipients (by index) whose reply is `reply`, Pigeon's words, not the server's."""
        settled = self.settled
        if len(settled) != count:
            return frozenset(range(count))
        return frozenset(index for index, own in enumerate(settled) if own is None)


NO_CHUNKING_FOR: Final = 3600.0
"""Seconds a server that answered BDAT as a command it does not know is sent DATA instead,
CHUNKING offered or not: one such answer costs a connection, not one a message."""
_NO_CHUNKING: dict[tuple[str, int], float] = {}  # (address, port) -> until when (monotonic)


def _chunking_broken(address: str, port: int) -> bool:
    """Whether the server at `address` did not understand BDAT within `NO_CHUNKING_FOR`."""
    until = _NO_CHUNKING.get((address, port))
    return until is not None and until > time.monotonic()


def _remember_chunking_broken(address: str, port: int) -> None:
    now = time.monotonic()
    for key in [key for key, until in _NO_CHUNKING.items() if until <= now]:
        del _NO_CHUNKING[key]  # (only servers that failed within the hour are kept)
    _NO_CHUNKING[(address, port)] = now + NO_CHUNKING_FOR


REFUSED_BY_POLICY_FOR: Final = 86_400.0
"""Seconds an MX host refused for an enforced MTA-STS policy's TLS (no STARTTLS, a certificate
not verified for its name) is tried after the domain's other hosts, while the policy's id is the
same. Otherwise every attempt would walk the same refused hosts first: with more of them than
`[delivery] mx_address_limit` before a good one, the domain's mail would never be delivered. A
day, longer than the retries of a deferred message are apart (`max_retry_interval`, 4 hours by
default): a shorter memory could forget between two retries and begin again with the refused
hosts. Cheap to get wrong the other way: such a host is still tried, after the others (it may
have been fixed), and forgotten as soon as it passes."""
_REFUSED_BY_POLICY: dict[tuple[str, str, str], float] = {}  # (domain, policy id, MX host) -> until (monotonic)


def _refused_last(sts: Applied, hops: tuple[Hop, ...]) -> tuple[Hop, ...]:
    """`hops`, those refused lately for `sts`'s TLS moved after the others (both in their order)."""
    now = time.monotonic()
    refused = {hop.host for hop in hops if _REFUSED_BY_POLICY.get((sts.domain, sts.policy_id, hop.host), 0.0) > now}
    if not refused:
        return hops
    return (*(hop for hop in hops if hop.host not in refused), *(hop for hop in hops if hop.host in refused))


def _remember_refused(sts: Applied, host: str) -> None:
    now = time.monotonic()
    if len(_REFUSED_BY_POLICY) > 1000:
        for key in [key for key, until in _REFUSED_BY_POLICY.items() if until <= now]:
            del _REFUSED_BY_POLICY[key]
        if len(_REFUSED_BY_POLICY) > 10_000:
            _REFUSED_BY_POLICY.clear()
    _REFUSED_BY_POLICY[(sts.domain, sts.policy_id, host)] = now + REFUSED_BY_POLICY_FOR


def _noted(reply: Reply, note: str) -> Reply:
    """`reply` with `note` after the text of its last line."""
    return Reply(reply.code, reply.enhanced, (*reply.lines[:-1], f"{reply.lines[-1]} {note}"))


def _with_note(reason: Reply) -> Reply:
    """`reason`, saying the end of data went unanswered (the message may have been taken)."""
    note = "no reply to the end of data: the message may be delivered twice"
    return Reply(reason.code, reason.enhanced, (*reason.lines[:-1], f"{reason.lines[-1]}; {note}"))


_FALLBACK_WARNINGS: Final = WarningPace()
"""A step down from verified TLS, or from TLS, is a WARNING once in 10 minutes per site, host
and step (DEBUG otherwise): connections to a host whose certificate never verifies are many."""

_UNVERIFIED: Final = client_context(verify=False)
_PRIVATE_CAS: dict[str, tuple[bytes, ssl.SSLContext]] = {}


@functools.cache
def system_cas() -> ssl.SSLContext:
    """The client context that verifies against the system's CAs. Made when first asked for,
    not with this module: reading the CAs takes some 25 ms, which a node that never verifies
    need not spend at start. The outbound side asks for it when its routes are set
    (`Outbound`), so that the first handshake to verify does not wait for it."""
    return client_context(verify=True)


def _context(verify: bool, ca_file: str | None) -> ssl.SSLContext:
    """The client context for a handshake. A `ca_file` is read at each handshake (a few KiB,
    against a handshake's milliseconds) and loaded again when its content changed, so CAs
    renewed on disk are trusted without a restart. Raises OSError or ssl.SSLError when it
    cannot be read: the handshake fails, and says why."""
    if not verify:
        return _UNVERIFIED
    if ca_file is None:
        return system_cas()
    content = Path(ca_file).read_bytes()
    known = _PRIVATE_CAS.get(ca_file)
    if known is not None and known[0] == content:
        return known[1]
    context = client_context(verify=True, cafile=Path(ca_file))
    _PRIVATE_CAS[ca_file] = (content, context)
    return context


# A host that cannot give the TLS a policy requires (MTA-STS enforced, DANE): passed over for the
# next, remembered, counted in TLS reports. Plaintext after its 220 to STARTTLS is one: its TLS is
# no more to be trusted than a handshake that failed (and the clear is never tried after it).
_TLS_REASONS: Final = frozenset({Reason.TLS_NOT_OFFERED, Reason.TLS_REFUSED, Reason.TLS_FAILED, Reason.TLS_INJECTED})

# Errors of our own side (the source address cannot be bound), not of the peer.
_LOCAL_ERRORS: Final = frozenset({errno.EADDRNOTAVAIL, errno.EADDRINUSE})
_TIMED_OUT: Final = Reply(451, "4.4.2", ("timed out",))
_CLOSED: Final = Reply(451, "4.4.2", ("closed the connection",))
# Linux's ioctl for the bytes of a socket's send queue that its kernel has not sent yet
# (linux/sockios.h; Python names only SIOCOUTQ, which counts the sent but unacknowledged too).
_SIOCOUTQNSD: Final = 0x894B
_RESET_ON_CLOSE: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends RST, drops the queue


def _unsent_in_kernel(transport: asyncio.BaseTransport, unknown: int = 1) -> int:
    """Bytes written to the socket that its kernel has not sent yet; `unknown` when that cannot
    be told (not Linux, no socket): 1 by default, as what is not known to have left must not
    be said to have."""
    sock = transport.get_extra_info("socket")
    if sock is None or not sys.platform.startswith("linux"):
        return unknown
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQNSD, b"\0\0\0\0"))[0])
    except (OSError, ValueError):  # closed meanwhile
        return unknown


class _Wire(asyncio.Protocol):
    """The socket side of one connection: bytes in go to the session, its answers go out at
    once, and the events it raises wait in order for the task."""

    def __init__(self, loop: asyncio.AbstractEventLoop, session: ClientSession) -> None:
        self.loop = loop
        self.session = session
        self.transport: asyncio.Transport | None = None
        self.raw: asyncio.Transport | None = None  # the TCP transport, under TLS once started
        self.events: deque[Event] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.error: Reply | None = None  # why the connection cannot be used any more
        self.final: Closed | Unusable | None = None  # how the session ended
        self.timer: asyncio.TimerHandle | None = None
        self.patience = 0.0
        self.ending_patience = 0.0  # for the reply to the end of a message's content
        self.progress = 0.0  # loop time of the last reply (or of the start of the wait)
        self.content_wait = False  # the wait is a transaction's, whose content may take long to go
        self.unsent_seen = 0  # what `unsent` said when last looked at (progress of a long content)
        self.dropped = False  # the server closed or reset it (not our timeout, nor a broken protocol)
        self.heard = False  # a byte came from the server (in the clear, or over TLS)
        self.reset_by = ""  # the system's words for a reset that ended it ("Connection reset by peer")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, but are one.
        self.transport = self.raw = cast(asyncio.Transport, transport)

    def unsent(self, *, unknown: int = 0, kernel: bool = True) -> int:
        """Bytes written that have not left this host: those in the transports' buffers and,
        with `kernel`, those in the socket's that its kernel has not sent (a server that stopped
        reading closes its window; `unknown` when that cannot be told). Both count: the
        buffers may stay as they are while the kernel's queue drains."""
        transport, raw = self.transport, self.raw
        if transport is None or raw is None:
            return 0
        buffered = transport.get_write_buffer_size() + (raw.get_write_buffer_size() if raw is not transport else 0)
        if not kernel or raw.is_closing():
            return buffered
        return buffered + _unsent_in_kernel(raw, unknown)

    def holds_unsent(self) -> bool:
        """Whether bytes written to the connection have not all left this host (if it cannot
        be told, they have not). The last bytes written being a message's end, the server
        cannot have it then."""
        return self.unsent(unknown=1) > 0

    def reset(self) -> None:
        """Close at once with a TCP reset, dropping whatever waits to be sent: the server
        never gets the rest (above all not a message's end, after we gave the transaction
        up: it would deliver a message we try again), and the socket and buffers are freed
        now. A plain close would wait to send them first, for good if the server never
        reads again."""
        transport, raw = self.transport, self.raw
        if transport is None or raw is None:
            return
        sock = raw.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
            except OSError:
                pass  # closed meanwhile: nothing left to drop
        transport.abort()
        if raw is not transport:
            raw.abort()

    def data_received(self, data: bytes) -> None:
        self.heard = True
        session = self.session
        seen = session.replies_received
        session.receive_data(data)
        self.pump()
        if self.timer is not None and session.replies_received != seen:
            self.progress = self.loop.time()

    def eof_received(self) -> bool | None:
        if self.error is None:
            self.error = _CLOSED
            self.dropped = True
        self.session.receive_data(b"")
        self.pump()
        self._wake()
        return None  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self.error is None:
            self.dropped = True  # (a reset; None: closed by us, or after the end `eof_received` saw)
            self.reset_by = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        self.fail(Reply(451, "4.4.2", (f"connection lost: {exc}",)) if exc is not None else _CLOSED)

    def pump(self) -> None:
        """Take the session's events, write what it has to say, wake the task if it must act."""
        session = self.session
        events = self.events
        try:
            while True:
                event = session.next_event()
                if event is NEED_DATA:
                    break
                if isinstance(event, (Closed, Unusable)):
                    if event is not self.final:  # once closed, the session keeps saying so
                        self.final = event
                        events.append(event)
                    break
                events.append(event)  # type: ignore[arg-type]
        except PlaintextAfterStartTls as injected:  # (its own name: mypyc binds a name to one class)
            # A broken protocol, and the host's STARTTLS not to be trusted: said as the session's
            # verdict, for `ClientConnection._greet` to weigh under the TLS policy (a host an
            # enforced MTA-STS policy or DANE then passes over), as it does a failed handshake.
            unusable = Unusable(Reason.TLS_INJECTED, detail=str(injected))
            self.final = unusable
            events.append(unusable)
            self.fail(Reply(451, "4.5.0", (f"broke the protocol: {injected}",)))
            self.reset()
            return
        except ClientProtocolError as error:
            self.fail(Reply(451, "4.5.0", (f"broke the protocol: {error}",)))
            self.reset()
            return
        out = session.data_to_send()
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            transport.write(out)
        if events:
            self._wake()

    def fail(self, reply: Reply) -> None:
        if self.error is None:
            self.error = reply
        self._wake()

    # --- waiting, with a reply timeout that counts from the last reply ------------------------
    async def wait(self, patience: float, ending_patience: float | None = None) -> None:
        """Until an event or a failure. A reply resets the clock (RFC 5321 4.5.3.2 times each
        command); partial replies do not, so a server dribbling bytes still times out. While
        the session awaits the reply to the end of a message's content, the clock runs to
        `ending_patience` instead, if that is longer (None: `patience` for every reply)."""
        loop = self.loop
        self.waiter = loop.create_future()
        self.patience = patience
        # Never shorter: a transaction only ever moves on to awaiting its end, so the timer set
        # for `patience` is never late, and _expire sets it again for what applies by then.
        self.ending_patience = patience if ending_patience is None else max(patience, ending_patience)
        self.progress = loop.time()
        self.content_wait = ending_patience is not None
        # (The buffers alone, no system call for each message: a content that fits the kernel's
        # is seen as progress once, at the first look, a server that reads none of it timed
        # out a `patience` later.)
        self.unsent_seen = self.unsent(kernel=False) if self.content_wait else 0
        self.timer = loop.call_at(self.progress + patience, self._expire)
        try:
            await self.waiter
        finally:
            self.waiter = None
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None

    def _expire(self) -> None:
        now = self.loop.time()
        unsent = self.unsent() if self.content_wait else 0
        if unsent:
            # Content still going out: the server reads it, or not. Each part it takes is
            # progress, as each reply is, and a server that takes none for `patience` is
            # timed out (RFC 5321 4.5.3.2.5 times each block of data, 3 minutes): the whole
            # transfer is no more bound by the end's patience than by a reply's, or a large
            # message to a slow but steady reader would fail at every attempt.
            if unsent != self.unsent_seen:
                self.unsent_seen, self.progress = unsent, now
            due = self.progress + self.patience
        else:
            if self.unsent_seen:  # the last of it left since last looked: the end's wait starts
                self.unsent_seen, self.progress = 0, now
            ending = self.session.awaits_end_of_data()
            due = self.progress + (self.ending_patience if ending else self.patience)
        if now < due:
            self.timer = self.loop.call_at(due, self._expire)  # a reply came, or the end's is awaited
        else:
            self.timer = None
            self.fail(_TIMED_OUT)

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class ClientConnection:
    """An open, greeted SMTP connection to one peer."""

    def __init__(self, wire: _Wire, *, peer: str, options: ClientOptions, host: str = "", address: str = "") -> None:
        self._wire = wire
        self._session = wire.session
        self.peer = peer
        self.host = host  # the hop's host (a name, or an address)
        self.address = address  # the address connected to
        self.tls: str | None = None  # the TLS version, cipher and verification, once on TLS
        # Opened as opportunistic TLS's fallback (the clear, or TLS unverified) after a STARTTLS
        # handshake with this address failed: what that failure said, which the attempt's records
        # carry (`Attempt.tls_failed`): in the clear, `tls` None alone would read as a server that
        # offers no STARTTLS, and a downgrade on the path would leave no trace but a WARNING.
        self.tls_failed: str | None = None
        self.options = options
        self.broken = False
        self.opened_with: tuple[Hop, Destination, TlsPolicy, HostPolicy | None] | None = None  # (`_again_with_data`)
        self.dane: HostPolicy | None = None  # what DANE asks of the host (its TLSA records), if anything
        self.dane_match: Record | None = None  # the TLSA record the certificate matched
        self._unverified = False  # the last handshake failed verifying the certificate (PKIX)
        self._carried: tuple[list[Reply], list[int]] | None = None  # see `_again_with_data`
        self._resending = False  # see `_again_fresh`

    def local_ip(self) -> str:
        """The address this connection is from ("": not known)."""
        raw = self._wire.raw
        name = raw.get_extra_info("sockname") if raw is not None else None
        return str(name[0]) if name else ""

    @property
    def capabilities(self) -> Capabilities:
        """What the server's last EHLO offered."""
        return self._session.capabilities

    @property
    def auth_user(self) -> str | None:
        """Who the server took us for (SMTP AUTH), or None: the connection did not authenticate."""
        return self._session.auth_user

    @property
    def deliveries(self) -> int:
        """Transactions completed on this connection."""
        return self._session.transactions

    @property
    def needs_reset(self) -> bool:
        return self._session.needs_reset

    # --- opening ---------------------------------------------------------------------------
    @classmethod
    async def open(
        cls,
        destination: Destination,
        resolver: Resolver,
        options: ClientOptions,
        *,
        avoid: str | None = None,
        sessions: int = 0,
        own: Listeners | None = None,
    ) -> ClientConnection:
        """The first hop that takes the connection, never at the address `avoid` (the host
        that just answered 4xx: `smtp_agent` tries another, `sessions` being those it had),
        nor a host one of whose addresses is one of this node's listeners (`own`): mail sent
        there would loop. Raises ConnectFailed with the last reason (a permanent `550 5.4.4`
        when the DNS said of every MX host that it has no address; after what the hosts tried
        did, why the others were not), `site_down` unless a host took the connection or was
        left untried for a lookup that failed for now; LoopsBack if no hop is left but this
        node: every hop is, or (MX hosts) this node is one of the most preferred, as RFC 5321
        5.1 leaves only the hosts more preferred than the client's own entry to send to.
        MX hosts of equal preference are taken in a new random order each time, and each
        host's addresses (IPv4 first) too: a site's connections spread over them.

        Within the limits, as Postfix's `smtp_mx_address_limit` and `smtp_mx_session_limit`:
        at most `mx_address_limit` addresses are tried, each once (an address several hosts
        name is one), a host that adds none (its lookup failed, its addresses were tried)
        counting as one, so that hosts past the limit are not even looked up; and it stops
        after `mx_session_limit` sessions that got a greeting (a 220) and would not do (a host
        an enforced MTA-STS policy's TLS refused is none: RFC 8461 5 moves on to the next). Then
        the failure is temporary, and names what was tried; the next attempt starts again
        from the first hop, but that hosts an enforced MTA-STS policy's TLS refused lately come
        after the others (`REFUSED_BY_POLICY_FOR`)."""
        last = ConnectFailed(Reply(451, "4.4.1", (f"no host to try for {destination.site}",)))
        policy = TlsPolicy(destination.tls.value)
        tried = connected = False  # whether any address was tried, and any took the connection
        seen: set[tuple[str, int]] = set()  # the addresses tried
        spent = 0  # of mx_address_limit: addresses tried, and hosts that added none
        done: list[str] = []  # what was tried, for a failure that the limits cut short
        cut = False
        refused = False  # whether a host was passed over for the policy's TLS (MTA-STS enforce, DANE)
        looped: str | None = None  # the first hop found to be this node, as a peer is named
        elsewhere = False  # whether any hop may be another node's (or could not be told: no address)
        hops = destination.hops
        mx = destination.hops_from == "mx"
        if mx:
            hops = connection_order(hops)  # (equal preferences in a new random order: RFC 5321 5.1)
        # RFC 5321 5.1: a client that is one of the MX hosts sends only to those more preferred
        # than its own most preferred entry (Postfix's "loops back to myself" when none is):
        # a host less preferred would send the mail back to us, and the two nodes pass it to
        # each other until `max_hops`. `mine_from`: that preference, once found; `examined`:
        # the preference up to which every hop was looked at for being this node.
        mine_from: int | None = None
        examined: int | None = None
        sts = destination.mta_sts
        counts = options.tls_report
        if policy is TlsPolicy.DISABLED:
            counts = None  # (the operator's choice: no TLS to report on)
        report_domain = sts.domain if sts is not None else destination.domain
        # MX hosts the DNS said have no address (NXDOMAIN, neither A nor AAAA): host -> why.
        # When that is every host, no retry reaches the domain (see the end).
        not_found: dict[str, str] = {}
        # Hosts not tried for a lookup (of addresses, or DANE's TLSA) that failed, and why: each
        # named after the failure of the hosts that were tried. One whose lookup failed for now
        # (a timeout, SERVFAIL, a TLSA lookup) may be the host that is up: the site is not down.
        untried: list[str] = []
        unresolved = False
        untaken: list[tuple[str, str]] = []  # the addresses that took no connection, and why
        first = avoid is None and sessions == 0  # (not `smtp_agent`'s move to another host)
        if sts is not None and _REFUSED_BY_POLICY and sts.enforced:
            hops = _refused_last(sts, hops)
        for hop in hops:
            if spent >= options.mx_address_limit or sessions >= options.mx_session_limit:
                cut = True
                break
            if mx and own is not None and (examined is None or hop.preference > examined):
                examined = hop.preference
                found = await _this_node_among(hops, examined, resolver, own)
                if found is not None and (mine_from is None or found[0] < mine_from):
                    mine_from, looped = found
            if mine_from is not None and hop.preference >= mine_from:
                _log.debug("%s: %s not sent to: this node is an MX host as preferred", destination.site, hop.host)
                continue
            secure = False  # (the addresses were validated: DANE's TLSA lookup follows)
            expanded: str | None = None  # (the end of the CNAME chain they came through)
            try:
                if _is_ip(hop.host):
                    addresses = [hop.host]
                elif destination.dane:
                    addresses, secure, expanded = await resolver.addresses_canonical(hop.host)
                else:
                    addresses = await resolver.addresses(hop.host)
            except DnsFailure as error:
                if not tried:  # (a host that was tried says more: this one is named after it)
                    last = ConnectFailed(Reply(451, "4.4.3", (f"{hop.host}: {error.reply.text}",)))
                untried.append(f"{hop.host} not tried: {error.reply.text}")
                if error.not_found:
                    not_found[hop.host] = error.reply.text
                else:
                    unresolved = True
                spent += 1
                done.append(f"{hop.host} (no address)")
                elsewhere = True
                continue
            if own is not None:
                mine = next((a for a in addresses if own.is_self(a, hop.port)), None)
                if mine is not None:
                    # The whole host is passed over, not only that address: its others (::1
                    # beside 127.0.0.1) would reach us too, or nothing.
                    _log.debug("%s: %s is this node: not connected to", destination.site, _peer(hop, mine))
                    looped = looped or _peer(hop, mine)
                    continue
            elsewhere = True
            dane: HostPolicy | None = None
            if destination.dane:
                try:
                    dane = await host_policy(resolver, hop.host, hop.port, secure, expanded)
                except LookupFailed as failed:
                    # RFC 7672 2.2: a TLSA lookup that failed (perhaps a bogus answer) makes the
                    # host unusable for now, never one to reach without DANE.
                    if not tried:
                        last = ConnectFailed(failed.reply)
                    untried.append(failed.reply.text)  # (it names the host, and says it was not used)
                    unresolved = True
                    spent += 1
                    done.append(f"{hop.host} (TLSA lookup failed)")
                    if counts is not None:
                        note_lookup_failed(counts, report_domain, hop.host, failed.reply.text)
                    continue
            if options.bind is not None:
                # A socket bound to an IPv4 address cannot reach an IPv6 one, nor the reverse.
                family = ipaddress.ip_address(options.bind).version
                usable = [a for a in addresses if ipaddress.ip_address(a).version == family]
                if not usable:
                    reason = f"{hop.host} has no IPv{family} address to reach from {options.bind}"
                    if not tried:  # (as a failed lookup: named after what the hosts tried did)
                        last = ConnectFailed(Reply(451, "4.4.1", (reason,)))
                    untried.append(reason)
                    spent += 1
                    done.append(f"{hop.host} (no IPv{family} address)")
                    continue
                addresses = usable
            if avoid is not None:
                addresses = [a for a in addresses if a != avoid]
            addresses = address_order(addresses)  # (each family's in a new random order, IPv4 first)
            fresh = [a for a in dict.fromkeys(addresses) if (a, hop.port) not in seen]
            if not fresh:
                spent += 1  # (its addresses were tried already, under another name)
                continue
            for address in fresh:
                if spent >= options.mx_address_limit or sessions >= options.mx_session_limit:
                    cut = True
                    break
                spent += 1
                seen.add((address, hop.port))
                done.append(_peer(hop, address))
                tried = True
                handshake_failed = greeted = False
                try:
                    connection = await cls._open_one(hop, address, destination, options, policy, dane)
                    if counts is not None and (sts is not None or dane is not None):
                        on_tls = connection.tls is not None
                        local = connection.local_ip()
                        note_opened(counts, report_domain, sts, dane, hop.host, address, local, on_tls=on_tls)
                    if sts is not None and _REFUSED_BY_POLICY:
                        _REFUSED_BY_POLICY.pop((sts.domain, sts.policy_id, hop.host), None)  # (fixed)
                    return connection
                except _NoConnection as error:
                    untaken.append(error.said)
                    if not connected:  # (a host that answered said more than one that would not connect)
                        last = error.with_traceback(None)  # (kept without the frames it came through)
                    continue
                except ConnectFailed as error:
                    if error.final:
                        raise  # (the route's trouble, whatever the address: the attempt's reply)
                    if counts is not None and error.tls_failure is not None:
                        failure = error.tls_failure
                        note_refused(counts, report_domain, sts, dane, hop.host, address, error.local, failure)
                    last = error.with_traceback(None)
                    handshake_failed = isinstance(error, _HandshakeFailed)
                    # A host the policy's TLS refused uses none of the sessions (RFC 8461 5: "MUST NOT
                    # be used; mail delivery SHOULD proceed to the next candidate"); the addresses
                    # tried stay bound by mx_address_limit.
                    greeted = error.greeted and not error.by_policy
                    refused = refused or error.by_policy
                    if error.by_policy and sts is not None and dane is None:
                        _remember_refused(sts, hop.host)  # (tried after the others next time)
                connected = True
                if not handshake_failed:
                    sessions += 1 if greeted else 0
                    continue
                # The session said a new connection in the clear may do (opportunistic TLS). One
                # that asked to verify tries TLS unverified first: a certificate that does not
                # verify is still better encryption than none. (Tried here, not in the `except`
                # above: compiled by mypyc, a handler that awaits sets sys.exc_info() back, once
                # done, to what it was when it began, which may be an exception thrown into
                # this task since handled: left behind, a later `finally` raises it again.)
                # The address counts as one session, however many of these it takes. A route
                # that authenticates takes neither (its session never says the clear may do):
                # the password goes only on the TLS the route asked for, verified if it asked.
                sessions += 1
                failed_handshake = last.reply.text  # (what the records of a fallback's mail say: `tls_failed`)
                fallbacks = (
                    [(dataclasses.replace(destination, tls_verify=False), policy)] if destination.tls_verify else []
                )
                fallbacks.append((destination, TlsPolicy.DISABLED))
                if dane is not None:
                    # TLSA records none usable, and a certificate that did not verify for a route
                    # that asks to but does not require TLS: unverified TLS, as without DANE, but
                    # never the clear (`_open_one` keeps TLS required under DANE).
                    fallbacks = fallbacks[:1] if destination.tls_verify else []
                if destination.auth is not None:
                    fallbacks = []  # (`_HandshakeFailed` is never raised for them: said twice, as it matters)
                for fallback, tls in fallbacks:
                    how = "in the clear" if tls is TlsPolicy.DISABLED else "on TLS without verifying the certificate"
                    # Once in a while per site, host and step: a host whose certificate never
                    # verifies (under a `testing` MTA-STS policy, or a route's `tls_verify`) would
                    # otherwise have a WARNING for each connection opened to it.
                    due = _FALLBACK_WARNINGS.due(f"{destination.site}\0{_peer(hop, address)}\0{how}")
                    _log.log(
                        logging.WARNING if due else logging.DEBUG,
                        "%s: %s; trying again %s",
                        destination.site,
                        last.reply,
                        how,
                    )
                    try:
                        connection = await cls._open_one(hop, address, fallback, options, tls, dane)
                    except ConnectFailed as again:
                        again.tls_failed = failed_handshake  # (a failure of the fallback is said as one)
                        if isinstance(again, _HandshakeFailed):
                            failed_handshake = again.reply.text  # (the unverified TLS failed too: why the clear)
                        last = again.with_traceback(None)
                        continue
                    connection.tls_failed = failed_handshake
                    return connection
            if cut:
                break
        hosts = {hop.host for hop in hops}
        if first and not cut and destination.hops_from == "mx" and hosts and hosts <= not_found.keys():
            # Every MX host definitely without an address: the domain takes no mail as its DNS
            # stands, as Postfix has it ("5.4.4 Host or domain name not found"), not a deferral
            # until max_age. One lookup that failed, or a host with an address that did not
            # answer, and it may yet work: deferred. (A route's next_hop is the operator's
            # configuration, not the recipient domain's: deferred, as Postfix's relayhost.)
            said = "; ".join(not_found[host] for host in dict.fromkeys(hop.host for hop in hops))
            raise ConnectFailed(
                Reply(550, "5.4.4", (f"host or domain name not found: no MX host has an address: {said}",))
            )
        if not connected and not cut and len(untaken) > 1:
            last = ConnectFailed(_none_took_it(untaken))
        if tried and untried:
            # What the hosts tried did, then why the others were not tried: the reply, the
            # message's last_response and its DSN name both (the lookup alone hid a refused
            # connection, the connection alone a host that may be the one up).
            last = last.noted("; ".join(untried))
        if cut:
            # Hosts were left untried: no verdict on the site's mail, whatever the last said.
            reply = last.reply if 400 <= last.reply.code < 500 else Reply(451, "4.4.1", last.reply.lines)
            note = (
                f"not all hosts tried ([delivery] mx_address_limit {options.mx_address_limit}, "
                f"mx_session_limit {options.mx_session_limit}); tried {', '.join(done)}"
            )
            last = last.noted(note, reply)
        elif refused and len(done) > 1:
            # Hosts passed over for the policy's TLS, each for a reason of its own: the last
            # host's alone would hide that the others were tried (and why they come last next time).
            last = last.noted(f"tried {', '.join(done)}")
        if looped is not None and not elsewhere and not cut:
            raise LoopsBack(destination.site, looped)
        # Down: no host took the connection, and none was left untried but for the DNS saying
        # it has no address (which no retry soon changes; see the README's "Dead sites").
        down = tried and not connected and not unresolved
        raise ConnectFailed(
            last.reply, site_down=down, peer=last.peer, tls=last.tls, server=last.server, tls_failed=last.tls_failed
        )

    @classmethod
    async def _open_one(
        cls,
        hop: Hop,
        address: str,
        destination: Destination,
        options: ClientOptions,
        policy: TlsPolicy,
        dane: HostPolicy | None = None,
    ) -> ClientConnection:
        peer = _peer(hop, address)
        if dane is not None:
            policy = TlsPolicy.REQUIRED  # (RFC 7672 2.2: with TLSA records, TLS or no mail, whatever the route says)
        loop = asyncio.get_running_loop()
        chunking = options.chunking and not _chunking_broken(address, hop.port)
        session = ClientSession(
            options.helo_name,
            tls=policy,
            pipelining=options.pipelining,
            chunking=chunking,
            credentials=destination.auth,
        )
        wire = _Wire(loop, session)
        origin = f" from {options.bind}" if options.bind is not None else ""
        try:
            async with asyncio.timeout(options.connect_timeout):
                local = (options.bind, 0) if options.bind is not None else None
                await loop.create_connection(lambda: wire, address, hop.port, local_addr=local)
        except (OSError, TimeoutError) as error:
            # The system's words for the errno (asyncio's loop says "Connect call failed (address)"
            # instead, uvloop's "Connection refused"): a reset then reads as one a moment later.
            if isinstance(error, TimeoutError):
                reason = "timed out"
            else:
                reason = os.strerror(error.errno) if error.errno else (error.strerror or str(error))
            if isinstance(error, OSError) and error.errno in _LOCAL_ERRORS:
                # Our side's fault: says nothing of the site.
                raise ConnectFailed(Reply(451, "4.4.1", (f"cannot connect to {peer}{origin}: {reason}",))) from None
            raise _NoConnection(f"{peer}{origin}", reason) from None
        connection = cls(wire, peer=peer, options=options, host=hop.host, address=address)
        connection.opened_with = (hop, destination, policy, dane)
        connection.dane = dane
        try:
            if policy is TlsPolicy.IMPLICIT:
                await connection._implicit_tls(hop, destination)
            await connection._greet(hop, destination)
        except ConnectionLost as error:
            connection.close()
            if wire.dropped and not wire.heard and connection.tls is None:
                # Reset or closed before a word: the host did not answer, as when the reset came
                # before the connection was made (`create_connection` raised), which only the
                # timing tells apart. The same either way: one that takes no connection (a site
                # whose every host does this is down), never a counted attempt.
                reason = wire.reset_by or "closed the connection before its greeting"
                raise _NoConnection(f"{peer}{origin}", reason) from None
            greeted = session.replies_received > 0  # (a banner other than 220 is Unusable)
            raise ConnectFailed(error.reply, peer=peer, tls=connection.tls, greeted=greeted) from None
        except BaseException:
            connection.close()
            raise
        sts = destination.mta_sts
        if sts is not None and not sts.enforced and connection.dane_match is None:
            _warn_testing(sts, hop.host, peer, connection.tls is not None and destination.tls_verify)
        return connection

    async def _greet(self, hop: Hop, destination: Destination) -> None:
        """Until the session is ready, starting TLS when it asks."""
        while True:
            event = await self._event()
            if isinstance(event, Ready):
                return
            if isinstance(event, StartTls):
                # An address is no server name to send (RFC 6066 3), but a verified connection
                # must still check the certificate names it: Python checks an IP against the
                # certificate's IP addresses and sends no SNI for one.
                verify = destination.tls_verify
                server_name = hop.host if verify or not _is_ip(hop.host) else None
                sts = destination.mta_sts
                dane = self.dane
                if dane is not None and dane.records:
                    # TLSA records to match: they, not PKIX, say whether the certificate will do
                    # (checked after the handshake), and MTA-STS gives way (RFC 8461 2); the
                    # server is named by the TLSA base domain (RFC 7672 8.1). None usable: TLS
                    # is mandatory, and nothing else changes: the certificate is verified if the
                    # route or an enforced MTA-STS policy asks (`tls_verify`), as without DANE.
                    verify = False
                    server_name = dane.base
                await self._start_tls(server_name, verify, destination.ca_file)
                if sts is not None and self.tls is not None and self.dane_match is None:
                    self.tls += f", MTA-STS {sts.policy.mode.value}"  # (what the records say: see `tls`)
            elif isinstance(event, Unusable):
                failure = _HandshakeFailed if event.retry_in_clear else ConnectFailed
                greeted = event.reason is not Reason.BANNER  # (turned away at the banner: no session)
                reply, server = event.explain(self.peer), event.said_by_server
                sts = destination.mta_sts
                by_policy = False
                # A certificate that did not verify, with TLSA records none usable: the check that
                # failed is the route's or MTA-STS's (DANE asked only for TLS), and so says the reply.
                pkix = self.dane is not None and not self.dane.records and self._unverified
                pkix = pkix and event.reason is Reason.TLS_FAILED
                if self.dane is not None and event.reason in _TLS_REASONS and not pkix:
                    # (RFC 7672 2.2: the next MX host is tried, as for a host MTA-STS refuses)
                    by_policy = True
                    reply = _noted(reply, self.dane.describe())
                elif pkix and (sts is None or not sts.enforced):
                    # The route's tls_verify: as without DANE, opportunistic TLS may try again
                    # unverified (`open`), but TLS it stays.
                    if TlsPolicy(destination.tls.value) is not TlsPolicy.REQUIRED and destination.auth is None:
                        failure = _HandshakeFailed
                elif sts is not None and sts.enforced and event.reason in _TLS_REASONS:
                    # (a host that turned us away otherwise is not the policy's doing: its reply stands)
                    by_policy = True
                    reply = _noted(reply, f"(TLS verified for {hop.host} required by {sts.describe()})")
                # The operator's to fix (a password, a route's TLS), not the recipients', nor the
                # address's: the attempt ends with it, and the dispatcher holds the route's mail
                # and says so (a WARNING once, not one a connection).
                authentication = event.authentication
                # (Plaintext after the 220 is the host's doing, or the path's: another address may do.)
                route_tls = event.reason in _TLS_REASONS and event.reason is not Reason.TLS_INJECTED
                final = authentication or (destination.auth is not None and route_tls)
                tls_failure: tuple[str, str] | None = None
                if event.reason in _TLS_REASONS and (self.dane is not None or sts is not None):
                    detail = event.detail or (str(event.reply) if event.reply is not None else "STARTTLS not offered")
                    matched = self.dane is not None and bool(self.dane.records)
                    tls_failure = (classify(event.reason.value, detail, dane=matched), detail)
                raise failure(
                    reply,
                    peer=self.peer,
                    tls=self.tls,
                    greeted=greeted,
                    server=server,
                    authentication=authentication,
                    final=final,
                    by_policy=by_policy,
                    tls_failure=tls_failure,
                    local=self.local_ip(),
                )
            else:
                raise ConnectionLost(self._lost(self._wire.error or _CLOSED))

    async def _start_tls(self, server_name: str | None, verify: bool, ca_file: str | None) -> None:
        wire, session = self._wire, self._session
        transport, failure = await self._handshake(server_name, verify, ca_file)
        if session.phase is not Phase.HANDSHAKE:
            return  # the session gave up meanwhile (plaintext after the 220: see _Wire.pump)
        if transport is None:
            session.tls_failed(failure)  # the connection is unusable now
        else:
            mismatch = self._dane_mismatch(transport)
            if mismatch is None:
                self._on_tls(transport, verify)
                session.tls_established()
            else:
                wire.transport = transport  # (closed with the connection, before any MAIL)
                session.tls_failed(mismatch)
        wire.pump()  # EHLO again, or the session's verdict on the failure

    def _dane_mismatch(self, transport: asyncio.Transport) -> str | None:
        """Why the certificate presented fails the host's TLSA records, or None (`dane_match`
        then says which record it met; nothing to match when it has none usable)."""
        dane = self.dane
        if dane is None or not dane.records:
            return None
        try:
            self.dane_match = check(dane, presented_chain(transport.get_extra_info("ssl_object")))
        except Mismatch as error:
            return f"DANE: {error}"
        return None

    async def _implicit_tls(self, hop: Hop, destination: Destination) -> None:
        """TLS from the first byte (RFC 8314 3: a submission port 465), before the banner, which
        then comes over TLS. The certificate is checked as the route says, as after STARTTLS.
        A handshake that fails is the host's failure (4.7.5), not the site's: it took the connection."""
        verify = destination.tls_verify
        server_name = hop.host if verify or not _is_ip(hop.host) else None
        transport, failure = await self._handshake(server_name, verify, destination.ca_file)
        if transport is None:
            reply = Reply(451, "4.7.5", (f"TLS handshake with {self.peer} failed: {failure} (implicit TLS)",))
            raise ConnectFailed(reply, peer=self.peer, final=destination.auth is not None)
        self._on_tls(transport, verify)
        self._wire.pump()  # a banner that came with the handshake's last bytes

    async def _handshake(
        self, server_name: str | None, verify: bool, ca_file: str | None
    ) -> tuple[asyncio.Transport | None, str]:
        """The TLS transport over the connection, or None and why not."""
        wire = self._wire
        assert wire.transport is not None
        failure = "the connection closed during the handshake"
        self._unverified = False
        try:
            async with asyncio.timeout(self.options.reply_timeout):
                transport = await wire.loop.start_tls(
                    wire.transport, wire, _context(verify, ca_file), server_hostname=server_name
                )
        except TimeoutError:
            failure = f"timed out after {self.options.reply_timeout:g}s ([delivery] reply_timeout)"
        except ConnectionResetError:
            failure = "connection reset by the server"
        except ssl.SSLCertVerificationError as error:
            self._unverified = verify
            failure = str(error) or type(error).__name__
        except (ssl.SSLError, OSError) as error:
            failure = str(error) or type(error).__name__
        else:
            if transport is not None:
                return transport, ""
        return None, failure

    def _on_tls(self, transport: asyncio.Transport, verify: bool) -> None:
        self._wire.transport = transport  # (wire.raw stays the TCP transport beneath)
        # Said in the text every record of the attempt carries: a session on the unverified
        # fallback (a certificate that expired, an unknown CA) is otherwise the same words
        # as a verified one, and an auditor could not tell them apart.
        described = describe(transport.get_extra_info("ssl_object"))
        checked = "certificate verified" if verify else "certificate not verified"
        if self.dane_match is not None:
            checked = f"certificate verified by DANE ({self.dane_match.describe()})"
        elif self.dane is not None:
            checked += f", DANE (TLSA {self.dane.name}, none usable)"
        self.tls = f"{described}, {checked}" if described is not None else None

    # --- sending ---------------------------------------------------------------------------
    async def send(self, envelope: Envelope) -> tuple[Result, float]:
        """Run one transaction. Returns its result and how long it took (seconds).

        Raises ConnectionLost if the connection broke: the recipients the server had answered
        with a refusal keep it (`ConnectionLost.settled`), the others are a transient failure
        with its reply, which says so when the message may have been taken.

        But a connection used before (a transaction done on it), alive as this one began, that the
        server closed or reset before it answered anything of it has taken nothing: the race of a
        server's idle timeout, or its limit of messages a connection, with our MAIL (`alive`
        said yes a moment before). The transaction goes again at once on a new connection to
        the same address (`_again_fresh`), and only what happens there counts. Once: the new
        connection is no reused one. A reply of any kind to this transaction (a 250 to MAIL
        before the close), a timeout, a broken protocol: the break stands, as above.
        """
        started = time.monotonic()
        session = self._session
        reused = session.transactions > 0 and session.is_ready()  # (one known dead already is not sent on)
        seen = session.replies_received
        try:
            result = await self._send_once(envelope)
        except ConnectionLost:
            unanswered = self._session is session and session.replies_received == seen
            if not (reused and unanswered and self._wire.dropped and self.opened_with is not None):
                raise
        else:
            return result, time.monotonic() - started
        # (Here, not in the handler: compiled by mypyc, a handler that awaits sets sys.exc_info()
        # back to what it was when it began once done: see `open`.)
        await self._again_fresh()
        result = await self._send_once(envelope)
        return result, time.monotonic() - started

    async def _send_once(self, envelope: Envelope) -> Result:
        """`send`'s transaction on this connection as it is, whatever became of it."""
        if not self._session.is_ready():
            self.broken = True
            raise ConnectionLost(self._lost(self._wire.error or _CLOSED))
        self._write(self._session.send(Deliver(envelope)))
        try:
            event = await self._event(ending_patience=self.options.data_done_timeout)
        except ConnectionLost as error:
            raise ConnectionLost(self._unanswered_end(error.reply), self._session.settled()) from None
        if not isinstance(event, TransactionDone):
            self.broken = True
            reason = self._unanswered_end(self._lost(self._wire.error or _CLOSED))
            raise ConnectionLost(reason, self._session.settled())
        result = self._quoted(event.result)
        if result.bdat_not_understood is not None:
            result = await self._again_with_data(envelope, result)
        return result

    async def _again_fresh(self) -> None:
        """This connection, which the server closed before it answered anything of a transaction
        (see `send`), given up for a new one to the same address, under the same TLS policy, as
        `_again_with_data` does. Raises ConnectionLost, the close's reason saying why, if none is
        to be had: the transaction's recipients then have the usual transient failure."""
        assert self.opened_with is not None
        hop, destination, policy, dane = self.opened_with
        lost = self._lost(self._wire.error or _CLOSED)
        _log.info(
            "%s: %s, nothing of the next transaction answered, on a connection used before (an idle timeout or a "
            "limit of messages a connection, met as MAIL came): the transaction goes again at once on a new connection",
            destination.site,
            lost,
        )
        self.close()
        self._resending = True  # (until the new one is in: a stop meanwhile cut nothing that went, `cut_short`)
        failed: Reply | None = None
        try:
            other = await ClientConnection._open_one(hop, self.address, destination, self.options, policy, dane)
        except ConnectFailed as error:
            failed = error.reply
        if failed is not None:
            self._resending = False
            last = f"{lost.lines[-1]}; connecting again failed: {failed}"
            raise ConnectionLost(Reply(lost.code, lost.enhanced, (*lost.lines[:-1], last)))
        self._adopt(other)
        self._resending = False

    def _adopt(self, other: ClientConnection) -> None:
        """Go on over `other`, a new connection to the same address, as this one."""
        # (`tls_failed` stays: `opened_with` is the fallback's, so the new connection is one
        # too, for the same failed handshake, and its recipients' records say so as well.)
        self._wire, self._session, self.tls, self.broken = other._wire, other._session, other.tls, False
        self.dane_match = other.dane_match

    async def _again_with_data(self, envelope: Envelope, result: Result) -> Result:
        """`result`, of a transaction whose BDAT the server did not understand (its session has
        closed the connection: see `ClientSession`), with the recipients it had accepted sent
        again with DATA on a new connection to the same address, under the same TLS policy:
        the server took no message, so each gets it once. The address gets DATA for
        `NO_CHUNKING_FOR` (`_open_one`). If no new connection is to be had, they keep their
        4xx (`client.bdat_not_understood`), which says why, and the connection is broken."""
        refused = result.bdat_not_understood
        assert refused is not None and self.opened_with is not None
        hop, destination, policy, dane = self.opened_with
        _remember_chunking_broken(self.address, hop.port)
        again = [i for i, reply in enumerate(result.replies) if reply == result.data_reply]
        _log.warning(
            "%s: %s answered BDAT with %s, though it offers CHUNKING: the message goes again with DATA on a new "
            "connection, and DATA it gets for the next %gs",
            destination.site,
            self.peer,
            refused,
            NO_CHUNKING_FOR,
        )
        self.close()
        try:
            other = await ClientConnection._open_one(hop, self.address, destination, self.options, policy, dane)
        except ConnectFailed as error:
            replies = list(result.replies)
            for index in again:
                replies[index] = _noted(replies[index], f"; connecting again failed: {error.reply}")
            return Result(replies, result.mail_reply, result.data_reply)
        self._adopt(other)
        replies = list(result.replies)
        self._carried = (replies, again)  # (should a stop cut what follows: `answered_before_cut`)
        rest = dataclasses.replace(envelope, recipients=[envelope.recipients[i] for i in again])
        try:
            more, _ = await self.send(rest)
        except ConnectionLost as lost:
            self._carried = None
            for index, reply in zip(again, lost.replies(len(again)), strict=True):
                replies[index] = reply
            return Result(replies, result.mail_reply, result.data_reply)
        self._carried = None  # (left set if a stop cancels the send: `answered_before_cut` reads it)
        for index, reply in zip(again, more.replies, strict=True):
            replies[index] = _noted(reply, "(sent with DATA: BDAT not understood)")
        return Result(replies, more.mail_reply, more.data_reply, needs_reset=more.needs_reset)

    def _unanswered_end(self, reason: Reply) -> Reply:
        """Why a transaction broke, saying so when it broke after the end of the content went
        out and before its reply came: the server may have taken the message (as Postfix has
        it, "while sending end of data -- message may be sent more than once"). Written is
        not gone: an end still in our buffers or the kernel's (a server that stopped reading
        mid-content) never reached the server, and the connection is reset when closed, so
        it never will."""
        if not self._end_may_have_arrived():
            return reason
        return _with_note(reason)

    def _end_may_have_arrived(self) -> bool:
        return self._session.end_of_data_unanswered() and not self._wire.holds_unsent()

    def cut_short(self) -> Reply | None:
        """A stop cancelled `send` (`[node] shutdown_timeout` ran out): the connection is done
        for, and this is the reply the cut transaction's recipients get if the end of its
        content had gone out unanswered, as when the connection breaks there (the server may
        have taken the message); None if it had not gone (nothing was taken: the message is
        simply tried again)."""
        self.broken = True
        if self._resending or not self._end_may_have_arrived():
            return None
        return _with_note(Reply(451, "4.4.2", (f"{self.peer} did not answer before the node stopped",)))

    def settled(self) -> list[Reply | None]:
        """Of the transaction under way (a stop cancelled `send`), each recipient's own outcome
        so far, None where it has none (`ClientSession.settled`): a refusal stands, cut or not."""
        return self._session.settled()

    def answered_before_cut(self) -> list[Reply] | None:
        """A stop cancelled `send`: the replies of its transaction if they had all come (read
        off the wire, the task not yet woken to take them), as `send` would have taken them;
        they stand (a restart must not send again what the server took). None if not."""
        for event in self._wire.events:
            if isinstance(event, TransactionDone):
                answered = self._quoted(event.result).replies
                if self._carried is None:
                    return list(answered)
                # The answers of a transaction sent again with DATA, to some of the recipients
                # of the one cut: the others keep what the first said.
                replies, again = self._carried
                replies = list(replies)
                for index, reply in zip(again, answered, strict=True):
                    replies[index] = reply
                return replies
        return None

    def alive(self) -> bool:
        """False if the connection broke or the server closed it while it sat idle."""
        wire = self._wire
        return not (
            self.broken
            or wire.error is not None
            or not self._session.is_ready()
            or wire.transport is None
            or wire.transport.is_closing()
        )

    async def quit(self) -> None:
        """Say goodbye politely (briefly); close either way."""
        if self.alive():
            try:
                self._write(self._session.send(Quit()))
                await self._event(patience=5.0)
            except ConnectionLost:
                pass
            except BaseException:  # cancelled while waiting (a second stop): closed all the same
                self.close()
                raise
        self.close()

    def close(self) -> None:
        """Close the connection; with a reset if some of what was written has not left (see
        `_Wire.reset`), so that nothing of an abandoned transaction goes after it."""
        self.broken = True
        wire = self._wire
        if wire.transport is None:
            return
        if wire.holds_unsent():
            wire.reset()
        else:
            wire.transport.close()

    # --- bytes -------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        wire = self._wire
        if wire.transport is None or wire.transport.is_closing():
            self.broken = True
            raise ConnectionLost(self._lost(wire.error or Reply(451, "4.4.2", ("connection closed",))))
        if data:
            wire.transport.write(data)

    async def _event(self, patience: float | None = None, ending_patience: float | None = None) -> Event:
        """The session's next event; ConnectionLost if the connection failed first. Each reply
        may take `patience` (None: `reply_timeout`), the one to the end of data `ending_patience`."""
        wire = self._wire
        if not wire.events:
            if wire.error is None:
                await wire.wait(self.options.reply_timeout if patience is None else patience, ending_patience)
            if not wire.events:
                self.broken = True
                assert wire.error is not None
                raise ConnectionLost(self._lost(wire.error))
        return wire.events.popleft()

    def _lost(self, reason: Reply) -> Reply:
        """The reason, naming the peer and the command it left unanswered, as Postfix does
        ("lost connection with mx while sending RCPT TO"): "451 4.4.2 mx.example.net
        [192.0.2.1]:25 closed the connection after MAIL FROM", "451 4.4.2 timeout waiting for
        mx.example.net [192.0.2.1]:25 to answer RCPT TO". Without it, a server that hangs up at
        MAIL (a sender it will not have) read the same as one that hangs up at DATA (content
        it will not have), and a timeout at EHLO the same as one at MAIL."""
        peer = self.peer
        session = self._session
        if reason is _TIMED_OUT and session.phase is Phase.BANNER:
            if self.tls is None:
                # A server that speaks first on TLS (port 465) sends nothing in the clear: the
                # usual cause of a greeting that never comes, and the fix is the route's.
                hint = '; a port that starts with TLS (465) needs the route\'s tls = "implicit"'
                return Reply(451, "4.4.2", (f"timeout waiting for the greeting of {peer}{hint}",))
            return Reply(451, "4.4.2", (f"timeout waiting for the greeting of {peer}",))
        stage = session.unanswered()
        content = False  # the message's content had not all left this host
        if stage == END_OF_DATA:
            if self._wire.holds_unsent():
                content = True
            elif self._end_may_have_arrived():
                stage = None  # (the note `_unanswered_end` adds names it, and what it may mean)
        if reason is _TIMED_OUT:
            if content:
                return Reply(451, "4.4.2", (f"timeout waiting for {peer} to take the message's content",))
            to_answer = f" to answer {stage}" if stage is not None else ""
            return Reply(451, "4.4.2", (f"timeout waiting for {peer}{to_answer}",))
        text = f"{peer} {reason.text}"
        if content:
            text += " during the message's content"
        elif stage is not None:
            # (A reset's text ends with the system's words: the stage goes in brackets after them.)
            text += f" after {stage}" if reason is _CLOSED else f" (after {stage})"
        return Reply(reason.code, reason.enhanced, (text,))

    def _quoted(self, result: Result) -> Result:
        """`result`, with a 421 that ended it (`Result.closing`) saying where it came from, as
        one to EHLO does (`Unusable.explain`): "421 4.3.2 shutting down (answer of mx
        [192.0.2.1]:25 to RCPT TO)". The server's words stay first, for the reactions."""
        closing = result.closing
        if closing is None:
            return result
        quoted = _noted(closing, f"(answer of {self.peer} to {result.closing_answered})")
        return dataclasses.replace(result, replies=[quoted if reply == closing else reply for reply in result.replies])


def _warn_testing(sts: Applied, host: str, peer: str, verified: bool) -> None:
    """A WARNING (once in a while per domain) when a connection made under a `testing` MTA-STS
    policy is one that enforcing it would have refused (RFC 8461 5: the mail goes all the same)."""
    why = sts.would_fail(host, verified)
    if why is not None and WARNINGS.due(f"{sts.domain}\0testing\0{host}"):
        _log.warning(
            "%s: MTA-STS testing: delivering to %s, which %s would refuse: %s", sts.domain, peer, sts.describe(), why
        )


def _peer(hop: Hop, address: str) -> str:
    """How a log and a record name the host at an address: "mx.example.net [192.0.2.1]:25"."""
    return f"{hop.host} [{address}]:{hop.port}" if hop.host != address else f"[{address}]:{hop.port}"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
