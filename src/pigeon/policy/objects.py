"""What policy hooks are given: frozen, documented objects with only what a policy needs.

A hook never sees Pigeon's internals (the spool's `Message`, a session, the spool): it gets
one of these, made for the call, and changing it is impossible (frozen structs, tuples, a
read-only `Headers` and `metadata`). What a hook may answer is in `pigeon.policy.answers`.

They are frozen `msgspec.Struct`s rather than frozen dataclasses: as immutable and as typed,
with the same attribute access and repr, but made in a tenth of the time (a frozen dataclass
sets each field through `object.__setattr__`), and up to six are made per message
(`bench/policy.py --calls`). `msgspec.structs.asdict(obj)` gives a dict of one.

Addresses are as the client wrote them (the domain part is not lower-cased); `peer_ip` is
the client's address without a port.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Final, Literal

import msgspec

NO_METADATA: Final[Mapping[str, str]] = MappingProxyType({})
"""`ReceivedMessage.metadata` of a message without any: read-only, as every other is."""


class Connection(msgspec.Struct, frozen=True):
    """`on_connect`: a client connected to the SMTP listener, before the greeting."""

    session: str
    """The SMTP session id, as in the log records."""
    peer_ip: str
    peer_port: int
    local_ip: str
    local_port: int


class MailFrom(msgspec.Struct, frozen=True):
    """`on_mail_from`: a client's MAIL FROM command, or the envelope sender of an HTTP
    injection (`/api/v1/inject`, `pigeon inject`: once per request)."""

    session: str
    """The SMTP session id, or the HTTP request's (`http-9c1e2a7f000004`), as in the log records."""
    peer_ip: str
    helo: str
    """The EHLO or HELO name ("" if the client gave none, and over HTTP)."""
    sender: str
    """The reverse-path ("" for the null sender, <>)."""
    size: int | None
    """The SIZE= the client announced, if it did (None over HTTP)."""
    smtputf8: bool
    """SMTPUTF8 asked for; over HTTP, whether an address of the request is not ASCII."""
    tls: str | None
    """TLS version and cipher ("TLSv1.3 TLS_AES_256_GCM_SHA384"), or None in the clear (HTTP)."""
    auth_user: str | None
    """Who authenticated (SMTP AUTH), if anyone; over HTTP the API token's name."""
    listener: Literal["smtp", "http"] = "smtp"


class RcptTo(msgspec.Struct, frozen=True):
    """`on_rcpt_to`: a client's RCPT TO command, once Pigeon would take the recipient (relay
    rules passed): a hook can only refuse more, never relay what Pigeon would refuse. Over
    HTTP: each recipient of an injection, in request order, before its message is composed.
    The fields are as `MailFrom`'s."""

    session: str
    peer_ip: str
    helo: str
    sender: str
    recipient: str
    accepted: tuple[str, ...]
    """The recipients of this transaction (HTTP: request) this hook has let through so far."""
    tls: str | None
    auth_user: str | None
    listener: Literal["smtp", "http"] = "smtp"


class Headers(Mapping[str, str]):
    """A message's header fields, read-only. Names match whatever their case.

    `headers["Subject"]` and `headers.get("subject")` give the first field of that name,
    unfolded (line breaks removed); `get_all(name)` every one in order; `fields()` every
    (name, value) pair in order. Only the first 64 KiB of the header section are read.
    """

    __slots__ = ("_fields", "_raw")

    def __init__(self, raw: bytes) -> None:
        """`raw`: the header section, CRLF line endings (parsed on first use: a hook that
        never looks pays nothing)."""
        self._raw = raw
        self._fields: tuple[tuple[str, str], ...] | None = None

    def fields(self) -> tuple[tuple[str, str], ...]:
        """Every (name, value) in order, names as written, values unfolded."""
        if self._fields is None:
            self._fields = _parse(self._raw)
        return self._fields

    def get_all(self, name: str) -> list[str]:
        wanted = name.lower()
        return [value for key, value in self.fields() if key.lower() == wanted]

    def __getitem__(self, name: str) -> str:
        wanted = name.lower()
        for key, value in self.fields():
            if key.lower() == wanted:
                return value
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(key.lower() == name.lower() for key, _ in self.fields())

    def __iter__(self) -> Iterator[str]:
        """Each name once (lower-case), in order of first appearance."""
        seen: dict[str, None] = {}
        for key, _ in self.fields():
            seen.setdefault(key.lower(), None)
        return iter(seen)

    def __len__(self) -> int:
        return len({key.lower() for key, _ in self.fields()})

    def __repr__(self) -> str:
        return f"Headers({list(self.fields())!r})"


