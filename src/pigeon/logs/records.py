"""Log records: one JSON object per event, one schema.

Every record has `type` (the event) and `timestamp` (Unix seconds, float, UTC). The other
fields depend on the type; absent optional fields are omitted, never written as null.

| field       | types                         | meaning                                                  |
|-------------|-------------------------------|----------------------------------------------------------|
| type        | all                           | `Reception`, `Rejection`, `Quarantine`, ...              |
| timestamp   | all                           | when the event happened                                  |
| node        | all                           | the node (host) name that wrote the record               |
| id          | Reception, Quarantine         | spool id, 16 hex digits                                  |
| session     | Reception, Rejection          | SMTP connection (or HTTP request) id, shared by its records |
| sender      | Reception, Rejection          | envelope sender ("" for the null sender)                 |
| original_sender | Reception                 | the sender it came with, where a policy changed `sender` |
| recipients  | Reception, Rejection          | envelope recipients of this message / the refused one    |
| queue       | Reception                     | scheduled queue name, `campaign:tenant@domain`           |
| tenant, campaign | Reception, Rejection, Rebind, | the message's tenant and campaign, when it has them (not |
|             | AdminHold                     | to be parsed out of `queue`); Rejection: an injected one's |
| reports_on  | Reception                     | a DSN's: the id of the message it reports on             |
| size        | Reception                     | bytes stored, `Received:` header included                |
| peer        | Reception, Rejection          | client address, `ip:port` (none for Pigeon's own DSNs)   |
| helo        | Reception, Rejection          | EHLO/HELO name the client gave (none over HTTP)          |
| protocol    | Reception                     | RFC 3848 keyword (ESMTP, ESMTPS, ESMTPSA, ...), HTTP for injections |
| tls         | Reception, Rejection          | TLS version and cipher, when the connection used TLS     |
| auth_user   | Reception, Rejection          | authenticated user (HTTP: the API token's name)          |
| meta        | Reception, Rejection          | metadata the injecting application gave the recipient    |
| command     | Rejection                     | the SMTP verb that was refused (MAIL, RCPT, DATA, ...), |
|             |                               | escaped as `recipients` are; none if the reply answered no |
|             |                               | command (a timeout)                                       |
| response    | Reception, Rejection          | `{code, enhanced, text}` of the reply Pigeon sent        |
| reason      | Quarantine                    | why a spool entry could not be read                      |
| from_queue, route, operator, operation | Rebind | an operator's rebind of a message: the queue it left, the |
|             |                               | domain it is routed as now, who asked, in which operation |
| recipients, reason, operator | AdminHold | an operator held the message (`pigeon hold`): its recipients |
|             |                               | held, the operator's reason and API token name            |

Delivery attempts write one record per recipient: `Delivery`, `Bounce` and `Expiration` are
terminal (exactly one per recipient), `TransientFailure` is not (one per failed attempt), nor
is `Held` (mail of an [[inbound]] route kept for an operator instead of bounced).

| field          | types            | meaning                                                   |
|----------------|------------------|-----------------------------------------------------------|
| id, queue, sender, size | all four | the spool message                                  |
| recipient      | all four         | this record's recipient                                   |
| attempt        | all four         | attempts so far, this one included                        |
| response       | all four         | the remote server's reply, or Pigeon's own (`4.4.1` ...)  |
| site           | all four         | the ready queue's site: MX host set or static next hop   |
|                |                  | (this and source, peer, tls, duration: none in a record no |
|                |                  | attempt made: a failed route lookup, an expiry or operator's |
|                |                  | bounce between attempts; metrics count it as site "-")    |
| source         | all four         | the egress `[[source]]` the attempt left from (absent: the |
|                |                  | implicit source, or no attempt)                           |
| peer           | all four         | `host [ip]:port` of the server that answered, if any (of a |
|                |                  | refusal before sending: the one lacking what it needs)    |
| tls            | all four         | TLS version and cipher of that connection, and whether the |
|                |                  | server's certificate was checked: `..., certificate       |
|                |                  | verified` / `..., certificate not verified` (`tls_verify` |
|                |                  | off, or its unverified fallback)                          |
|                |                  | and, under a recipient domain's MTA-STS policy, its mode: |
|                |                  | `..., certificate verified, MTA-STS enforce`              |
| tls_failed     | all four         | the connection was opportunistic TLS's fallback (the clear, |
|                |                  | or TLS unverified) after a STARTTLS handshake with `peer` |
|                |                  | failed: what that failure said (absent: no fallback; a    |
|                |                  | server that offers no STARTTLS has none)                  |
| auth_user      | all four         | the user that connection authenticated as (a `[[route]]`'s |
|                |                  | `auth_username`, SMTP AUTH to its smart host); absent: none |
| created        | all four         | when the message was received                             |
| duration       | all four         | seconds the transaction took                              |
| classification | Bounce, Held,    | bounce class from the rule table (InvalidRecipient, ...; |
|                | TransientFailure | always in a Bounce and a TransientFailure: Uncategorized |
|                |                  | if no rule matched; a deferral's 4xx by the same table)   |
| dsn            | Bounce, Expiration, Held | why no DSN went to the sender (an [[inbound]] route's `bounces`) |
| cause          | Held             | `refused` (by the target, for good) or `expired`          |
| next_attempt   | TransientFailure | when the next attempt is due (0: none, an operator held the |
|                |                  | message while that attempt was on the wire: `AdminHold`)  |
| reason, operator | AdminBounce    | the operator's reason and API token name (terminal too)    |
| attempt_response | AdminBounce    | bounced while an attempt was on the wire: what that attempt |
|                |                  | was answered (then `site`, `peer`, `tls` are that attempt's) |
| meta           | all four         | metadata given at injection, as in `Reception`            |
| tenant, campaign | all four       | the message's, as in `Reception` (left out when none)     |
| seq            | terminal ones    | unique on the node, but not written in seq order: see below |

Inbound handoffs write `InboundDelivery` (the target accepted) or `InboundFailure` (it did
not; `permanent`, `next_attempt`, `action` say what next), with `source`, `target`,
`dedupe_key`, `message_id`, `mailbox`, `uidvalidity`, `uid`, `attempt`, `detail`, `duration`.

A policy hook (`pigeon.policy`) that raises, answers what it may not, or outlasts
`[policy] timeout` writes `PolicyFailure`: `hook`, `error`, `traceback` (when it raised),
`action` (what Pigeon did instead: `451 4.3.0` to the client, `deferred`, or `kept` the
attempt's own outcome), and `session` or `id` when it was about one.

Shaping that reacts (`pigeon.shaping.reactions`) writes `ShapingEffect` when a reply starts an
effect (`event` "created") and when it ends ("expired"), from the worker that created it; on
every other node, the first worker to learn of it writes "learned" (and "expired"):
`effect` (its id), `rule`, `key` (`site:...`, `path:source->site`, `provider:...`), `action`
(suspend, limit, bounce), `expires_at`, `reply` (the reply that triggered it), `origin` (the
node that saw it), `scope` (`cluster` when shared through Redis, else `node`), and for a
limit `connection_limit` and `max_message_rate`.

`Reception` carries a `seq` too: it and the terminal records are written exactly once,
even across `kill -9` (see `pigeon.logs.outbox`). A `seq` is given as its record is sealed
with the change it reports, before the commit, and the record is written once that commit has
ended: commits end out of the order their records were sealed in (and records kept in the
outbox are written later), so a consumer dedupes with a set of the seqs seen, not the highest.

A `seq` is a JSON string of 16 hex digits, in the form of `id` (it is drawn from the same
63-bit space): as a JSON number it was past 2^53, which jq and JavaScript read as a double,
so that two seqs in a row read as one (RFC 8259 6) and a dedupe dropped real records. Logs
written before were numbers: `pigeon.logs.reader.find_seqs` reads both.
"""

