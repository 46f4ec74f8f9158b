"""The outbound side of a node, built from the configuration: resolver, router, delivery agents,
DSNs, and the engine (`engine`: the queue's rooms and the dispatcher) around them. `Node` starts
and stops it as one piece. Wiring only: every decision lives in the rooms it builds.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping

from pigeon.config.load import ConfigError
from pigeon.config.patterns import host_port
from pigeon.config.schema import Config, RouteConfig, canonical_host
from pigeon.config.secret_file import first_line
from pigeon.delivery.classify import Classifier
from pigeon.delivery.content import OutgoingBody
from pigeon.delivery.dsn import Notifier
from pigeon.delivery.egress import Egress, Source
from pigeon.delivery.loops import Listeners
from pigeon.delivery.mta_sts_store import PolicyStore
from pigeon.delivery.mx import Resolver
from pigeon.delivery.reactor import Reactor
from pigeon.delivery.routes import Hop, Kind, Route, Router, TlsPolicy
from pigeon.delivery.session import ClientOptions, system_cas
from pigeon.delivery.seven_bit import SevenBitHop
from pigeon.delivery.sites import SiteHealth
from pigeon.delivery.smtp_agent import SmtpAgents
from pigeon.delivery.target_agent import TargetAgents
from pigeon.delivery.tls_report import Counts
from pigeon.delivery.tls_reporter import TlsReporter
from pigeon.inbound.targets import Target, Verdict
from pigeon.intake import Intake
from pigeon.logs.outbox import Outbox
from pigeon.logs.writer import LogWriter
from pigeon.message import Envelope, Message, Recipient
from pigeon.metrics import DeliveryState, Metrics
from pigeon.node.engine import build_engine
from pigeon.policy.delivery import DeliveryHooks
from pigeon.policy.hooks import Policy
from pigeon.queue.pacing import QueueRates
from pigeon.queue.policy import PoolChooser, QueuePolicies, QueuePolicy, QueueRule, egress_pool
from pigeon.queue.retry import RetryPolicy
from pigeon.queue.scheduler import route_key
from pigeon.shaping.effects import Board
from pigeon.shaping.gcra import Rate
from pigeon.shaping.reactions import Reactions, shipped_provider_of
from pigeon.shaping.rules import ShapingRules
from pigeon.shaping.table import MemoryTable, SharedTable, Table, shared_table_path
from pigeon.shaping.throttles import Throttles
from pigeon.smtp.client_auth import MECHANISMS, Credentials
from pigeon.spool.shards import Spools
from pigeon.spool.spool import Spool

_log = logging.getLogger(__name__)

_OUTCOMES = {Verdict.ACCEPTED: "delivered", Verdict.TRANSIENT: "deferred", Verdict.PERMANENT: "failed"}


class Outbound:
    def __init__(
        self,
        config: Config,
        *,
        spools: Spools,
        primary: Spool,
        log: LogWriter,
        outbox: Outbox,
        metrics: Metrics,
        intake: Intake,
        targets: Mapping[str, Target] | None = None,
        policy: Policy | None = None,
        worker: int = 0,
        workers: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        delivery = config.delivery
        self._clock = clock
        self._background: set[asyncio.Future[int]] = set()  # (making held mail due: `_make_due_held`)
        self.throttles = build_throttles(config, worker, workers)
        metrics.track_shaping(self.throttles, worker)
        self.effects = build_board(config, log)
        metrics.track_effects(self.effects, worker)
        shaping = ShapingRules.from_config(config)
        self._provider_of = shipped_provider_of(shaping.providers)  # (a rule's provider, as the limits know it)
        reactions = self.reactions_of(config)
        self.reactor = Reactor(reactions, self.effects) if reactions else None
        self._intake = intake
        classifier = Classifier.from_files(delivery.bounce_rules)
        nameservers = [(e.host, e.port) for e in config.dns.nameservers]
        self.resolver = Resolver(nameservers or None, timeout=config.dns.timeout, dnssec=config.dane.enabled)
        # SMTP TLS reporting (RFC 8460): sessions under a policy counted in memory, reported by
        # worker 0 at each interval's end (`pigeon.delivery.tls_reporter`).
        rpt = config.tls_rpt
        self.tls_counts = Counts() if rpt.enabled else None
        self.tls_reporter = (
            TlsReporter(
                self.tls_counts,
                directory=config.spool.path / "tls-rpt",
                worker=worker,
                workers=workers,
                interval=rpt.interval,
                resolver=self.resolver,
                node=config.node.name,
                hostname=config.smtp.hostname,
                organization=rpt.organization_name,
                contact=rpt.contact_info,
                sender=rpt.report_sender,
                ca_file=rpt.ca_file,
                timeout=rpt.timeout,
                submit=functools.partial(_submit_report, intake),
                clock=clock,
            )
            if self.tls_counts is not None
            else None
        )
        sts = config.mta_sts
        self.mta_sts = (
            PolicyStore(
                self.resolver,
                ca_file=sts.ca_file,
                https_port=sts.https_port,
                fetch_timeout=sts.fetch_timeout,
                directory=config.spool.path,
                worker=worker,
                workers=workers,  # (whose files it takes in while it runs: the siblings')
                count=metrics.counts.mta_sts,
                tls_report=self.tls_counts,
            )
            if sts.enabled
            else None
        )
        self.router = Router(
            routes_from(config),
            self.resolver,
            tls=TlsPolicy(delivery.tls),
            tls_verify=delivery.tls_verify,
            ca_file=str(delivery.ca_file) if delivery.ca_file else None,
            smtp_port=delivery.smtp_port,
            classify=classifier.classify,
            mta_sts=self.mta_sts,
            dane=config.dane.enabled,
        )
        self._load_system_cas()
        self.policies = policies = _policies(config)

        def pool_of(message: Message) -> tuple[str | None, PoolChooser | None]:
            # What `before_delivery` is told: the pool the scheduler picks, as `pigeon inspect` shows it.
            return egress_pool(message.envelope, policies.for_queue(message.queue), delivery.pool)

        inbound = metrics.inbound_messages
        self.egress = Egress.from_config(config.pool, delivery.pool)
        # This node's SMTP listeners, which no delivery connects to (mail would loop): as
        # configured until they are bound (`listening`).
        self.own = Listeners((e.host, e.port) for e in config.smtp.listen)
        self._warns = worker == 0  # (said once for the node, not by each worker)
        smtp_agents = SmtpAgents(
            self.resolver,
            ClientOptions(
                helo_name=delivery.helo_name or config.smtp.hostname,
                connect_timeout=delivery.connect_timeout,
                reply_timeout=delivery.reply_timeout,
                data_done_timeout=delivery.data_done_timeout,
                pipelining=delivery.pipelining,
                chunking=delivery.chunking,
                try_next_mx=delivery.try_next_mx,
                mx_address_limit=delivery.mx_address_limit,
                mx_session_limit=delivery.mx_session_limit,
                tls_report=self.tls_counts,
            ),
            classifier,
            [Source(s.name, s.bind, s.ehlo) for s in config.source],
            self.own,
            SevenBitHop(convert=delivery.eight_bit_conversion, sign=functools.partial(_sign_again, intake)),
        )
        target_agents = TargetAgents(
            targets or {}, classifier, lambda target, verdict: inbound.labels("smtp", target, _OUTCOMES[verdict]).inc()
        )
        strip = (delivery.tenant_header.lower().encode(), delivery.campaign_header.lower().encode())
        # One view of a message as it leaves, for its delivery and for what a DSN returns of it.
        outgoing = OutgoingBody(spools, strip)
        engine = build_engine(
            spools=spools,
            primary=primary,
            log=log,
            outbox=outbox,
            counts=metrics.counts,
            policies=self.policies,
            routes=self.router,
            agents={Kind.SMTP: smtp_agents.open, Kind.TARGET: target_agents.open},
            shaping=shaping,
            owns_queue=shaping.owns_queue,
            body=outgoing,
            hooks=DeliveryHooks(policy, classifier.classify, pool_of) if policy is not None else None,
            classify=classifier.classify,
            notifier=Notifier(
                hostname=config.smtp.hostname,
                spools=spools,
                outgoing=outgoing,
                submit=intake.local,
                max_line=config.smtp.max_line_length,
                from_address=delivery.dsn_from or None,
            ),
            route_failures=intake.inbound_routes.failures if intake.inbound_routes else lambda address: None,
            source=delivery.source,
            egress=self.egress.choose,
            default_pool=delivery.pool,
            max_active=delivery.max_active,
            observe_lag=metrics.scheduler_lag.observe,
            throttles=self.throttles,
            queue_rates=queue_rates(config),
            rate_share=workers,
            reactor=self.reactor,
            sites=SiteHealth(delivery.site_retry_interval, delivery.max_site_retry_interval),
            clock=clock,
        )
        self.active = engine.active
        self.dispatcher = engine.dispatcher
        self.scheduler = engine.scheduler
        self.ready = engine.ready
        self.admin = engine.admin
        self.rules = engine.rules
        metrics.track_stale_results(lambda: self.active.stale_results)
        self._implicit_source = metrics.counts.implicit_source = delivery.source
        metrics.track_sites(self._site_states, worker)

    def reactions_of(self, config: Config) -> Reactions:
        """The `[[reaction]]` rules in force under `config` (raises `ReactionError`)."""
        return Reactions.from_config(
            config.reaction, defaults=config.delivery.default_reactions, provider_of=self._provider_of
        )

    def take_routes(self, routes: list[Route]) -> None:
        """The `[[route]]`s of a reload, from now on. Mail already waiting for a route that
        changed (next hop, TLS settings: its ready queue) is routed again, so that none rides
        a connection opened under the old route (a route that now requires TLS, say); so is
        mail of such a route deferred, untried, to the probe of a site found down: made due
        now (`_make_due_rerouted`), not at a probe of a site it may no longer go to. A reload
        whose [[route]]s are those in force (the only routing a reload changes: `[delivery]
        tls` and its kin stay until a restart) walks no spool for it: no such retry is logged
        nor listed among the operations. A down site no route leads to any more is forgotten:
        nothing is left to probe it."""
        rerouting = routes != self.router.routes  # (equal when no route's setting, nor their order, changed)
        before = {(r.next_hop, r.auth.username): r.auth for r in self.router.routes if r.auth and r.next_hop}
        hops_before = {host_port(r.next_hop.host, r.next_hop.port) for r in self.router.routes if r.next_hop}
        health, now = self.dispatcher.health, self._clock()
        # When each down site's mail is due: its probe's time, to which it was deferred.
        probes = {site: now + health.until_probe(site) for site in health.down_sites() if not health.probing(site)}
        changed = self.router.replace(routes)
        for route in routes:
            # A smart host held for refusing the old password gets the new one at once.
            auth, hop = route.auth, route.next_hop
            if auth is not None and hop is not None and before.get((hop, auth.username), auth) != auth:
                for site, wait in self.dispatcher.credentials_changed(host_port(hop.host, hop.port)):
                    # Its held mail was deferred to the probe: due now, not at the probe, by
                    # this walk alone (the rerouting walk below would race it for the same
                    # rows, and the log would credit the wrong one).
                    probes.pop(site, None)
                    self._make_due_held(self._clock() + wait)
        self._warn_routes_to_self(routes)
        self._load_system_cas()
        moved = self.scheduler.reroute(changed)
        if moved:
            _log.info("reload: %d waiting messages routed again by the new [[route]]s", moved)
        gone = hops_before - {host_port(r.next_hop.host, r.next_hop.port) for r in routes if r.next_hop}
        for key in health.down_sites():
            if key.rpartition("->")[2] in gone and health.forget(key):  # (`source->site` for a [[source]]'s path)
                _log.info("reload: site %s was down, and no [[route]] leads there any more: no longer probed", key)
        if probes and rerouting:
            self._make_due_rerouted(list(probes.values()), changed)

    def _make_due_rerouted(self, probes: list[float], changed: Callable[[str, str | None], bool]) -> None:
        """The spool's mail whose route `changed` that waits for a down site's probe (due at
        one of `probes`) is due now, to be routed afresh: the admin's retry does it, as
        `pigeon retry` would (the walk acts on rows not held in memory, and leaves what the
        scheduler or a connection holds to them)."""

        def rerouted(message: Message) -> bool:
            return changed(*route_key(message))

        task = asyncio.ensure_future(self.admin.retry_waiting_for_probes(probes, rerouted))
        self._background.add(task)
        task.add_done_callback(self._rerouted_made_due)

    def _rerouted_made_due(self, task: asyncio.Future[int]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            _log.error("making due the mail a reload routed away from a site down failed: %s", error, exc_info=error)
        elif not task.cancelled() and task.result():
            made_due = task.result()
            said = "1 message" if made_due == 1 else f"{made_due} messages"
            _log.info("reload: %s that waited for the probe of a site down made due now, to go by the new "
                      "[[route]]s (mail a real attempt deferred keeps its own retry: `pigeon retry --domain D` "
                      "brings it now)", said)  # fmt: skip

    def _make_due_held(self, when: float) -> None:
        """The mail a lifted hold deferred to its probe (due at `when`) is due now."""
        task = asyncio.ensure_future(self.admin.retry_deferred_to(when, untried=True))
        self._background.add(task)
        task.add_done_callback(self._held_made_due)

    def _held_made_due(self, task: asyncio.Future[int]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            _log.error("making due the mail a refused AUTH held failed: %s", error, exc_info=error)
        elif not task.cancelled() and task.result():
            made_due = task.result()
            said = "1 message" if made_due == 1 else f"{made_due} messages"
            _log.info("%s held for a refused AUTH made due now (a reload changed the credentials)", said)

    def listening(self, addresses: list[tuple[str, int]]) -> None:
        """The SMTP listeners are bound to `addresses` (host, port): no delivery connects there.
        A `[[route]]` whose next hop is one of them is an operator's mistake, and a warning says so."""
        self.own.replace(addresses)
        self._warn_routes_to_self(self.router.routes)

    def _warn_routes_to_self(self, routes: list[Route]) -> None:
        """A WARNING for each route whose `next_hop` is this node (an address, or localhost:
        a host name is only known to be this node once resolved, at delivery)."""
        if not self._warns:
            return
        for route in routes:
            hop = route.next_hop
            if hop is None:
                continue
            hosts = ["127.0.0.1", "::1"] if hop.host.lower() == "localhost" else [hop.host]
            if any(self.own.is_self(host, hop.port) for host in hosts):
                _log.warning(
                    "[[route]] for %s: next_hop %s is this node's own SMTP listener: its mail would loop back "
                    "to this node, and bounces (554 5.4.6) instead",
                    route.domain,
                    host_port(hop.host, hop.port),
                )

    def _load_system_cas(self) -> None:
        """The system's CAs read now, at start or reload, if some mail may be verified against
        them: not at the first handshake that does, which would wait some 25 ms for them."""
        if self.router.verifies_with_system_cas():
            system_cas()

    def take_shaping(self, config: Config, running: Config) -> bool:
        """The `[[shaping]]` blocks and `[delivery]` limits of `config`, from now on (a
        reload). False, and nothing changes, if the providers differ from the running ones':
        which provider a site is (and so its limit keys and the reactions' keys) is fixed
        until a restart."""
        same_providers = config.provider == running.provider and (
            config.delivery.provider_defaults == running.delivery.provider_defaults
        )
        if not same_providers:
            return False
        rules = ShapingRules.from_config(config)
        self.dispatcher.replace_shaping(rules)
        # A domain block added or removed gives its domain a ready queue of its own or takes
        # it away: what waits moves to the queue it belongs in now (after the lanes took the
        # new limits, so a queue opened by the move starts under them).
        moved = self.ready.rehome(rules.owns_queue)
        if moved:
            _log.info("reload: %d waiting messages moved to the ready queues the new [[shaping]] blocks give", moved)
        return True

    def take_queue_rates(self, config: Config) -> None:
        """The `[[queue]]` blocks' `max_message_rate`s of `config`, from now on (a reload): each
        paced queue's next booking takes its new rate; mail of a queue whose rate is gone goes
        on at once."""
        self.scheduler.pacer.rates = queue_rates(config)

    def take_reactions(self, reactions: Reactions) -> bool:
        """Replies are matched against `reactions` from now on (a reload); live effects stay
        as they are. False if this node started without any rule (no reactor to hand them to:
        a restart takes them)."""
        if self.reactor is None:
            return not reactions
        self.reactor.reactions = reactions
        return True

    async def start(self) -> None:
        await self.throttles.start()
        await self.effects.start()
        self._intake.on_stored = self.scheduler.admit
        self.scheduler.start()
        if self.tls_reporter is not None:
            await self.tls_reporter.start()

    def halt(self) -> None:
        """The node stops: no delivery starts from now on (those in flight finish, within
        `stop`'s grace). Said first thing in a stop, before the node waits for its SMTP sessions:
        what they store meanwhile waits in the spool for the next start."""
        self._intake.on_stored = None
        self.dispatcher.halt()

    async def stop(self, grace: float) -> None:
        self.halt()
        await self.scheduler.stop()
        await self.dispatcher.drain(grace)
        if self.tls_reporter is not None:
            await self.tls_reporter.stop()  # (after the deliveries: what they counted is written)
        await self.throttles.close()
        await self.effects.close()
        await asyncio.sleep(0.1)  # let the last settlements' commits come back

    def state(self) -> DeliveryState:
        """For /metrics: messages in memory by state, and per site what waits and how many connections."""
        active: dict[str, int] = {}
        for entry in self.active:
            active[entry.state.value] = active.get(entry.state.value, 0) + 1
        sites: dict[str, tuple[int, int]] = {}
        sources: dict[str, tuple[int, int]] = {}
        for site, source, queued, connections in self.dispatcher.sites():
            waiting, open_connections = sites.get(site, (0, 0))
            sites[site] = (waiting + queued, open_connections + connections)
            source = source or self._implicit_source
            waiting, open_connections = sources.get(source, (0, 0))
            sources[source] = (waiting + queued, open_connections + connections)
        return (
            active,
            [(site, waiting, connections) for site, (waiting, connections) in sites.items()],
            [(source, waiting, connections) for source, (waiting, connections) in sources.items()],
        )

    def _site_states(self) -> Iterator[tuple[str, str, bool]]:
        """For /metrics: (site, source, down) of every site found down. Health is kept per path
        (`source->site`) for a `[[source]]`, per site for the implicit source (`_health_key`):
        told apart here, so that `site` is always a site, as in the other metrics. (A source's
        name has no "->": `[[source]] name` is letters, digits, '.', '_' and '-'.)"""
        for key, down in self.dispatcher.health.states():
            source, arrow, site = key.partition("->")
            yield (site, source, down) if arrow else (key, self._implicit_source, down)


