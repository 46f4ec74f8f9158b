"""Intake: the step between every listener and the spool.

A listener opens a `Draft` when a message's content starts, writes the content into it as
it arrives, and commits it at the end. The draft:

* prepends our `Received:` header (RFC 5321 4.4), and ends the header section after it where
  HTTP injection ends raw content's (`pigeon.header_section.HeaderEnd`): a line that neither
  starts a field nor continues one starts the body, after an empty line put in;
* splits the recipients by domain: one spool message per destination domain, all sharing
  one body, so that every message belongs to exactly one scheduled queue;
* names each message's queue `campaign:tenant@domain` from the `X-Tenant` and `X-Campaign`
  headers, wherever they are in the header section, of the operator's mail (`Arrival.trusted`):
  mail taken from anyone has neither, whatever its headers say;
* refuses (550 5.7.1) a message whose tenant header names a tenant its credential (an SMTP
  AUTH user, an API token) is not bound to (`Arrival.tenants`), and gives a credential's
  one tenant to its mail that names none: the tenant picks `[[dkim]] tenant` keys and
  `[[queue]]` policies, so a platform with a credential per customer must keep each in its
  own. A policy's `Changes(tenant=...)` is the operator's code and is not held to it;
* refuses a header section with a field RFC 5322 3.6 allows once there twice (two From:
  one would be signed and the other shown; RFC 6376 8.15), wherever in it they are, and a
  policy's change that would add one (Pigeon's own DSNs are not looked at);
* refuses a submission (HTTP injection, SMTP after AUTH) without a From field (or with an
  empty one), which its completion (our Date and Message-ID) cannot supply, and one whose
  Date or Message-ID is not of its RFC 5322 syntax (`pigeon.header_section.date_problem`,
  `message_id_problem`), wherever in the header section they are;
* refuses mail loops (more than `max_hops` Received headers with ours, that is `max_hops`
  or more as it came, as Postfix counts `hopcount_limit`; RFC 5321 6.3, `Received :` too),
  counted over the whole header section however long it is (`pigeon.header_section`: policy and signing see
  only its first 64 KiB);
* asks the policy's `on_message` hook, if the policy module has one: it may refuse the
  message, or change its envelope sender, queue, route, egress pool, DKIM signers and
  headers (kept in the envelope: the stored body is never rewritten, see `delivery.content`);
* refuses (550 5.7.1) a message a recipient group of which would go by a `[[route]]`
  reserved for other tenants (`[[route]] tenants`, `pigeon.route_tenants`), judged by its
  tenant and routing domain once the policy has had its say;
* signs it (DKIM) when a `[[dkim]]` signer applies: once per reception, before the store,
  so every copy and every retry sends the same signature (`pigeon.dkim.signing`); mail taken
  from anyone only with the signers the policy names for it;
* stores everything in one group commit, and only then writes the `Reception` records
  and lets the listener answer 250;
* stores nothing for an SMTP client gone by the time the checks are done (`ClientGone`): it
  never heard 250 and will send the message again. One gone during the commit keeps its
  message, whose `Reception` records then say `answered: false`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, NamedTuple

import msgspec

from pigeon.delivery.content import edited
from pigeon.header_section import (
    KEPT,
    SINGLE_FIELDS,
    HeaderEnd,
    HeaderSection,
    LateField,
    RoutingNames,
    author_missing,
    malformed_field,
    received_fields,
    repeated_field,
    single_fields,
)
from pigeon.inbound.routes import PREFIX as INBOUND
from pigeon.inbound.routes import InboundRoutes
from pigeon.logs.outbox import Outbox
from pigeon.logs.peer_text import shown_value
from pigeon.logs.records import Reception, Response
from pigeon.logs.writer import LogWriter
from pigeon.message import Envelope, Message, Recipient, SpoolId, format_id
from pigeon.metrics import Metrics
from pigeon.mime import message_id_field
from pigeon.policy.answers import Changes, Refuse, folded_field
from pigeon.policy.hooks import POLICY_ERROR, HookFailed, Policy, refusal
from pigeon.policy.objects import NO_METADATA, Headers, ReceivedMessage
from pigeon.queue.names import (
    campaign_problem,
    queue_name,
    queue_part_from_header,
    queue_part_problem,
    scheduled_queue,
)
from pigeon.route_tenants import RouteTenants
from pigeon.smtp import replies
from pigeon.smtp.address import a_label, ascii_name, same_mailbox_key, valid_literal, with_a_label
from pigeon.smtp.replies import Reply
from pigeon.spool.body import Body, BodyWriter
from pigeon.spool.spool import NewMessage, Once, Settling, Spool, SpoolError

if TYPE_CHECKING:
    from pigeon.dkim.signing import Signing

_log = logging.getLogger(__name__)
_LINE_LIMIT: Final = 998  # RFC 5322 2.1.1, without the CRLF
_SINGLE_LOWER: Final = frozenset(name.lower() for name in SINGLE_FIELDS)
_DAYS: Final = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS: Final = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class Stored(NamedTuple):
    """A message durably in the spool: its ids (one per destination domain) and the 250."""

    ids: list[SpoolId]
    reply: Reply


class Refused(Exception):
    """Intake will not take this message. `reply` says why, for the client."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(str(reply))
        self.reply = reply


class ClientGone(Refused):
    """The client hung up while its message was being checked (a policy hook, DKIM signing),
    so it was not stored: no 250 can reach the client, which will send the message again, and
    stored it would be delivered twice. `reply` is what its Rejection record says; none is sent."""

    def __init__(self) -> None:
        super().__init__(replies.CLIENT_GONE)


@dataclass(frozen=True, slots=True)
class Arrival:
    """How a message reached us: what the Received header and the log records say."""

    listener: str  # "smtp", later "http"
    session: str
    peer: str  # "ip:port"
    peer_ip: str
    helo: str
    protocol: str  # RFC 3848 keyword
    tls: str | None = None
    auth_user: str | None = None
    trusted: bool = False
    """Sent by a client Pigeon relays for (`[smtp] relay_networks`, SMTP AUTH, an HTTP API
    token) or by Pigeon itself (a DSN). False: mail Pigeon takes from anyone (RFC 5321 4.5.1
    postmaster, an `[[inbound]]` route), which its X-Tenant and X-Campaign headers do not
    route (they would put it in a tenant's queues, under its policies) and which no
    `[[dkim]]` block signs (an outsider would get any From it writes signed with our keys,
    and so passing DMARC) unless the policy names signers for it."""
    tenants: frozenset[str] | None = None
    """The tenants the client's credential is bound to (the users file's `:tenants=`, a
    `[[http.token]]`'s `tenants`): its mail may name no other, and with exactly one, mail
    naming none is that one's. None: unbound, any tenant (relay_networks clients, DSNs,
    credentials without a binding)."""
    reports_on: str | None = None
    """A DSN: the id of the message it reports on (its `Reception` names it)."""


