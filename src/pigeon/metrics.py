"""Prometheus metrics of one Pigeon process: defined once here, updated where things happen.

Counters bumped once or more per message are plain integers on `Counts` (an attribute add,
no lock) that a collector reads when /metrics is scraped; prometheus_client's own
`Counter.inc()` takes a lock each time, which shows up at thousands of messages a second.
Colder metrics (labelled rejections, histograms observed once per commit) use the library.

Each node has its own `Metrics` (its own registry), so tests can run several in one
process and read them back without interference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pigeon.queue.state import IN_MEMORY

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# Every record type `Counts.outcome` is given (the README lists them): each is exposed from 0 on.
_OUTCOMES = ("Delivery", "TransientFailure", "Bounce", "Expiration", "AdminBounce", "Held")
# What became of an MTA-STS policy fetch (`mta_sts_store`): each is exposed from 0 on.
MTA_STS_OUTCOMES: Final = ("fetched", "failed", "kept")
# Queues and sites given a label value of their own (each with any outcome); the others count as
# "_other". Each worker keeps to it, and so does the node's sum (`pigeon.node.answers.cap_labels`),
# which the workers' own caps alone did not bound (each sees other queues).
MAX_QUEUE_LABELS = 1000
MAX_SITE_LABELS = 1000
# Bounce classes given a label value of their own: the built-in table's and the user's rule
# files' (`[delivery] bounce_rules`), so few, but a rule file may name as many as it likes.
MAX_CLASSIFICATION_LABELS = 100
# Egress sources come from the configuration (bounded), but reloads may rename them while the
# node runs: held to a cap all the same, as sites and queues are.
MAX_SOURCE_LABELS = 1000
NO_ATTEMPT: Final = "-"  # the site and source of an outcome no attempt made (see the README)
# Messages in memory by state; per site: (site, messages waiting, connections); per egress
# source (its name, the implicit one's too): (source, messages waiting, connections).
DeliveryState = tuple[dict[str, int], list[tuple[str, int, int]], list[tuple[str, int, int]]]
_LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Counts:
    """Hot-path counters: plain integers."""

    __slots__ = (
        "by_classification",
        "by_queue",
        "by_site",
        "by_source",
        "bytes_received",
        "converted_messages",
        "implicit_source",
        "labelled_classifications",
        "labelled_queues",
        "labelled_sites",
        "labelled_sources",
        "messages_received",
        "mta_sts_policies",
        "outcomes",
        "receptions",
        "smtp_connections_accepted",
        "smtp_connections_evicted",
    )

    def __init__(self) -> None:
        self.messages_received = 0
        self.bytes_received = 0
        self.receptions: dict[str, int] = {}
        self.smtp_connections_accepted = 0
        self.smtp_connections_evicted = 0  # closed to make room (listener.smtp)
        self.converted_messages = 0  # attempts that delivered a message in its 7-bit form (queue.settlement)
        self.mta_sts_policies: dict[str, int] = {}  # policy fetches by outcome (MTA_STS_OUTCOMES)
        self.outcomes: dict[str, int] = {}  # per recipient: Delivery, TransientFailure, Bounce, Expiration, ...
        self.by_site: dict[tuple[str, str], int] = {}  # (outcome, site), at most MAX_SITE_LABELS sites
        self.by_queue: dict[tuple[str, str], int] = {}  # (outcome, queue), at most MAX_QUEUE_LABELS queues
        self.by_source: dict[tuple[str, str], int] = {}  # (outcome, source), at most MAX_SOURCE_LABELS
        self.labelled_sites: set[str] = set()  # the sites with a label of their own
        self.labelled_queues: set[str] = set()
        self.by_classification: dict[tuple[str, str], int] = {}  # (outcome, classification): Bounce, TransientFailure
        self.labelled_classifications: set[str] = set()
        self.labelled_sources: set[str] = set()
        # What an attempt from the implicit source is counted under (its records name no source):
        # `[delivery] source`, as its ready queues are named (`default->site`). Set by the node.
        self.implicit_source = "default"

    def outcome(self, kind: str, queue: str, site: str, n: int = 1, *, source: str | None = None) -> None:
        """Count `n` recipient outcomes of one kind for a queue, a site and the egress source
        the attempt left from (None: the implicit one, or no attempt when there is no site)."""
        self.outcomes[kind] = self.outcomes.get(kind, 0) + n
        # A site per recipient domain (no MX: its own) is unbounded, and Prometheus does not
        # take unbounded label values well. ("-": no attempt, so no site; see the README.)
        if site:
            source = _labelled(source or self.implicit_source, self.labelled_sources, MAX_SOURCE_LABELS)
        else:
            site = source = NO_ATTEMPT
        self.by_source[kind, source] = self.by_source.get((kind, source), 0) + n
        site = _labelled(site, self.labelled_sites, MAX_SITE_LABELS)
        self.by_site[kind, site] = self.by_site.get((kind, site), 0) + n
        queue = _labelled(queue, self.labelled_queues, MAX_QUEUE_LABELS)
        self.by_queue[kind, queue] = self.by_queue.get((kind, queue), 0) + n

    def mta_sts(self, outcome: str) -> None:
        """Count one MTA-STS policy fetch's outcome (one of `MTA_STS_OUTCOMES`)."""
        self.mta_sts_policies[outcome] = self.mta_sts_policies.get(outcome, 0) + 1

    def classified(self, kind: str, classification: str) -> None:
        """Count one recipient outcome (a Bounce, a TransientFailure) of this bounce class."""
        label = _labelled(classification, self.labelled_classifications, MAX_CLASSIFICATION_LABELS)
        self.by_classification[kind, label] = self.by_classification.get((kind, label), 0) + 1