from __future__ import annotations

import msgspec

from pigeon.smtp.replies import Reply


class Response(msgspec.Struct, omit_defaults=True):
    code: int
    text: str
    enhanced: str | None = None

    @classmethod
    def of(cls, reply: Reply, *, enhanced: bool = True) -> Response:
        """`enhanced=False`: the reply as a greeting sends it, without its enhanced code (RFC
        2034 3), so that the record says what the client was told."""
        return cls(reply.code, reply.text, reply.enhanced if enhanced else None)


class Record(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    """Fields every record has."""

    timestamp: float
    node: str = ""


class Reception(Record, tag="Reception", kw_only=True):
    """A message was stored durably and the client was told 250."""

    id: str
    session: str
    sender: str
    # The sender the client gave, where the policy's on_message changed it (`Changes(sender=...)`):
    # `sender` is the one the message is stored and sent with, and its DSNs go to.
    original_sender: str | None = None
    recipients: list[str]
    queue: str
    # The message's tenant and campaign (its routing headers, its credential's one tenant, or a
    # policy's), which its queue name is made of: said apart, not to be parsed out of `queue`
    # (a queue a policy named, `bulk`, has none of them). Left out when it has none.
    tenant: str | None = None
    campaign: str | None = None
    size: int
    peer: str = ""  # none for Pigeon's own DSNs (protocol LOCAL): left out
    helo: str = ""  # none over HTTP: left out
    protocol: str
    response: Response
    tls: str | None = None
    auth_user: str | None = None
    meta: dict[str, str] | None = None
    # The id our `Received:` field names, where it is another message's: a reception for several
    # domains stores one body, whose field names the first of its messages.
    trace_id: str | None = None
    # A DSN's (`protocol` LOCAL): the id of the message whose failure (or delivery) it reports.
    reports_on: str | None = None
    seq: str = ""  # 16 hex digits, as `id`: see the module's docstring
    # False: the client was gone when the commit ended (it hung up while the message was being
    # written): the message is stored and kept, but the 250 could not be given, so the client
    # may send it again. True over HTTP says only that the client was there when this recipient
    # was stored, not that it got the injection's answer (given once every recipient is stored).
    answered: bool = True


class Rejection(Record, tag="Rejection", kw_only=True):
    """Pigeon answered a client's command with a 4xx or 5xx reply; or, over HTTP, refused a
    recipient of an injection at intake (`command` "inject", `session` the request's)."""

    session: str
    peer: str
    # The command answered, as the client gave its verb (at most 16 octets, escaped as
    # `recipients` are: `pigeon.logs.peer_text.shown`); left out when the reply answered none
    # (a timeout, a connection evicted or shut down between commands).
    command: str | None = None
    response: Response
    helo: str | None = None
    sender: str | None = None
    recipients: list[str] | None = None
    tls: str | None = None
    auth_user: str | None = None
    # A message refused once it was whole (by the policy's on_message, as a loop, or by the
    # spool): the id it was given, which on_message saw and a PolicyFailure names. Nothing is
    # stored under it; it is here so that grepping for it finds the refusal.
    id: str | None = None
    # An injected recipient refused (`command` "inject"): the tenant and campaign the request
    # named (or its token's one tenant), and the recipient's metadata, as its Reception would
    # have given them. (No queue: a policy hook may name it, and it is not asked of a refusal.)
    tenant: str | None = None
    campaign: str | None = None
    meta: dict[str, str] | None = None


class Attempt(Record):
    """Fields of every record about a delivery attempt or its end, one record per recipient."""

    id: str
    queue: str
    sender: str
    recipient: str
    size: int
    attempt: int  # attempts made so far, this one included
    response: Response
    site: str = ""
    source: str | None = None  # the egress [[source]] it left from; None: the implicit source
    peer: str | None = None  # "mx.example.net [192.0.2.1]:25"
    tls: str | None = None
    # The connection is opportunistic TLS's fallback after a STARTTLS handshake that failed
    # there (in the clear, or unverified TLS): what that failure said. Absent: no fallback.
    tls_failed: str | None = None
    auth_user: str | None = None  # who the connection authenticated as (a smart host's AUTH), as Reception's
    created: float = 0.0  # when the message was received
    duration: float | None = None  # seconds this attempt took, connection excluded
    meta: dict[str, str] | None = None  # metadata given at injection
    tenant: str | None = None  # as in Reception (a rebind into `campaign:tenant@domain` changes them)
    campaign: str | None = None


class Delivery(Attempt, tag="Delivery"):
    """The recipient's server took the message (2xx). Terminal."""

    seq: str = ""  # 16 hex digits, as `id`: see the module's docstring
    # "7bit": it went in a 7-bit form made for a server without 8BITMIME (8-bit parts
    # quoted-printable, `pigeon.delivery.seven_bit`); absent: as it was.
    converted: str | None = None


class TransientFailure(Attempt, tag="TransientFailure"):
    """This attempt failed, another will follow (4xx, timeout, connection error)."""

    next_attempt: float = 0.0  # when (0: not by itself: an operator held it, `AdminHold`)
    # The reply's class from the bounce rule table, as a Bounce's (QuotaIssues, PolicyRelated,
    # BadConnection ...; Uncategorized when no rule matched): why it was deferred, without
    # reading the text. Absent only in records written before deferrals were classified.
    classification: str = ""
    # True when this deferral's sender was told, with a "delayed" DSN committed with it, that the
    # message is still being retried (`[delivery] delay_warning`): once a message. Absent: not.
    delay_notified: bool = False


class Bounce(Attempt, tag="Bounce"):
    """The recipient will not get the message (5xx, or refused before sending). Terminal."""

    classification: str = ""  # the bounce class: "Uncategorized" when no rule matched (never left out)
    dsn: str | None = None  # why no DSN was sent, when an [[inbound]] route's `bounces` kept it back
    said_by: str = "server"
    """Whose `response` it is: "server" (a server's reply), or "pigeon" when Pigeon refused the
    recipient itself (no mail server for the domain, a message the server cannot take: no
    8BITMIME, over its SIZE), even with a server on the line (`peer`)."""
    seq: str = ""  # 16 hex digits, as `id`: see the module's docstring

    def __post_init__(self) -> None:
        # Its default is "", which `omit_defaults` leaves out, and never written: the README
        # lists `classification` as a Bounce field, and a reader looks for it in every one
        # (an older record without it reads as "Uncategorized", as it was).
        if not self.classification:
            self.classification = "Uncategorized"


class Expiration(Attempt, tag="Expiration"):
    """The message was not delivered within max_age. Terminal."""

    dsn: str | None = None  # as in Bounce
    seq: str = ""  # 16 hex digits, as `id`: see the module's docstring


class Held(Attempt, tag="Held"):
    """An [[inbound]] target refused the recipient for good, or it expired, and its sender gets
    no DSN: the message is kept in the spool for an operator (`pigeon retry` sends it again).
    Not terminal: the recipient's terminal record comes once the operator released it."""

    classification: str = ""  # the refusal's bounce class ("" for an expiry)
    cause: str = ""  # "refused" or "expired"
    dsn: str = ""  # why no DSN was sent
    seq: str = ""  # 16 hex digits, as `id`: see the module's docstring


class AdminBounce(Attempt, tag="AdminBounce"):
    """An operator bounced the recipient (terminal; no DSN is sent)."""

    reason: str = ""
    operator: str = ""  # the API token's name
    attempt_response: Response | None = None  # bounced while an attempt was on the wire: its reply
    seq: str = ""  # 16 hex digits, as `id`: see the module's docstring


class Rebind(Record, tag="Rebind"):
    """An operator rebound a message (`pigeon rebind`): it moved to another scheduled queue,
    or is routed as another domain, or both, and is due at once. One per message, written once
    the move is committed (of a message whose attempt was on the wire: what that attempt left,
    when it ended), so that a `Delivery` through another site than its domain's says why.
    Not exactly once: as a `TransientFailure`, a crash between the commit and the write loses it."""

    id: str
    queue: str  # the scheduled queue it is in now
    recipients: list[str]  # those moved (of a message being sent: those its attempt left)
    from_queue: str | None = None  # the queue it left; absent: it stayed in its queue
    route: str | None = None  # the domain it is routed as now ("": its recipients' own again); absent: as before
    operator: str = ""  # the API token's name
    operation: str | None = None  # the bulk operation's id (`GET /api/v1/admin/operations`)
    tenant: str | None = None  # as in Reception: the message's now (a queue `campaign:tenant@domain` names them)
    campaign: str | None = None


class AdminHold(Record, tag="AdminHold"):
    """An operator held a message (`pigeon hold`, Postfix's `postsuper -h`): kept in the spool,
    untried and never expiring, until an operator releases it (`pigeon retry --id`) or bounces
    it. One per message, written once the hold is committed (of a message whose attempt was on
    the wire: what that attempt left, when it ended). Not terminal, and not exactly once: as a
    `Rebind`, a crash between the commit and the write loses it (the message stays held)."""

    id: str
    queue: str
    recipients: list[str]  # those held (of a message being sent: those its attempt left)
    reason: str = ""
    operator: str = ""  # the API token's name
    tenant: str | None = None  # as in Reception
    campaign: str | None = None


class Quarantine(Record, tag="Quarantine"):
    """A spool entry could not be read (by the check after the start, or when first read) and
    was moved to quarantine."""

    id: str
    reason: str


class Inbound(Record):
    """A message of an IMAP mailbox handed (or not) to an application's target. (Mail an
    `[[inbound]]` route took over SMTP is spooled, and its handoff is a `Delivery`.)"""

    source: str  # "imap:<mailbox name>" or "smtp"
    target: str
    dedupe_key: str  # SHA-256 of the raw message, hex: what the application dedupes on
    size: int
    message_id: str | None = None
    mailbox: str | None = None  # "user@host:port/folder"
    uidvalidity: int | None = None
    uid: int | None = None
    # 1 for the first handoff. Always written (a default would be left out of the line, and
    # consumers would have to know it); None only when reading a record from before it was.
    attempt: int | None = None
    detail: str = ""  # the target's answer ("202 Accepted", "duplicate", ...)
    duration: float | None = None
    # Set when this node tried a message whose claim was taken over from a node that died (its
    # heartbeat ran out) before marking it done, by this node or by one whose attempt failed
    # since: that node (its arbitration token, as in `recovered_from`), which may have handed it
    # over already, its answer lost with it. The application may have got it twice (same dedupe
    # key): on an InboundDelivery, this may be the second copy. Every record of the message
    # says it until it is handed over (an InboundFailure: the attempt that failed).
    taken_over_from: str | None = None


class InboundDelivery(Inbound, tag="InboundDelivery"):
    """The target accepted the message."""

    # The acknowledgement at the source ("seen", "moved to X", "deleted"), asked for once this
    # record is written: written first, so that no handoff goes unrecorded whenever the node
    # dies. One the server did not take (a stop, a lost connection) is done by the start (or
    # node) that finds the done mark, and recorded again then (`recovered_from`); the node's
    # log says when it did not go through.
    acknowledged: str = ""
    # Set when this node writes the record on behalf of another: the node (its arbitration
    # token) that handed the message over and died before acknowledging it. Such a record
    # can be the second for its dedupe key; the application got the message once.
    recovered_from: str | None = None
    # True when another node took the claim over while this node handed the message over (this
    # node's heartbeat ran out meanwhile: stopped or stalled): the other node may have handed it
    # over too, so the application may have got it twice (same dedupe key). Logged as a WARNING.
    # Also when it may have been: the heartbeat may have run out, and Redis did not answer to tell.
    repeated_by_takeover: bool = False


class InboundFailure(Inbound, tag="InboundFailure"):
    """The target did not accept the message: retried after `next_attempt`, or, when
    `permanent`, given up (moved to the failed folder, or bounced).

    A mailbox's message over `max_message_size` is refused without being fetched: its `size`
    is the one the IMAP server gives (RFC822.SIZE), and its `dedupe_key` (and `message_id`) are
    empty, since the body they come from was never read."""

    permanent: bool = False
    next_attempt: float | None = None
    action: str = ""


class PolicyFailure(Record, tag="PolicyFailure"):
    """A policy hook failed: it raised, answered what it may not, or took longer than
    `[policy] timeout`. Pigeon went on without it (`action` says how). `session`: the
    connection or injection request it failed for; `id`: the message (for on_message, one
    refused with 451: the `Rejection` of that message carries the same `id`)."""

    hook: str
    error: str
    action: str
    traceback: str | None = None
    session: str | None = None
    id: str | None = None


class ShapingEffect(Record, tag="ShapingEffect"):
    """A reaction's effect began or ended (see `pigeon.shaping.effects`)."""

    event: str  # "created", "learned" (another node's, first known here), "expired" or "ended" (early)
    effect: str  # its id
    rule: str
    key: str
    action: str
    expires_at: float
    reply: str
    origin: str  # the node that saw the reply
    scope: str  # "cluster" (through Redis) or "node"
    connection_limit: int | None = None
    max_message_rate: str | None = None
    ended_by: str | None = None  # "ended": the API token of the operator who ended it


AnyRecord = (
    Reception
    | Rejection
    | Delivery
    | TransientFailure
    | Bounce
    | Expiration
    | AdminBounce
    | Held
    | Rebind
    | AdminHold
    | Quarantine
    | InboundDelivery
    | InboundFailure
    | PolicyFailure
    | ShapingEffect
)
RECORD_TYPES: tuple[type[Record], ...] = (
    Reception,
    Rejection,
    Delivery,
    TransientFailure,
    Bounce,
    Expiration,
    AdminBounce,
    Held,
    Rebind,
    AdminHold,
    Quarantine,
    InboundDelivery,
    InboundFailure,
    PolicyFailure,
    ShapingEffect,
)
TERMINAL_TYPES: tuple[type[Record], ...] = (Delivery, Bounce, Expiration, AdminBounce)


def record_types() -> frozenset[str]:
    """Every record type (`type`) the log may hold: the tags of the leaf classes (`Attempt`,
    `Inbound` are the fields their kinds share, never written as they are)."""
    found: set[str] = set()
    waiting: list[type[Record]] = [Record]
    while waiting:
        kind = waiting.pop()
        below = kind.__subclasses__()
        waiting.extend(below)
        tag = kind.__struct_config__.tag
        if not below and isinstance(tag, str):
            found.add(tag)
    return frozenset(found)
