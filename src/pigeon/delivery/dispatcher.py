"""The dispatcher: ready queues, the connections that drain them, and the shaping limits.

For each ready queue it keeps up to `connection_limit` connection tasks. A task opens a
connection (`session.ClientConnection`), then takes messages off the queue one after the
other, up to `max_deliveries_per_connection`, until the queue has been empty for
`idle_timeout`. Before each message the site's rate limit (GCRA) may make it wait.
Every attempt's outcome goes to the queue's settlement; the dispatcher itself never
decides what a reply means.

How many connections: KumoMTA's curve, `ceil(limit * (1 - e^(-0.023 * queued)))`: one
connection for a trickle, the full limit only for a real backlog.

A connection that cannot be opened costs the message it was opened for one attempt.
After `connection_failures_before_delay` such failures in a row, everything waiting in
that ready queue is deferred at once: a dead site should not be tried message by message.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from pigeon.delivery.mx import Resolver
from pigeon.delivery.outcome import Attempt
from pigeon.delivery.routes import Destination
from pigeon.delivery.session import ClientConnection, ClientOptions, ConnectFailed, ConnectionLost
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Target, Verdict
from pigeon.message import format_id
from pigeon.queue.ready import ReadyQueue
from pigeon.queue.state import Entry, StaleTransition, State, transition
from pigeon.shaping.gcra import Gcra, Rate
from pigeon.smtp import client
from pigeon.smtp.client import refusal_before_sending
from pigeon.smtp.replies import Reply
from pigeon.spool.spool import SpoolError

_log = logging.getLogger(__name__)

Settle = Callable[[Entry, int, Attempt], None]
_TARGET_BATCH: Final = 64  # messages handed to an inbound target at once
BodyLoader = Callable[[Entry], bytes]


@dataclass(frozen=True, slots=True)
class Shaping:
    """Limits for one destination (from `[delivery]`, refined by `[[shaping]]`)."""

    connection_limit: int = 32
    max_deliveries_per_connection: int = 1000
    idle_timeout: float = 10.0
    max_message_rate: Rate | None = None
    connection_failures_before_delay: int = 3


def ideal_connections(queued: int, limit: int) -> int:
    return min(queued, math.ceil(limit * (1 - math.exp(-0.023 * queued))))


class Dispatcher:
    """Delivers what the scheduler makes ready."""

    def __init__(
        self,
        *,
        source: str,
        resolver: Resolver,
        options: ClientOptions,
        shaping: Callable[[str], Shaping],
        load_body: BodyLoader,
        settle: Settle,
        targets: Mapping[str, Target] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._targets = targets or {}
        self._resolver = resolver
        self._options = options
        self._shaping = shaping
        self._load_body = load_body
        self._settle = settle
        self._clock = clock
        self.queues: dict[str, ReadyQueue] = {}
        self.counted: Callable[[str, Verdict], None] | None = None
        """Told each inbound target's answer to SMTP-routed mail (for the inbound metrics)."""
        self.held: Callable[[str], bool] = lambda site: False
        """Whether an operator suspended deliveries to a site (set by the admin room)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.in_flight = 0

    # --- the scheduler's side ---------------------------------------------------------------
    def enqueue(self, entry: Entry, destination: Destination, domain: str) -> None:
        """Put a READY message in its ready queue and make sure someone is working on it."""
        path = f"{self._source}->{destination.site}"
        queue = self.queues.get(path)
        if queue is None:
            shaping = self._shaping(domain)
            limiter = Gcra(shaping.max_message_rate) if shaping.max_message_rate else None
            queue = self.queues[path] = ReadyQueue(path, destination, shaping, limiter)
        entry.site = destination.site
        queue.put(entry)
        self._kick(queue)

    def expired(self, is_expired: Callable[[Entry], bool]) -> list[Entry]:
        """Take every expired message out of the ready queues (the caller settles them)."""
        found: list[Entry] = []
        for queue in self.queues.values():
            found += queue.remove_if(is_expired)
        return found

    async def drain(self, grace: float) -> None:
        """Stop starting transactions; let running ones finish for up to `grace` seconds."""
        self._stopping = True
        for queue in self.queues.values():
            queue.wake_all()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)

    @property
    def connections(self) -> int:
        return sum(q.connections for q in self.queues.values())

    def kick_all(self) -> None:
        """Start connections wherever mail waits (after a site's suspension ended)."""
        for queue in self.queues.values():
            if len(queue):
                self._kick(queue)

    # --- connections -----------------------------------------------------------------------
    def _kick(self, queue: ReadyQueue) -> None:
        if self._stopping or self.held(queue.destination.site):
            return
        shaping: Shaping = queue.shaping
        want = ideal_connections(len(queue), shaping.connection_limit)
        while queue.connections < max(1, want) and queue.connections < shaping.connection_limit:
            queue.connections += 1
            task = asyncio.create_task(self._work(queue), name=f"deliver {queue.path}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _work(self, queue: ReadyQueue) -> None:
        if queue.destination.target is not None:
            await self._hand_over(queue, queue.destination.target)
            return
        shaping: Shaping = queue.shaping
        connection: ClientConnection | None = None
        try:
            if not len(queue):
                return
            try:
                connection = await ClientConnection.open(queue.destination, self._resolver, self._options)
            except ConnectFailed as error:
                self._connection_failed(queue, shaping, error.reply)
                return
            queue.failures = 0
            while connection.deliveries < shaping.max_deliveries_per_connection and not self._stopping:
                if self.held(queue.destination.site):
                    break  # an operator suspended the site: what waits stays in the ready queue
                entry = await queue.take(shaping.idle_timeout)
                if entry is None:
                    break
                if not connection.alive():
                    # The server hung up while we were idle: a new connection, not a failure.
                    connection.close()
                    try:
                        connection = await ClientConnection.open(queue.destination, self._resolver, self._options)
                    except ConnectFailed as error:
                        queue.put_front(entry)
                        connection = None
                        self._connection_failed(queue, shaping, error.reply)
                        return
                if not await self._deliver(queue, connection, entry):
                    break
        except Exception:
            _log.exception("delivery to %s failed unexpectedly", queue.path)
        finally:
            queue.connections -= 1
            if connection is not None:
                await connection.quit()
            if len(queue) and not self._stopping:
                self._kick(queue)

    async def _deliver(self, queue: ReadyQueue, connection: ClientConnection, entry: Entry) -> bool:
        """One message over an open connection. False when the connection is no longer usable."""
        try:
            generation = transition(entry, State.READY, entry.generation, State.IN_FLIGHT)
        except StaleTransition:
            return True  # someone else took it (expired, admin): nothing to do
        message = entry.message
        count = len(message.envelope.recipients)
        self.in_flight += 1
        try:
            if queue.limiter is not None:
                wait = queue.limiter.reserve(self._clock())
                if wait > 0:
                    await asyncio.sleep(wait)
            try:
                body = self._load_body(entry)
            except SpoolError as error:
                _log.error("message %016x: %s", message.id, error)
                self._settle(entry, generation, Attempt.same_for_all(error.reply, count, queue.destination.site))
                return True
            envelope = _client_envelope(entry, body)
            refusal = refusal_before_sending(envelope, connection.capabilities)
            if refusal is not None:
                attempt = Attempt.same_for_all(refusal, count, queue.destination.site, connection.peer)
                self._settle(entry, generation, attempt)
                return True
            try:
                result, duration = await connection.send(envelope)
            except ConnectionLost as error:
                site = queue.destination.site
                self._settle(entry, generation, Attempt.same_for_all(error.reply, count, site, connection.peer))
                return False
            self._settle(
                entry,
                generation,
                Attempt(result.replies, queue.destination.site, connection.peer, connection.tls, duration),
            )
            return not connection.broken
        finally:
            self.in_flight -= 1

    async def _hand_over(self, queue: ReadyQueue, name: str) -> None:
        """Mail of an `[[inbound]]` route: batches handed to the application's target; its
        answers become replies (250, 451, 550) so the queue retries and bounces as usual."""
        shaping: Shaping = queue.shaping
        target = self._targets.get(name)
        try:
            while not self._stopping and not self.held(queue.destination.site):
                entry = await queue.take(shaping.idle_timeout)
                if entry is None:
                    break
                batch = [entry]
                while len(batch) < _TARGET_BATCH and (more := queue.take_nowait()) is not None:
                    batch.append(more)
                taken: list[tuple[Entry, int]] = []
                for entry in batch:
                    try:
                        taken.append((entry, transition(entry, State.READY, entry.generation, State.IN_FLIGHT)))
                    except StaleTransition:
                        continue
                self.in_flight += len(taken)
                settled: set[int] = set()
                try:
                    await self._hand_batch(queue, name, target, taken, settled)
                except Exception as error:
                    # Whatever went wrong, every message taken gets an outcome: left IN_FLIGHT
                    # it would wait for a restart, out of reach of admin operations too.
                    _log.exception("handing over to target %s failed unexpectedly", name)
                    reply = Reply(451, "4.3.0", (f"{name}: {type(error).__name__}: {error}",))
                    for entry, generation in taken:
                        if id(entry) not in settled:
                            count = len(entry.message.envelope.recipients)
                            self._settle(entry, generation, Attempt.same_for_all(reply, count, queue.destination.site))
                finally:
                    self.in_flight -= len(taken)
        except Exception:
            _log.exception("handing over to target %s failed unexpectedly", name)
        finally:
            queue.connections -= 1
            if len(queue) and not self._stopping:
                self._kick(queue)

    async def _hand_batch(
        self, queue: ReadyQueue, name: str, target: Target | None, taken: list[tuple[Entry, int]], settled: set[int]
    ) -> None:
        site = queue.destination.site

        def settle(entry: Entry, generation: int, attempt: Attempt) -> None:
            settled.add(id(entry))  # the caller settles whatever this batch did not
            self._settle(entry, generation, attempt)

        messages: list[tuple[Entry, int, InboundMessage]] = []
        for entry, generation in taken:
            count = len(entry.message.envelope.recipients)
            if target is None:
                reply = Reply(451, "4.3.5", (f"no [[target]] called {name!r} in this node's configuration",))
                settle(entry, generation, Attempt.same_for_all(reply, count, site))
                continue
            try:
                body = self._load_body(entry)
            except SpoolError as error:
                settle(entry, generation, Attempt.same_for_all(error.reply, count, site))
                continue
            envelope = entry.message.envelope
            inbound = InboundMessage.of(
                body,
                "smtp",
                entry.message.created,
                spool_id=format_id(entry.message.id),
                sender=envelope.sender,
                recipients=tuple(r.address for r in envelope.recipients),
            )
            messages.append((entry, generation, inbound))
        if not messages or target is None:
            return
        started = time.monotonic()
        answers = await target.deliver_many([m for _, _, m in messages])
        duration = (time.monotonic() - started) / len(messages)
        if self.counted is not None:
            for answer in answers:
                self.counted(name, answer.verdict)
        for (entry, generation, _), answer in zip(messages, answers, strict=True):
            if answer.verdict is Verdict.ACCEPTED:
                reply = Reply(250, "2.0.0", (f"{name}: {answer.detail}",))
            elif answer.verdict is Verdict.PERMANENT:
                reply = Reply(550, "5.0.0", (f"{name}: {answer.detail}",))
            else:
                reply = Reply(451, "4.3.0", (f"{name}: {answer.detail}",))
            count = len(entry.message.envelope.recipients)
            settle(entry, generation, Attempt([reply] * count, site, name, None, duration))

    def _connection_failed(self, queue: ReadyQueue, shaping: Shaping, reply: Reply) -> None:
        queue.failures += 1
        victims = [queue.take_nowait()]
        if queue.failures >= shaping.connection_failures_before_delay:
            # The site is down: defer everything waiting for it rather than trying one by one.
            while (entry := queue.take_nowait()) is not None:
                victims.append(entry)
            queue.failures = 0
        for entry in victims:
            if entry is None:
                continue
            try:
                generation = transition(entry, State.READY, entry.generation, State.IN_FLIGHT)
            except StaleTransition:
                continue
            count = len(entry.message.envelope.recipients)
            self._settle(entry, generation, Attempt.same_for_all(reply, count, queue.destination.site))


def _client_envelope(entry: Entry, body: bytes) -> client.Envelope:
    envelope = entry.message.envelope
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
