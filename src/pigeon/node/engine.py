"""The delivery engine wired together: the queue's rooms and the dispatcher, around what they are
given (spools, routes, agents, the log). `Outbound` gives it the real ones; the tests' world
(tests/support/queue_world.py) gives it fakes whose completions it releases in any order, so
the engine a test explores is wired exactly as the one that runs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pigeon.delivery.agent import Opener
from pigeon.delivery.dispatcher import Dispatcher
from pigeon.delivery.reactor import Reactor
from pigeon.delivery.routes import Kind
from pigeon.delivery.sites import SiteHealth
from pigeon.message import Message
from pigeon.metrics import Counts
from pigeon.policy.delivery import DeliveryHooks
from pigeon.queue.admin import Admin
from pigeon.queue.names import ready_queue
from pigeon.queue.pacing import QueueRates
from pigeon.queue.policy import QueuePolicies, QueuePolicy, egress_pool
from pigeon.queue.ready import ReadyQueues
from pigeon.queue.retry import RetryPolicy
from pigeon.queue.rules import Rules
from pigeon.queue.scheduler import Routes, Scheduler
from pigeon.queue.settlement import Notifier, RecordLog, RecordOutbox, RouteFailures, Settlement
from pigeon.queue.state import ActiveSet, Lease
from pigeon.shaping.effects import Effect
from pigeon.shaping.rules import Shaping, ShapingQuery
from pigeon.shaping.throttles import Throttles
from pigeon.smtp.replies import Reply
from pigeon.spool.shards import Spools
from pigeon.spool.spool import Spool

_log = logging.getLogger(__name__)

ChooseSource = Callable[[str | None, Any, Callable[[str], bool] | None], str | None]
"""A message's source from its pool (`pigeon.delivery.egress.Egress.choose`)."""


@dataclass(frozen=True, slots=True)
class Engine:
    active: ActiveSet
    settlement: Settlement
    rules: Rules
    dispatcher: Dispatcher
    ready: ReadyQueues
    scheduler: Scheduler
    admin: Admin


