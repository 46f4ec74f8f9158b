"""The SMTP agent: leased messages over one outbound connection (`session.ClientConnection`).

One message per transaction; the connection is reused for the next. A server that takes
only so many recipients per transaction answers the rest `452 4.5.3` (RFC 5321 4.5.3.1.10);
they go in another transaction on the same connection at once, as many times as it takes,
rather than waiting for the retry schedule. What the peer cannot take at all (SMTPUTF8 it
lacks, over its SIZE) is a permanent, explained refusal rather than a protocol violation at
the next hop; where only some recipients' addresses need the SMTPUTF8 it lacks, those alone are
refused, and the others go without it (`client.smtputf8_refused_apart`). 8-bit data goes to a
hop without 8BITMIME in a 7-bit form (`seven_bit.SevenBitHop`: its 8-bit parts
quoted-printable, signed again where Pigeon signed it, and a report of Pigeon's own as
`dsn.seven_bit` writes it), and is refused only when it has none (UTF-8 in a header
field) or `[delivery] eight_bit_conversion` is off (a report of Pigeon's own goes 7-bit all the
same: no one would hear of its refusal). The conversion is only looked at for such a hop.
A connection that breaks mid-transaction is a transient failure for every recipient of that
message the server had not answered (or had accepted): one it refused keeps its refusal, a
5xx bounced at once (`session.ConnectionLost.settled`). The agent is no longer usable. Not
such a break: a connection used before that the server closed or reset before answering
anything of the transaction (its idle timeout, or its limit of messages a connection, met as
MAIL came) took nothing, and the connection sends it again at once on a new one, once
(`session.ClientConnection.send`); what happens there is the attempt.

A recipient the host answers 4xx (greylisting, a busy or broken server, a DATA deferred) is
tried at once at the site's next host (`[delivery] try_next_mx`), within the same attempt, as
Postfix does: the domain's other MX may well take it, and the message need not wait for the
retry schedule. One other host per attempt, in preference order, never the same address
again, and none the agent passed over when it opened (down, or turning it away). The
connection that answered 4xx is closed before the next is opened, so the agent never holds
more than the one connection its site's limit allowed it; the agent then goes on over the new
one, whose 4xx may send it back (or, if no other host took a connection, is no longer usable,
and the dispatcher opens the next in preference order). The recipients answered there name
that host in their records (`Attempt.via`); what it answered is final for this attempt, a
4xx there included (or its 421, or the break of its connection). A later message that host
cannot take (SMTPUTF8 or a SIZE it lacks) goes back to the host the agent came from rather
than being refused: hosts of one site need not offer the same.

A server that ends the session with a 421 of its own at MAIL, RCPT or DATA said a definite no
to the transaction, so its recipients go to the next host too; a connection that broke
silently did not (the message may have been taken), and waits for the retry. The next host
has the connect timeout, not the reply timeout, to be connected and greet; when none takes a
connection, the site's next hosts are left alone for `NEXT_MX_PAUSE` (and a warning says so),
rather than each deferred message waiting as long again. If the delivery is cancelled (a
stop) while the next host is tried, the dispatcher reports what the first host answered
(`final`): what it took is not sent again at the next start. A stop that cuts a transaction
after the end of its content went out (the reply to it not come by `[node] shutdown_timeout`)
is the same as a break there: the recipients' attempt is a `451 4.4.2 ... the message may be
delivered twice` to report (`final`), counted and due for a retry, and a WARNING names the
message and its recipients; cut before, the message is tried again as if never sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from pigeon.delivery.agent import Unreachable, Work
from pigeon.delivery.classify import Classifier
from pigeon.delivery.egress import Source
from pigeon.delivery.loops import Listeners
from pigeon.delivery.mx import Resolver
from pigeon.delivery.routes import Destination
from pigeon.delivery.session import ClientConnection, ClientOptions, ConnectFailed, ConnectionLost, LoopsBack
from pigeon.delivery.seven_bit import SevenBitHop
from pigeon.message import format_id
from pigeon.queue.attempt import Attempt, Via
from pigeon.smtp import client
from pigeon.smtp.client import refusal_before_sending
from pigeon.smtp.replies import Reply

_log = logging.getLogger(__name__)

NEXT_MX_PAUSE: Final = 120.0
"""Seconds a site's next MX host is not tried after a 4xx, once none took a connection."""