def received_field(
    hostname: str, now: int, envelope: Envelope, arrival: Arrival, spool_id: SpoolId, max_line: int = _LINE_LIMIT
) -> bytes:
    """The Received field Pigeon prepends to a message it takes in (RFC 5321 4.4), folded so
    that no line passes `max_line` octets (`[smtp] max_line_length`: a next hop with the same
    setting refuses a longer one) whatever the client named itself."""
    lines = [f"Received: from {_from_clause(ascii_name(arrival.helo), arrival.peer_ip)}"]
    if arrival.tls:
        lines.append(f"\t(using {arrival.tls})")
    lines.append(f"\tby {hostname} (Pigeon) with {arrival.protocol} id {format_id(spool_id)}")
    date = _rfc5322_date(now)
    if len(envelope.recipients) == 1:
        lines.append(f"\tfor <{with_a_label(envelope.recipients[0].address)}>; {date}")
    else:
        lines[-1] += ";"
        lines.append(f"\t{date}")
    return b"".join(_folded(line.encode("utf-8"), max_line) for line in lines)


_HELO_DOMAIN: Final = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?")
"""A name that reads as one domain in our Received field: LDH labels, and what real clients
send beside them (underscores, one label like `localhost`, a trailing dot)."""
_HELO_LITERAL: Final = re.compile(r"\[[A-Za-z0-9.:-]+\]")
"""What may be an address literal (RFC 5321 4.1.3): the characters IPv4, IPv6 and a tag use.
Written bare only if it is one (`valid_literal`): `[999.1.1.1]` is no address."""
_HELO_SHOWN: Final = 600
"""The most octets of a name shown in our field's comment (the line stays under 998)."""


def _from_clause(helo: str, peer_ip: str) -> str:
    """The `from` clause of our Received field (RFC 5321 4.4's Extended-Domain): the client's
    name and its address in a comment. A name that is no domain nor address literal (`(x`, `[999.1.1.1]`,
    `a;b`, `<x>`) is not refused (RFC 5321 4.1.4 leaves the name to the client, and such
    mail is no less mail), but never written bare, where its `(` would make the rest of the
    field a comment, or its `;` the date's separator: the address literal then stands for
    the client, and the name goes into the comment, each `(`, `)` and `\\` quoted
    (RFC 5322 3.2.2), so the field parses whatever the client said."""
    # An IPv6 address literal carries its tag (RFC 5321 4.1.3): "[::1]" is no address literal.
    literal = f"[IPv6:{peer_ip}]" if ":" in peer_ip else f"[{peer_ip}]"
    if not helo:  # HTTP has no HELO: the address alone says where the message came from.
        return literal
    if _HELO_DOMAIN.fullmatch(helo) or (_HELO_LITERAL.fullmatch(helo) and valid_literal(helo[1:-1])):
        return f"{helo} ({literal})"
    shown: list[str] = []
    size = 0
    for char in helo:
        quoted = "\\" + char if char in "()\\" else char
        if size + len(quoted) > _HELO_SHOWN:
            shown.append("...")
            break
        shown.append(quoted)
        size += len(quoted)
    return f"{literal} (helo={''.join(shown)})"