def build_throttles(config: Config, worker: int, workers: int) -> Throttles:
    """The limits of this worker: held for the node (in memory for one worker, in the table its
    workers share for several), and for the cluster when there is a `[redis] url`."""
    table: Table
    if workers > 1:
        table = SharedTable(shared_table_path(config.spool.path), worker, workers)
    else:
        table = MemoryTable(time.monotonic)
    redis = config.redis
    if redis.url is None:
        return Throttles(table)
    # Here, not with the module: the Redis client takes a tenth of a second to import, which a
    # node without Redis (and every test that starts one) need not spend.
    from pigeon.shaping.cluster import ClusterThrottles

    return ClusterThrottles(
        redis.url,
        table=table,
        node=config.node.name,
        worker=worker,
        prefix=redis.key_prefix,
        timeout=redis.timeout,
        remembered=config.spool.path / "run" / "cluster-nodes",
    )


def build_board(config: Config, log: LogWriter) -> Board:
    """This worker's view of the reactions' effects: shared with the node's other workers
    through the run directory, and with the cluster through Redis when there is a `[redis] url`."""
    redis = config.redis
    return Board(
        config.spool.path / "run" / "effects",
        node=config.node.name,
        log=log.write,
        redis_url=redis.url,
        prefix=redis.key_prefix,
        timeout=redis.timeout,
    )


