"""Delivery agents: lease + body in, attempt out.

An agent is one session with a destination: an SMTP connection (`smtp_agent`), or an
application's inbound target (`target_agent`); a destination's kind says which opens it.
The dispatcher opens one per connection it runs for a ready queue, hands it leased
messages (`Work`), `batch` at a time, and reports each `Attempt` back to the queue with the
lease it came with (each as soon as it is made, for an agent that hands messages over
`separately`). An agent never touches the queue's state, and classifies the replies it
got, so the queue reads a bounce class and never the rule table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol

from pigeon.delivery.routes import Destination
from pigeon.message import Message
from pigeon.policy.objects import Delivery
from pigeon.queue.attempt import Attempt
from pigeon.queue.state import Lease
from pigeon.smtp.replies import Reply


class Work(NamedTuple):
    """One message to attempt: the lease to report with, the message (read-only), its bytes."""

    lease: Lease
    message: Message
    body: bytes
    delivery: Delivery | None = None
    """What the policy's `before_delivery` hook was told of this attempt, if it was asked."""


class Unreachable(Exception):
    """No session with the destination could be opened. `reply` is the last reason, and
    `classification` its bounce class if it is a 5xx. `site_down`: no host of the
    destination took a connection at all, so the whole site is down (`pigeon.delivery.sites`).
    `peer` and `tls`: the host that answered and would not do (a 421, TLS it does not offer or
    a certificate that does not verify), and its TLS if it was on TLS by then; `server`: `reply`
    is that host's own (its 421), not Pigeon's words about it. `authentication`: a route's
    smart host refused its credentials (or cannot take them): its mail is held as a down
    site's, under the route's user (`pigeon.delivery.sites`). `tls_failed`: `peer` was tried
    again in the clear (or on TLS unverified) after a STARTTLS handshake that failed, which
    this says (`Attempt.tls_failed`). `reply_for`,
    if given, is the reply as said of a message's domain (mail that loops back to this node:
    the site names its hosts, the domain is what a reader looks for)."""

    def __init__(
        self,
        reply: Reply,
        classification: str = "",
        *,
        site_down: bool = False,
        peer: str | None = None,
        tls: str | None = None,
        reply_for: Callable[[str], Reply] | None = None,
        server: bool = False,
        authentication: bool = False,
        tls_failed: str | None = None,
    ) -> None:
        super().__init__(str(reply))
        self.authentication = authentication
        self.reply = reply
        self.classification = classification
        self.site_down = site_down
        self.peer = peer
        self.tls = tls
        self.tls_failed = tls_failed
        self.reply_for = reply_for
        self.server = server


class Agent(Protocol):
    """A session with one destination."""

    @property
    def batch(self) -> int:
        """How many messages `deliver` takes at once."""

    @property
    def separately(self) -> bool:
        """Whether each message is handed over on its own (a webhook call each, run side by
        side up to the target's concurrency): the dispatcher then calls `deliver` with one
        message at a time, the batch's calls side by side, and reports each attempt as soon
        as it is made, not once the slowest of the batch is."""

    def usable(self) -> bool:
        """False once the session cannot take another message (a broken connection)."""

    async def deliver(self, work: Sequence[Work]) -> list[Attempt]:
        """Attempt each message; one `Attempt` per `Work`, in order. Never raises for a
        message's sake: failures are replies (451 for a broken connection)."""

    def final(self) -> list[Attempt]:
        """Of the `deliver` call under way, the attempts (from the first message on) that must
        be reported even if the call is cancelled: a host took some of their recipients."""

    async def close(self) -> None: ...


Opener = Callable[[Destination, str | None], Awaitable[Agent]]
"""Opens an agent for a destination (one per destination kind), from an egress `[[source]]`
(None: the implicit source). Raises `Unreachable`."""
