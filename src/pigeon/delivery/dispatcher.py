"""The dispatcher: the connections that drain the ready queues, within the shaping limits.

For each ready queue (told by the queue when it has work) it keeps up to `connection_limit`
connection tasks. A task opens an agent for the queue's destination (an SMTP connection, or an
application's target: see `agent`), then takes leased messages off the queue, `batch` at a
time, up to `max_deliveries_per_connection`, until the queue has been empty for `idle_timeout`
(half a second when every slot of its path is taken: `_next`). A ready queue is an egress path,
`source->site`: its connections leave from its source (`pigeon.delivery.egress`), and its
attempts say so. Both limits are asked of the throttles (`pigeon.shaping.throttles`), which
hold them for the node, or for the cluster through Redis, per path (`limit_key`): a connection
task first takes a connection slot of its path (if none is free, the lane asks again
`_REFUSED_RETRY` later), and each batch of messages books its slots of the path's rate (GCRA),
waiting for them.

Right before a message is handed to the agent, `begin(lease)` asks the queue whether the
lease still holds: an operator may have bounced, suspended or rebound the message while it
waited for its turn, and then it is not sent. From `begin` on, nothing takes the message
back: its attempt is reported with the lease it was taken with, and the queue alone decides
what the replies mean.

A policy module's delivery hooks (`pigeon.policy.delivery`) are asked between `begin` and
the agent (`before_delivery`: send, defer, fail or reroute) and between the agent and the
report (`on_delivery_outcome`: reclassify). A hook's answer becomes an attempt (or a
reroute) reported with the message's lease like any other; without such hooks nothing is
asked and nothing is built.

Shaping that reacts (`reactor`, `pigeon.delivery.reactor`): every attempt with a reply of
400 or above (a 4xx its recipient then got past at the next MX host included:
`Attempt.passed_over`), and every connection that failed with a reply, is shown to the
reactor, whose rules may start an effect on the queue's site, path or provider. While a
suspension lives the lane takes nothing (as under an operator's site suspension: mail waits
in the ready queue, untried) and a message that got the reply is tried again when it ends;
while a limit lives, the lane's connection limit and rate are the lower ones (a connection
over the lowered limit ends after its batch); while a bounce lives, what waits is bounced.
When an effect ends the board calls `kick_all`.

How many connections: KumoMTA's curve, `ceil(limit * (1 - e^(-0.023 * queued)))`: one
connection for a trickle, the full limit only for a real backlog.

A connection that cannot be opened costs the message it was opened for one attempt.
After `connection_failures_before_delay` such failures in a row, everything waiting in
that ready queue is attempted at once with that failure.

A dead site (no host took the connection: `Unreachable.site_down`) is not tried message by
message: it is *down* (`pigeon.delivery.sites`) from that failure on. The message the
connection was for is deferred with that failure, and what else waits for the site, in each
of its ready queues, with `451 4.4.1 not tried: <site> is down`, all until the next probe and
with no attempt counted; each is reported with its lease like any attempt, so the queue
settles it as it settles every other. Mail that comes ready meanwhile is deferred alike. At
the probe's time that mail is due again, and the first connection asked for is the probe
(one, for the whole site: the rest waits in the ready queue for its verdict; a probe given
up before it connects, its mail gone meanwhile, hands the probe on to the site's other
queues with mail). If it opens,
the site is up and the mail flows on it and on as many connections as the queues want; if
not, the message it was for is deferred with its failure and the rest "not tried", to the
next probe, twice as far off. Each message deferred "not tried" keeps the site's last
connection error as its `last_response` (`Attempt.cause`): what `pigeon inspect` and an
expiry's DSN name is why the site is down, not only that it is. An operator's retry
makes every down site's probe due now (`probe_down_sites`): the host may be back. A reload
that routes a domain elsewhere makes its mail deferred to a probe due now, and forgets a
down site no route leads to any more (`pigeon.node.outbound.Outbound.take_routes`).

A smart host that refuses a route's credentials (`Unreachable.authentication`: a wrong
password, AUTH it does not offer) is held the same way, under the site and the route's user
(`_health_key`): its mail waits, no attempt counted, for a probe (one connection, one AUTH)
rather than each connection trying the password again, which a provider counts towards
locking the account. One WARNING says so when the hold begins. Until a connection has
authenticated, a route that authenticates opens one connection at a time, so that a backlog
does not send a burst of AUTHs with a wrong password. A reload that changes the route's
credentials lifts the hold at once (`credentials_changed`). Like a dead site, the hold is
this worker's own: with N workers, up to N AUTHs per wave (README, smart hosts).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Final

from pigeon.delivery.agent import Agent, Opener, Unreachable, Work
from pigeon.delivery.reactor import BOUNCE_CLASS, Reactor, bounce_reply, held_text
from pigeon.delivery.routes import Destination, Kind
from pigeon.delivery.sites import SiteHealth, not_tried
from pigeon.message import Message, format_id
from pigeon.policy.answers import Reroute
from pigeon.policy.delivery import DeliveryHooks
from pigeon.queue.attempt import Attempt
from pigeon.queue.ready import ReadyQueue
from pigeon.queue.state import Lease
from pigeon.shaping.effects import Effect
from pigeon.shaping.gcra import Rate
from pigeon.shaping.rules import Shaping, ShapingQuery, site_key, source_key
from pigeon.shaping.throttles import Hold, Throttles
from pigeon.smtp.client_session import AUTH_NEEDS_TLS_CODE
from pigeon.smtp.replies import Reply
from pigeon.spool.spool import SpoolError

_log = logging.getLogger(__name__)
_INTERNAL: Final = Reply(451, "4.3.0", ("internal error during delivery; will try again",))
_AFTER_A_CRASH: Final = 1.0  # seconds before a connection task that failed unexpectedly is replaced
# Seconds before a lane whose site had no connection slot free asks again (a slot other
# workers or nodes hold frees without telling us).
_REFUSED_RETRY: Final = 0.1
_AFTER_YIELDING: Final = 1.0  # a lane whose connection made room for another waits this long to ask again
# Seconds an idle connection keeps its slot when every slot of its path is taken (see `_next`).
_MAKE_ROOM: Final = 0.5
_MESSAGES_PER_CONNECTION: Final = 5.0  # a second, to a remote MX: what one connection is counted to carry
_RATE_RECHECK: Final = 0.5  # seconds: a connection waiting for a rate slot looks at the rate again this often


def ideal_connections(queued: int, limit: int) -> int:
    return min(queued, math.ceil(limit * (1 - math.exp(-0.023 * queued))))


def rate_connections(rate: Rate) -> int:
    """How many connections a message rate can keep busy. A connection waiting for its rate
    slot holds the messages it took: more of them would only sit idle at the receiving MX, and
    hold mail that an operator's move or a reload could otherwise still move."""
    return max(1, math.ceil(rate.per_second / _MESSAGES_PER_CONNECTION))