def routes_from(config: Config) -> list[Route]:
    """The `[[route]]` tables as the router takes them. A route's `auth_password_file` is read
    here, at start and at each reload: ConfigError (naming the route and the file, never the
    password) if it cannot be, and the reload keeps the routes it had."""
    return [
        Route(
            r.domain.lower(),
            Hop(canonical_host(r.next_hop.host), r.next_hop.port) if r.next_hop else None,
            TlsPolicy(r.tls) if r.tls else None,
            r.tls_verify,
            str(r.ca_file) if r.ca_file else None,
            _credentials(r),
            frozenset(r.tenants) if r.tenants is not None else None,
        )
        for r in config.route
    ]


def _credentials(route: RouteConfig) -> Credentials | None:
    """Who `route` authenticates to its next hop as (checked at load: `_check_route_auth`)."""
    if route.auth_username is None:
        return None
    password = route.auth_password
    file = route.auth_password_file
    where = f"[[route]] {route.domain!r}: auth_password_file {file}"
    if file is not None:
        try:
            password = first_line(file)
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
            raise ConfigError(f"{where} cannot be read: {reason}") from None
    mechanisms = tuple(m.upper() for m in route.auth_mechanisms) if route.auth_mechanisms else MECHANISMS
    try:
        return Credentials(
            route.auth_username,
            password or "",
            mechanisms,
            plaintext=route.allow_plaintext_auth,
            route=route.domain,
        )
    except ValueError as error:  # (the file changed since it was checked; the text names no password)
        raise ConfigError(f"{where if file is not None else f'[[route]] {route.domain!r}'}: {error}") from None


