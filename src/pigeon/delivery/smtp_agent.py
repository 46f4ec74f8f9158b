"""The SMTP agent: leased messages over one outbound connection (`session.ClientConnection`).

One message per transaction; the connection is reused for the next. A server that takes
only so many recipients per transaction answers the rest `452 4.5.3` (RFC 5321 4.5.3.1.10);
they go in another transaction on the same connection at once, as many times as it takes,
rather than waiting for the retry schedule. What the peer cannot take at all (SMTPUTF8 it
lacks, over its SIZE, 8-bit data without 8BITMIME) is a permanent, explained refusal rather
than a protocol violation at the next hop. A connection that breaks mid-transaction is a
transient failure for every recipient of that message, and the agent is no longer usable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pigeon.delivery.agent import Unreachable, Work
from pigeon.delivery.classify import Classifier
from pigeon.delivery.egress import Source
from pigeon.delivery.mx import Resolver
from pigeon.delivery.routes import Destination
from pigeon.delivery.session import ClientConnection, ClientOptions, ConnectFailed, ConnectionLost
from pigeon.queue.attempt import Attempt
from pigeon.smtp import client
from pigeon.smtp.client import refusal_before_sending
from pigeon.smtp.replies import Reply


class SmtpAgent:
    batch = 1

    def __init__(self, connection: ClientConnection, site: str, classifier: Classifier) -> None:
        self._connection = connection
        self._site = site
        self._classifier = classifier

    def usable(self) -> bool:
        return self._connection.alive()

    async def deliver(self, work: Sequence[Work]) -> list[Attempt]:
        connection, site = self._connection, self._site
        attempts = []
        for item in work:  # one transaction each (batch is 1: a loop only to keep the interface)
            envelope = _client_envelope(item)
            count = len(envelope.recipients)
            refusal = refusal_before_sending(envelope, connection.capabilities)
            if refusal is not None:
                classification = self._classifier.classify(refusal)
                attempts.append(Attempt.same_for_all(refusal, count, classification, site, connection.peer))
                continue
            try:
                replies, duration = await _send_all(connection, envelope)
            except ConnectionLost as error:
                attempts.append(Attempt.same_for_all(error.reply, count, "", site, connection.peer))
                continue
            classes = self._classifier.classify_all(replies)
            passed_on = "DSN" in connection.capabilities
            attempts.append(
                Attempt(replies, classes, site, connection.peer, connection.tls, duration, passed_on=passed_on)
            )
        return attempts

    async def close(self) -> None:
        await self._connection.quit()


class SmtpAgents:
    """Opens an `SmtpAgent` for a destination of SMTP hops, from an egress source: its
    connection binds to the source's address and gives its EHLO name."""

    def __init__(
        self, resolver: Resolver, options: ClientOptions, classifier: Classifier, sources: Sequence[Source] = ()
    ) -> None:
        self._resolver = resolver
        self._options = options
        self._classifier = classifier
        self._sources = {
            s.name: dataclasses.replace(options, bind=s.bind, helo_name=s.ehlo or options.helo_name) for s in sources
        }

    async def open(self, destination: Destination, source: str | None = None) -> SmtpAgent:
        options = self._options if source is None else self._sources.get(source)
        if options is None:  # the ready queue outlived its source (cannot happen: sources change at restart)
            raise Unreachable(Reply(451, "4.3.5", (f"egress source {source!r} is not configured ([[source]])",)))
        try:
            connection = await ClientConnection.open(destination, self._resolver, options)
        except ConnectFailed as error:
            reply = error.reply
            classification = self._classifier.classify(reply) if reply.code >= 500 else ""
            raise Unreachable(reply, classification, site_down=error.site_down) from None
        return SmtpAgent(connection, destination.site, self._classifier)


def too_many_recipients(reply: Reply) -> bool:
    """A RCPT refused only because the transaction has enough recipients (RFC 5321
    4.5.3.1.10): `452 4.5.3`, or a bare 452 (the code the RFC gives for it)."""
    return reply.code == 452 and reply.enhanced in (None, "4.5.3")


async def _send_all(connection: ClientConnection, envelope: client.Envelope) -> tuple[list[Reply], float]:
    """Every recipient's reply, over as many transactions as the server's recipient limit
    takes: those it refused as too many go again in the next transaction, while the last one
    delivered to somebody (a server that took none, or refused the data, would refuse them
    again: they keep their 452 and wait for the retry schedule). Raises ConnectionLost if
    the first transaction broke; a later break is the reply of that transaction's
    recipients, the deliveries before it standing."""
    result, duration = await connection.send(envelope)
    replies = list(result.replies)
    pending = [i for i, reply in enumerate(replies) if too_many_recipients(reply)]
    progress = any(reply.code < 300 for reply in replies)
    while pending and progress:
        rest = dataclasses.replace(envelope, recipients=[envelope.recipients[i] for i in pending])
        try:
            more, took = await connection.send(rest)
        except ConnectionLost as error:
            for index in pending:
                replies[index] = error.reply
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