class Intake:
    """Turns finished content into durable spool messages."""

    def __init__(
        self,
        spool: Spool,
        log: LogWriter,
        metrics: Metrics,
        *,
        outbox: Outbox | None = None,
        inbound_routes: InboundRoutes | None = None,
        route_tenants: RouteTenants | None = None,
        hostname: str,
        max_line: int = _LINE_LIMIT,
        max_hops: int = 100,
        tenant_header: str = "X-Tenant",
        campaign_header: str = "X-Campaign",
        signing: Signing | None = None,
        policy: Policy | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spool = spool
        self.clock = clock  # arrival times; the same clock delivery measures max_age with
        self.log = log
        self.metrics = metrics
        self.hostname = hostname
        self.max_line = max_line
        """`[smtp] max_line_length`: no line of a field Pigeon adds is longer."""
        self.max_hops = max_hops
        self._tenant = b"\n" + tenant_header.lower().encode() + b":"
        self._campaign = b"\n" + campaign_header.lower().encode() + b":"
        self._routing_names = (tenant_header.lower(), campaign_header.lower())
        self._routing_headers = (tenant_header, campaign_header)  # as the operator spelt them, for replies
        self._routing_bytes = tuple(name.encode() for name in self._routing_names)
        self._routing = RoutingNames(self._routing_bytes)
        self.policy = policy or Policy()
        """The policy module's hooks (`on_message` is asked here; the listeners ask the others)."""
        self.signing = signing
        """DKIM signers (None: none configured)."""
        self.outbox = outbox
        """Where Reception records go with their commit (None in small tests: straight to the log)."""
        self.inbound_routes = inbound_routes
        """Recipients that go to an application's target rather than an MX."""
        self.route_tenants = route_tenants if route_tenants is not None else RouteTenants()
        """Which `[[route]]`s are reserved for which tenants' mail (a reload replaces it)."""
        self.on_stored: Callable[[list[Message]], None] | None = None
        # The spool's last refusal of a reception (disk full, I/O error), until one is stored
        # again: /healthz reports the spool down meanwhile (every message gets a 4xx).
        self.refusing: SpoolError | None = None
        """Told about every message once it is durable, while delivery runs (the scheduler
        subscribes when it starts, and leaves when it stops)."""

    async def local(
        self,
        envelope: Envelope,
        data: bytes,
        *,
        spool: Spool | None = None,
        settles: Settling | None = None,
        reports_on: str | None = None,
    ) -> Stored:
        """Store a message Pigeon wrote itself (a DSN): no client, a `by`-only Received header.

        `settles`: the outcome the message reports, committed in the same transaction (a
        crash leaves both or neither), in `spool`, the shard of the message it reports on
        (this worker's own, or one it adopted). `reports_on`: that message's id, which its
        `Reception` record names."""
        spool = self.spool if spool is None else spool
        arrival = Arrival(
            "local", "local", "", "127.0.0.1", self.hostname, "LOCAL", trusted=True, reports_on=reports_on
        )
        envelope.recipients = _unique(envelope.recipients)
        groups = _group_by_domain(envelope.recipients, self.inbound_routes)
        ids = spool.new_ids(len(groups))
        draft = Draft(self, envelope, arrival, groups, ids, spool.body_writer(ids[0]), spool, settles)
        date = _rfc5322_date(int(self.clock()))
        # Folded before the date: on one line, a long host name takes it past RFC 5322's 78 octets.
        by = _folded(f"Received: by {self.hostname} (Pigeon) id {format_id(ids[0])};".encode(), self.max_line)
        draft.trace(by + f"\t{date}\r\n".encode())
        draft.write(data)
        return await draft.commit()

    def draft(self, envelope: Envelope, arrival: Arrival) -> Draft:
        """Start a message. The Received header is written at once."""
        envelope.recipients = _unique(envelope.recipients)
        groups = _group_by_domain(envelope.recipients, self.inbound_routes)
        ids = self.spool.new_ids(len(groups))
        draft = Draft(self, envelope, arrival, groups, ids, self.spool.body_writer(ids[0]), self.spool)
        draft.trace(received_field(self.hostname, int(self.clock()), envelope, arrival, ids[0], self.max_line))
        return draft

    def signer_names(self) -> list[str]:
        """The names of the `[[dkim]]` signers, as a policy chooses them (those loaded now)."""
        signing = self.signing
        return [] if signing is None else [s.name for s in signing.keys.all if s.name is not None]

    def unknown_signers(self, names: Sequence[str]) -> list[str]:
        """Those of `names` no `[[dkim]]` signer has."""
        known = set(self.signer_names())
        return [name for name in names if name not in known]

    def _has_routing_field(self, lowered: bytes) -> bool:
        """Whether the lowered header section (from its leading newline) has a routing field:
        a substring look first (most mail has none), the field's exact form only then."""
        return any(name in lowered for name in self._routing_bytes) and self._routing.field.search(lowered) is not None

    def _routing_refusal(
        self, head: bytes, lowered: bytes, section: HeaderSection, arrival: Arrival
    ) -> tuple[str, Reply] | None:
        """The header (as `[delivery]` names it) and the reply refusing a message whose tenant
        or campaign header holds a control or format character (it would name its queue, and so
        be in every log record and admin listing of it); None when both are fine or absent, or
        name nothing (mail taken from anyone)."""
        values = self._tenant_and_campaign(head, lowered, section, arrival)
        checks = (queue_part_problem, campaign_problem)
        for value, header, check in zip(values, self._routing_headers, checks, strict=True):
            if value is not None and (problem := _not_utf8(value) or check(value)) is not None:
                return header, replies.r(554, "5.6.0", f"{header} header {problem} (it names a queue)")
        return None

    def _tenant_and_campaign(
        self, head: bytes, lowered: bytes, section: HeaderSection, arrival: Arrival
    ) -> tuple[str | None, str | None]:
        """The tenant and campaign of the message: those the routing headers name (none for
        mail taken from anyone, `Arrival.trusted`, whose headers are the sender's word, not the
        operator's), and, when they name no tenant, the one a credential is bound to alone."""
        tenant, campaign = self._claimed(head, lowered, section, arrival)
        bound = arrival.tenants
        if tenant is None and bound is not None and len(bound) == 1:
            tenant = next(iter(bound))
        return tenant, campaign

    def _claimed(
        self, head: bytes, lowered: bytes, section: HeaderSection, arrival: Arrival
    ) -> tuple[str | None, str | None]:
        """The tenant and campaign the routing headers name, for mail of a trusted client."""
        if not arrival.trusted:
            return None, None
        late = section.late_fields
        return _routing_value(head, lowered, self._tenant, late), _routing_value(head, lowered, self._campaign, late)

    def _binding_refusal(self, head: bytes, lowered: bytes, section: HeaderSection, arrival: Arrival) -> Reply | None:
        """550 5.7.1 for a message whose tenant header names a tenant its client's credential
        is not bound to (`Arrival.tenants`); None for an unbound one, or a tenant it may use."""
        bound = arrival.tenants
        if bound is None:
            return None
        tenant, _ = self._claimed(head, lowered, section, arrival)
        if tenant is None or tenant in bound:
            return None
        who = shown_value(arrival.auth_user or "the client")
        header = self._routing_headers[0]
        return replies.r(550, "5.7.1", f"{who} may not send as tenant {shown_value(tenant)} ({header} header)")


class Draft:
    """One message being received. `write()` content, then `commit()` once, or `discard()`."""

    __slots__ = (
        "_body",
        "_done",
        "_end",
        "_groups",
        "_head",
        "_ids",
        "_intake",
        "_outbound_asked",
        "_present",
        "_resident",
        "_settles",
        "_spool",
        "_then",
        "arrival",
        "envelope",
    )

    def __init__(
        self,
        intake: Intake,
        envelope: Envelope,
        arrival: Arrival,
        groups: list[tuple[_Group, list[Recipient]]],
        ids: list[SpoolId],
        body: BodyWriter,
        spool: Spool,
        settles: Settling | None = None,
    ) -> None:
        self._intake = intake
        self._spool = spool  # the shard the ids and the body writer are of
        self._settles = settles
        self.envelope = envelope
        self.arrival = arrival
        self._groups = groups
        self._ids = ids
        self._body = body
        self._head = HeaderSection(intake._routing)
        self._end = HeaderEnd()
        self._done = False
        self._resident: bytes | None = None
        self._outbound_asked: str | None = None  # on_message's Changes of outbound mail only (`_outbound_only`)
        self._then: Once | None = None
        self._present: Callable[[], bool] | None = None

    @property
    def id(self) -> SpoolId:
        return self._ids[0]

    def ids_by_recipient(self) -> dict[str, SpoolId]:
        """Each recipient's address, with the id of the spool message it is in once stored (one
        per domain, or per `[[inbound]]` target): `Stored.ids` in the same order."""
        groups = zip(self._ids, self._groups, strict=True)
        return {recipient.address: spool_id for spool_id, (_, group) in groups for recipient in group}

    def trace(self, field: bytes) -> None:
        """Write our Received field: the message's first, before all that `write` is given."""
        self._put(field)

    def write(self, data: bytes) -> None:
        """Write content: the message as the client (or the composer) gave it, in as many
        pieces as it comes in. Its header section ends where HTTP injection ends raw content's
        (`HeaderEnd`), so content that starts with white space is body, never a continuation of
        our Received field, and every check made here reads the split that is delivered."""
        end = self._end
        self._put(data if end.ended else end.feed(data))

    def _content_written(self) -> None:
        """The content is complete: store what `HeaderEnd` still held (its last line)."""
        self._put(self._end.finish())

    def _put(self, data: bytes) -> None:
        if not data:
            return
        self._body.write(data)
        if not self._head.ended:
            self._head.feed(data)

    def discard(self) -> None:
        if not self._done:
            self._done = True
            self._body.discard()

    def commit(
        self,
        then: Callable[[asyncio.Future[Stored]], None] | None = None,
        *,
        present: Callable[[], bool] | None = None,
    ) -> asyncio.Future[Stored]:
        """Store the message. The future gives the spool ids and the 250 once they are durable.

        It fails with `Refused` (loop detected, or the policy said no) or a `SpoolError`
        (write failed, disk full); either carries the reply for the client.

        `then(future)`: a done callback, called once; when the message is stored (or the
        store failed), from the callback that completes the commit, not loop turns later
        (`GroupCommitter.submit`): the 250 leaves as soon as it may.

        `present()`: whether the client can still be answered (None: it always can). Asked when
        the checks are done, just before the message is stored: a client gone by then gets
        nothing stored (`ClientGone`). Asked again when the commit ends: a client gone during
        the commit leaves its message stored, and its Reception records say `answered: false`.
        """
        self._then = Once(then) if then is not None else None
        self._present = present
        future = self._commit()
        if self._then is not None:
            future.add_done_callback(self._then)
        return future

    def content_refusal(self) -> Reply | None:
        """The reply `commit()` would refuse the message written so far with for its header
        section alone (a loop, a tenant or campaign that cannot name a queue, a field given
        twice, a submission without From or with a Date or Message-ID that is not one), before
        any policy is asked; None if it has none of those. An injection asks before committing
        its first recipient's message: that content fails for them all.
        Asked once all is written."""
        self._content_written()
        head = b"\n" + bytes(self._head.head)
        return self._content_refusal(head, head.lower())

    def routing_refusal(self) -> tuple[str, Reply] | None:
        """The header and the reply `commit()` would refuse the message written so far with for
        a tenant or campaign header that cannot name a queue (`Intake._routing_refusal`); None
        if it has none. HTTP injection asks, to answer 400 naming the request's member, before
        it asks `binding_refusal`, in the order `commit()` asks them. Asked once all is written."""
        self._content_written()
        head = b"\n" + bytes(self._head.head)
        return self._intake._routing_refusal(head, head.lower(), self._head, self.arrival)

    def binding_refusal(self) -> Reply | None:
        """The reply `commit()` would refuse the message written so far with for naming a
        tenant its credential is not bound to (`Intake._binding_refusal`); None if it names
        one it may. HTTP injection asks, to answer 403 naming the request's field. Asked once
        all is written."""
        self._content_written()
        head = b"\n" + bytes(self._head.head)
        return self._intake._binding_refusal(head, head.lower(), self._head, self.arrival)

    def _content_refusal(self, head: bytes, lowered: bytes) -> Reply | None:
        # Our own Received header is counted too: the message would leave with that many. So
        # is every one past the kept part of the header section, or a loop whose hops each
        # add a DKIM signature on top would never be found (pigeon.header_section).
        if received_fields(lowered) + self._head.late_received > self._intake.max_hops:
            return replies.TOO_MANY_HOPS
        # A tenant that cannot name a queue names none: said before whether it may be named.
        routing = self._intake._routing_refusal(head, lowered, self._head, self.arrival)
        refusal = routing[1] if routing is not None else None
        if refusal is None:
            refusal = self._intake._binding_refusal(head, lowered, self._head, self.arrival)
        if refusal is not None:
            return refusal
        if self.arrival.listener != "local" and (repeated := repeated_field(lowered, self._head.late_single)):
            return replies.content_field_repeated(repeated)
        # The fields a submission is checked by are read wherever they are: in the kept part of
        # the header section, or (`cut`: it is longer) past it, or across its end (`late_checked`).
        cut, late = len(self._head.head) >= KEPT, self._head.late_checked
        if self._submitted() and author_missing(head, lowered, cut=cut, late=late):
            # Completed with our Date and Message-ID, but no one can say who wrote it: RFC 5322
            # 3.6 requires a From, and 3.6.2 a mailbox in it (an empty one is none); Gmail and
            # others refuse mail without. (Relayed mail is left as it came.)
            return replies.CONTENT_NO_FROM
        if self._submitted() and (malformed := malformed_field(head, lowered, cut=cut, late=late)) is not None:
            # Its Date or Message-ID is not one (Pigeon adds them only where there are none):
            # said now, not in a bounce from a receiver that refuses it (Gmail: "missing a
            # valid Message-ID"). Relayed mail is left as it came, as above.
            return replies.content_field_malformed(malformed.name, shown_value(malformed.value), malformed.problem)
        return None

    def _submitted(self) -> bool:
        """A submission, whose message Pigeon completes (`_complete_submission`): an HTTP
        injection's, or one sent over SMTP after AUTH."""
        arrival = self.arrival
        return arrival.listener == "http" or (arrival.listener == "smtp" and arrival.auth_user is not None)

    def _commit(self) -> asyncio.Future[Stored]:
        intake = self._intake
        self._done = True
        self._content_written()
        head = b"\n" + bytes(self._head.head)  # a leading LF: every field starts with "\n<name>:"
        lowered = head.lower()
        if (refusal := self._content_refusal(head, lowered)) is not None:
            return self._refuse(Refused(refusal))
        hook = intake.policy.on_message
        if hook is None or self.arrival.listener == "local":
            # (Pigeon's own DSNs are not the policy's to refuse: a refused one would be
            # stored again and again by the settlement waiting for it.)
            return self._accept(head, lowered, None)
        tenant, campaign = intake._tenant_and_campaign(head, lowered, self._head, self.arrival)
        arrival, envelope = self.arrival, self.envelope
        verdict = hook(
            ReceivedMessage(
                id=format_id(self._ids[0]),
                listener="http" if arrival.listener == "http" else "smtp",
                session=arrival.session,
                peer_ip=arrival.peer_ip,
                helo=arrival.helo,
                protocol=arrival.protocol,
                tls=arrival.tls,
                auth_user=arrival.auth_user,
                sender=envelope.sender,
                recipients=tuple(r.address for r in envelope.recipients),
                size=self._body.size,
                headers=Headers(head[1:]),
                tenant=tenant,
                campaign=campaign,
                # A view of a copy: a hook that assigns to it fails (TypeError, 451) rather
                # than change what the log records and the spool keep of the application's
                # metadata, past `[http] max_metadata_size`; the copy, because one request's
                # messages of the same metadata share its dict.
                metadata=MappingProxyType(dict(envelope.metadata)) if envelope.metadata else NO_METADATA,
                trusted=arrival.trusted,
            ),
            session=arrival.session,
            message_id=format_id(self._ids[0]),
        )
        if not isinstance(verdict, asyncio.Future):
            return self._decided(verdict, head, lowered)
        result: asyncio.Future[Stored] = asyncio.get_running_loop().create_future()
        verdict.add_done_callback(lambda done: self._chain(done, result, head, lowered))
        return result

    def _chain(
        self,
        verdict: asyncio.Future[Refuse | Changes | HookFailed | None],
        result: asyncio.Future[Stored],
        head: bytes,
        lowered: bytes,
    ) -> None:
        if verdict.cancelled():  # shutting down: nothing is stored, the client hears nothing
            self._body.discard()
            result.cancel()
            return
        if (error := verdict.exception()) is not None:
            # (a hook's own failures are verdicts: this is a bug of ours, and the message is
            # refused as for a failing hook, not left without an answer)
            _log.error("message %s: the policy's on_message call failed unexpectedly: %s", format_id(self.id), error,
                       exc_info=error)  # fmt: skip
            answer: Refuse | Changes | HookFailed | None = HookFailed(POLICY_ERROR)
        else:
            answer = verdict.result()
        decided = self._decided(answer, head, lowered)
        decided.add_done_callback(lambda done: _copy_result(done, result))

    def _decided(
        self, verdict: Refuse | Changes | HookFailed | None, head: bytes, lowered: bytes
    ) -> asyncio.Future[Stored]:
        if isinstance(verdict, (Refuse, HookFailed)):
            return self._refuse(Refused(refusal(verdict)))
        if verdict is not None and verdict.dkim and (unknown := self._intake.unknown_signers(verdict.dkim)):
            # A signer name no [[dkim]] block has (a typo, a tenant without keys) would send
            # the mail unsigned, and DMARC would then fail it: a failed hook, and nothing sent.
            known = ", ".join(self._intake.signer_names()) or "none: no [[dkim]] block has a name"
            error = LookupError(f"on_message chose DKIM signer {', '.join(map(repr, unknown))}, which no [[dkim]] "
                                f"block names (known: {known})")  # fmt: skip
            return self._refuse(self._policy_failed(error))
        if verdict is not None and verdict.add_headers and (repeated := self._repeated_by(verdict, lowered)):
            # The policy's fault, as an unknown signer is: its change is not made, the message
            # waits (451 4.3.0) and a PolicyFailure says why.
            problem = ValueError(
                f"on_message added a {repeated} header field the message would then have twice (RFC 5322 3.6 "
                f"allows one): remove_headers the message's own first"
            )
            return self._refuse(self._policy_failed(problem))
        return self._accept(head, lowered, verdict)

    def _complete_submission(self, lowered: bytes, now: float) -> None:
        """A message submitted over authenticated SMTP without a Date or Message-ID gets ours,
        as HTTP injection's does (RFC 6409 8.2, 8.3: a submission server may add them): the
        author's program left them out, and Gmail and others refuse mail without a
        Message-ID. Added on the way out with the policy's edits, and signed so. What the
        policy removed is not there (an injection's, composed with the message, too): a
        policy that drops a client's Date to replace it and adds none must not send the
        message out without one (RFC 5322 3.6 requires it)."""
        envelope = self.envelope
        present = {name.lower() for name in single_fields(lowered, self._head.late_single)}
        present -= {name.lower() for name in envelope.headers_removed or ()}
        present |= {field.partition(":")[0].strip().lower() for field in envelope.headers_added or ()}
        added = []
        if "date" not in present:
            added.append(f"Date: {_rfc5322_date(int(now))}")
        if "message-id" not in present:
            # Injected mail's form, folded within [smtp] max_line_length (a field of
            # `headers_added` is written with one CRLF after it: the fold's stays inside).
            added.append(message_id_field(self._intake.hostname, self._intake.max_line).removesuffix("\r\n"))
        if added:
            envelope.headers_added = [*(envelope.headers_added or ()), *added]

    def _repeated_by(self, changes: Changes, lowered: bytes) -> str | None:
        """The first of the once-only fields that `changes` adds to a message that keeps its
        own, or adds twice."""
        removed = {name.lower() for name in changes.remove_headers}
        kept = {name.lower() for name in single_fields(lowered, self._head.late_single)} - removed
        for name, _ in changes.add_headers:
            lowered_name = name.lower()
            if lowered_name in kept:
                return name
            if lowered_name in _SINGLE_LOWER:
                kept.add(lowered_name)
        return None

    def _policy_failed(self, error: Exception) -> Refused:
        """The refusal of a message whose `on_message` answer cannot be carried out: logged
        (and a PolicyFailure written) as the hook's failure, without a traceback."""
        hook = self._intake.policy.on_message
        if hook is None:  # the policy was reloaded without the hook meanwhile
            _log.error("message %s refused: %s", format_id(self.id), error)
            return Refused(POLICY_ERROR)
        failed = hook.failed(error, self.arrival.session, format_id(self._ids[0]), show_traceback=False)
        return Refused(refusal(failed))

    def _refuse(self, refusal: Refused) -> asyncio.Future[Stored]:
        self._body.discard()
        result: asyncio.Future[Stored] = asyncio.get_running_loop().create_future()
        result.set_exception(refusal)
        return result

    def _accept(self, head: bytes, lowered: bytes, changes: Changes | None) -> asyncio.Future[Stored]:
        """Take the message (with the policy's changes, if any): sign it, then store it."""
        intake = self._intake
        result: asyncio.Future[Stored] = asyncio.get_running_loop().create_future()
        try:
            body = self._body.finish()
        except SpoolError as error:
            intake.refusing = error
            result.set_exception(error)
            return result
        # Every body received in memory (up to [spool] inline_limit) is handed to delivery with
        # its messages; the active set keeps at most its body budget of them (queue/state.py).
        self._resident = body.data
        now = intake.clock()
        tenant, campaign = intake._tenant_and_campaign(head, lowered, self._head, self.arrival)
        queue: str | None = None
        envelope = self.envelope
        if changes is not None:
            tenant, campaign, queue = _apply(changes, envelope, tenant, campaign, intake._routing_names, head)
            self._outbound_asked = _outbound_only(changes)
        if (reserved := self._reserved_refusal(tenant)) is not None:
            body.discard()
            result.set_exception(Refused(reserved))
            return result
        arrival = self.arrival
        # (an injection is composed with both: only a policy's removal can take them away)
        injected_and_edited = arrival.listener == "http" and self.envelope.headers_removed
        if injected_and_edited or (arrival.auth_user is not None and arrival.listener == "smtp"):
            self._complete_submission(lowered, now)
        late = self._head.late_routing  # a line past the kept part starts with a routing name
        if tenant is None and campaign is None and (late or intake._has_routing_field(lowered)):
            # A routing header without a value (or any other form that names no queue): it
            # names nothing, but must not leave either.
            envelope.headers_removed = sorted({*(envelope.headers_removed or ()), *intake._routing_names})
        signing = intake.signing
        # Mail taken from anyone is signed only by the signers a policy names for it: the
        # default choice (by author domain) would sign any From an outsider writes.
        chosen = arrival.trusted or envelope.dkim is not None
        if signing is not None and chosen and any(group.target is None for group, _ in self._groups):
            message: bytes | Path = body.data if body.data is not None else _flushed(body)
            fields = head[1:]
            if envelope.headers_added or envelope.headers_removed:
                # The policy's header edits are made on the way out: sign the message as it
                # will leave (read back whole if it was spilled to a file).
                stored = message if isinstance(message, bytes) else message.read_bytes()
                leaving = msgspec.structs.replace(envelope, tenant=tenant, campaign=campaign)
                message = edited(stored, leaving, intake._routing_bytes)
                fields = _header_block(message)[1:]
            try:
                signing_now = signing.sign(
                    message,
                    fields,
                    tenant,
                    int(now),
                    envelope.dkim,
                    then=lambda signed: self._signed(signed, result, body, now, tenant, campaign, queue),
                )
            except signing.Refused as refused:
                # A signer the policy named that cannot sign this message (another author
                # domain, another tenant) would make a signature that fails, or sign with a
                # key that is not this mail's: refused as an unknown name is (the hook failed).
                body.discard()
                result.set_exception(self._policy_failed(refused))
                return result
            if signing_now:
                return result
        self._store(result, body, now, tenant, campaign, queue, None)
        return result

    def _reserved_refusal(self, tenant: str | None) -> Reply | None:
        """550 5.7.1 when a recipient group's route (by its domain, or the routing domain the
        policy gave) is reserved for other tenants than the message's (`[[route]] tenants`),
        its tenant now final (the policy's `on_message` answered); None otherwise. Pigeon's own
        DSNs are not refused here (refused, one would be stored again and again by the
        settlement waiting for it): delivery bounces them, as it bounces all such mail."""
        reserved = self._intake.route_tenants
        if not reserved.any or self.arrival.listener == "local":
            return None
        routed = self.envelope.routing_domain
        for group, _ in self._groups:
            if group.target is None:
                refusal = reserved.refusal(routed or group.domain, (tenant,), routed=routed is not None)
                if refusal is not None:
                    return refusal
        return None

    def _signed(
        self,
        signed: bytes | BaseException,
        result: asyncio.Future[Stored],
        body: Body,
        now: float,
        tenant: str | None,
        campaign: str | None,
        queue: str | None,
    ) -> None:
        if isinstance(signed, BaseException):
            # Unsigned mail from a domain that publishes DMARC may be refused or filed as
            # spam: better the client tries again than the mail leaves without.
            _log.error("message %s not signed (DKIM), refused for now: %r", format_id(self.id), signed)
            body.discard()
            if not result.done():
                result.set_exception(Refused(replies.CANNOT_SIGN))
            return
        self._store(result, body, now, tenant, campaign, queue, signed)

    def _store(
        self,
        result: asyncio.Future[Stored],
        body: Body,
        now: float,
        tenant: str | None,
        campaign: str | None,
        queue: str | None,
        signatures: bytes | None,
    ) -> None:
        intake = self._intake
        if self._present is not None and not self._present():
            # Gone while the message was checked: nothing was accepted, nothing is kept.
            body.discard()
            result.set_exception(ClientGone())
            return
        if len(self._groups) == 1:  # the common case: the envelope is this message's own
            envelope = self.envelope
            envelope.tenant, envelope.campaign, envelope.dkim_signatures = tenant, campaign, signatures
            (group, _), spool_id = self._groups[0], self._ids[0]
            messages = [NewMessage(spool_id, _queue_of(group, envelope, queue), envelope, now, now)]
        else:
            messages = []
            for spool_id, (group, recipients) in zip(self._ids, self._groups, strict=True):
                copy = _copy_envelope(self.envelope, recipients, tenant, campaign)
                if group.target is None:  # an application's target gets the message as received
                    copy.dkim_signatures = signatures
                messages.append(NewMessage(spool_id, _queue_of(group, copy, queue), copy, now, now))
        # The Reception records are committed with the messages (the outbox): logged once,
        # even if the process dies between the commit and the log write.
        ids = [m.id for m in messages]
        printed = [format_id(i) for i in ids]
        reply = replies.queued(printed)
        response = Response.of(reply)
        arrival = self.arrival
        records = [
            Reception(
                timestamp=now,
                id=printed_id,
                session=arrival.session,
                sender=m.envelope.sender,
                original_sender=m.envelope.original_sender,
                recipients=[r.address for r in m.envelope.recipients],
                queue=m.queue,
                tenant=m.envelope.tenant,
                campaign=m.envelope.campaign,
                size=body.size,
                peer=arrival.peer,
                helo=arrival.helo,
                protocol=arrival.protocol,
                response=response,
                tls=arrival.tls,
                auth_user=arrival.auth_user,
                meta=m.envelope.metadata,
                trace_id=None if printed_id == printed[0] else printed[0],
                reports_on=arrival.reports_on,
            )
            for m, printed_id in zip(messages, printed, strict=True)
        ]
        spool = self._spool
        sealed = intake.outbox.seal(spool, records) if intake.outbox is not None else []
        spool.store(
            body,
            messages,
            sealed,
            settles=self._settles,
            then=lambda f: self._stored(f, result, messages, body.size, Stored(ids, reply), sealed, records),
        )

    def _stored(
        self,
        stored: asyncio.Future[None],
        result: asyncio.Future[Stored],
        messages: list[NewMessage],
        size: int,
        outcome: Stored,
        sealed: list[tuple[int, bytes]],
        records: list[Reception],
    ) -> None:
        if result.cancelled():
            return
        error = stored.exception()
        own = self._spool is self._intake.spool  # (not a DSN's in an adopted shard: /healthz is of this one)
        if error is not None:
            if isinstance(error, SpoolError) and own:
                self._intake.refusing = error
            result.set_exception(error)
            self._told(result)
            return
        intake, arrival = self._intake, self.arrival
        if own:
            intake.refusing = None
        if self._present is not None and not self._present():
            # Gone during the commit: the message is durable and stays (a crash now would keep
            # it too), but its 250 cannot be given. Its records say so, with the seqs they were
            # sealed with (should the process die before they are logged, the outbox's copies,
            # written before the commit, are logged without the flag).
            for record in records:
                record.answered = False
            if sealed:  # (none without an outbox: the records are written as they are now)
                sealed = [(seq, intake.log.encode(record)) for (seq, _), record in zip(sealed, records, strict=True)]
        if intake.outbox is not None:
            intake.outbox.committed(self._spool, sealed)
        else:
            for record in records:
                intake.log.write(record)
        if self._outbound_asked is not None:
            self._outbound_not_applied(messages)
        if intake.on_stored is not None:
            # Bodies ride along in memory, so the first attempt need not read them back.
            data = self._resident
            intake.on_stored(
                [
                    Message(m.id, m.queue, m.envelope, m.created, size, self._ids[0], due=m.due, data=data)
                    for m in messages
                ]
            )
        counts = intake.metrics.counts
        counts.messages_received += len(messages)
        counts.bytes_received += size
        counts.receptions[arrival.listener] = counts.receptions.get(arrival.listener, 0) + 1
        result.set_result(outcome)
        self._told(result)

    def _outbound_not_applied(self, messages: list[NewMessage]) -> None:
        """Say, for each stored message of an `[[inbound]]` route, that what on_message's
        `Changes` asked of outbound mail only (a route, a queue, an egress pool) was not applied
        to it: it goes to its target from its own queue, as a before_delivery `Reroute` of it is
        not carried out either (`policy.delivery`). Said rather than ignored quietly: the
        policy's author would otherwise wait for the mail at the route's hosts, or in the queue."""
        for message in messages:
            target = message.envelope.target
            if target is not None:
                _log.warning("on_message answered Changes(%s) for message %s of the [[inbound]] route's queue %s "
                             "(session %s): not applied; inbound mail keeps its target %s", self._outbound_asked,
                             format_id(message.id), message.queue, self.arrival.session, target)  # fmt: skip

    def _told(self, result: asyncio.Future[Stored]) -> None:
        """Tell `commit`'s `then` now, with `result` done (the policy's path copies it to the
        future `commit` returned a turn later: that one's call then does nothing)."""
        if self._then is not None:
            self._then(result)


class _Group(NamedTuple):
    """Recipients that make one spool message: one domain's, or one `[[inbound]]` target's."""

    domain: str
    target: str | None


def _unique(recipients: list[Recipient]) -> list[Recipient]:
    """Each mailbox once, as Postfix's duplicate filter does: a client that names one twice
    (or <postmaster> and the postmaster's address) means one delivery. Domains compare
    without case; local parts with it (RFC 5321 2.4). The first one's DSN parameters win."""
    if len(recipients) < 2:
        return recipients
    seen: set[str] = set()
    unique: list[Recipient] = []
    for recipient in recipients:
        key = same_mailbox_key(recipient.address)  # as HTTP injection finds a repeat
        if key not in seen:
            seen.add(key)
            unique.append(recipient)
    return unique


def _group_by_domain(
    recipients: Sequence[Recipient], routes: InboundRoutes | None
) -> list[tuple[_Group, list[Recipient]]]:
    """Recipients by domain, except those of an `[[inbound]]` route: by target."""
    groups: dict[_Group, list[Recipient]] = {}
    for recipient in recipients:
        target = routes.target(recipient.address) if routes else None
        key = _Group("", target) if target is not None else _Group(recipient.domain, None)
        groups.setdefault(key, []).append(recipient)
    return list(groups.items())


def _queue_of(group: _Group, envelope: Envelope, named: str | None = None) -> str:
    """The scheduled queue of a recipient group (`named` by the policy, or made of the
    tenant, campaign and domain); an `[[inbound]]` group is its own queue,
    `inbound:<target>`, and its envelope names the target it is delivered to."""
    if group.target is not None:
        envelope.target = group.target
        return INBOUND + group.target
    if named is not None:
        return named
    return scheduled_queue(group.domain, envelope.tenant, envelope.campaign)


def _apply(
    changes: Changes,
    envelope: Envelope,
    tenant: str | None,
    campaign: str | None,
    routing_names: tuple[str, str],
    head: bytes,
) -> tuple[str | None, str | None, str | None]:
    """The policy's changes into the envelope; returns the tenant, campaign and queue name."""
    removed = [name.lower() for name in changes.remove_headers]
    if changes.tenant is not None or changes.campaign is not None:
        # The routing headers must still come off on the way out, whatever the new values
        # (render() only looks for them when a tenant or campaign is set).
        lowered = head.lower()
        removed += [name for name in routing_names if b"\n" + name.encode() + b":" in lowered]
    if changes.tenant is not None:
        tenant = changes.tenant or None
    if changes.campaign is not None:
        campaign = changes.campaign or None
    if changes.route is not None:
        # As recipient domains are named (an A-label), a final dot the same name (as a rebind takes it).
        envelope.routing_domain = a_label(changes.route.removesuffix(".")) or None
    if changes.egress_pool is not None:
        envelope.egress_pool = changes.egress_pool or None
    if changes.sender is not None and changes.sender != envelope.sender:
        # Stored as the sender (Postfix's sender_canonical_maps): its DSNs go there, and every
        # record names it; the one it came with is kept for its Reception and `pigeon inspect`.
        envelope.original_sender = envelope.sender
        envelope.sender = changes.sender
        if not changes.sender.isascii():
            # As an SMTPUTF8 MAIL FROM (RFC 6531): sent with SMTPUTF8, or not at all.
            envelope.smtputf8 = True
    if changes.dkim is not None:
        envelope.dkim = list(changes.dkim)
    if changes.add_headers:
        # Folded as they will leave (and be signed): a 2,000-character value in one line
        # would be refused by a receiving server (RFC 5322 2.1.1: 998 octets at most).
        envelope.headers_added = [folded_field(name, value) for name, value in changes.add_headers]
        if not all(field.isascii() for field in envelope.headers_added):
            # RFC 6532 3: UTF-8 in a header field asks for SMTPUTF8 along the way, as if the
            # client had: sent with it where offered, as 8-bit data (8BITMIME) where not.
            envelope.smtputf8 = True
    if removed:
        envelope.headers_removed = sorted(set(removed))
    # Written as `[[queue]] name` globs read it, or that policy would never find its mail.
    return tenant, campaign, None if changes.queue is None else queue_name(changes.queue)


def _outbound_only(changes: Changes) -> str | None:
    """What `changes` asks that only outbound mail can take (`route=..., queue=...`), if any."""
    asked = [f"{name}={value!r}" for name, value in (("route", changes.route), ("queue", changes.queue),
             ("egress_pool", changes.egress_pool)) if value]  # fmt: skip
    return ", ".join(asked) or None


def _copy_result(source: asyncio.Future[Stored], target: asyncio.Future[Stored]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


def _copy_envelope(
    envelope: Envelope, recipients: list[Recipient], tenant: str | None, campaign: str | None
) -> Envelope:
    return Envelope(
        sender=envelope.sender,
        recipients=recipients,
        ret=envelope.ret,
        envid=envelope.envid,
        body=envelope.body,
        smtputf8=envelope.smtputf8,
        tenant=tenant,
        campaign=campaign,
        peer=envelope.peer,
        helo=envelope.helo,
        auth_user=envelope.auth_user,
        protocol=envelope.protocol,
        metadata=envelope.metadata,
        routing_domain=envelope.routing_domain,
        egress_pool=envelope.egress_pool,
        dkim=envelope.dkim,
        headers_added=envelope.headers_added,
        headers_removed=envelope.headers_removed,
        original_sender=envelope.original_sender,
    )


def _flushed(body: Body) -> Path:
    """The file of a spilled body, its buffered bytes written out so a thread can read it."""
    assert body.file is not None and body.path is not None
    body.file.flush()
    return body.path


def _header_block(head: bytes) -> bytes:
    """The header section, with a leading LF so every field starts with "\\n<name>:"."""
    end = head.find(b"\r\n\r\n")
    return b"\n" + (head if end < 0 else head[: end + 2])


def _routing_value(head: bytes, lowered: bytes, marker: bytes, late: dict[bytes, LateField]) -> str | None:
    """A routing header's value (marker: b"\\n<lower-case name>:"): its first field's, in the
    kept part of the header section (`head`, from a leading LF) or else past it (`late`)."""
    at, start = _find_field(lowered, marker)
    field = late.get(marker[1:-1]) if late else None
    # The one past it, or the same one read whole (it was cut off by the kept part's end).
    if field is not None and (at < 0 or field.at == at - 1):
        head = b"\n" + bytes(field.text)
        at, start = _find_field(head.lower(), marker)
    return _header_value(head, start) if at >= 0 else None


def _find_field(lowered: bytes, marker: bytes) -> tuple[int, int]:
    """Where the first field of a header (marker: b"\\n<lower-case name>:") starts in the
    lowered header section, and where its value does; (-1, -1) when it has none."""
    at = lowered.find(marker[:-1])
    if at < 0:
        return -1, -1
    if lowered.startswith(marker, at):
        return at + 1, at + len(marker)
    # "X-Tenant-Id:", or "X-Tenant : acme", the obsolete form (RFC 5322 4.5): the first field
    # of that name, whichever its form.
    field = re.compile(re.escape(marker[:-1]) + rb"[ \t]*:").search(lowered, at)
    return (field.start() + 1, field.end()) if field is not None else (-1, -1)


def _header_value(head: bytes, start: int) -> str | None:
    """The value of the field whose value starts at `start`, unfolded and trimmed of the
    header's own white space, SP and HTAB (None if empty)."""
    end = head.find(b"\r\n", start)
    while end >= 0 and head[end + 2 : end + 3] in (b" ", b"\t"):
        end = head.find(b"\r\n", end + 2)
    # Unfolded (RFC 5322 2.2.3): the CRLFs out, HTAB made SP (a run of them is one "_"). Not
    # `bytes.split()`, which takes VT and FF for white space too: they became "_" (or vanished
    # at an end) rather than being refused as the control characters they are
    # (`queue_part_problem`).
    raw = head[start : end if end >= 0 else len(head)].replace(b"\r\n", b"").replace(b"\t", b" ").strip(b" ")
    # A queue name part must not carry white space nor the separators of the queue name itself.
    # Bytes that are not UTF-8 are kept as they are (surrogate escapes), for `_not_utf8` to
    # refuse: read as U+FFFD, "glob\xe9x" and "glob\xe8x" were one tenant, "glob\ufffdx".
    return queue_part_from_header(raw.decode("utf-8", "surrogateescape")) or None


_ESCAPED_LOW: Final = chr(0xDC80)  # "surrogateescape" decodes byte 0x80 as this, ...
_ESCAPED_HIGH: Final = chr(0xDCFF)  # ... and byte 0xFF as this


def _not_utf8(value: str) -> str | None:
    """Why a routing header's value (`_header_value`) names no queue for bytes in it that are
    not UTF-8 (a name is text: a byte that is none would name a queue no selector, log reader
    or JSON client reads back as it was sent); None when it is text."""
    if value.isascii():
        return None
    # (The escapes' range by chr(): mypyc, which compiles this module, takes no surrogates in literals.)
    byte = next((ord(char) - 0xDC00 for char in value if _ESCAPED_LOW <= char <= _ESCAPED_HIGH), None)
    return None if byte is None else f"holds byte 0x{byte:02X}, which is not UTF-8: a name is text, in UTF-8"


def _folded(line: bytes, limit: int) -> bytes:
    """One line of our Received field, with its CRLF, folded (RFC 5322 2.2.3: a CRLF before
    white space it has) where it would be over `limit` octets (`[smtp] max_line_length`, at
    most 998, RFC 5322 2.1.1: a next hop may refuse such a message, as Pigeon does, 554
    5.6.0), whatever the client named; a word that is longer still (it has no white space to
    fold at) is cut, with "..." to say so: the field is a trace, and a message that no next
    hop takes traces nothing."""
    if len(line) <= limit:
        return line + b"\r\n"
    folded: list[bytes] = []
    for word in line.split(b" "):
        if len(word) > limit - 1:  # (after the tab that starts a continuation line)
            word = word[: limit - 4] + b"..."
        if folded and len(folded[-1]) + 1 + len(word) <= limit - 1:  # (a tab may start it)
            folded[-1] += b" " + word
        else:
            folded.append(word)
    return b"\r\n\t".join(folded) + b"\r\n"


@functools.lru_cache(maxsize=4)
def _rfc5322_date(second: int) -> str:
    t = time.gmtime(second)
    day, month = _DAYS[t.tm_wday], _MONTHS[t.tm_mon - 1]
    return f"{day}, {t.tm_mday:02d} {month} {t.tm_year} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} +0000"