def _parse(raw: bytes) -> tuple[tuple[str, str], ...]:
    end = raw.find(b"\r\n\r\n")
    head = raw if end < 0 else raw[: end + 2]
    fields: list[tuple[str, list[str]]] = []
    for line in head.decode("utf-8", "replace").split("\r\n"):
        if not line:
            continue
        if line[0] in " \t":
            if fields:
                fields[-1][1].append(line.strip())
            continue
        name, colon, value = line.partition(":")
        if colon:
            fields.append((name.strip(), [value.strip()]))
    return tuple((name, " ".join(part for part in parts if part)) for name, parts in fields)


class ReceivedMessage(msgspec.Struct, frozen=True):
    """`on_message`: a whole message, received over SMTP (DATA or BDAT) or injected over
    HTTP, before it is stored. One call per reception (not per recipient domain)."""

    id: str
    """The spool id it will have (the first, when its recipients span several domains)."""
    listener: Literal["smtp", "http"]
    session: str
    peer_ip: str
    helo: str
    """The EHLO/HELO name ("" over HTTP)."""
    protocol: str
    """How it came: ESMTP, ESMTPS, ESMTPSA, ..., or HTTP."""
    tls: str | None
    auth_user: str | None
    """The SMTP AUTH user, or the HTTP API token's name."""
    sender: str
    recipients: tuple[str, ...]
    size: int
    """Bytes, our Received header included."""
    headers: Headers
    """Our own Received header comes first."""
    tenant: str | None
    """From the tenant header (`[delivery] tenant_header`, X-Tenant), if there is one and the
    message is `trusted` (else None: its headers route nothing)."""
    campaign: str | None
    metadata: Mapping[str, str] = NO_METADATA
    """What the injecting application gave this recipient (HTTP), else empty. Read-only, as
    the rest: changing it (`metadata["user"] = ...`) raises TypeError, and assigning to the
    field (`message.metadata = ...`), as to any field, AttributeError (the hook fails)."""
    trusted: bool = True
    """From a client Pigeon relays for: in `[smtp] relay_networks`, authenticated (SMTP AUTH,
    an HTTP API token). False: mail Pigeon takes from anyone (to the postmaster, to an
    `[[inbound]]` route), which is not DKIM-signed unless this hook names signers for it."""


class Delivery(msgspec.Struct, frozen=True):
    """`before_delivery`: a message about to be sent to its destination (each attempt)."""

    id: str
    queue: str
    """The scheduled queue, `campaign:tenant@domain`."""
    tenant: str | None
    campaign: str | None
    sender: str
    recipients: tuple[str, ...]
    """The recipients still to deliver (one destination domain)."""
    size: int
    attempt: int
    """This attempt's number: 1 for the first."""
    site: str
    """Where it is going: the MX host set, or `host:port` of a static route."""
    routing_domain: str | None
    """The domain it is routed as when a policy or an operator's rebind set one; None when it is
    routed by its recipients' own domain (the usual case: look at `recipients` then)."""
    egress_pool: str | None
    """The `[[pool]]` it leaves from, as the scheduler chose it and `pigeon inspect` shows it:
    the one `on_message` named (`Changes(egress_pool=...)`), else its `[[queue]]`'s `pool`, else
    `[delivery] pool`. None: the implicit source (no pool applies), and for mail of an
    `[[inbound]]` route, which goes to its target."""
    created: float
    """When it was received (Unix time)."""
    last_response: str | None
    """The reply of its last failed attempt, if any."""
    source: str | None = None
    """The `[[source]]` it leaves from (its address and EHLO name); None: the implicit source."""
    egress_pool_from: Literal["policy", "queue", "delivery"] | None = None
    """What named `egress_pool`: "policy" (`on_message`), "queue" (its `[[queue]]`), "delivery"
    (`[delivery] pool`); None when `egress_pool` is None. As `pigeon inspect`'s field."""


class RecipientResult(msgspec.Struct, frozen=True):
    """One recipient's part of a delivery attempt."""

    recipient: str
    code: int
    enhanced: str | None
    text: str
    status: Literal["delivered", "transient", "permanent"]
    """What Pigeon makes of it: 2xx delivered, 4xx (or a broken connection) transient, 5xx permanent."""
    classification: str
    """The bounce class of a permanent failure (InvalidRecipient, SpamBlock ...), else ""."""
    peer: str | None = None
    """The server that answered this recipient, `host [ip]:port` (None: none did). Not always
    `DeliveryOutcome.peer`: a recipient that server answered 4xx was tried at the domain's
    next MX host in the same attempt (`[delivery] try_next_mx`), which answered it."""


class DeliveryOutcome(msgspec.Struct, frozen=True):
    """`on_delivery_outcome`: what an attempt came to, before Pigeon acts on it."""

    delivery: Delivery
    results: tuple[RecipientResult, ...]
    """One per recipient, in the order of `delivery.recipients`."""
    peer: str | None
    """The server that answered, `host [ip]:port`, if one did (the first, when some recipients
    were answered by the next MX host: see `RecipientResult.peer`)."""
    tls: str | None
    duration: float | None
    """Seconds the transaction took."""