def queue_rates(config: Config) -> QueueRates:
    """The `[[queue]]` blocks' rates (checked when the config was loaded)."""
    return QueueRates(
        [(q.name, Rate.parse(q.max_message_rate) if q.max_message_rate is not None else None) for q in config.queue]
    )


def _policies(config: Config) -> QueuePolicies:
    delivery = config.delivery

    def retry(interval: float | None, cap: float | None, age: float | None) -> RetryPolicy:
        return RetryPolicy(
            retry_interval=interval if interval is not None else delivery.retry_interval,
            max_retry_interval=cap if cap is not None else delivery.max_retry_interval,
            max_age=age if age is not None else delivery.max_age,
        )

    default = QueuePolicy(retry(None, None, None), delivery.dsn, delay_warning=delivery.delay_warning)
    rules = [
        QueueRule(
            q.name,
            QueuePolicy(
                retry(q.retry_interval, q.max_retry_interval, q.max_age),
                delivery.dsn if q.dsn is None else q.dsn,
                q.pool,
                delivery.delay_warning if q.delay_warning is None else q.delay_warning,
            ),
        )
        for q in config.queue
    ]
    return QueuePolicies(default, rules)


async def _sign_again(intake: Intake, message: Message, data: bytes) -> bytes | None:
    """`data` (a message's 7-bit form, `SevenBitHop`) signed by the signers in force that
    apply to it, as `message` was at reception: its tenant, and the signers a policy named.
    None: there are none now (a reload took them away). The intake's signing, looked up now:
    a reload may have started one, or replaced its signers."""
    signing = intake.signing
    if signing is None:
        return None
    envelope = message.envelope
    return await signing.sign_bytes(data, envelope.tenant, int(time.time()), envelope.dkim)


async def _submit_report(intake: Intake, sender: str, recipients: list[str], data: bytes) -> None:
    """A TLS report (RFC 8460 5.3) put in the queue, from `sender` (`[tls_rpt] report_sender`).
    Stored as Pigeon's own mail is (`Intake.local`: trusted), so that a `[[dkim]]` signer of its
    From's domain signs it, as RFC 8460 5.3 asks ("SHOULD")."""
    envelope = Envelope(sender=sender, recipients=[Recipient(address) for address in recipients], protocol="LOCAL")
    await intake.local(envelope, data)
