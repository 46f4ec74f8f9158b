"""The one noun every room passes on: a spooled message, its envelope and its id.

A `Message` is one spool entry: one body, one sender, the recipients of **one** destination
domain, one queue. A reception for several domains becomes several messages sharing one
body, so that a message always belongs to exactly one scheduled queue.

`Envelope` is stored as MessagePack (msgspec, array-like: field order is the format, so
new fields go at the end with a default).
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Final, NewType

import msgspec

from pigeon.smtp.address import a_label

SpoolId = NewType("SpoolId", int)

# Ids are time-ordered 63-bit integers: milliseconds since 2025-01-01 (41 bits, good until
# 2094), a 16-bit sequence and a 6-bit shard (one per worker process). They print as 16
# hex digits, sort by arrival, and need no coordination between shards. Each millisecond's
# sequence starts at a point drawn from the node's name (`node_start`), not at 0: nodes of a
# cluster, each counting from 0, gave the same id to different messages whenever two of them
# received mail in the same millisecond (an outside test saw 93 of 707).
_EPOCH_MS: Final = 1_735_689_600_000
_SHARD_BITS: Final = 6
_TIME_SHIFT: Final = 22
_SEQUENCE_BITS: Final = _TIME_SHIFT - _SHARD_BITS
_ID_TEXT: Final = re.compile(r"[0-9a-fA-F]{16}")
_SHOWN: Final = 40  # characters of a malformed id a refusal shows


def format_id(spool_id: int) -> str:
    return f"{spool_id:016x}"


def parse_id(text: str) -> SpoolId:
    """Parse a printed id; raises ValueError with the reason."""
    if not _ID_TEXT.fullmatch(text):
        # Cut as every refusal cuts what it was given: a page of text is echoed as its start.
        raise ValueError(f"spool id {text[:_SHOWN]!r}{'...' if len(text) > _SHOWN else ''} must be 16 hex digits")
    value = int(text, 16)
    if value >= 1 << 63:  # ids are 63-bit (they are SQLite rowids)
        raise ValueError(f"spool id {text!r} is out of range: Pigeon ids start with 0-7")
    return SpoolId(value)


def shard_of(spool_id: int) -> int:
    """The spool shard (worker) that made an id, and so holds its message."""
    return spool_id & ((1 << _SHARD_BITS) - 1)


def id_time(spool_id: int) -> float:
    """The Unix time (seconds) at which an id was made."""
    return ((spool_id >> _TIME_SHIFT) + _EPOCH_MS) / 1000.0


def node_start(node: str) -> int:
    """Where a node's sequence starts each millisecond: 16 bits of a hash of its name, the
    same on every start (so a restart keeps to its own part of the sequence). Nodes collide
    only when two names' starts lie within a millisecond's burst of ids (a few) of each other."""
    return int.from_bytes(hashlib.blake2b(node.encode("utf-8", "surrogateescape"), digest_size=2).digest(), "big")


class IdGenerator:
    """Unique, increasing ids for one spool shard, even if the clock steps back."""

    __slots__ = ("_last", "_low", "_shard")

    def __init__(self, shard: int = 0, last: int = 0, start: int = 0) -> None:
        if not 0 <= shard < (1 << _SHARD_BITS):
            raise ValueError(f"shard must be 0..{(1 << _SHARD_BITS) - 1}")
        if not 0 <= start < (1 << _SEQUENCE_BITS):
            raise ValueError(f"start must be 0..{(1 << _SEQUENCE_BITS) - 1}")
        self._shard = shard
        self._low = (start << _SHARD_BITS) | shard  # a millisecond's first id, but its time
        self._last = last

    def next(self) -> SpoolId:
        now_ms = int(time.time() * 1000) - _EPOCH_MS
        candidate = (now_ms << _TIME_SHIFT) | self._low
        if candidate <= self._last:
            # Same millisecond (or a clock step back): bump the sequence, keep the shard bits.
            candidate = (self._last | ((1 << _SHARD_BITS) - 1)) + 1 + self._shard
        self._last = candidate
        return SpoolId(candidate)


class Recipient(msgspec.Struct, array_like=True, omit_defaults=True):
    """One envelope recipient with its DSN parameters (RFC 3461)."""

    address: str
    notify: list[str] | None = None  # e.g. ["SUCCESS", "FAILURE"], or ["NEVER"]
    orcpt: str | None = None  # "rfc822;user@example.com"
    # The reply this recipient's last failed attempt got: its expiry and its DSN name it. Kept
    # per recipient, for the recipients of one attempt get different replies (451, 452 ...).
    last_response: str | None = None
    # The host whose reply `last_response` is ("mx.example.net", "[192.0.2.1]"), when a server
    # gave it; None when Pigeon wrote it (a DNS failure, a refused connection, "not tried").
    # An expiry's DSN then reports that reply as the server's (`Remote-MTA`, `smtp;`).
    last_peer: str | None = None
    # The host `last_response` was met at when Pigeon wrote it about a server it reached (the
    # connection broke or timed out there); None otherwise. An expiry's DSN names it
    # (`Remote-MTA`) with that reply as Pigeon's own (`X-Pigeon;`), as the delay warning did.
    # Last, with a default: a Pigeon from before it reads the recipient, this element ignored.
    last_host: str | None = None

    @property
    def domain(self) -> str:
        """The domain in lower case, as an A-label where it is not ASCII (`a_label`): what its
        queue, its MX lookup and an operator's selector name it by."""
        _, at, domain = self.address.rpartition("@")
        return a_label(domain) if at else ""


