"""What work that left the queue hands back: an attempt's replies, or a destination that
cannot be resolved.

Delivery agents try and report; only the queue decides what a reply means for the message
(Postfix's division between `smtp` and `qmgr`). Agents classify the replies they got
(`classifications`, from the bounce rule table), so the queue reads the class and never the
rule table itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from pigeon.smtp.replies import Reply


class Via(NamedTuple):
    """Another host of the site that answered some of an attempt's recipients (see
    `Attempt.via`): its peer, its TLS, whether it took the DSN parameters, and the failed
    handshake its connection fell back from (`Attempt.tls_failed`)."""

    peer: str
    tls: str | None
    passed_on: bool
    tls_failed: str | None = None


class Attempt(NamedTuple):
    """One attempt at a message: `replies[i]` is what happened to its recipient `i`, and
    `classifications[i]` the bounce class of that reply when it is a 5xx ("" otherwise: the
    queue classifies a 4xx for its `TransientFailure` record, `Settlement`'s `classify`).
    (A named tuple: one is made for every attempt, and it is immutable.)"""

    replies: Sequence[Reply]
    classifications: Sequence[str]
    site: str = ""
    peer: str | None = None
    tls: str | None = None
    duration: float | None = None
    retry_after: float | None = None
    """Seconds until the next try of what failed transiently (a policy's `Defer(delay=...)`);
    None: the queue's backoff."""
    source: str | None = None
    """The `[[source]]` the attempt was made from (None: the implicit source, or none at all)."""
    not_before: float | None = None
    """Seconds before which what failed transiently must not be tried again (a webhook
    target's `Retry-After`): the queue waits the longer of this, at most its
    `max_retry_interval`, and its backoff. None: the backoff alone."""
    passed_on: bool = False
    """The peer took the DSN parameters (it offered DSN): reporting success is its job from
    here (RFC 3461 5.2.2). False: Pigeon reports a success asked for itself ("relayed")."""
    tried: bool = True
    """False: nothing was sent (its site is down, `pigeon.delivery.sites`): the message is
    deferred by `retry_after` with these replies, and no attempt is counted, so its own
    retry schedule is not spent on an outage."""
    cause: Reply | None = None
    """Of an attempt not tried: the failure that keeps it from being tried (its site's last
    connection error). The message keeps it as its `last_response`, which `pigeon inspect`
    shows and an expiry's DSN names, while its records say it was not tried."""
    via: Mapping[int, Via] | None = None
    """Recipients (by index) whose reply came from another host of the site than `peer`, in
    this same attempt: `peer` answered them 4xx, and they were tried at once at the next MX
    (`pigeon.delivery.smtp_agent`). Their records name that host. None: all came from `peer`."""
    passed_over: Sequence[Reply] = ()
    """The 4xx `peer` answered the recipients in `via` before they went to the next host:
    what the site said all the same, so the shaping reactions (`pigeon.delivery.reactor`) see
    them with `replies`."""
    own: frozenset[int] = frozenset()
    """Recipients (by index) whose reply Pigeon decided on its own side of the wire although a
    peer was there: the peer lacked what the message needs (SMTPUTF8, 8BITMIME, a SIZE big
    enough), a shaping reaction bounced what it deferred, or a 4xx of Pigeon's words about the
    peer (the connection broke or timed out, its TLS failed). Their DSN (a bounce's, or an
    expiry's naming that last failure) says `X-Pigeon;`, not `smtp;`: no server gave that reply."""
    held_by: str | None = None
    """What holds what failed for now after this attempt, when a shaping reaction's suspension
    does (`pigeon.delivery.reactor.held_text`): the message keeps it (`Envelope.held_by`), which
    `pigeon inspect` shows and an expiry names. None: nothing holds it (the common case)."""
    auth_user: str | None = None
    """Who the connection authenticated as (SMTP AUTH to a route's smart host), or None."""
    converted: str | None = None
    """"7bit": the message went in a 7-bit form made for a peer without 8BITMIME
    (`pigeon.delivery.seven_bit`), which its `Delivery` records say. None: as it was."""
    tls_failed: str | None = None
    """The connection to `peer` is opportunistic TLS's fallback after a STARTTLS handshake
    that failed there (`tls` None: in the clear; or on TLS whose certificate was not verified,
    after it did not verify), and this is what that handshake's failure said ("TLS handshake
    with mx.example.net [192.0.2.1]:25 failed: ..."). None: no such fallback (a server that
    offers no STARTTLS is in the clear without one). An auditor tells a downgrade from a
    server without TLS by it."""

    def peer_of(self, index: int) -> tuple[str | None, str | None, bool]:
        """The peer, TLS and `passed_on` that recipient `index`'s reply came with."""
        via = self.via.get(index) if self.via else None
        if via is None:
            return self.peer, self.tls, self.passed_on
        return via.peer, via.tls, via.passed_on

    def tls_failed_of(self, index: int) -> str | None:
        """The `tls_failed` of the connection recipient `index`'s reply came over."""
        via = self.via.get(index) if self.via else None
        return self.tls_failed if via is None else via.tls_failed

    @classmethod
    def same_for_all(
        cls, reply: Reply, count: int, classification: str = "", site: str = "", peer: str | None = None
    ) -> Attempt:
        return cls([reply] * count, [classification] * count, site, peer)


class Unroutable(Exception):
    """A destination cannot be resolved (no MX, NXDOMAIN, a DNS timeout): an attempt that
    failed before any connection. `reply` says how; a 5xx is permanent."""

    def __init__(self, reply: Reply, classification: str = "") -> None:
        super().__init__(str(reply))
        self.reply = reply
        self.classification = classification