def limit_key(site: str, source: str | None = None) -> str:
    """The throttle key of a path's own limits: per source and site (a provider's sites share
    `provider:<name>`: `Shaping.key`, from `pigeon.shaping.rules`); the implicit source (None)
    keeps the site's key, as before sources existed."""
    return source_key(source, site_key(site))


def shaping_query(queue: ReadyQueue) -> ShapingQuery:
    """What a ready queue's limits are looked up by."""
    destination: Destination = queue.destination
    hosts = tuple(hop.host for hop in destination.hops)
    return ShapingQuery(
        queue.domain, queue.site, hosts, queue.source, security=destination.security, shared=not queue.own
    )


class _Lane:
    """The delivery side of one ready queue: its limits and its connections."""

    __slots__ = (
        "connections",
        "deferring",
        "failures",
        "key",
        "queue",
        "reaction_keys",
        "refused",
        "rekey",
        "shaping",
        "source",
    )

    def __init__(self, queue: ReadyQueue, shaping: Shaping, reaction_keys: tuple[str, ...] = ()) -> None:
        self.queue = queue
        self.shaping = shaping
        self.source: str | None = queue.source
        self.key = shaping.key or limit_key(queue.site, queue.source)
        self.reaction_keys = reaction_keys  # the keys reactions' effects on this queue are on
        self.connections = 0  # connection tasks running
        self.failures = 0  # consecutive failed connection attempts
        self.refused: asyncio.TimerHandle | None = None  # no connection slot was free: asks again then
        self.rekey: str | None = None  # a reload's new limit key, taken once no connection is open
        self.deferring = False  # its site is down: deferring what waits is on its way (call_soon)


class _Connection:
    """What one connection task holds, for its end (`Dispatcher._end`) to give back or close
    whichever way the task ended."""

    __slots__ = ("agent", "begun", "crashed", "hold", "probe", "taken")

    def __init__(self, hold: Hold, probe: bool) -> None:
        self.hold = hold
        self.probe = probe  # it still has to say whether the site's probe opened (`health`)
        self.agent: Agent | None = None
        self.taken: list[Lease] = []  # leased, not begun: given back if the task ends
        self.begun: list[Work] = []  # begun, not reported: reported as a transient failure if it fails
        self.crashed = False  # it ended on a bug, not on the peer


# Defaults of `Dispatcher`'s hooks are functions, not lambdas: a lambda as a parameter's
# default stops mypyc (setup.py) with an internal error, in ready.py and settlement.py too.
def _never_held(site: str) -> bool:
    return False


def _no_reroute(lease: Lease, domain: str) -> None:
    return None