class AfterAttempt(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """What an operator asked of a message while an attempt of it was on the wire (`pigeon hold
    --id`, `pigeon bounce`): `kind` "hold" or "bounce", with their reason and name. Applied to
    what that attempt leaves when it ends; an attempt that never ends (a stop cut it before its
    content went, a crash) leaves it in the row, and it is applied as the row is loaded again,
    before any other attempt (`pigeon.queue.scheduler`)."""

    kind: str
    reason: str = ""
    operator: str = ""
    # The tenants of the token that asked (`[[http.token]] tenants`), sorted; None: a token bound
    # to none (the operator), and every mark stored before it was kept. A hold keeps it
    # (`Envelope.hold_bound_to`): who may release it.
    bound_to: list[str] | None = None


class RebindAfterAttempt(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """An operator's rebind (`pigeon rebind`) of a message while an attempt of it was on the
    wire: the scheduled queue it moves to and the domain it is routed as (None: either as it
    is; "": by its recipients' own domain again), who asked and in which operation. Kept apart
    from `AfterAttempt`, for a hold or a bounce may be asked too: a bounce ends the message
    (nothing is left to move), a hold and a rebind both apply (each with its own operator, and
    the hold with its own `bound_to`). Applied to what that attempt leaves when it ends; an
    attempt that never ends (a stop, a crash) leaves it in the row, and it is applied as the row
    is loaded again, before any attempt (`pigeon.queue.scheduler`): the message moves, with its
    `Rebind` record, as the operator was told."""

    queue: str | None = None
    routing_domain: str | None = None
    operator: str = ""
    operation: str | None = None


class Envelope(msgspec.Struct, array_like=True, omit_defaults=True):
    """Who the message is from and to, and how it arrived."""

    sender: str
    recipients: list[Recipient]
    ret: str | None = None  # DSN RET: FULL or HDRS
    envid: str | None = None  # DSN ENVID, xtext-decoded
    body: str | None = None  # BODY: 7BIT or 8BITMIME
    smtputf8: bool = False
    tenant: str | None = None
    campaign: str | None = None
    peer: str = ""  # client address, "ip" or "ip:port"
    helo: str = ""
    auth_user: str | None = None
    protocol: str = "ESMTP"  # RFC 3848 WITH keyword of the reception
    # The last failed attempt's reply (its last recipient's), for inspection; an expiry names
    # each recipient's own (`Recipient.last_response`), this only for rows stored without one.
    last_response: str | None = None
    last_attempt: float | None = None  # when that attempt ended: an expiry's DSN says it (RFC 3464 2.3.7)
    metadata: dict[str, str] | None = None  # from the injecting application, copied into log records
    routing_domain: str | None = None  # route as if the recipients were in this domain (admin rebind)
    target: str | None = None  # an application's [[target]] (an [[inbound]] route), not an MX
    held: str | None = None  # why the queue holds it for an operator (`HELD`): the refusal or expiry
    released: float | None = None  # when an operator released it from hold: max_age counts from then
    dkim_signatures: bytes | None = None  # DKIM-Signature fields made at reception, put on top as it leaves
    # Set by the policy's on_message hook (pigeon.policy). Header edits are not made in the
    # stored body (it was streamed to the spool as it arrived): `delivery.content.render`
    # applies them to the bytes that leave, and DKIM signs those.
    egress_pool: str | None = None  # the egress pool to send from (None: the default source)
    dkim: list[str] | None = None  # names of the [[dkim]] signers to sign with (None: the config decides)
    headers_added: list[str] | None = None  # whole fields, "Name: value", put on top of the message
    headers_removed: list[str] | None = None  # lower-case names of fields taken off
    # What held it when it was last deferred, if a shaping reaction's suspension did (`Attempt.held_by`):
    # "shaping reaction <rule> (suspend <key> until <time>) after <reply>". `pigeon inspect` shows it
    # and an expiry names it; the next attempt's outcome clears it.
    held_by: str | None = None
    # The sender the message came with, where the policy's on_message changed it (`sender` is the
    # one it is stored and sent with, and its DSNs go to): its Reception and `pigeon inspect` say it.
    original_sender: str | None = None
    # When its sender was told it is still being retried (a delay DSN, `[delivery] delay_warning`):
    # committed with that DSN, so that no restart, retry, rebind or move warns again. Last, with a
    # default: a Pigeon from before it reads the envelope, this element ignored.
    delay_warned: float | None = None
    # The operator (the API token's name) who held it (`pigeon hold`), with `held` their reason.
    # Its release (`pigeon retry --id`) does not count `max_age` afresh, as the release of held
    # `[[inbound]]` mail does: held mail does not expire while held, and once released it is as
    # old as it is (past `max_age`, it expires at its next turn, with the usual DSN).
    hold_operator: str | None = None
    # An operator's hold or bounce given while an attempt was on the wire, committed before the
    # operator is answered: whatever ends that attempt (its outcome, a stop, a crash), what it does
    # not deliver is held or bounced, never tried again. Cleared by the outcome that applies it.
    after_attempt: AfterAttempt | None = None
    # The tenants of the token that held it (`pigeon hold`, with `hold_operator`), sorted; None:
    # a token bound to none, the operator (and every hold stored before it was kept, which were
    # the operator's as far as anyone can tell). A token bound to tenants releases only a hold of
    # a token bound to none but its tenants (`pigeon.listener.http.tenancy.releases`): the
    # operator's hold of its mail is not its to lift by retrying it. Last, with a default, as
    # `delay_warned`.
    hold_bound_to: list[str] | None = None
    # An operator's rebind given while an attempt was on the wire, committed before the operator
    # is answered, as `after_attempt` is: whatever ends that attempt (its outcome, a stop, a
    # crash), what it does not deliver moves where the operator asked before it is tried again.
    # Cleared by the outcome that applies it. Last, with a default, as `delay_warned`.
    rebind_after_attempt: RebindAfterAttempt | None = None

    def __post_init__(self) -> None:
        # Spools written before `target` existed said "inbound:<target>" as the routing domain.
        if self.target is None and self.routing_domain is not None and self.routing_domain.startswith("inbound:"):
            self.target, self.routing_domain = self.routing_domain[len("inbound:") :], None


HELD: Final = 1e15
"""The due time of a held message: time never brings it (the year 31 million); only an
operator does, by making it due (`pigeon retry`), which releases it. A held message that
expires unreleased at Unix time t is due at `HELD + t` (floats are exact to 1/8 s there):
held `[[inbound]]` mail past its route's `held_for`; mail an operator held (`pigeon hold`)
is due at `HELD` itself, and waits for ever."""

ENVELOPE_ENCODER: Final = msgspec.msgpack.Encoder()
ENVELOPE_DECODER: Final = msgspec.msgpack.Decoder(Envelope)
_ENVELOPE_ELEMENTS: Final = msgspec.msgpack.Decoder(list[msgspec.Raw])
_TENANT_DECODER: Final = msgspec.msgpack.Decoder(str | None)
_TENANT_AT: Final = Envelope.__struct_fields__.index("tenant")


def envelope_tenant(envelope: bytes) -> str | None:
    """A stored envelope's `tenant` (`ENVELOPE_ENCODER`'s msgpack), read without decoding the
    rest: its elements are skipped over, not made into objects (its recipients may be
    thousands). None for an envelope without one, and for bytes that are no envelope (the
    whole decode, `ENVELOPE_DECODER`, refuses those)."""
    try:
        elements = _ENVELOPE_ELEMENTS.decode(envelope)
        # (Trailing defaults are left out of what is stored: a short array has no tenant.)
        return _TENANT_DECODER.decode(elements[_TENANT_AT]) if len(elements) > _TENANT_AT else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


@dataclass(slots=True)
class Message:
    """One spool entry as held in memory."""

    id: SpoolId
    queue: str
    envelope: Envelope
    created: float
    size: int
    body_id: SpoolId
    attempts: int = 0
    due: float = 0.0
    data: bytes | None = field(default=None, repr=False)  # loaded on demand

    @property
    def age_from(self) -> float:
        """Where `max_age` counts from: its arrival, or its release from an `[[inbound]]` route's
        hold by an operator (not from an operator's own hold: `Envelope.hold_operator`)."""
        released = self.envelope.released
        return self.created if released is None else released