# What a message gets when the agent left its first host for another (a 4xx moved it), that
# other host cannot take the message, and no way back opened: the first host may take it later.
_NO_WAY_BACK: Final = Reply(451, "4.4.1", ("no connection to the site's other host, which may take this message",))


class SmtpAgent:
    batch = 1
    separately = False

    def __init__(
        self,
        connection: ClientConnection,
        site: str,
        classifier: Classifier,
        elsewhere: Callable[[ClientConnection], Awaitable[ClientConnection | None]] | None = None,
        seven_bit: SevenBitHop | None = None,
    ) -> None:
        self._connection = connection
        self._seven_bit = seven_bit or SevenBitHop(convert=False)
        self._site = site
        self._classifier = classifier
        self._first = connection.host  # the host the agent reached when it opened
        self._elsewhere = elsewhere
        """Opens a connection to another host of the site than the one given (None: there is
        none, or none took it); None: recipients answered 4xx are not tried elsewhere."""
        self._final: list[Attempt] = []

    def usable(self) -> bool:
        return self._connection.alive()

    def final(self) -> list[Attempt]:
        """Of the messages of the `deliver` call under way, the attempts already made at a
        host that answered (in order, from the first): should the call be cancelled (a
        stop) while their 4xx recipients are tried at the next host, these are what to
        report, or a restart would send again what the first host took."""
        return list(self._final)

    async def deliver(self, work: Sequence[Work]) -> list[Attempt]:
        connection, site = self._connection, self._site
        attempts: list[Attempt] = []
        self._final = attempts  # (the same list: `final` reads what is done so far)
        for item in work:  # one transaction each (batch is 1: a loop only to keep the interface)
            original = _client_envelope(item)
            envelope, refused, refusal, converted = await self._for_peer(item, original, connection)
            if (refusal is not None or refused) and self._elsewhere is not None and connection.host != self._first:
                # This host, one a 4xx moved the agent to, lacks what the message needs
                # (SMTPUTF8, a SIZE, 8BITMIME): the host the agent came from may well have it.
                other = await self._elsewhere(connection)
                if other is None:
                    count = len(original.recipients)
                    attempts.append(Attempt.same_for_all(_NO_WAY_BACK, count, "", site, connection.peer))
                    continue
                self._connection = connection = other
                envelope, refused, refusal, converted = await self._for_peer(item, original, connection)
            count = len(envelope.recipients)  # (those it goes to: `refused` are not among them)
            if refusal is not None:
                classification = self._classifier.classify(refusal) if refusal.code >= 500 else ""
                attempt = Attempt.same_for_all(refusal, count, classification, site, connection.peer)
                attempts.append(self._with_refused(attempt._replace(own=frozenset(range(count))), refused))
                continue
            done: list[Reply] = []  # (what the transactions answered so far: see the stop below)
            try:
                replies, duration = await _send_all(connection, envelope, done)
            except ConnectionLost as error:
                # The message may have been taken: not sent again now, at another host. The
                # reply is Pigeon's words (a timeout, a closed connection), not the server's,
                # but for the recipients the server had refused before the break: theirs stands
                # (a 5xx is bounced now, not deferred until the message expires).
                lost = error.replies(count)
                attempt = Attempt(
                    lost,
                    self._classifier.classify_all(lost),
                    site,
                    connection.peer,
                    connection.tls,
                    passed_on="DSN" in connection.capabilities,
                    own=error.unanswered(count),
                    auth_user=connection.auth_user,
                    tls_failed=connection.tls_failed,
                )
                attempts.append(self._with_refused(attempt, refused))
                continue
            except asyncio.CancelledError:
                # A stop, with the transaction on the wire (the dispatcher then reports `final`).
                # No await here: this module is compiled (setup.py).
                cut = self._cut_short(item, envelope, connection, done)
                if cut is not None:
                    attempts.append(self._with_refused(cut, refused))
                raise
            classes = self._classifier.classify_all(replies)
            passed_on = "DSN" in connection.capabilities
            attempt = Attempt(
                replies,
                classes,
                site,
                connection.peer,
                connection.tls,
                duration,
                passed_on=passed_on,
                auth_user=connection.auth_user,
                tls_failed=connection.tls_failed,
            )
            if converted:
                attempt = attempt._replace(converted="7bit")
            if refused:  # from here on, indexed as the message's recipients
                attempt = self._with_refused(attempt, refused)
                envelope = dataclasses.replace(envelope, recipients=original.recipients)
            pending = [i for i, reply in enumerate(attempt.replies) if 400 <= reply.code < 500]
            if pending and self._elsewhere is not None:
                self._final.append(attempt)  # (until the next host answers: see `final`)
                attempt = await self._next_host(item, envelope, attempt, pending)
                self._final.pop()
                connection = self._connection
            attempts.append(attempt)
        return attempts

    async def _for_peer(
        self, item: Work, original: client.Envelope, connection: ClientConnection
    ) -> tuple[client.Envelope, list[int], Reply | None, bool]:
        """What of the message (`original`) goes to `connection`: the envelope to send, the
        recipients refused apart (by index in `original`, not in that envelope: their address
        needs the SMTPUTF8 the host lacks, `client.smtputf8_refused_apart`), the reply of all
        in the envelope when it cannot go at all (a refusal before sending, or a 7-bit form
        not made), and whether the envelope is in a 7-bit form made for a host without 8BITMIME."""
        capabilities = connection.capabilities
        refused = client.smtputf8_refused_apart(original, capabilities)
        envelope = original
        if refused:
            envelope = original.only([i for i in range(len(original.recipients)) if i not in refused])
        refusal = None
        converted = False
        if envelope.eight_bit and "8BITMIME" not in capabilities:
            seven_bit, refusal = await self._seven_bit_form(item, envelope, connection)
            converted = seven_bit is not envelope
            envelope = seven_bit
        if refusal is None:
            refusal = refusal_before_sending(envelope, capabilities)
        return envelope, refused, refusal, converted

    def _with_refused(self, attempt: Attempt, refused: list[int]) -> Attempt:
        """`attempt`, made for the recipients that went (`_for_peer`), as the message's: each
        of those `refused` apart (by index in the message) gets `client.NO_SMTPUTF8`, Pigeon's
        own reply, the others theirs."""
        if not refused:
            return attempt
        count = len(attempt.replies) + len(refused)
        went = [i for i in range(count) if i not in refused]
        reply = client.NO_SMTPUTF8
        replies = [reply] * count
        classes = [self._classifier.classify(reply)] * count
        for index, own_reply, classification in zip(went, attempt.replies, attempt.classifications, strict=True):
            replies[index], classes[index] = own_reply, classification
        own = frozenset(refused) | frozenset(went[index] for index in attempt.own)
        via = None if attempt.via is None else {went[index]: host for index, host in attempt.via.items()}
        return attempt._replace(replies=replies, classifications=classes, own=own, via=via)

    async def _seven_bit_form(
        self, item: Work, envelope: client.Envelope, connection: ClientConnection
    ) -> tuple[client.Envelope, Reply | None]:
        """`envelope` (8-bit) as it goes to `connection`, which lacks 8BITMIME: in its 7-bit
        form (a new envelope) where it has one, else as it is (then refused, 5.6.3); with a
        reply when it has none (a 554 5.6.3 saying why) or that form could not be signed (a
        451: deferred). A message that needs
        SMTPUTF8 the host lacks is refused for that whatever its body (5.6.7): not converted."""
        if envelope.needs_smtputf8 and "SMTPUTF8" not in connection.capabilities:
            return envelope, None
        body, failed = await self._seven_bit(item.message, envelope.body)
        if body is None:
            return envelope, failed
        return dataclasses.replace(envelope, body=body, eight_bit=not body.isascii()), None

    def _cut_short(
        self, item: Work, envelope: client.Envelope, connection: ClientConnection, done: list[Reply]
    ) -> Attempt | None:
        """The attempt to report for a message whose transaction a stop cut short, if any (see
        `_cut_replies`). None: nothing to report (nothing went, or nothing that can have been taken)."""
        replies = self._cut_replies(item, envelope, connection, done)
        if replies is None:
            return None
        classes = self._classifier.classify_all(replies)
        passed_on = "DSN" in connection.capabilities
        return Attempt(
            replies,
            classes,
            self._site,
            connection.peer,
            connection.tls,
            passed_on=passed_on,
            tls_failed=connection.tls_failed,
        )

    def _cut_replies(
        self, item: Work, envelope: client.Envelope, connection: ClientConnection, done: list[Reply]
    ) -> list[Reply] | None:
        """Each of `envelope`'s recipients' reply when a stop cut its transaction short: if the
        end of its content went out, the server may have the message, and the reply says so
        (with a WARNING naming it); if the server's answer had come already (read, not yet
        taken), it stands. Transactions before the cut one (the server's recipient limit:
        `done` holds what they answered) stand too: only what the cut one carried is cut, and of
        it not a recipient the server had refused (its refusal stands). None: nothing to report
        (nothing went, or nothing that can have been taken)."""
        answered = connection.answered_before_cut()
        cut = connection.cut_short()
        count = len(envelope.recipients)
        carried = [i for i, reply in enumerate(done) if too_many_recipients(reply)] if done else list(range(count))
        if answered is not None:
            got = answered
        elif cut is not None:
            # Those the server refused before the cut keep their refusal: they cannot have the message.
            settled = connection.settled()
            got = (
                [cut if own is None else own for own in settled]
                if len(settled) == len(carried)
                else [cut] * len(carried)
            )
            doubtful = [envelope.recipients[i] for i, reply in zip(carried, got, strict=True) if reply is cut]
            if doubtful:
                self._warn_cut(item, doubtful, connection)
        elif done:
            return list(done)  # the cut transaction's content never went: they keep their 452
        else:
            return None
        replies = list(done) if done else list(got)
        for index, reply in zip(carried, got, strict=True):
            replies[index] = reply
        return replies

    async def _next_host(self, item: Work, envelope: client.Envelope, attempt: Attempt, pending: list[int]) -> Attempt:
        """`attempt` with its 4xx recipients (`pending`, by index in `envelope`, which has all
        the message's recipients) tried again at another host of the site; the attempt as it
        was if none took a connection or that host cannot take the message. Those whose address
        needs the SMTPUTF8 that host lacks keep their 4xx, and the others go."""
        assert self._elsewhere is not None
        other = await self._elsewhere(self._connection)
        if other is None:
            return attempt
        self._connection = other
        rest = envelope.only(pending)
        apart = client.smtputf8_refused_apart(rest, other.capabilities)
        if apart:
            # Those whose address needs the SMTPUTF8 this host lacks keep their 4xx (the host
            # that gave it offers SMTPUTF8, and may take them later); the others go here.
            pending = [index for position, index in enumerate(pending) if position not in apart]
            rest = envelope.only(pending)
        if refusal_before_sending(rest, other.capabilities) is not None:
            return attempt  # this host cannot take it (no SMTPUTF8, too big): the 4xx stand
        done: list[Reply] = []  # (what this host's transactions answered so far: see the stop below)
        try:
            more, took = await _send_all(other, rest, done)
        except ConnectionLost as error:  # what happened last, and where, is what the records say
            merged = self._merged(attempt, pending, error.replies(len(pending)), 0.0, other)
            unanswered = frozenset(pending[index] for index in error.unanswered(len(pending)))
            return merged._replace(own=merged.own | unanswered)  # (Pigeon's words, not the server's)
        except asyncio.CancelledError:
            # A stop: `final` holds what the first host answered. What this host answered
            # before the cut stands (its recipient limit: a transaction it took is not sent
            # again); those cut with their content's end unanswered may be delivered twice,
            # and it says so. No await here: this module is compiled (setup.py).
            cut = self._cut_replies(item, rest, other, done)
            if cut is not None and self._final:
                self._final[-1] = self._merged(attempt, pending, cut, 0.0, other)
            raise
        return self._merged(attempt, pending, more, took, other)

    def _merged(
        self, attempt: Attempt, pending: list[int], more: list[Reply], took: float, other: ClientConnection
    ) -> Attempt:
        """`attempt` with its `pending` recipients' replies the ones `other` gave (`more`)."""
        replies, classes = list(attempt.replies), list(attempt.classifications)
        classified = self._classifier.classify_all(more)
        via = Via(other.peer, other.tls, "DSN" in other.capabilities, other.tls_failed)
        for index, reply, classification in zip(pending, more, classified, strict=True):
            replies[index], classes[index] = reply, classification
        duration = (attempt.duration or 0.0) + took
        return attempt._replace(
            replies=replies,
            classifications=classes,
            duration=duration,
            via=dict.fromkeys(pending, via),
            passed_over=[attempt.replies[i] for i in pending],
        )

    @staticmethod
    def _warn_cut(item: Work, recipients: Sequence[client.Recipient], connection: ClientConnection) -> None:
        _log.warning(
            "message %s: the node stopped before %s answered the end of data: %s may be delivered twice",
            format_id(item.message.id),
            connection.peer,
            ", ".join(recipient.address for recipient in recipients),
        )

    async def close(self) -> None:
        await self._connection.quit()