class Dispatcher:
    """Delivers what the queue makes ready."""

    def __init__(
        self,
        *,
        agents: Mapping[Kind, Opener],
        shaping: Callable[[ShapingQuery], Shaping],
        begin: Callable[[Lease], Message | None],
        report: Callable[[Lease, Attempt], asyncio.Future[None] | None],
        body: Callable[[Message], bytes],
        held: Callable[[str], bool] = _never_held,
        hooks: DeliveryHooks | None = None,
        reroute: Callable[[Lease, str], None] = _no_reroute,
        throttles: Throttles | None = None,
        reactor: Reactor | None = None,
        sites: SiteHealth | None = None,
    ) -> None:
        self._agents = agents
        self.health = sites if sites is not None else SiteHealth()
        """Which sites are down (this worker's view), and when each is probed."""
        self._reactor = reactor
        """Shaping that reacts to the replies (None: no rules)."""
        self._throttles = throttles if throttles is not None else Throttles()
        """Connection slots and message rates, per limit key."""
        self._shaping = shaping
        self._begin = begin
        """The queue: is this lease still good to send? (marks the message as being sent)"""
        self._report = report
        """The queue: an attempt's outcome, with the lease it was taken with; gives a future
        done once that outcome is durable."""
        self._body = body
        """A message's bytes as they go out."""
        self._held = held
        """Whether an operator suspended deliveries to a site."""
        self._hooks = hooks
        """The policy's delivery hooks, if a policy module is configured."""
        self._reroute = reroute
        """The queue: route this leased message again, as this domain (a policy's Reroute)."""
        self._lanes: dict[str, _Lane] = {}
        # Health keys of routes that authenticate whose credentials a connection got through
        # with: until one has, their lanes open one connection at a time (`_start`).
        self._authenticated: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.in_flight = 0

    # --- the queue's side ---------------------------------------------------------------
    def kick(self, queue: ReadyQueue) -> None:
        """`queue` has mail: make sure enough connections work on it."""
        lane = self._lanes.get(queue.path)
        if lane is None or lane.queue is not queue:  # (a queue forgotten, then opened again)
            keys = self._reactor.keys(queue.egress, queue.site) if self._reactor is not None else ()
            lane = self._lanes[queue.path] = _Lane(queue, self._shaping(shaping_query(queue)), keys)
        self._start(lane)

    def replace_shaping(self, shaping: Callable[[ShapingQuery], Shaping]) -> None:
        """New limits (a reload): every ready queue's are looked up again. Open connections
        take them at their next batch (one over a lowered limit ends after it). A queue whose
        limit key changes (a provider-wide limit added, say) keeps counting its connections
        under the old one until none is open, so no slot is counted under two keys."""
        self._shaping = shaping
        for lane in self._lanes.values():
            lane.shaping = shaping(shaping_query(lane.queue))
            key = lane.shaping.key or limit_key(lane.queue.site, lane.queue.source)
            if lane.connections == 0:
                lane.key, lane.rekey = key, None
            else:
                lane.rekey = key if key != lane.key else None
        self.kick_all()  # a raised limit lets more connections start

    def idle_timeout_of(self, queue: ReadyQueue) -> float | None:
        """How long an empty ready queue may stay idle before it is forgotten (its site's
        `idle_timeout`); None while its lane is busy: a connection open or about to ask
        again, or a shaping effect on it (the API's row is where that effect shows); and
        None while its site is down or an operator's site suspension holds it, for the same
        reason: its row (`down`, `suspended_by`) is listed even with nothing queued."""
        if self.health.is_down(_health_key(queue)) or self._held(queue.site):
            return None
        lane = self._lanes.get(queue.path)
        if lane is None or lane.queue is not queue:
            return 0.0  # never kicked: nothing of ours holds it
        if lane.connections or lane.refused is not None or self.effects_on(queue.path):
            return None
        return lane.shaping.idle_timeout

    def forget(self, queue: ReadyQueue) -> None:
        """A ready queue was forgotten (empty and idle): so is its lane."""
        lane = self._lanes.get(queue.path)
        if lane is not None and lane.queue is queue and not lane.connections:
            del self._lanes[queue.path]

    def kick_all(self) -> None:
        """Start connections wherever mail waits (after a site's suspension ended)."""
        for lane in self._lanes.values():
            if len(lane.queue):
                self._start(lane)

    def halt(self) -> None:
        """Stop starting transactions (the node stops): idle connections close, and what a
        connection took and has not begun goes back to its queue."""
        self._stopping = True
        for lane in self._lanes.values():
            lane.queue.wake_all()

    async def drain(self, grace: float) -> None:
        """Stop starting transactions; let running ones finish for up to `grace` seconds."""
        self.halt()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)

    @property
    def connections(self) -> int:
        return sum(lane.connections for lane in self._lanes.values())

    def connections_to(self, path: str) -> int:
        lane = self._lanes.get(path)
        return lane.connections if lane is not None else 0

    def provider_of(self, path: str) -> str | None:
        """The provider a ready queue is shaped as (None: none, or no connection asked yet)."""
        lane = self._lanes.get(path)
        return lane.shaping.provider if lane is not None else None

    def effects_on(self, path: str) -> list[Effect]:
        """The reactions' effects that live on a ready queue (its site, path or provider)."""
        lane = self._lanes.get(path)
        if lane is None or self._reactor is None:
            return []
        return self._reactor.board.of(lane.reaction_keys)

    def holding(self, queue: ReadyQueue) -> str | None:
        """What holds the mail waiting in `queue`, if a reaction's suspension does
        (`reactor.held_text`): what an expiry there names, and `pigeon inspect` shows. Asked
        only of a message that expires or is inspected, never on the delivery path."""
        lane = self._lanes.get(queue.path)
        if lane is None or lane.queue is not queue or self._reactor is None:
            return None
        effect = self._reactor.suspension(lane.reaction_keys)
        return held_text(effect) if effect is not None else None

    def site_down(self, site: str) -> bool:
        """Whether this worker found `site` down from the implicit source (its mail waits for a
        probe); `source->site` for a `[[source]]`'s path to it."""
        return self.health.is_down(site)

    def queue_down(self, queue: ReadyQueue) -> bool:
        """Whether this worker found `queue`'s site down from its source."""
        return self.health.is_down(_health_key(queue))

    def probe_down_sites(self) -> None:
        """An operator retried mail: every site this worker finds down probes at once (one
        connection each, when mail for it is ready), not at its scheduled probe. A host that
        is back then takes its mail without waiting out the interval; one still down is
        deferred again, its backoff going on from where it stood."""
        for site in self.health.probe_now():
            _log.info("site %s is down: an operator's retry makes its probe due now", site)
            self._start_site(site)  # (mail already waiting in its ready queues asks for it now)

    def credentials_changed(self, site: str) -> list[tuple[str, float]]:
        """A reload changed the credentials of a route to `site` (its smart host, `host:port`):
        a hold for a refused AUTH there is lifted (the new password is tried at once, by the
        mail that comes ready), and the new credentials are not yet known to work (one
        connection first). Each lifted hold's health key and the seconds until its probe: its
        held mail was deferred to then, and the caller makes it due now
        (`Admin.retry_deferred_to`)."""
        lifted = []
        for key in [*self.health.down_sites(), *self._authenticated]:
            if _auth_site(key) == site:
                self._authenticated.discard(key)
                wait = self.health.until_probe(key)
                if self.health.connected(key) is not None:
                    _log.info("site %s: a reload changed the route's credentials: its mail goes again", key)
                    lifted.append((key, wait))
                    self._start_site(key)
        return lifted

    def sites(self) -> Iterator[tuple[str, str | None, int, int]]:
        """(site, source, messages waiting, connections) of every ready queue (source None: the
        implicit one)."""
        for lane in self._lanes.values():
            yield lane.queue.site, lane.queue.source, len(lane.queue), lane.connections

    # --- connections -----------------------------------------------------------------------
    def _start(self, lane: _Lane) -> None:
        queue = lane.queue
        if lane.connections >= len(queue) or self._stopping or self._is_held(lane) or lane.refused:
            return  # (as many connections as messages: the usual case, checked first)
        reactor = self._reactor
        if reactor is not None and (bouncing := reactor.bouncing(lane.reaction_keys)) is not None:
            # (not from within the queue's put, which called this)
            asyncio.get_running_loop().call_soon(self._bounce_waiting, lane, bouncing)
            return
        health, key = self.health, _health_key(queue)
        if health.is_down(key):
            if health.probe(key):
                self._launch(lane, probe=True)  # one connection for the whole site: the probe
            elif not health.probing(key) and not lane.deferring:
                # Not from within the queue's put, which called this; once for a burst of mail.
                lane.deferring = True
                asyncio.get_running_loop().call_soon(self._defer_waiting, lane)
            return  # (while a probe is under way, the mail waits for its verdict)
        shaping = self._shaping_of(lane)
        limit = shaping.connection_limit
        if queue.destination.auth is not None and key not in self._authenticated:
            limit = 1  # (credentials not yet known to work: one AUTH at a time, not a burst of them)
        want = ideal_connections(len(queue), limit)
        if shaping.max_message_rate is not None:
            want = min(want, rate_connections(shaping.max_message_rate))
        while lane.connections < max(1, want) and lane.connections < limit:
            self._launch(lane)

    def _launch(self, lane: _Lane, *, probe: bool = False) -> None:
        lane.connections += 1
        task = asyncio.create_task(self._work(lane, probe), name=f"deliver {lane.queue.path}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _is_held(self, lane: _Lane) -> bool:
        """Whether the lane takes nothing now: an operator's suspension, or a reaction's."""
        if self._held(lane.queue.site):
            return True
        return self._reactor is not None and self._reactor.suspended(lane.reaction_keys)

    def _shaping_of(self, lane: _Lane) -> Shaping:
        """The lane's limits, lowered by the reactions' limit effects that live."""
        reactor = self._reactor
        if reactor is None or not reactor.board:
            return lane.shaping
        connections, rate = reactor.limits(lane.reaction_keys)
        if connections is None and rate is None:
            return lane.shaping
        shaping = lane.shaping
        if connections is not None and connections < shaping.connection_limit:
            shaping = replace(shaping, connection_limit=connections)
        current = shaping.max_message_rate
        if rate is not None and (current is None or rate.per_second < current.per_second):
            shaping = replace(shaping, max_message_rate=rate)
        return shaping

    async def _next(self, queue: ReadyQueue, key: str, shaping: Shaping) -> Lease | None:
        """The next message for an open connection; None once the queue has been empty for
        `idle_timeout`, or for `_MAKE_ROOM` when the path's limit is full, or at once when the
        node stops (a graceful stop must not wait for idle connections): an idle connection
        then gives its slot back, for another lane, worker or node may be waiting for one
        (with `connection_limit = 1` and two workers, holding it idle stalled the other
        worker's mail for the whole `idle_timeout`)."""
        waited = 0.0
        while True:
            step = min(_MAKE_ROOM, shaping.idle_timeout - waited)
            lease = await queue.take(step)
            if lease is not None:
                return lease
            if self._stopping:
                return None  # woken by `drain`: an idle connection closes now, not after idle_timeout
            waited += step
            if waited >= shaping.idle_timeout or self._throttles.crowded(key, shaping.connection_limit):
                return None

    async def _admit(self, lane: _Lane, rate: Rate, count: int) -> None:
        """Wait until `count` messages may go at `rate`. Booked per rate: when the rate changes
        (a limit effect begins or ends, a reload), what was booked at the old one does not hold
        the new one back, and a connection waiting for a slot asks again at the new rate."""
        while True:
            wait = await self._throttles.admit(f"{lane.key}@{rate.per_second:g}/s", rate, count)
            while wait > 0:
                step = min(wait, _RATE_RECHECK)
                await asyncio.sleep(step)
                wait -= step
                current = self._shaping_of(lane).max_message_rate
                if current != rate:
                    break
            else:
                return
            if current is None:
                return
            rate = current

    def _retry_start(self, lane: _Lane) -> None:
        lane.refused = None
        self._start(lane)

    async def _work(self, lane: _Lane, probe: bool = False) -> None:
        """One connection's life. A `probe` (its site is down) reports whether it opened to
        `health`; one that never tried (no slot, no mail left, a stop) gives the probe up."""
        queue, shaping = lane.queue, self._shaping_of(lane)
        try:
            hold = await self._throttles.connect(lane.key, shaping.connection_limit) if len(queue) else None
        except Exception:  # a bug: the lane asks again later, as if refused
            _log.exception("asking for a connection to %s failed unexpectedly", queue.path)
            hold = None
        except BaseException:
            lane.connections -= 1
            if probe:
                self._probe_given_up(lane)
            raise
        if hold is None:
            lane.connections -= 1
            if probe:
                self._probe_given_up(lane)
            if len(queue) and not self._stopping and lane.refused is None:
                # Every slot is held elsewhere (other workers, other nodes): ask again shortly.
                loop = asyncio.get_running_loop()
                lane.refused = loop.call_later(_REFUSED_RETRY, self._retry_start, lane)
            return
        connection = _Connection(hold, probe)
        stop: BaseException | None = None
        try:
            await self._run(lane, shaping, connection)
        except Exception:
            _log.exception("delivery to %s failed unexpectedly", queue.path)
            connection.crashed = True
            for work in connection.begun:  # every message begun gets an outcome, or it would wait for a restart
                count = len(work.message.envelope.recipients)
                self._report_from(lane, work.lease, Attempt.same_for_all(_INTERNAL, count, "", queue.site))
        except BaseException as error:  # cancelled (a stop): the connection ends all the same, first
            stop = error
        # Not a `finally`: compiled by mypyc, a `finally` that awaits leaves the exception it
        # ran for set as sys.exc_info() for every other task, and one that ends normally raises
        # whatever sys.exc_info() then holds (tests/unit/test_compiled_awaits.py).
        await self._end(lane, connection)
        if stop is not None:
            raise stop

    async def _run(self, lane: _Lane, shaping: Shaping, connection: _Connection) -> None:
        """Open a connection and deliver on it until the queue runs dry, a limit says stop, or
        the connection breaks (`_work` ends it, whatever happened)."""
        queue, hold = lane.queue, connection.hold
        destination: Destination = queue.destination
        # Outcomes of the last batch, being written. The next batch waits for the one before:
        # a kill -9 can then deliver again at most two batches per connection (the one whose
        # outcome was being committed and the one on the wire), however slow the disk.
        writing: list[asyncio.Future[None]] = []
        if not len(queue):
            return
        try:
            agent = connection.agent = await self._open(destination, lane.source)
        except Unreachable as error:
            was_probe, connection.probe = connection.probe, False  # (its verdict is given here)
            self._unreachable(lane, error, probe=was_probe)
            return
        connection.probe = False
        lane.failures = 0
        self._site_up(lane)
        if destination.auth is not None and (key := _health_key(queue)) not in self._authenticated:
            self._authenticated.add(key)
            self._start(lane)  # (the one connection got through: as many as the queue wants now)
        deliveries = 0
        while deliveries < shaping.max_deliveries_per_connection and not self._stopping:
            # (a limit effect may have begun or ended, or a reload changed the limits)
            shaping = self._shaping_of(lane)
            limit = shaping.connection_limit
            if lane.connections > limit or not self._throttles.keep(hold, limit):
                # Lowered under what is open, in this worker or across the node's workers
                # and the cluster's nodes (or a node over its share after Redis went away),
                # or its turn is over while another lane, worker or node waits: this one ends.
                break
            lease = await self._next(queue, lane.key, shaping)
            if lease is None:
                break
            taken = connection.taken
            taken.append(lease)
            while len(taken) < agent.batch and (more := queue.take_nowait()) is not None:
                taken.append(more)
            if self._stopping:
                self._give_back(queue, taken)  # the node stops: nothing new starts (`halt`)
                break
            if not agent.usable():
                # The server hung up while we were idle: a new connection, not a failure.
                await agent.close()
                connection.agent = None
                try:
                    agent = connection.agent = await self._open(destination, lane.source)
                except Unreachable as error:
                    self._give_back(queue, taken)
                    self._unreachable(lane, error)
                    return
            if shaping.max_message_rate is not None:
                await self._admit(lane, shaping.max_message_rate, len(taken))
            if self._is_held(lane) or self._stopping:
                # Suspended (an operator, a reaction), or the node stops (it may have while this
                # connection waited for its rate): it waits, untried.
                self._give_back(queue, taken)
                break
            if self._reactor is not None and (bouncing := self._reactor.bouncing(lane.reaction_keys)):
                self._give_back(queue, taken)
                self._bounce_waiting(lane, bouncing)
                break
            begun = connection.begun = self._begin_all(taken, lane)
            connection.taken = []
            hooks = self._hooks
            if begun and hooks is not None and hooks.vets:
                begun = connection.begun = await self._vetted(hooks, begun, lane)
            if not begun:
                continue
            earlier, writing = writing, []
            if agent.separately:
                # Each message its own call, side by side: each is reported as it is answered,
                # not when the slowest of the batch is (see `_deliver_one`). All end before a
                # failure (a bug) is raised: what one did not report, `_work` reports.
                ones = [self._deliver_one(lane, agent, work, connection, writing) for work in begun]
                for failure in await asyncio.gather(*ones, return_exceptions=True):
                    if failure is not None:
                        raise failure
            else:
                await self._deliver(lane, agent, begun, writing)
            deliveries += len(begun)
            connection.begun = []
            if earlier and not all(future.done() for future in earlier):
                await asyncio.wait(earlier)
            if not agent.usable():
                break

    async def _deliver(self, lane: _Lane, agent: Agent, begun: list[Work], writing: list[asyncio.Future[None]]) -> None:
        """Hand `begun` to the agent, and report each attempt with its lease once all are made
        (through the reactions and the outcome hook, if any); each outcome being written goes
        in `writing`."""
        self.in_flight += len(begun)
        try:
            attempts = await agent.deliver(begun)
        except asyncio.CancelledError:
            # A stop while the agent tried a message's deferred recipients at the next
            # MX host: what the first host took is reported, or a restart sends it again.
            for work, attempt in zip(begun, agent.final(), strict=False):
                self._report_from(lane, work.lease, attempt)
            raise
        finally:
            self.in_flight -= len(begun)
        if lane.source is not None:  # named now: the outcome hook sees it too
            attempts = [attempt._replace(source=lane.source) for attempt in attempts]
        made = attempts
        try:
            if self._reactor is not None:
                attempts = self._reacted(begun, attempts, lane.queue)
            hooks = self._hooks
            if hooks is not None and hooks.reviews:
                attempts = await self._reviewed(hooks, begun, attempts, lane)
        except Exception:
            # A bug past the agent: the messages are sent (or refused) by now, and reported as
            # the agent made them; left to `_work`, each would be an internal error, retried,
            # and a delivered one sent again (found from outside, at every retry until max_age).
            _log.exception("the outcomes of delivery to %s could not be worked out; reported as made", lane.queue.path)
            attempts = made
        failed: Exception | None = None
        for work, attempt in zip(begun, attempts, strict=True):
            try:
                written = self._report_from(lane, work.lease, attempt)
            except Exception as error:  # the others still get theirs; `_work` gives this one one
                failed = failed or error
                continue
            if written is not None:
                writing.append(written)
        if failed is not None:
            raise failed

    async def _deliver_one(
        self, lane: _Lane, agent: Agent, work: Work, connection: _Connection, writing: list[asyncio.Future[None]]
    ) -> None:
        """One message of a batch given to an agent that takes each on its own (a webhook:
        `Agent.separately`), reported as soon as it is answered. Reported once its slowest
        sibling was, a batch's answered handoffs waited unrecorded behind one slow call, and
        a kill -9 made them all again: an outside test saw 66 to 102 repeated webhook calls
        per kill where 16 were ever on the wire. Reported at once, the outcome goes to the
        spool's next group commit, and what a kill makes again is what was on the wire (and
        what was answered within that commit)."""
        await self._deliver(lane, agent, [work], writing)
        connection.begun = [other for other in connection.begun if other is not work]

    async def _end(self, lane: _Lane, connection: _Connection) -> None:
        """The end of a connection task, however it ended: what it holds goes back, the
        connection closes, its slot frees, and the lane goes on if mail waits."""
        queue = lane.queue
        if connection.probe:  # it never opened nor failed to: the next connection asked for probes
            self._probe_given_up(lane)
        # Cancelled at shutdown: what was begun stays as it is in the spool, and is tried
        # again at the next start; what was only taken goes back now.
        self._give_back(queue, connection.taken)
        lane.connections -= 1
        try:
            if connection.agent is not None:
                await connection.agent.close()
        except Exception:
            _log.exception("closing a connection to %s failed", queue.path)
        finally:
            self._throttles.disconnect(connection.hold)  # once closed: the site never sees one more than the limit
            if lane.connections == 0 and lane.rekey is not None:  # (no slot is held under the old key)
                lane.key, lane.rekey = lane.rekey, None
        if len(queue) and not self._stopping:
            if connection.crashed:  # a bug, not the peer: try again, but not in a tight loop
                asyncio.get_running_loop().call_later(_AFTER_A_CRASH, self._start, lane)
            elif connection.hold.yielding and lane.refused is None:
                # It made room for a lane that waits (asking every `_REFUSED_RETRY`): asked
                # at once, this lane would take the slot back before it.
                lane.refused = asyncio.get_running_loop().call_later(_AFTER_YIELDING, self._retry_start, lane)
            else:
                self._start(lane)

    async def _open(self, destination: Destination, source: str | None) -> Agent:
        opener = self._agents.get(destination.kind)
        if opener is None:
            raise Unreachable(Reply(451, "4.3.5", (f"no delivery agent for {destination.kind.value} destinations",)))
        return await opener(destination, source)

    def _report_from(self, lane: _Lane, lease: Lease, attempt: Attempt) -> asyncio.Future[None] | None:
        """Report an attempt made on `lane`, naming its source (the implicit one goes unnamed)."""
        if lane.source is not None and attempt.source is None:
            attempt = attempt._replace(source=lane.source)
        return self._report(lease, attempt)

    def _begin_all(self, leases: list[Lease], lane: _Lane) -> list[Work]:
        """The leased messages still good to send, with their bytes. Called right before the
        agent gets them, with no await in between: an operator's action that came first wins."""
        work: list[Work] = []
        for lease in leases:
            message = self._begin(lease)
            if message is None:
                continue  # an operator took it meanwhile (counted as a stale result)
            try:
                body = self._body(message)
            except SpoolError as error:
                _log.error("message %s: %s", format_id(message.id), error)
                count = len(message.envelope.recipients)
                self._report_from(lane, lease, Attempt.same_for_all(error.reply, count, "", lane.queue.site))
                continue
            work.append(Work(lease, message, body))
        return work

    async def _vetted(self, hooks: DeliveryHooks, begun: list[Work], lane: _Lane) -> list[Work]:
        """What `before_delivery` lets through, each with what the hook was told (the outcome
        hook is told the same); the rest is reported (deferred, failed) or rerouted here.
        Cancelled meanwhile (shutdown), nothing was sent: what was begun stays in the spool as
        it is, as for any attempt cut short."""
        kept: list[Work] = []
        site, source = lane.queue.site, lane.source
        for work in begun:
            delivery = hooks.delivery(work.message, site, source)
            verdict = hooks.before(work.message, delivery)
            if not (verdict is None or isinstance(verdict, (Attempt, Reroute))):
                verdict = await verdict  # a hook that must be waited for (async, on a thread)
            if verdict is None:
                kept.append(Work(work.lease, work.message, work.body, delivery))
            elif isinstance(verdict, Attempt):
                self._report_from(lane, work.lease, verdict)
            else:
                self._reroute(work.lease, verdict.domain)
        return kept

    async def _reviewed(
        self, hooks: DeliveryHooks, begun: list[Work], attempts: list[Attempt], lane: _Lane
    ) -> list[Attempt]:
        """The attempts as `on_delivery_outcome` reclassified them. The messages are sent by
        now: if this is cancelled (shutdown), every attempt is reported as the agent made it,
        or a restart would send them again."""
        reviewed: list[Attempt] = []
        try:
            for work, attempt in zip(begun, attempts, strict=True):
                try:
                    answer = hooks.after(work.message, attempt, work.delivery)
                    if not isinstance(answer, Attempt):
                        answer = await answer  # a hook that must be waited for (async, on a thread)
                except Exception:  # (the hooks' own say a failing hook's; this is a bug of ours)
                    _log.exception(
                        "reviewing an attempt at message %s failed; kept as made", format_id(work.message.id)
                    )
                    answer = attempt
                reviewed.append(answer)
        except asyncio.CancelledError:
            for work, attempt in zip(begun, attempts, strict=True):
                self._report_from(lane, work.lease, attempt)
            raise
        return reviewed

    def _reacted(self, begun: list[Work], attempts: list[Attempt], queue: ReadyQueue) -> list[Attempt]:
        """The attempts as the reactions' effects make them (see the module docstring)."""
        reactor = self._reactor
        assert reactor is not None
        reacted: list[Attempt] = []
        for work, attempt in zip(begun, attempts, strict=True):
            # What a host answered before the recipients went to the next counts too.
            replies = [*attempt.passed_over, *attempt.replies] if attempt.passed_over else attempt.replies
            if all(reply.code < 400 for reply in replies):
                reacted.append(attempt)
                continue
            effect = reactor.observe(queue.egress, queue.site, _domain(work.message), replies)
            reacted.append(reactor.apply(attempt, effect) if effect is not None else attempt)
        return reacted

    def _bounce_waiting(self, lane: _Lane, effect: Effect) -> None:
        """A reaction bounces what waits for this queue: each message gets its bounce as an attempt."""
        queue = lane.queue
        reply = bounce_reply(effect)
        while (lease := queue.take_nowait()) is not None:
            message = self._begin(lease)
            if message is None:
                continue
            count = len(message.envelope.recipients)
            self._report_from(lane, lease, Attempt.same_for_all(reply, count, BOUNCE_CLASS, queue.site))

    @staticmethod
    def _give_back(queue: ReadyQueue, leases: list[Lease]) -> None:
        for lease in reversed(leases):  # each goes to the front: keep their order
            queue.give_back(lease)
        leases.clear()

    def _unreachable(self, lane: _Lane, error: Unreachable, *, probe: bool = False) -> None:
        """No connection: the message it was for gets this reply as its attempt (all waiting
        messages, after `connection_failures_before_delay` failures in a row). When no host
        took it (`site_down`), the site is down instead: the message it was for gets this reply
        (if this failure took the site down), but as no attempt of its own, and it and the
        rest, in every ready queue of the site, wait for the next probe: when the site is
        back, all its mail goes, none left behind on a retry schedule of its own."""
        queue = lane.queue
        lane.failures += 1
        effect = None
        if self._reactor is not None:  # (a 421 in the banner is a reply like any other)
            effect = self._reactor.observe(queue.egress, queue.site, queue.domain, (error.reply,))
        victims: list[Lease | None] = []
        until_probe: float | None = None  # the site is down: what this costs is no attempt
        went_down = False
        # A refused AUTH holds the route's mail as a dead site's: trying each message would
        # send the password again at each connection, and a provider locks the account.
        down = error.site_down or error.authentication
        if error.authentication:
            self._authenticated.discard(_health_key(queue))
        if down:
            lane.failures = 0
            went_down = self.health.failed(_health_key(queue), error.reply, probe=probe)
            if went_down or probe:
                # The message this connection was opened for gets what it met (a failed probe's
                # too: its record says why the site is still down, not just that it is).
                victims.append(queue.take_nowait())
                until_probe = self.health.until_probe(_health_key(queue))
        else:
            victims.append(queue.take_nowait())
            if lane.failures >= lane.shaping.connection_failures_before_delay:
                # The site fails us: defer everything waiting for it rather than trying one by one.
                while (lease := queue.take_nowait()) is not None:
                    victims.append(lease)
                lane.failures = 0
        for lease in victims:
            if lease is None:
                continue
            message = self._begin(lease)
            if message is None:
                continue
            count = len(message.envelope.recipients)
            reply = error.reply
            if error.reply_for is not None:
                reply = error.reply_for(message.envelope.routing_domain or _domain(message))
            attempt = Attempt.same_for_all(reply, count, error.classification, queue.site, error.peer)
            attempt = attempt._replace(tls=error.tls, tls_failed=error.tls_failed)
            if error.peer is not None and not error.server:
                # Pigeon's words about a host that would not do (TLS, a broken greeting): no
                # server's reply, whatever host is named with it.
                attempt = attempt._replace(own=frozenset(range(count)))
            if until_probe is not None:
                attempt = attempt._replace(tried=False, retry_after=until_probe)
            if self._reactor is not None and effect is not None:
                attempt = self._reactor.apply(attempt, effect)
            self._report_from(lane, lease, attempt)
        if down:
            deferred = sum(1 for lease in victims if lease is not None)
            site = _health_key(queue)
            for other in list(self._lanes.values()):
                if _health_key(other.queue) == site:
                    deferred += self._defer_waiting(other)
            wait = _seconds(self.health.until_probe(site))
            messages = f"{deferred} message{'' if deferred == 1 else 's'}"
            auth = queue.destination.auth
            if error.authentication and auth is not None:
                # The operator's to fix (the reply names the user, never the password).
                log = _log.warning if went_down else _log.info
                # A TLS the server did not give is no password's fault: a new one cures nothing.
                cure = (
                    "`pigeon retry`, once the server's TLS (or the route's tls) is fixed"
                    if error.reply.enhanced == AUTH_NEEDS_TLS_CODE
                    else "a reload that changes the password, or `pigeon retry`"
                )
                log("[[route]] %r: %s; %s held, no attempt counted: AUTH to %s is tried again in %s (at once after %s)",
                    auth.route, error.reply, messages, queue.site, wait, cure)  # fmt: skip
            elif went_down:
                _log.warning("site %s is down (%s): %s deferred to a probe in %s, no attempt counted",
                             site, error.reply, messages, wait)  # fmt: skip
            elif probe:
                _log.info("site %s is still down (%s): %s deferred, next probe in %s",
                          site, error.reply, messages, wait)  # fmt: skip
        elif probe:
            # A host answered the probe (a 421, a failed TLS handshake): the site is not dead,
            # whatever this connection's trouble. Left probing, every ready queue of the site
            # would hold its mail back for a verdict that never comes, until max_age.
            self._site_up(lane)

    def _defer_waiting(self, lane: _Lane) -> int:
        """The lane's site is down: what waits in its queue is deferred, untried, to the next
        probe (each message through its lease, as any attempt); how many were. If the probe
        is due, or the site came up meanwhile, the lane starts as usual instead."""
        lane.deferring = False
        queue, health = lane.queue, self.health
        site = _health_key(queue)
        if health.probing(site) or not len(queue):
            return 0  # what waits, waits for the probe's verdict
        wait = health.until_probe(site)
        if not health.is_down(site) or wait <= 0 or self._is_held(lane) or self._stopping:
            self._start(lane)  # (up, or the probe is due; a suspension or a stop: it waits)
            return 0
        auth = queue.destination.auth
        reply = not_tried(queue.site, queue.source, auth.username if auth is not None else None)
        cause = health.reason(site)  # the connection error that took it down, or the last probe's
        deferred = 0
        while (lease := queue.take_nowait()) is not None:
            message = self._begin(lease)
            if message is None:
                continue  # an operator took it meanwhile (counted as a stale result)
            count = len(message.envelope.recipients)
            attempt = Attempt.same_for_all(reply, count, "", queue.site)
            attempt = attempt._replace(tried=False, retry_after=wait, cause=cause)
            self._report_from(lane, lease, attempt)
            deferred += 1
        return deferred

    def _site_up(self, lane: _Lane) -> None:
        """A connection to the lane's site opened: if the site was down, it is up, and the mail
        waiting in all its ready queues goes now."""
        site = _health_key(lane.queue)
        was_down = self.health.connected(site)
        if was_down is None:
            return
        down_for, probes = was_down
        failed = "1 probe" if probes == 1 else f"{probes} probes"
        _log.warning("site %s is up again after %s down (%s failed); its mail goes now",
                     site, _seconds(down_for), failed)  # fmt: skip
        self._start_site(site)

    def _probe_given_up(self, lane: _Lane) -> None:
        """The lane's probe never opened a connection nor failed to (no slot free, its mail
        gone meanwhile: a reload moved it, an operator bounced it; a stop). The site's other
        ready queues with mail held back for its verdict (`_start`), and nothing else would
        start them until new mail came: they ask now, and one of them probes. (The lane's
        own restart is its caller's.)"""
        site = _health_key(lane.queue)
        self.health.abandoned(site)
        self._start_site(site, but=lane)

    def _start_site(self, site: str, *, but: _Lane | None = None) -> None:
        """Start every ready queue of `site` (a `_health_key`; but `but`) with mail waiting."""
        for other in list(self._lanes.values()):
            if other is not but and _health_key(other.queue) == site and len(other.queue):
                self._start(other)


def _health_key(queue: ReadyQueue) -> str:
    """What a site's health (down, probed) is kept under for `queue`: its site from the
    implicit source, its source's path to the site (`source->site`) from a `[[source]]`. One
    source that cannot reach a site (its address family, a firewall refusing that address)
    says nothing of another's: kept by site alone, an IPv6 source's refused connections held
    an IPv4 source's mail for a probe that the IPv6 source's mail kept failing. A route that
    authenticates adds its user (`site (auth USER)`): a smart host that refuses one user's
    password holds that route's mail, not another's. (Two routes to one host as one user have
    one password: `pigeon.config.load` refuses two.)"""
    key = queue.site if queue.source is None else queue.egress
    auth = queue.destination.auth
    return key if auth is None else f"{key}{_AUTH_MARK}{auth.username})"


_AUTH_MARK: Final = " (auth "


def _auth_site(key: str) -> str | None:
    """The site of a health key of a route that authenticates (None: not one)."""
    base, mark, _ = key.partition(_AUTH_MARK)
    return base.partition("->")[2] or base if mark else None


def _seconds(wait: float) -> str:
    """A wait for a log line: "45s", "10m", "1h30m"."""
    seconds = round(wait)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s" if seconds else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _domain(message: Message) -> str:
    recipients = message.envelope.recipients
    return recipients[0].domain if recipients else ""