def _labelled(value: str, labelled: set[str], most: int) -> str:
    """`value` if it has (or may still get) a label of its own, else "_other"."""
    if value in labelled:
        return value
    if len(labelled) >= most:
        return "_other"
    labelled.add(value)
    return value


class _CountsCollector(Collector):
    def __init__(self, counts: Counts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        c = self._counts
        yield CounterMetricFamily(
            "pigeon_messages_received", "Messages accepted and stored (one per spool entry)", value=c.messages_received
        )
        yield CounterMetricFamily("pigeon_bytes_received", "Bytes of message data stored", value=c.bytes_received)
        receptions = CounterMetricFamily(
            "pigeon_receptions", "Transactions answered with 250 after a durable commit", labels=["listener"]
        )
        for listener, value in sorted(c.receptions.items()):
            receptions.add_metric([listener], value)
        yield receptions
        yield CounterMetricFamily(
            "pigeon_smtp_connections_accepted", "SMTP connections accepted", value=c.smtp_connections_accepted
        )
        yield CounterMetricFamily(
            "pigeon_smtp_connections_evicted",
            "SMTP connections closed (421) to make room for a new one past max_connections: idle ones, or an "
            "outsider's transaction open too long",
            value=c.smtp_connections_evicted,
        )
        outcomes = CounterMetricFamily(
            "pigeon_recipients", "Recipient outcomes of delivery attempts, by record type", labels=["outcome"]
        )
        for outcome in (*_OUTCOMES, *sorted(c.outcomes.keys() - set(_OUTCOMES))):  # and any not named above
            outcomes.add_metric([outcome], c.outcomes.get(outcome, 0))
        yield outcomes
        by_site = CounterMetricFamily(
            "pigeon_site_recipients", "Recipient outcomes by site (ready queue)", labels=["outcome", "site"]
        )
        for (outcome, site), value in sorted(c.by_site.items()):
            by_site.add_metric([outcome, site], value)
        yield by_site
        by_source = CounterMetricFamily(
            "pigeon_source_recipients",
            "Recipient outcomes by the egress source the attempt left from ([[source]] name, or the implicit "
            "source's; '-': no attempt)",
            labels=["outcome", "source"],
        )
        for (outcome, source), value in sorted(c.by_source.items()):
            by_source.add_metric([outcome, source], value)
        yield by_source
        by_queue = CounterMetricFamily(
            "pigeon_queue_recipients", "Recipient outcomes by scheduled queue", labels=["outcome", "queue"]
        )
        for (outcome, queue), value in sorted(c.by_queue.items()):
            by_queue.add_metric([outcome, queue], value)
        yield by_queue
        classified = CounterMetricFamily(
            "pigeon_classified_recipients",
            "Bounces and deferrals by bounce class (the rule table's, as their records name it)",
            labels=["outcome", "classification"],
        )
        for (outcome, classification), value in sorted(c.by_classification.items()):
            classified.add_metric([outcome, classification], value)
        yield classified
        yield CounterMetricFamily(
            "pigeon_converted_messages",
            "Messages delivered in their 7-bit form to a server without 8BITMIME (once per attempt that delivered)",
            value=c.converted_messages,
        )
        policies = CounterMetricFamily(
            "pigeon_mta_sts_policies",
            "MTA-STS policy fetches by outcome: fetched, failed (no policy applies), kept (failed, the cached "
            "policy stands)",
            labels=["outcome"],
        )
        for outcome in MTA_STS_OUTCOMES:
            policies.add_metric([outcome], c.mta_sts_policies.get(outcome, 0))
        yield policies


class _DeliveryCollector(Collector):
    """Live state of delivery, read when scraped: messages in memory, ready queues, connections."""

    def __init__(self, state: Callable[[], DeliveryState]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        active, sites, sources = self._state()
        gauge = GaugeMetricFamily(
            "pigeon_active_messages",
            "Messages in memory (due, being routed or sent), by state; deferred mail waits in the spool",
            labels=["state"],
        )
        # Every state, 0 when none is in it: a series that is not there gives an alert "no
        # data", not 0 (a node whose mail is all deferred has none in memory).
        for state in (*IN_MEMORY, *sorted(active.keys() - set(IN_MEMORY))):
            gauge.add_metric([state], active.get(state, 0))
        yield gauge
        depth = GaugeMetricFamily("pigeon_ready_queue_messages", "Messages waiting in a ready queue", labels=["site"])
        connections = GaugeMetricFamily("pigeon_outbound_connections", "Open delivery connections", labels=["site"])
        for site, waiting, open_connections in sorted(sites):
            depth.add_metric([site], waiting)
            connections.add_metric([site], open_connections)
        yield depth
        yield connections
        # The same by egress source, summed over its sites: a source's share of the traffic
        # (an address being warmed up) without a series per source and site.
        source_depth = GaugeMetricFamily(
            "pigeon_source_ready_queue_messages",
            "Messages waiting in a ready queue, by egress source",
            labels=["source"],
        )
        source_connections = GaugeMetricFamily(
            "pigeon_source_outbound_connections", "Open delivery connections, by egress source", labels=["source"]
        )
        for source, waiting, open_connections in sorted(sources):
            source_depth.add_metric([source], waiting)
            source_connections.add_metric([source], open_connections)
        yield source_depth
        yield source_connections


@dataclass(frozen=True, slots=True)
class LogState:
    """The event log's health, read when /metrics is scraped."""

    failing: bool  # the last write or fsync of a segment failed
    write_errors: int  # failed writes and fsyncs so far
    pending: int  # records in memory waiting to be written
    unlogged: int  # records dropped from memory, kept in the spool's outbox to be written later
    unconfirmed: int  # records written before a failed fsync: the next start checks them
    lost: int  # records neither the log nor the spool could keep


class _LogCollector(Collector):
    def __init__(self, state: Callable[[], LogState]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        s = self._state()
        yield GaugeMetricFamily(
            "pigeon_log_failing",
            "1 while the event log cannot be written or fsynced (by any worker: 0 or 1 for the node, not a sum)",
            value=int(s.failing),
        )
        yield CounterMetricFamily(
            "pigeon_log_write_errors", "Failed writes and fsyncs of event log segments", value=s.write_errors
        )
        yield GaugeMetricFamily(
            "pigeon_log_records_pending", "Log records in memory waiting to be written", value=s.pending
        )
        yield GaugeMetricFamily(
            "pigeon_log_records_unlogged",
            "Log records the log could not take, kept in the spool's outbox to be written when it can",
            value=s.unlogged,
        )
        yield GaugeMetricFamily(
            "pigeon_log_records_unconfirmed",
            "Log records written before an fsync that failed; the next start writes them if the log lacks them",
            value=s.unconfirmed,
        )
        yield CounterMetricFamily(
            "pigeon_log_records_lost", "Log records neither the log nor the spool could keep", value=s.lost
        )


class HookState(Protocol):
    """What a log hook tells /metrics (`pigeon.logs.hook.HookState`)."""

    name: str
    sent: int
    batches: int
    failures: dict[str, int]
    failing: bool

    def lag(self) -> float: ...


class _LogHookCollector(Collector):
    def __init__(self, hooks: Sequence[HookState]) -> None:
        self._hooks = hooks

    def collect(self) -> Iterator[Metric]:
        sent = CounterMetricFamily(
            "pigeon_log_hook_records_sent", "Log records a log hook's receiver took (a 2xx)", labels=["hook"]
        )
        batches = CounterMetricFamily(
            "pigeon_log_hook_batches_sent", "Batches a log hook's receiver took (a 2xx)", labels=["hook"]
        )
        failures = CounterMetricFamily(
            "pigeon_log_hook_failures",
            "POSTs of a log hook that failed: refused (a 4xx but 408, 429) or unavailable (5xx, 408, 429, no "
            "answer); the batch is sent again",
            labels=["hook", "kind"],
        )
        failing = GaugeMetricFamily("pigeon_log_hook_failing", "1 while a log hook's last POST failed", labels=["hook"])
        lag = GaugeMetricFamily(
            "pigeon_log_hook_lag_seconds",
            "Age of the oldest log record a log hook has read and its receiver not yet taken (0: caught up)",
            labels=["hook"],
        )
        for hook in self._hooks:
            sent.add_metric([hook.name], hook.sent)
            batches.add_metric([hook.name], hook.batches)
            for kind, count in hook.failures.items():
                failures.add_metric([hook.name, kind], count)
            failing.add_metric([hook.name], int(hook.failing))
            lag.add_metric([hook.name], hook.lag())
        yield from (sent, batches, failures, failing, lag)


class _StaleCollector(Collector):
    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "pigeon_stale_results",
            "Results dropped because the message moved on while the work was out (its lease went stale), by step",
            labels=["step"],
        )
        for step, value in sorted(self._counts().items()):
            family.add_metric([step], value)
        yield family


class ShapingState(Protocol):
    """What the throttles tell /metrics (`pigeon.shaping.throttles`)."""

    @property
    def mode(self) -> str: ...


class _ShapingCollector(Collector):
    def __init__(self, throttles: ShapingState, worker: int) -> None:
        self._throttles = throttles
        self._worker = str(worker)

    def collect(self) -> Iterator[Metric]:
        throttles, worker = self._throttles, [self._worker]
        mode = throttles.mode
        shared = GaugeMetricFamily(
            "pigeon_shaping_shared",
            "1 while this worker's limits are shared by the cluster through Redis; 0 while it keeps to its "
            "node's share because Redis does not answer, or without [redis]",
            labels=["worker"],
        )
        shared.add_metric(worker, int(mode == "cluster"))
        yield shared
        fallback = GaugeMetricFamily(
            "pigeon_shaping_fallback",
            "1 while Redis does not answer and this worker keeps to its node's share of every limit",
            labels=["worker"],
        )
        fallback.add_metric(worker, int(mode == "fallback"))
        yield fallback
        nodes = getattr(throttles, "nodes", None)
        if nodes is not None:
            family = GaugeMetricFamily("pigeon_shaping_nodes", "Nodes sharing the limits, as last seen in Redis",
                                       labels=["worker"])  # fmt: skip
            family.add_metric(worker, nodes)
            yield family
            calls = CounterMetricFamily("pigeon_shaping_redis_calls", "Round trips to Redis for limits")
            calls.add_metric([], getattr(throttles, "calls", 0))
            yield calls
            errors = CounterMetricFamily(
                "pigeon_shaping_redis_errors", "Round trips to Redis for limits that failed or timed out"
            )
            errors.add_metric([], getattr(throttles, "errors", 0))
            yield errors


class EffectsState(Protocol):
    """What the reactions' effects tell /metrics (`pigeon.shaping.effects.Board`)."""

    @property
    def mode(self) -> str: ...

    def live(self) -> Sequence[Any]: ...


class _EffectsCollector(Collector):
    def __init__(self, board: EffectsState, worker: int) -> None:
        self._board = board
        self._worker = str(worker)

    def collect(self) -> Iterator[Metric]:
        counts = dict.fromkeys(("suspend", "limit", "bounce"), 0)
        for effect in self._board.live():
            counts[effect.action] = counts.get(effect.action, 0) + 1
        family = GaugeMetricFamily(
            "pigeon_shaping_effects",
            "Live effects of shaping reactions, by action, as this worker knows them (every worker knows "
            "every effect of its node, and with [redis] of the cluster: read one worker's)",
            labels=["worker", "action"],
        )
        for action, count in counts.items():
            family.add_metric([self._worker, action], count)
        yield family
        shared = GaugeMetricFamily(
            "pigeon_shaping_effects_shared",
            "1 while this worker shares shaping effects with the cluster through Redis",
            labels=["worker"],
        )
        shared.add_metric([self._worker], int(self._board.mode == "cluster"))
        yield shared


class _SitesCollector(Collector):
    def __init__(self, states: Callable[[], Iterable[tuple[str, str, bool]]], worker: int) -> None:
        self._states = states
        self._worker = str(worker)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "pigeon_site_down",
            "1 while no host of a site takes a connection and its mail waits for a probe, as this worker "
            "found it from that egress source; 0 once it is up again",
            labels=["site", "source", "worker"],
        )
        for site, source, down in self._states():
            family.add_metric([site, source, self._worker], int(down))
        yield family


class Metrics:
    """All metrics of one node."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.counts = Counts()
        r.register(_CountsCollector(self.counts))
        self.rejections = Counter(
            "pigeon_rejections",
            "Commands answered with a 4xx or 5xx reply (command: the SMTP verb, other for one Pigeon does not "
            "know, CONNECT a connection refused at its greeting, - none answered; inject: recipients an HTTP "
            "injection refused)",
            ["command", "code"],
            registry=r,
        )
        self.smtp_connections = Gauge("pigeon_smtp_connections", "Open SMTP server connections", registry=r)
        self.spool_messages = Gauge("pigeon_spool_messages", "Messages in the spool", registry=r)
        self.spool_commit_batch = Histogram(
            "pigeon_spool_commit_batch_size",
            "Operations per spool commit (one fsync each)",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.spool_commit_seconds = Histogram(
            "pigeon_spool_commit_seconds",
            "Duration of one spool commit, fsync included",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.spool_quarantined = Counter(
            "pigeon_spool_quarantined", "Spool entries set aside as unreadable", registry=r
        )
        self.scheduler_lag = Histogram(
            "pigeon_scheduler_lag_seconds",
            "How late a message was made ready after it fell due (fresh mail: after it was stored)",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.log_records_dropped = Gauge(
            "pigeon_log_records_dropped", "Log records dropped because the log disk kept failing", registry=r
        )
        self.inbound_messages = Counter(
            "pigeon_inbound_messages",
            "Inbound handoffs by source (imap:<mailbox>, smtp), target and outcome (delivered, deferred, failed)",
            ["source", "target", "outcome"],
            registry=r,
        )
        self.inbound_errors = Counter(
            "pigeon_inbound_mailbox_errors",
            "IMAP sessions lost or refused, and acknowledgements refused, by mailbox",
            ["mailbox"],
            registry=r,
        )
        self.inbound_last_poll = Gauge(
            "pigeon_inbound_last_poll_timestamp_seconds",
            "When each mailbox last answered a search or an acknowledgement (Unix time)",
            ["mailbox"],
            registry=r,
        )

    def observe_commit(self, batch: int, seconds: float) -> None:
        """Called after each spool commit."""
        self.spool_commit_batch.observe(batch)
        self.spool_commit_seconds.observe(seconds)

    def track_spool(self, count: Callable[[], int]) -> None:
        self.spool_messages.set_function(count)

    def track_smtp_connections(self, count: Callable[[], int]) -> None:
        self.smtp_connections.set_function(count)

    def track_delivery(self, state: Callable[[], DeliveryState]) -> None:
        self.registry.register(_DeliveryCollector(state))

    def track_dropped_logs(self, dropped: Callable[[], int]) -> None:
        self.log_records_dropped.set_function(dropped)

    def track_log(self, state: Callable[[], LogState]) -> None:
        self.registry.register(_LogCollector(state))

    def track_shaping(self, throttles: ShapingState, worker: int) -> None:
        """Whether limits are shared through Redis (per worker: a fallback is each worker's own)."""
        self.registry.register(_ShapingCollector(throttles, worker))

    def track_effects(self, board: EffectsState, worker: int) -> None:
        """The live effects of shaping reactions (per worker: each knows them all)."""
        self.registry.register(_EffectsCollector(board, worker))

    def track_sites(self, states: Callable[[], Iterable[tuple[str, str, bool]]], worker: int) -> None:
        """Sites found down (`pigeon.delivery.sites`): (site, source, down), per worker: each
        finds them by itself."""
        self.registry.register(_SitesCollector(states, worker))

    def track_log_hooks(self, hooks: Sequence[HookState]) -> None:
        """The node's log hooks (one worker runs them)."""
        self.registry.register(_LogHookCollector(hooks))

    def track_stale_results(self, counts: Callable[[], dict[str, int]]) -> None:
        """Results of work whose lease went stale (an operator moved the message meanwhile)."""
        self.registry.register(_StaleCollector(counts))