class SmtpAgents:
    """Opens an `SmtpAgent` for a destination of SMTP hops, from an egress source: its
    connection binds to the source's address and gives its EHLO name. A host that is this
    node itself (one of `own`'s listeners) is never connected to: when every host is, the
    mail would loop, and fails for good (`554 5.4.6`, as Postfix's "loops back to myself")."""

    def __init__(
        self,
        resolver: Resolver,
        options: ClientOptions,
        classifier: Classifier,
        sources: Sequence[Source] = (),
        own: Listeners | None = None,
        seven_bit: SevenBitHop | None = None,
    ) -> None:
        self._own = own
        self._seven_bit = seven_bit
        self._resolver = resolver
        self._options = options
        self._classifier = classifier
        self._sources = {
            s.name: dataclasses.replace(options, bind=s.bind, helo_name=s.ehlo or options.helo_name) for s in sources
        }
        self._paused: dict[str, float] = {}  # site -> until when (monotonic) its next host is not tried

    async def open(self, destination: Destination, source: str | None = None) -> SmtpAgent:
        options = self._options if source is None else self._sources.get(source)
        if options is None:  # the ready queue outlived its source (cannot happen: sources change at restart)
            raise Unreachable(Reply(451, "4.3.5", (f"egress source {source!r} is not configured ([[source]])",)))
        try:
            connection = await ClientConnection.open(destination, self._resolver, options, own=self._own)
        except ConnectFailed as error:
            reply = error.reply
            classification = self._classifier.classify(reply) if reply.code >= 500 else ""
            site_down, peer, tls, server = error.site_down, error.peer, error.tls, error.server
            reply_for = error.reply_for if isinstance(error, LoopsBack) else None
            raise Unreachable(
                reply,
                classification,
                site_down=site_down,
                peer=peer,
                tls=tls,
                reply_for=reply_for,
                server=server,
                authentication=error.authentication,
                tls_failed=error.tls_failed,
            ) from None
        elsewhere = None
        if options.try_next_mx and len(destination.hops) > 1:
            elsewhere = functools.partial(self._elsewhere, destination, options, connection.host)
        return SmtpAgent(connection, destination.site, self._classifier, elsewhere, self._seven_bit)

    async def _elsewhere(
        self, destination: Destination, options: ClientOptions, first: str, current: ClientConnection
    ) -> ClientConnection | None:
        """A connection to the first host of `destination` other than `current`'s that takes
        one, from the `first` the agent reached on: those before it were passed over when the
        agent opened (down, or turning us away), and would cost each such message a failed
        connection. `current` is closed first (one connection at a time). None if none took it."""
        hosts = [hop.host for hop in destination.hops]
        start = hosts.index(first) if first in hosts else len(hosts)
        others = tuple(hop for hop in destination.hops[start:] if hop.host != current.host)
        site = destination.site
        if not others or options.mx_session_limit < 2 or self._paused.get(site, 0.0) > time.monotonic():
            return None  # (`current` is one session of the attempt: mx_session_limit 1 leaves no other)
        await current.quit()
        try:
            # The message has its answer already (a 4xx): a next host slow to greet is given
            # the connect timeout, not the reply timeout's minutes, for opening and greeting.
            async with asyncio.timeout(options.connect_timeout):
                return await ClientConnection.open(
                    dataclasses.replace(destination, hops=others),
                    self._resolver,
                    options,
                    avoid=current.address,
                    sessions=1,
                    own=self._own,
                )
        except LoopsBack:
            return None  # the site's other hosts are this node: none to go to, and none down
        except (ConnectFailed, TimeoutError) as error:
            reason = error.reply if isinstance(error, ConnectFailed) else f"no greeting in {options.connect_timeout:g}s"
            # Every message deferred there would wait as long again: for a while, none tries.
            now = time.monotonic()
            self._paused = {site: until for site, until in self._paused.items() if until > now}
            self._paused[site] = now + NEXT_MX_PAUSE
            _log.warning(
                "%s: after a 4xx from %s, no next MX host took a connection (%s): deferred recipients of this "
                "site wait for their retry for the next %gs",
                site,
                current.peer,
                reason,
                NEXT_MX_PAUSE,
            )
            return None


