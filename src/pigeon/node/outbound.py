"""The outbound side of a node, built from the configuration: resolver, router, queues,
dispatcher, settlement, scheduler, DSNs. `Node` starts and stops it as one piece.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections.abc import Callable, Mapping

from pigeon.config.schema import Config
from pigeon.delivery.classify import Classifier
from pigeon.delivery.content import strip_headers
from pigeon.delivery.dispatcher import Dispatcher, Shaping
from pigeon.delivery.dsn import Failure, build_report
from pigeon.delivery.mx import Resolver
from pigeon.delivery.routes import Hop, Route, Router, TlsPolicy
from pigeon.delivery.session import ClientOptions
from pigeon.inbound.targets import Target, Verdict
from pigeon.intake import Intake
from pigeon.logs.outbox import Outbox
from pigeon.logs.writer import LogWriter
from pigeon.message import Envelope, Message, Recipient, format_id
from pigeon.metrics import DeliveryState, Metrics
from pigeon.queue.admin import Admin
from pigeon.queue.policy import QueuePolicies, QueuePolicy, QueueRule
from pigeon.queue.retry import RetryPolicy
from pigeon.queue.scheduler import Scheduler
from pigeon.queue.settlement import Settlement
from pigeon.queue.state import ActiveSet, Entry
from pigeon.shaping.gcra import Rate
from pigeon.spool.sqlite import SqliteSpool

_log = logging.getLogger(__name__)


class Outbound:
    def __init__(
        self,
        config: Config,
        *,
        spools: Mapping[int, SqliteSpool],
        primary: SqliteSpool,
        log: LogWriter,
        outbox: Outbox,
        metrics: Metrics,
        intake: Intake,
        targets: Mapping[str, Target] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        delivery = config.delivery
        self._config = config
        self._spools = spools
        self._log = log
        self._intake = intake
        self._strip = (delivery.tenant_header.lower().encode(), delivery.campaign_header.lower().encode())
        nameservers = [(e.host, e.port) for e in config.dns.nameservers]
        self.resolver = Resolver(nameservers or None, timeout=config.dns.timeout)
        self.router = Router(
            [
                Route(
                    r.domain.lower(),
                    Hop(r.next_hop.host, r.next_hop.port) if r.next_hop else None,
                    TlsPolicy(r.tls) if r.tls else None,
                    r.tls_verify,
                )
                for r in config.route
            ],
            self.resolver,
            tls=TlsPolicy(delivery.tls),
            tls_verify=delivery.tls_verify,
            smtp_port=delivery.smtp_port,
        )
        self.policies = _policies(config)
        self.active = ActiveSet(delivery.max_active)
        self.settlement = Settlement(
            spools=spools,
            active=self.active,
            log=log,
            outbox=outbox,
            metrics=metrics,
            classifier=Classifier.from_files(delivery.bounce_rules),
            policies=self.policies,
            notifier=self._send_dsn,
            clock=clock,
        )
        self.dispatcher = Dispatcher(
            source=delivery.source,
            resolver=self.resolver,
            options=ClientOptions(
                helo_name=delivery.helo_name or config.smtp.hostname,
                connect_timeout=delivery.connect_timeout,
                reply_timeout=delivery.reply_timeout,
                pipelining=delivery.pipelining,
                chunking=delivery.chunking,
            ),
            shaping=_shaping(config),
            load_body=self._load_body,
            settle=self.settlement.settle,
            targets=targets,
            clock=clock,
        )
        outcomes = {Verdict.ACCEPTED: "delivered", Verdict.TRANSIENT: "deferred", Verdict.PERMANENT: "failed"}
        inbound = metrics.inbound_messages
        self.dispatcher.counted = lambda target, verdict: inbound.labels("smtp", target, outcomes[verdict]).inc()
        self.scheduler = Scheduler(
            spools=list(spools.values()),
            active=self.active,
            router=self.router,
            dispatcher=self.dispatcher,
            settlement=self.settlement,
            policies=self.policies,
            clock=clock,
        )
        self.admin = Admin(
            spools=spools,
            primary=primary,
            active=self.active,
            settlement=self.settlement,
            rewind=self._rewind,
            dispatcher=self.dispatcher,
            clock=clock,
        )
        self.scheduler.intercept = self.admin.intercept

    def start(self) -> None:
        self._intake.on_stored = self.scheduler.admit
        self.scheduler.start()

    async def stop(self, grace: float) -> None:
        self._intake.on_stored = None
        await self.scheduler.stop()
        await self.dispatcher.drain(grace)
        await asyncio.sleep(0.1)  # let the last settlements' commits come back

    def state(self) -> DeliveryState:
        """For /metrics: messages in memory by state, and per site what waits and how many connections."""
        active: dict[str, int] = {}
        for entry in self.active:
            active[entry.state.value] = active.get(entry.state.value, 0) + 1
        sites: dict[str, tuple[int, int]] = {}
        for queue in self.dispatcher.queues.values():
            waiting, connections = sites.get(queue.destination.site, (0, 0))
            sites[queue.destination.site] = (waiting + len(queue), connections + queue.connections)
        return active, [(site, waiting, connections) for site, (waiting, connections) in sites.items()]

    # --- helpers -----------------------------------------------------------------------
    def _rewind(self, due: float) -> None:
        self.scheduler.rewind(due)
        self.scheduler.wake()

    def _load_body(self, entry: Entry) -> bytes:
        message = entry.message
        body = message.data if message.data is not None else self._spools[message.id & 63].body(message.body_id)
        envelope = message.envelope
        if envelope.tenant is None and envelope.campaign is None:
            return body  # the intake found neither header: nothing to take off
        return strip_headers(body, self._strip)

    def _send_dsn(self, message: Message, failures: list[Failure]) -> asyncio.Future[object]:
        future: asyncio.Future[object] = asyncio.ensure_future(self._store_dsn(message, failures))
        return future

    async def _store_dsn(self, message: Message, failures: list[Failure]) -> object:
        original = self._spools[message.id & 63].body(message.body_id)
        report = build_report(
            hostname=self._config.smtp.hostname,
            queue_id=format_id(message.id),
            envelope=message.envelope,
            failures=failures,
            original=original,
            arrival=message.created,
        )
        envelope = Envelope(sender="", recipients=[Recipient(message.envelope.sender)], protocol="LOCAL")
        return await self._intake.local(envelope, report)


def _policies(config: Config) -> QueuePolicies:
    delivery = config.delivery

    def retry(interval: float | None, cap: float | None, age: float | None) -> RetryPolicy:
        return RetryPolicy(
            retry_interval=interval if interval is not None else delivery.retry_interval,
            max_retry_interval=cap if cap is not None else delivery.max_retry_interval,
            max_age=age if age is not None else delivery.max_age,
        )

    default = QueuePolicy(retry(None, None, None), delivery.dsn)
    rules = [
        QueueRule(
            q.name,
            QueuePolicy(
                retry(q.retry_interval, q.max_retry_interval, q.max_age), delivery.dsn if q.dsn is None else q.dsn
            ),
        )
        for q in config.queue
    ]
    return QueuePolicies(default, rules)


def _shaping(config: Config) -> Callable[[str], Shaping]:
    delivery = config.delivery
    default = Shaping(
        connection_limit=delivery.connection_limit,
        max_deliveries_per_connection=delivery.max_deliveries_per_connection,
        idle_timeout=delivery.idle_timeout,
        max_message_rate=Rate.parse(delivery.max_message_rate) if delivery.max_message_rate else None,
        connection_failures_before_delay=delivery.connection_failures_before_delay,
    )
    rules = [
        (
            s.domain.lower(),
            Shaping(
                connection_limit=s.connection_limit or default.connection_limit,
                max_deliveries_per_connection=s.max_deliveries_per_connection or default.max_deliveries_per_connection,
                idle_timeout=s.idle_timeout if s.idle_timeout is not None else default.idle_timeout,
                max_message_rate=Rate.parse(s.max_message_rate) if s.max_message_rate else default.max_message_rate,
                connection_failures_before_delay=default.connection_failures_before_delay,
            ),
        )
        for s in config.shaping
    ]

    def shaping(domain: str) -> Shaping:
        return next((rule for pattern, rule in rules if fnmatch.fnmatchcase(domain, pattern)), default)

    return shaping