def build_engine(
    *,
    spools: Spools,
    primary: Spool,
    log: RecordLog,
    outbox: RecordOutbox,
    counts: Counts,
    policies: QueuePolicies,
    routes: Routes,
    agents: Mapping[Kind, Opener],
    shaping: Callable[[ShapingQuery], Shaping],
    owns_queue: Callable[[str], bool] = lambda domain: False,
    body: Callable[[Message], bytes],
    notifier: Notifier | None = None,
    classify: Callable[[Reply], str] | None = None,
    hooks: DeliveryHooks | None = None,
    route_failures: RouteFailures = lambda address: None,
    source: str = "default",
    egress: ChooseSource = lambda pool, destination, down: None,
    default_pool: str | None = None,
    max_active: int = 10_000,
    observe_lag: Callable[[float], None] = lambda seconds: None,
    throttles: Throttles | None = None,
    queue_rates: QueueRates | None = None,
    rate_share: int = 1,
    reactor: Reactor | None = None,
    sites: SiteHealth | None = None,
    clock: Callable[[], float] = time.time,
    pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Engine:
    """Build the engine (inside the running loop: rules arm their timers)."""
    active = ActiveSet(max_active)
    # One set of limits for the ready queues' sites and the scheduled queues' rates.
    throttles = throttles if throttles is not None else Throttles()
    settlement = Settlement(
        spools=spools,
        active=active,
        log=log,
        outbox=outbox,
        counts=counts,
        policies=policies,
        notifier=notifier,
        route_failures=route_failures,
        classify=classify if classify is not None else _unclassified,
        clock=clock,
    )
    rules = Rules(
        spools=spools,
        settlement=settlement,
        expires=lambda message: policies.for_queue(message.queue).retry.expires(message.age_from),
        clock=clock,
    )

    def reroute(lease: Lease, domain: str) -> None:
        settled = settlement.reroute(lease, domain)
        if settled is not None:  # due now: the scheduler reads it back once it is durable
            settled.add_done_callback(lambda _: scheduler.wake())

    dispatcher = Dispatcher(
        agents=agents,
        shaping=shaping,
        begin=active.begin,
        report=settlement.report,
        body=body,
        held=rules.site_held,
        hooks=hooks,
        reroute=reroute,
        throttles=throttles,
        reactor=reactor,
        sites=sites,
    )
    ready = ReadyQueues(
        active,
        source,
        dispatcher.kick,
        owns=owns_queue,
        idle_timeout=dispatcher.idle_timeout_of,
        on_forget=dispatcher.forget,
    )

    def choose_source(pool: str | None, destination: Any) -> str | None:
        # A pool's source that finds the site down is passed over for one that does not.
        site = getattr(destination, "site", "")
        return egress(pool, destination, lambda source: dispatcher.health.is_down(ready_queue(source, site)))

    scheduler = Scheduler(
        spools=list(spools.values()),
        active=active,
        routes=routes,
        ready=ready,
        settlement=settlement,
        policies=policies,
        intercept=rules.intercept,
        egress=choose_source,
        observe_lag=observe_lag,
        holding=lambda entry: dispatcher.holding(entry.ready) if entry.ready is not None else None,
        rates=queue_rates,
        throttles=throttles,
        rate_share=rate_share,
        clock=clock,
    )

    def rewind(due: float) -> None:
        # (An operator made mail due now: a paced queue's put-back mail is spread again.)
        scheduler.pacer.forget()
        scheduler.rewind(due)
        scheduler.wake()

    admin = Admin(
        spools=spools,
        primary=primary,
        active=active,
        settlement=settlement,
        rules=rules,
        ready=ready,
        rewind=rewind,
        kick=dispatcher.kick_all,
        promote=scheduler.promote,
        connections=dispatcher.connections_to,
        provider=dispatcher.provider_of,
        effects=dispatcher.effects_on,
        holding=dispatcher.holding,
        down=dispatcher.queue_down,
        probe_down=dispatcher.probe_down_sites,
        pool_of=lambda message: egress_pool(message.envelope, policies.for_queue(message.queue), default_pool),
        reserved_for=routes.reserved_for,  # (the router's routes are replaced in place at a reload)
        clock=clock,
        pause=pause,
    )
    if reactor is not None:
        reactor.board.on_end = functools.partial(_effect_ended, dispatcher, admin)
    return Engine(active, settlement, rules, dispatcher, ready, scheduler, admin)


def build_reader(
    *,
    spools: Spools,
    primary: Spool,
    log: RecordLog,
    outbox: RecordOutbox,
    counts: Counts,
    clock: Callable[[], float] = time.time,
) -> Admin:
    """The admin of a node that does not deliver (`[delivery] enabled = false`), for reads only:
    the queues its spool holds, one message, the standing rules stored with it. No scheduler
    takes mail from that spool, so nothing is in memory and no ready queue is open: what it
    answers is the spool as it is. Its writes are refused before they reach it (a bounce or a
    rebind claims messages for a scheduler that is not there): `pigeon.listener.http.admin`."""
    active = ActiveSet(1)
    # Never acts (writes are refused): the parts an Admin and its Rules are built with.
    settlement = Settlement(
        spools=spools,
        active=active,
        log=log,
        outbox=outbox,
        counts=counts,
        policies=QueuePolicies(QueuePolicy(RetryPolicy())),
        clock=clock,
    )
    rules = Rules(spools=spools, settlement=settlement, clock=clock)
    ready = ReadyQueues(active, "default", lambda queue: None)
    return Admin(
        spools=spools,
        primary=primary,
        active=active,
        settlement=settlement,
        rules=rules,
        ready=ready,
        rewind=lambda due: None,
        kick=lambda: None,
        promote=lambda entry: None,
        clock=clock,
    )


def _unclassified(reply: Reply) -> str:
    """No rule table given (a test's engine): a deferral's record names no class."""
    return ""


def _effect_ended(dispatcher: Dispatcher, admin: Admin, effect: Effect) -> None:
    """An effect that ends lets go of what it held: the mail waiting in its ready queues, and,
    when an operator ended a suspension early, the mail its matching replies deferred to its
    end (due then, otherwise)."""
    dispatcher.kick_all()
    if effect.ended_at is not None and effect.action == "suspend":
        task = asyncio.ensure_future(admin.retry_deferred_to(effect.expires_at))
        _background.add(task)
        task.add_done_callback(_retried)


_background: set[asyncio.Future[int]] = set()


def _retried(task: asyncio.Future[int]) -> None:
    _background.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        _log.error("making due what an ended suspension deferred failed: %s", error, exc_info=error)
    elif not task.cancelled() and task.result():
        made_due = task.result()
        said = "1 message" if made_due == 1 else f"{made_due} messages"
        _log.info("%s a suspension deferred to its end %s due now (it was ended early)", said,
                  "is" if made_due == 1 else "are")  # fmt: skip