def too_many_recipients(reply: Reply) -> bool:
    """A RCPT refused only because the transaction has enough recipients (RFC 5321
    4.5.3.1.10): `452 4.5.3`, or a bare 452 (the code the RFC gives for it)."""
    return reply.code == 452 and reply.enhanced in (None, "4.5.3")


async def _send_all(
    connection: ClientConnection, envelope: client.Envelope, done: list[Reply] | None = None
) -> tuple[list[Reply], float]:
    """Every recipient's reply, over as many transactions as the server's recipient limit
    takes: those it refused as too many go again in the next transaction, while the last one
    delivered to somebody (a server that took none, or refused the data, would refuse them
    again: they keep their 452 and wait for the retry schedule). Raises ConnectionLost if
    the first transaction broke; a later break is the reply of that transaction's
    recipients, the deliveries before it standing. `done`, if given, is the list of replies
    (filled once the first transaction is answered, then kept up to date): a caller cancelled
    meanwhile reads there what the transactions before the cut one answered."""
    result, duration = await connection.send(envelope)
    replies = done if done is not None else []
    replies[:] = result.replies
    pending = [i for i, reply in enumerate(replies) if too_many_recipients(reply)]
    progress = any(reply.code < 300 for reply in replies)
    while pending and progress:
        rest = dataclasses.replace(envelope, recipients=[envelope.recipients[i] for i in pending])
        try:
            more, took = await connection.send(rest)
        except ConnectionLost as error:
            for index, reply in zip(pending, error.replies(len(pending)), strict=True):
                replies[index] = reply
            break
        duration += took
        for index, reply in zip(pending, more.replies, strict=True):
            replies[index] = reply
        progress = any(reply.code < 300 for reply in more.replies)
        pending = [i for i in pending if too_many_recipients(replies[i])]
    return replies, duration


def _client_envelope(work: Work) -> client.Envelope:
    envelope = work.message.envelope
    body = work.body
    return client.Envelope(
        sender=envelope.sender,
        recipients=[
            client.Recipient(r.address, tuple(r.notify) if r.notify else None, r.orcpt) for r in envelope.recipients
        ],
        body=body,
        eight_bit=not body.isascii(),
        smtputf8=envelope.smtputf8,
        ret=envelope.ret,
        envid=envelope.envid,
    )
