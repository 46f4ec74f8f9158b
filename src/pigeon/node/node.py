"""One Pigeon node: every room built from the configuration, started and stopped in order.

Start: spool, logs, TLS and users, intake, SMTP and HTTP listeners, then the spool's check in
the background (unreadable entries to quarantine, leftovers removed). Stop (SIGTERM, SIGINT):
start no delivery or handoff, stop accepting, let open transactions (and deliveries and
handoffs in flight) finish within `shutdown_timeout`, then close the spool (its queued commits
complete first) and the logs.
Nothing a client was told 250 about is lost on the way down.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sqlite3
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from aiohttp import web
from prometheus_client import generate_latest

from pigeon.config.load import ConfigError, load, load_text, unbindable_sources
from pigeon.config.patterns import host_port
from pigeon.config.schema import Config, InboundRouteConfig
from pigeon.inbound.routes import InboundRoute, InboundRoutes
from pigeon.intake import Intake
from pigeon.listener.auth_throttle import AuthLimits, AuthThrottle
from pigeon.listener.client_table import ClientTable, client_table_path
from pigeon.listener.connection_limits import ClientConnections, LocalConnections, SharedConnections
from pigeon.listener.http.admin import confine_received, perform, refusal_answer
from pigeon.listener.http.app import HttpListener
from pigeon.listener.http.auth import Tokens
from pigeon.listener.http.connections import ConnectionLimits
from pigeon.listener.http.health import DEGRADED, DOWN, OK, STOPPING, worst
from pigeon.listener.password_checker import PasswordChecker
from pigeon.listener.passwords import PasswordFile, PasswordFileError
from pigeon.listener.shared_auth_throttle import SharedAuthThrottle
from pigeon.listener.smtp import SmtpListener
from pigeon.listener.tls import ensure_self_signed, server_context
from pigeon.logs.outbox import Outbox, finish_outbox, recover_outbox_lines
from pigeon.logs.records import Quarantine
from pigeon.logs.writer import LogWriter
from pigeon.message import format_id
from pigeon.metrics import DeliveryState, LogState, Metrics
from pigeon.node import collector, signals
from pigeon.node.config_warnings import config_warnings
from pigeon.node.descriptors import open_files_limit, share
from pigeon.node.exposure import Exposure
from pigeon.node.notify import sd_notify
from pigeon.node.sockets import Bound, ListenError
from pigeon.node.standing import INTERNAL_PATH, keep_node_rules, say_run_out, take, take_node_rules
from pigeon.node.standing import decode as decode_standing
from pigeon.policy.hooks import Policy, PolicyLoadError, PolicyModule
from pigeon.queue.admin import Admin
from pigeon.queue.policy import InboundFailures
from pigeon.route_tenants import RouteTenants
from pigeon.shaping.effects import Board
from pigeon.shaping.reactions import ReactionError
from pigeon.shaping.rules import SETTINGS
from pigeon.smtp.framing import BareLinefeeds
from pigeon.smtp.server import ServerConfig
from pigeon.spool.shards import Spools, adopted_shards, shard_directory
from pigeon.spool.spool import Quarantined, SpoolDiskFull, SpoolError, SpoolFull, SpoolWriteError
from pigeon.spool.sqlite import SqliteSpool

if TYPE_CHECKING:
    from pigeon.config.schema import DkimConfig
    from pigeon.delivery.routes import Route
    from pigeon.dkim.signer import Signers
    from pigeon.dkim.signing import Signing
    from pigeon.logs.hook import LogHooks
    from pigeon.node.broadcast import Broadcast
    from pigeon.node.inbound import Inbound
    from pigeon.node.outbound import Outbound

_log = logging.getLogger(__name__)
T = TypeVar("T")
_DISK_FULL_RETRY = 2.0  # seconds between attempts to open a spool whose disk is full
_DISK_FULL_REMINDER = 60.0  # seconds between warnings while it stays full
_ROOM_FOR_MAIL = 1024 * 1024  # bytes free under which the spool is down, refusal or not (`_room_needed`) ...
_ROOM_TO_RECOVER = 16 * 1024 * 1024  # ... and after which one that refused for lack of room is up again ...
_ROOM_SHARE = 8  # ... or this share of [spool] max_size or of the disk, if less: a small one must recover too


class Node:
    """A running Pigeon. `await start()`, then `await stop()` (or `run()` for both)."""

    def __init__(
        self,
        config: Config,
        *,
        worker: int = 0,
        workers: int = 1,
        control_socket: Path | None = None,
        config_path: Path | None = None,
        listening: Bound | None = None,
        clock: Callable[[], float] = time.time,
        reloaded_text: str | None = None,
    ) -> None:
        """`config_path`: the file SIGHUP reads again. `listening`: sockets bound before a
        privilege drop (or by the supervisor), served instead of binding the configured addresses.
        `reloaded_text`: a worker's supervisor reloaded the node since it started, and this is
        the text of `config_path` it read then (`pigeon.node.handed`): taken before the node
        starts (`_take_handed`), in place of reading the file."""
        self.config = config
        self.config_path = config_path
        self._handed = reloaded_text
        self._listening = listening
        self._clock = clock  # what delivery takes for "now"; tests turn it forward
        self.worker = worker
        self._workers = workers
        self.shutdown_timeout = config.node.shutdown_timeout
        self._control_socket = control_socket
        self.metrics = Metrics()
        self.log = LogWriter(
            config.log.path,
            node=config.node.name,
            shard=worker,
            max_segment_size=config.log.max_segment_size,
            max_segment_age=config.log.max_segment_age,
            compress=config.log.compress,
        )
        self.spool = self._spool(worker)
        self.adopted = [self._spool(shard) for shard in adopted_shards(config.spool.path, worker, workers)]
        self.smtp: SmtpListener | None = None
        self.http: HttpListener | None = None
        self.smtp_addresses: list[tuple[str, int]] = []
        self.http_address: tuple[str, int] | None = None
        self.outbound: Outbound | None = None
        self.outbox: Outbox | None = None
        self._spools: Spools | None = None  # from start() on
        self._reader: Admin | None = None  # a node that does not deliver: its spool's, once asked
        self.inbound: Inbound | None = None
        self.intake: Intake  # from start() on
        self.signing: Signing | None = None
        self.tokens: Tokens
        self._stopping = False
        self._stop_requested = asyncio.Event()  # SIGTERM or SIGINT, from `run`
        self._notify = False  # tell systemd how start-up goes (`run(notify=True)`)
        self._reload_asked = False  # a SIGHUP during start-up (or a reading): reloaded once it ends
        self._reading: asyncio.Future[_Reading] | None = None  # a reload's files, read in a thread
        self._reloading: asyncio.Task[None] | None = None
        self._abandoned: asyncio.Future[_Reading] | None = None  # a reading past reload_timeout, running on
        # Why the last reload did not take everything it read (/healthz's `config`): a key
        # rollover that failed must show where an operator's alerts look, not only in the log.
        self._reload_problem: str | None = None
        self._step = ""  # what that thread is doing, for the log
        self._started_at = 0.0
        self._check: asyncio.Task[None] | None = None
        self.log_hooks: LogHooks | None = None  # worker 0's ([[log_hook]])
        self._exposure = Exposure()  # (worker 0's: files holding secrets that others may read)
        self.policy = Policy()  # the [policy] module's hooks, loaded by start()
        # With [redis]: admin operations other nodes were asked for reach this worker's shards.
        self.broadcast: Broadcast | None = None
        self._consuming: asyncio.Task[None] | None = None
        self._running_out: asyncio.Task[None] | None = None
        """A node of one worker: says each standing rule that ran out (`standing.say_run_out`)."""

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        # The spool first: its lock says this shard (and its log segments) is ours, before
        # anything touches the log directory.
        opened = (self.spool, *self.adopted)
        for spool in opened:
            await self._open_spool(spool, loop)
        unlogged = [recover_outbox_lines(spool, self.log.directory) for spool in opened]
        self.log.open(loop)
        self._spools = spools = Spools(opened)
        self.outbox = outbox = Outbox(self.log, spools)
        self.metrics.track_dropped_logs(lambda: self.log.dropped)
        self.metrics.track_log(self._log_state)
        for spool, found in zip(opened, unlogged, strict=True):
            spool.on_quarantine = self._quarantined
            finish_outbox(outbox, found)
        self.metrics.track_spool(lambda: self.spool.count + sum(s.count for s in self.adopted))
        self.metrics.track_smtp_connections(lambda: len(self.smtp.connections) if self.smtp else 0)
        smtp = config.smtp
        self.tokens = Tokens.from_config(config)
        if config.dkim:
            from pigeon.dkim.signing import Signing

            self.signing = Signing(_signers(config.dkim))
        if self.worker == 0:  # (every worker reads the same)
            for warning in config_warnings(config, self.config_path, self._exposure, start=True):
                _log.warning("%s", warning)
        # Said by each worker: one started again (its sources are the node's start's) may be
        # the only one to find an address gone since.
        _warn_unbindable_sources(config)
        # Every worker loads the module; one warns about misspelt hook names (`prepare()`), as
        # of the configuration above (`serve --check` says them too).
        with signals.stoppable():  # its import may take long: a stop meanwhile stops the node
            self.policy = Policy.from_config(
                config.policy, self.log, warn=self.worker == 0, config_path=self.config_path
            )
        for warning in self.policy.warnings:
            _log.warning("%s", warning)
        if config.policy.module is not None:
            _log.info("policy %s: hooks %s", config.policy.module, ", ".join(self.policy.defined()) or "none")
        self.intake = intake = Intake(
            self.spool,
            self.log,
            self.metrics,
            outbox=outbox,
            inbound_routes=InboundRoutes([_inbound_route(r) for r in config.inbound]) if config.inbound else None,
            route_tenants=RouteTenants.from_config(config.route),
            hostname=smtp.hostname,
            max_line=smtp.max_line_length,
            max_hops=smtp.max_hops,
            tenant_header=config.delivery.tenant_header,
            campaign_header=config.delivery.campaign_header,
            signing=self.signing,
            policy=self.policy,
            clock=self._clock,
        )
        # The inbound and outbound sides are imported when configured, not with this module:
        # delivery alone (DNS, the SMTP client) is a fifth of a node's start, which a node that
        # only accepts ([delivery] enabled = false) need not spend.
        if config.target:
            from pigeon.node.inbound import Inbound

            self.inbound = Inbound(config, self.log, self.metrics, watch=self.worker == 0, outbox=self.outbox)
            await self.inbound.start()
        if config.delivery.enabled:
            from pigeon.node.outbound import Outbound

            self.outbound = Outbound(
                config,
                spools=spools,
                primary=self.spool,
                log=self.log,
                outbox=self.outbox,
                metrics=self.metrics,
                intake=intake,
                targets=self.inbound.targets if self.inbound is not None else {},
                policy=self.policy,
                worker=self.worker,
                workers=self._workers,
                clock=self._clock,
            )
            if self._control_socket is not None:
                # What this worker missed of the node's standing rules while it was down (its
                # supervisor keeps them): taken before the scheduler starts, as the cluster's are.
                await take_node_rules(config.spool.path, self.outbound.admin.adopt, self._clock(), self.worker)
            else:
                # A node of one worker keeps the node's rules itself: those a run with more
                # workers left are taken now, and a run with more after this one gets its own.
                node_rules = await keep_node_rules(
                    config.spool.path, self.outbound.admin.adopt, self.outbound.rules, self._clock
                )
                self._running_out = asyncio.create_task(say_run_out(node_rules, self._clock), name="rules running out")
            if config.redis.url:
                # The cluster's suspensions and standing bounces are taken before the scheduler
                # starts: nothing they hold may go out meanwhile; and so are the operations issued
                # through other nodes while this one was away (a bounce or a hold by id of mail it
                # holds). Imported here, not with the module: a node without Redis need not spend
                # a tenth of a second on its client.
                from pigeon.node.broadcast import Broadcast

                admin = self.outbound.admin
                self.broadcast = Broadcast(config, worker=self.worker, workers=self._workers, held=admin.standing)
                await self.broadcast.join(self.outbound.admin.adopt, self._apply)
            await self.outbound.start()
            self.metrics.track_delivery(self.outbound.state)
            if self.broadcast is not None:
                self._consuming = asyncio.create_task(
                    self.broadcast.consume(self._apply, self.outbound.admin.adopt), name="admin stream"
                )
        else:
            # Nothing is loaded to be sent: the delivery gauges say 0 (no series would be "no
            # data" to an alert), as a node whose mail is all deferred says it.
            self.metrics.track_delivery(_nothing_in_delivery)
        tls_context = _tls_context(config)
        passwords = PasswordFile.load(smtp.auth_users) if smtp.auth_users is not None else None
        auth_throttle, client_connections = _client_limits(config, self.worker, self._workers)
        # A worker's public HTTP listener is its supervisor's: it has only its control socket.
        public_http = config.http.max_connections if self._control_socket is None else 0
        shares = share(open_files_limit(), smtp.max_connections, public_http)
        if shares.warning is not None and self.worker == 0:  # said once: every worker has the same limit
            _log.warning("%s", shares.warning)
        self.smtp = SmtpListener(
            _session_config(config, tls_context, passwords),
            intake,
            relay_networks=[network.network for network in smtp.relay_networks],
            postmaster=smtp.postmaster,
            tls_context=tls_context,
            passwords=passwords,
            # Made even without users: a reload may bring some. Threads start on first use.
            password_checker=PasswordChecker(threads=smtp.auth_threads, max_waiting=smtp.auth_max_waiting),
            auth_throttle=auth_throttle,
            client_connections=client_connections,
            idle_timeout=smtp.idle_timeout,
            command_timeout=smtp.command_timeout,
            envelope_timeout=smtp.envelope_timeout,
            min_data_rate=smtp.min_data_rate,
            max_connections=shares.smtp,
            max_connections_per_client=smtp.max_connections_per_client,
        )
        listening = self._listening
        try:
            if listening is not None:
                self.smtp_addresses = await self.smtp.serve(listening.smtp)
            else:
                self.smtp_addresses = await self.smtp.start([(e.host, e.port) for e in smtp.listen])
        except OSError as error:
            raise ListenError(f"[smtp] listen: cannot listen: {error.strerror or error}") from None
        if self.outbound is not None:
            self.outbound.listening(self.smtp_addresses)  # (what a port 0 bound, too)
        internal = {INTERNAL_PATH: self._take_rules} if self._control_socket is not None else None
        limits = ConnectionLimits.of(config.http, shares.http) if self._control_socket is None else None
        self.http = HttpListener(self, internal, limits)
        if self._control_socket is not None:
            await self.http.start_unix(self._control_socket)
        elif listening is not None and listening.http:
            self.http_address = await self.http.serve(listening.http)
            _log.info("http listening on %s", host_port(*self.http_address))
        else:
            try:
                self.http_address = await self.http.start(config.http.listen.host, config.http.listen.port)
            except OSError as error:
                raise ListenError(
                    f"[http] listen {config.http.listen}: cannot listen: {error.strerror or error}"
                ) from None
            _log.info("http listening on %s", host_port(*self.http_address))
        self._started_at = time.time()
        self._check = asyncio.create_task(self._check_spools(opened), name="spool check")
        if config.log_hook and self.worker == 0:
            # One process of the node sends each record: worker 0 reads every worker's segments.
            from pigeon.logs.hook import LogHooks

            self.log_hooks = LogHooks(
                config.log_hook, log_directory=config.log.path, spool=config.spool.path, node=config.node.name
            )
            self.metrics.track_log_hooks([hook.state for hook in self.log_hooks.hooks])
            self.log_hooks.start()
        _tune_garbage_collector()
        for host, port in self.smtp_addresses:
            _log.info("smtp listening on %s", host_port(host, port))

    async def _open_spool(self, spool: SqliteSpool, loop: asyncio.AbstractEventLoop) -> None:
        """Open a spool shard. On a full disk, wait for room and try again: the spool is
        intact, and refusing to start (or moving it aside) would help no one."""
        said = -_DISK_FULL_REMINDER
        while True:
            try:
                spool.open(loop)
                return
            except SpoolDiskFull as error:
                collector.started()  # a wait that may last hours: collect meanwhile
                if time.monotonic() - said >= _DISK_FULL_REMINDER:
                    said = time.monotonic()
                    _log.warning("cannot start yet: %s; trying again every %.0fs", error, _DISK_FULL_RETRY)
                if self._notify:  # systemd would otherwise give up on the start, and start it again
                    sd_notify(
                        f"STATUS=waiting for room on the disk of spool {spool.directory}",
                        f"EXTEND_TIMEOUT_USEC={int(_DISK_FULL_REMINDER * 1_000_000)}",
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_requested.wait(), _DISK_FULL_RETRY)
            if self._stop_requested.is_set():
                raise SpoolDiskFull(f"stopped while waiting for room on the disk of spool {spool.directory}")

    async def stop(self) -> None:
        """Graceful stop. Safe to call twice."""
        if self._stopping:
            return
        self._stopping = True
        if self._reloading is not None:  # a reading in its thread runs on, and is dropped
            self._reloading.cancel()
        _log.info("stopping: finishing open transactions (up to %.0fs)", self.shutdown_timeout)
        # Nothing new starts from here, while the SMTP sessions finish: no delivery, no handoff
        # to a target, no mailbox claim. What is in flight finishes; the rest waits where it is.
        if self.outbound is not None:
            self.outbound.halt()
        if self.inbound is not None:
            self.inbound.halt()
        if self.smtp is not None:
            await self.smtp.drain(self.shutdown_timeout)
        if self._consuming is not None:  # before the queues stop: no operation half applied
            self._consuming.cancel()
            await asyncio.gather(self._consuming, return_exceptions=True)
            if self.broadcast is not None:
                await self.broadcast.leave()
        if self.broadcast is not None:
            await self.broadcast.close()
        if self._running_out is not None:
            self._running_out.cancel()
            await asyncio.gather(self._running_out, return_exceptions=True)
        if self.outbound is not None:
            await self.outbound.stop(self.shutdown_timeout)
        if self.inbound is not None:
            await self.inbound.stop(self.shutdown_timeout)
        if self.http is not None:
            await self.http.stop()
        if self.log_hooks is not None:
            await self.log_hooks.stop()
        if self._check is not None:
            self._check.cancel()
            await asyncio.gather(self._check, return_exceptions=True)
        if self.outbox is not None:
            await self.outbox.close()  # what the log cannot take stays in the spools' outboxes
        if self.signing is not None:
            await self.signing.close()  # nothing is waiting: the listeners are closed
        for spool in (self.spool, *self.adopted):
            spool.close()  # blocks until the commit in flight is done: a few milliseconds
        await asyncio.sleep(0)  # let the last commits' callbacks run
        self.policy.close()
        self.log.close()
        _log.info("stopped")

    async def run(self, *, notify: bool = False) -> None:
        """Start, serve until SIGTERM or SIGINT, stop; reload on SIGHUP. `notify`: tell systemd
        (sd_notify) when the node is ready and when it stops (the main process only)."""
        loop = asyncio.get_running_loop()
        stop = self._stop_requested
        self._notify = notify
        # The handlers stay for the whole shutdown: a second signal (Ctrl-C reaches every
        # worker, then the supervisor forwards SIGTERM) must not kill a stopping worker.
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        # Before start(): a SIGHUP during start-up must not kill the node (the default action);
        # it is remembered, and the reload done once the node has started.
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        held = signals.release()  # what was sent since the process started comes now
        try:
            if self._handed is not None:
                await self._take_handed(self._handed)
                self._handed = None
            await self.start()
            signals.started()  # a stop that came meanwhile is the loop's, as any later one
            if self._reload_asked and not stop.is_set():
                self._reload_asked = False
                _log.info("reload: asked for during start-up; reloading now")
                self.reload()
            if notify:
                sd_notify("READY=1", f"STATUS=serving SMTP on {_addresses(self.smtp_addresses)}")
            await stop.wait()
        finally:
            if notify:
                sd_notify("STOPPING=1")
            await self.stop()
            if held:  # stopped: a late signal must not end the exit (status 129 for a SIGHUP)
                signals.hold()
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(signum)

    async def _take_handed(self, text: str) -> None:
        """A worker started again after the node reloaded: the reloaded configuration (its
        supervisor's `text`) in force before the worker serves or delivers anything, so that
        it runs what the other workers run from its first message: its routes, TLS pair, SMTP
        users, tokens, DKIM keys, reaction and shaping rules. The files it names are read
        here, and one that no longer loads stops the start (ConfigError: `worker N: cannot
        start: configuration error: ...`, and its supervisor tries again with a growing wait):
        starting on the configuration the node started with instead would deliver by routes
        the reload replaced. What a reload does not take waits for the node's restart, as at
        a SIGHUP (the same warnings)."""
        _log.info("reload: taking the configuration the node reloaded before this worker started")
        try:
            # (The policy module is not imported here: `start` imports the one it names, once.)
            read = await _in_thread(lambda: self._read_for_reload(text, policy=False), f"reload w{self.worker}")
            if self.config.delivery.enabled:
                _routes(read.config)  # (as `_take` checks them)
        except ssl.SSLError as error:
            raise ConfigError(f"[smtp] tls_certificate: {error}") from None
        # (its [policy] too: `start` imports the module that one names)
        _reloaded_into(self.config, read.config, reactions=True, shaping=True, policy=True)
        for key in changed_keys(self.config, read.config):
            # (Found from outside: "takes effect at the next restart", said by a worker that
            # had just restarted, left it unclear which value that worker runs.)
            _log.warning("reload: %s changed; this worker, started again, keeps the value the node started "
                         "with, as the other workers do; it takes effect when the node restarts", key)  # fmt: skip

    def reload(self) -> None:
        """SIGHUP: read the config file again and take its TLS certificate, SMTP users,
        routes, DKIM signers (their keys read again), shaping limits and reaction rules, and
        import the policy module again: the one `[policy]` names now, under its timeout and
        sync now (a section added, changed or removed too).
        New connections see the new ones; open ones keep what they have, but for the SMTP users
        and `relay_networks`: a session authenticated as a user removed or given another
        password, or from a network taken out, loses that authorization at once
        (`SmtpConnection.judge_again`). If anything cannot be used, nothing changes and the
        reason is logged. Asked for while the node starts, it is done once it has started
        (`run`): the file may have changed since it was read.

        The files are read, and the policy module imported, in a thread of their own
        (`_read_for_reload`): an import may take long (a module that connects somewhere), and
        meanwhile the loop serves mail and /healthz with the running configuration. What was
        read is taken on the loop (`_take`), all at once. A reading that outlasts `[node]
        reload_timeout` is abandoned (a thread cannot be stopped: it runs on, and what it reads
        is dropped); one SIGHUP that comes while a reading runs is done once it has ended."""
        if self._stopping:
            return
        if self.smtp is None:
            self._reload_asked = True
            return
        if self._reading is not None:
            _log.info("reload: still reading for the last SIGHUP (%s); this one follows once that ends", self._step)
            self._reload_asked = True
            return
        text, self._handed = self._handed, None  # the supervisor's text (`__init__`): read once, in place of the file
        self._reading = _in_thread(lambda: self._read_for_reload(text), f"reload w{self.worker}")
        self._reading.add_done_callback(self._read)
        self._reloading = asyncio.create_task(self._reload(self._reading), name="reload")

    async def _reload(self, reading: asyncio.Future[_Reading]) -> None:
        timeout = self.config.node.reload_timeout
        try:
            read = await asyncio.wait_for(asyncio.shield(reading), timeout)
        except TimeoutError:
            if self._abandoned is not None:
                # No third thread: this one is waited for, as a reading that runs is.
                _log.error(
                    "reload abandoned: still %s after %gs ([node] reload_timeout), and an earlier abandoned reading "
                    "still runs too; the running configuration stays, and no reload is done until one of them "
                    "ends: restart this worker (kill it; its supervisor starts it again)",
                    self._step,
                    timeout,
                )
                self._reload_problem = f"the last reload was abandoned: still {self._step} after {timeout:g}s"
                return
            _log.error(
                "reload abandoned: still %s after %gs ([node] reload_timeout); the running configuration stays "
                "(what that reading brings, if it ends, is dropped); a SIGHUP reads again",
                self._step,
                timeout,
            )
            self._reload_problem = f"the last reload was abandoned: still {self._step} after {timeout:g}s"
            # A module whose import never ends must not stop every later reload: the next
            # SIGHUP reads again, beside the one that runs on.
            self._abandoned, self._reading = reading, None
            self._follow()
            return
        except (ConfigError, PasswordFileError, OSError, ssl.SSLError) as error:
            _log.error("reload failed; the running configuration stays: %s", error)
            self._reload_problem = f"the last reload failed, the configuration before it runs: {error}"
            return
        except Exception as error:  # Pigeon's own defect: said, not lost in a task nobody awaits
            _log.exception("reload failed (a defect in Pigeon: please report it); the running configuration stays")
            self._reload_problem = f"the last reload failed, the configuration before it runs: {error!r}"
            return
        if not self._stopping:
            self._take(read)

    def _read(self, reading: asyncio.Future[_Reading]) -> None:
        """A reload's reading has ended (to be taken, failed, or after it was abandoned): a
        SIGHUP that came meanwhile is done now."""
        error = reading.exception()
        abandoned = reading is self._abandoned or (self._reloading is not None and self._reloading.done())
        if reading is self._abandoned:
            self._abandoned = None
            if self._reading is not None and self._reloading is not None and self._reloading.done():
                self._abandoned, self._reading = self._reading, None  # abandoned too: now the one that runs on
        else:
            self._reading = None
        if abandoned and not self._stopping:
            _log.warning("reload: the abandoned reading ended after all (%s); it was dropped", error or "read")
        self._follow()

    def _follow(self) -> None:
        """A SIGHUP that came while a reading ran: done now."""
        if self._reload_asked and not self._stopping and self._reading is None:
            self._reload_asked = False
            self.reload()

    def _read_for_reload(self, text: str | None = None, *, policy: bool = True) -> _Reading:
        """In a thread: every file a reload takes, read and checked (and the policy module
        `[policy]` names now imported, unless not `policy`), touching nothing the loop uses.
        `self._step` says what it is doing. `text`: the config file's text to take instead
        of reading the file (`__init__`)."""
        self._step = "reading the configuration file"
        if text is not None and self.config_path is not None:
            config = load_text(text, self.config_path)
        else:
            config = load(self.config_path) if self.config_path is not None else self.config
        self._step = "reading the TLS certificate and key"
        tls_context = _tls_context(config)
        self._step = "reading the SMTP users file"
        smtp = config.smtp
        passwords = PasswordFile.load(smtp.auth_users) if smtp.auth_users is not None else None
        self._step = "reading the [[dkim]] keys"
        # (DKIM's modules are loaded only once there are signers, maybe by this reload.)
        signers = _signers(config.dkim) if config.dkim or self.signing is not None else None
        prepared: PolicyModule | PolicyLoadError | None = None
        if policy:
            self._step = f"importing the policy module {config.policy.module}"
            try:
                prepared = self.policy.prepare(warn=self.worker == 0, config=config.policy)
            except PolicyLoadError as error:
                prepared = error
        self._step = "done reading"
        return _Reading(config, tls_context, passwords, signers, prepared)

    def _take(self, read: _Reading) -> None:
        """On the loop: what a reload read, in force from now on (or, if some of it cannot be
        used, nothing of it)."""
        config, tls_context, passwords, signers = read.config, read.tls_context, read.passwords, read.signers
        smtp = config.smtp
        try:
            routes = _routes(config) if self.outbound is not None else []
            reactions = self.outbound.reactions_of(config) if self.outbound is not None else None
        except (ConfigError, ReactionError) as error:
            _log.error("reload failed; the running configuration stays: %s", error)
            self._reload_problem = f"the last reload failed, the configuration before it runs: {error}"
            return
        assert self.smtp is not None  # started before any reload
        assert read.policy is not None  # (a reload's reading imports it)
        policy_taken = not isinstance(read.policy, PolicyLoadError)
        if isinstance(read.policy, PolicyLoadError):
            # (with the traceback, if it raised: where in the module, and how it got there)
            # The whole [policy] stays: its timeout and sync were for the module that runs.
            _log.error("reload: the policy module stays as it was: %s", read.policy, exc_info=read.policy.__cause__)
            hooks, kept = self.policy.defined(), " (the module as it was)"  # the summary names what runs
            self._reload_problem = f"the last reload kept the policy module as it was: {read.policy}"
        else:
            hooks, kept = self.policy.take(read.policy), ""
            self._reload_problem = None
            for warning in read.policy.warnings:  # (worker 0's: `_read_for_reload`)
                _log.warning("%s", warning)
        self.smtp.tls_context = tls_context
        self.smtp.set_passwords(passwords)  # (open sessions whose user is gone or changed lose their AUTH)
        self.smtp.session_config = replace(
            self.smtp.session_config,
            tls_available=tls_context is not None,
            auth_mechanisms=("PLAIN", "LOGIN") if passwords is not None else (),
        )
        reactions_taken = False
        shaping_taken = False
        # Which routes are reserved for which tenants, asked where mail arrives: in force with the
        # routes (whether or not this node delivers: its mail may wait for one that does).
        self.intake.route_tenants = RouteTenants.from_config(config.route)
        if self.outbound is not None:
            self.outbound.take_routes(routes)
            if reactions is not None:
                reactions_taken = self.outbound.take_reactions(reactions)
            shaping_taken = self.outbound.take_shaping(config, self.config)
            self.outbound.take_queue_rates(config)
        if self.signing is None and signers is not None and len(signers):
            from pigeon.dkim.signing import Signing

            self.signing = self.intake.signing = Signing(signers)
        elif self.signing is not None:
            assert signers is not None  # read above whenever there is a signing
            self.signing.keys = signers
        running = self.config
        _reloaded_into(running, config, reactions=reactions_taken, shaping=shaping_taken, policy=policy_taken)
        # Narrowed at once: an open relay found, or a network no longer trusted, must not wait
        # for a restart (nor widen then on one worker restarted before the others).
        self.smtp.set_relay_networks([network.network for network in smtp.relay_networks])
        self.tokens.take(config, running.spool.path)
        if self.worker == 0:
            for warning in config_warnings(config, self.config_path, self._exposure, start=False):
                _log.warning("%s", warning)
            _warn_unbindable_sources(config)
        for key in changed_keys(running, config):
            if key.startswith("[policy]"):
                continue  # its module could not be imported: said above, and the old one runs
            if key == "[[queue]]" and self.outbound is not None:
                _log.warning("reload: [[queue]] changed; its max_message_rates are in force, the rest takes effect "
                             "at the next restart")  # fmt: skip
                continue
            _log.warning("reload: %s changed; it takes effect at the next restart", key)
        rules = f", {_counted(len(config.shaping), '[[shaping]] block')}" if shaping_taken else ""
        if reactions_taken and reactions is not None:
            rules += f", {_counted(len(reactions.rules), 'reaction rule')}"
        _log.info(
            "reloaded: TLS %s, %s, %s, %s (keys read again)%s%s",
            "on" if tls_context is not None else "off",
            _counted(len(passwords), "SMTP user") if passwords is not None else "no SMTP users",
            _counted(len(config.route), "route"),  # every [[route]], whether or not this node delivers
            _counted(len(signers) if signers is not None else 0, "DKIM signer"),
            rules,
            "" if self.policy.spec is None else f", policy hooks {', '.join(hooks) or 'none'}{kept}",
        )

    @property
    def admin(self) -> Admin | None:
        return self.outbound.admin if self.outbound is not None else None

    @property
    def reader(self) -> Admin | None:
        """The admin that answers reads (queues, a message, operations, standing rules): the
        outbound side's, or on a node that does not deliver one over its spool alone, made when
        first asked (`pigeon.node.engine.build_reader`): such a node still shows what it holds."""
        if self.outbound is not None:
            return self.outbound.admin
        if self._reader is None and self._spools is not None and self.outbox is not None:
            from pigeon.node.engine import build_reader

            self._reader = build_reader(
                spools=self._spools,
                primary=self.spool,
                log=self.log,
                outbox=self.outbox,
                counts=self.metrics.counts,
                clock=self._clock,
            )
        return self._reader

    @property
    def broadcast_front(self) -> Broadcast | None:
        """The admin stream, if this process is the one the API is asked through (one worker,
        no supervisor): it tells the other nodes. A supervised worker does not: its supervisor does."""
        return self.broadcast if self._control_socket is None else None

    def forgot(self, entries: dict[str, float]) -> None:
        if self.broadcast is not None:
            self.broadcast.forgot(entries)

    async def _apply(self, method: str, path: str, body: bytes, operator: str, issued: float) -> tuple[int, Any]:
        """An admin request another node was asked for (at `issued`), applied to this worker's shards."""
        if path.partition("?")[0] == "/metrics":  # `pigeon top --cluster`: counters, added up there
            return 200, {"text": generate_latest(self.metrics.registry).decode()}
        admin = self.admin
        if admin is None:
            return 503, {"error": f"delivery is disabled on node {self.config.node.name}"}
        try:
            # A bound token's write is confined here too, or refused: never carried out unconfined.
            body = confine_received(
                method,
                path,
                body,
                operator,
                self.tokens.binding(operator),
                admin.rule,
                self.tokens.routing_domains(operator),
            )
            return await perform(admin, method, path, body, operator, issued=issued)
        except web.HTTPException as refusal:
            return refusal_answer(refusal)

    async def _take_rules(self, request: web.Request) -> web.Response:
        """POST /internal/rules (the control socket only): the node's standing rules, from the
        supervisor, to a worker that missed a change to them (`pigeon.node.standing`)."""
        admin = self.admin
        if admin is None:
            return web.json_response({"error": "delivery is disabled on this node"}, status=503)
        try:
            standing = decode_standing(await request.read())
        except msgspec.DecodeError as error:
            return web.json_response({"error": f"malformed rules: {error}"}, status=400)
        where = "the node's rules, handed by its supervisor"
        added, ended = await take(standing, admin.adopt, self._clock(), self.worker, where)
        if self.broadcast is not None and (added or ended):
            # Redis has the last word on a cluster's rules: one another node ended meanwhile ends here again.
            self.broadcast.sync_again()
        return web.json_response({"added": added, "ended": ended})

    @property
    def effects(self) -> Board | None:
        """The live effects of shaping reactions (None without delivery)."""
        return self.outbound.effects if self.outbound is not None else None

    def health(self) -> dict[str, Any]:
        """What /healthz says: a status per component, and the worst of them (see
        `pigeon.listener.http.health` for what each status means)."""
        log = self._log_state()
        spool = self._spool_health()
        inbound = self.inbound.health() if self.inbound is not None and self.inbound.watchers else {}
        routed = self.inbound.routed_health() if self.inbound is not None else {}
        shaping = self.outbound.throttles.health() if self.outbound is not None else None
        config = {"status": OK} if self._reload_problem is None else {"status": DEGRADED, "error": self._reload_problem}
        components = [spool["status"], DEGRADED if log.failing else OK, *(m["status"] for m in inbound.values())]
        components += [t["status"] for t in routed.values()]
        components.append(config["status"])
        if shaping is not None:
            components.append(shaping["status"])
        return {
            "status": STOPPING if self._stopping else worst(components),
            "node": self.config.node.name,
            "worker": self.worker,
            "uptime": round(time.time() - self._started_at, 3) if self._started_at else 0.0,
            "spool": spool,
            "smtp": {"status": OK, "connections": len(self.smtp.connections) if self.smtp else 0},
            "log": {
                "status": DEGRADED if log.failing else OK,
                **({"error": self.log.error} if self.log.error else {}),
                "pending": log.pending,
                "unlogged": log.unlogged,
                "unconfirmed": log.unconfirmed,
                "lost": log.lost,
            },
            **({"inbound": inbound} if inbound else {}),
            **({"targets": routed} if routed else {}),
            **({"shaping": shaping} if shaping is not None else {}),
            "config": config,
        }

    def _spool_health(self) -> dict[str, Any]:
        """Down after a reception refused for an I/O error, until one is stored again; and for
        lack of room, looked at whenever asked (a probe that took a node out of service must
        see it come back without mail arriving): while the room left is under what an ordinary
        message needs, or, after a message refused for lack of room, until there is plenty
        again (see `_room_needed`). One message too big for the room left, with plenty left for
        others, does not take the node down."""
        messages = self.spool.count + sum(s.count for s in self.adopted)
        refusing = self.intake.refusing
        if isinstance(refusing, SpoolWriteError):
            return {"status": DOWN, "messages": messages, "error": f"new mail gets 451: {refusing}"}
        # Not waiting: under a max_size, the room is unknown (None) until the spool's body files
        # are counted after its open, and /healthz is what says the node is up meanwhile.
        room = self.spool.room_now()
        if room is None:
            return {"status": OK, "messages": messages}
        ordinary, plenty = self._room_needed()
        # (Past the cap by what a commit's WAL pages took beyond it, the room is negative:
        # said as none, not as "-632 bytes left".)
        room = max(room, 0)
        if room < ordinary:
            error = (
                f"no room for mail: {room} bytes left, under the {ordinary} an ordinary message needs; "
                "MAIL declaring a larger SIZE, or a message that does not fit, gets 452 4.3.1"
            )
        elif isinstance(refusing, SpoolFull) and room < plenty:
            error = f"new mail gets 452: {refusing}"
        else:
            return {"status": OK, "messages": messages}
        return {"status": DOWN, "messages": messages, "error": error, "room": room}

    def _room_needed(self) -> tuple[int, int]:
        """The room an ordinary message needs, and the room after which a spool that refused
        one for lack of room is up again ("plenty").

        An ordinary message is 1 MiB, whatever `max_size` is, as long as the shard can have
        that much room: with a cap of 2 MiB or more, the spool is down as soon as under 1 MiB
        is left under it. A shard whose cap leaves it less than 2 MiB when empty (its database
        and WAL take their part) could never take 1 MiB once it holds anything; there, half
        its empty room is an ordinary message (`max_size = "1MiB"`: 368 KiB, so down once it
        holds half of what it can). On a disk smaller than 8 MiB, an eighth of the disk, so
        that a tiny disk can say up. Plenty is 16 MiB, or an eighth of `max_size` or of the
        disk if less, and never less than an ordinary message."""
        capacity = self.spool.capacity()
        disk = self.spool.disk_size()
        limits = [_ROOM_FOR_MAIL]
        if capacity is not None:
            limits.append(capacity // 2)
        if disk > 0:
            limits.append(disk // _ROOM_SHARE)
        ordinary = min(limits)
        shares = [size // _ROOM_SHARE for size in (self.config.spool.max_size, disk) if size is not None and size > 0]
        return ordinary, max(ordinary, min(_ROOM_TO_RECOVER, *shares))

    def _log_state(self) -> LogState:
        outbox = self.outbox
        return LogState(
            failing=self.log.error is not None,
            write_errors=self.log.write_errors,
            pending=self.log.pending,
            unlogged=outbox.unlogged if outbox is not None else 0,
            unconfirmed=outbox.unconfirmed if outbox is not None else 0,
            lost=outbox.lost if outbox is not None else 0,
        )

    def _spool(self, shard: int) -> SqliteSpool:
        spool = self.config.spool
        return SqliteSpool(
            shard_directory(spool.path, shard),
            shard=shard,
            inline_limit=spool.inline_limit,
            segment_from=spool.segment_from,
            segment_size=spool.segment_size,
            commit_window=spool.commit_window,
            max_batch=spool.max_batch,
            max_size=spool.max_size,
            reserve=spool.reserve,
            inline_total=spool.inline_total,
            observer=self.metrics.observe_commit,
            node=self.config.node.name,
        )

    async def _check_spools(self, spools: tuple[SqliteSpool, ...]) -> None:
        """The spools' check after the start, one shard after another (see `pigeon.spool.recovery`)."""
        for spool in spools:
            started = time.monotonic()
            try:
                report = await spool.check()
            except (SpoolError, OSError, sqlite3.Error) as error:
                _log.error("spool %s: its check stopped (%s); it runs again at the next start", spool.directory, error)
                continue
            _log.info(
                "spool %s: %d messages, %d quarantined, %d orphan bodies and %d orphan files removed (in %.1fs)",
                spool.directory,
                report.messages,
                len(report.quarantined),
                report.orphan_bodies_removed,
                report.orphan_files_removed,
                time.monotonic() - started,
            )

    def _quarantined(self, entries: list[Quarantined]) -> None:
        for entry in entries:
            _log.warning("spool entry %s quarantined: %s", format_id(entry.id), entry.reason)
            self.log.write(Quarantine(timestamp=time.time(), id=format_id(entry.id), reason=entry.reason))
        self.metrics.spool_quarantined.inc(len(entries))


@dataclass(frozen=True, slots=True)
class _Reading:
    """What a reload read, in its thread (`Node._read_for_reload`), for the loop to take."""

    config: Config
    tls_context: ssl.SSLContext | None
    passwords: PasswordFile | None
    signers: Signers | None
    policy: PolicyModule | PolicyLoadError | None  # None: not imported (`_take_handed`: `start` imports it)


def _nothing_in_delivery() -> DeliveryState:
    """/metrics' delivery state of a node that delivers nothing (`[delivery] enabled = false`)."""
    return {}, [], []


def _in_thread(function: Callable[[], T], name: str) -> asyncio.Future[T]:
    """`function` run in a thread of its own (not the loop's pool, whose few threads a long
    import would hold), its outcome in a future of the running loop. The thread is a daemon:
    one still running when the node has stopped does not hold up the exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result, error = function(), None
        except BaseException as raised:  # handed to the loop, whatever it is
            result, error = None, raised
        with contextlib.suppress(RuntimeError):  # the loop has closed: no one is waiting
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _client_limits(config: Config, worker: int, workers: int) -> tuple[AuthLimits, ClientConnections]:
    """The SMTP listener's per-client limits: in the worker's memory when it is the node's only
    one, else in the client table the node's workers share (so they hold for the node)."""
    smtp = config.smtp
    if workers <= 1:
        throttle = AuthThrottle(
            per_address=smtp.auth_failures_per_address,
            per_user=smtp.auth_failures_per_user,
            window=smtp.auth_failure_window,
            cooldown=smtp.auth_lockout,
        )
        return throttle, LocalConnections()
    table = ClientTable(client_table_path(config.spool.path), worker, window=smtp.auth_failure_window)
    shared = SharedAuthThrottle(
        table,
        per_address=smtp.auth_failures_per_address,
        per_user=smtp.auth_failures_per_user,
        cooldown=smtp.auth_lockout,
    )
    return shared, SharedConnections(table, workers)


_RELOADED_SMTP_KEYS = ("starttls", "tls_certificate", "tls_private_key", "auth_users", "relay_networks")
# The [delivery] keys the shaping rules read (besides the [[shaping]] blocks themselves).
_RELOADED_SHAPING_KEYS = (*SETTINGS, "connection_failures_before_delay")


def _reloaded_into(running: Config, loaded: Config, *, reactions: bool, shaping: bool, policy: bool) -> None:
    """Put into `running` what a reload takes of `loaded` (the reaction and shaping rules
    and `[policy]` only if taken: `reactions`, `shaping`, `policy`); the rest waits for a
    restart (`changed_keys`)."""
    for key in _RELOADED_SMTP_KEYS:
        setattr(running.smtp, key, getattr(loaded.smtp, key))
    running.http.token, running.http.local_token = loaded.http.token, loaded.http.local_token
    running.http.status_token_required = loaded.http.status_token_required  # (`Tokens.take` took it)
    running.route = loaded.route
    running.dkim = loaded.dkim
    if [q.name for q in running.queue] == [q.name for q in loaded.queue]:
        # The rates are in force (`take_queue_rates`); the blocks' other keys wait for a restart.
        for now, then in zip(running.queue, loaded.queue, strict=True):
            now.max_message_rate = then.max_message_rate
    if reactions:
        running.reaction = loaded.reaction
        running.delivery.default_reactions = loaded.delivery.default_reactions
    if policy:
        running.policy = loaded.policy
    if shaping:
        running.shaping = loaded.shaping
        for key in _RELOADED_SHAPING_KEYS:
            setattr(running.delivery, key, getattr(loaded.delivery, key))


def changed_keys(running: Config, loaded: Config) -> list[str]:
    """The keys that differ between two configs, as "[section] key" (tables of arrays whole)."""
    old, new = msgspec.to_builtins(running, enc_hook=repr), msgspec.to_builtins(loaded, enc_hook=repr)
    changed = []
    for section in Config.__struct_fields__:
        before, after = old.get(section), new.get(section)
        if isinstance(before, dict) and isinstance(after, dict):
            changed += [f"[{section}] {key}" for key in before if before.get(key) != after.get(key)]
        elif before != after:
            changed.append(f"[[{section}]]")
    return changed


def _session_config(config: Config, tls: ssl.SSLContext | None, passwords: PasswordFile | None) -> ServerConfig:
    smtp = config.smtp
    return ServerConfig(
        hostname=smtp.hostname,
        banner=smtp.banner,
        max_message_size=smtp.max_message_size,
        max_recipients=smtp.max_recipients,
        max_messages_per_connection=smtp.max_messages_per_connection,
        max_errors=smtp.max_errors,
        max_junk_commands=smtp.max_junk_commands,
        max_line_length=smtp.max_line_length,
        bare_linefeeds=BareLinefeeds(smtp.bare_linefeeds),
        pipelining=smtp.pipelining,
        chunking=smtp.chunking,
        smtputf8=smtp.smtputf8,
        dsn=smtp.dsn,
        tls_available=tls is not None,
        auth_mechanisms=("PLAIN", "LOGIN") if passwords is not None else (),
        auth_requires_tls=not smtp.allow_plaintext_auth,
    )


def _routes(config: Config) -> list[Route]:
    """The `[[route]]`s of `config`, for the outbound side (whose module is loaded with it)."""
    from pigeon.node.outbound import routes_from

    return routes_from(config)


def _signers(configs: list[DkimConfig]) -> Signers:
    """The `[[dkim]]` blocks' signers, their keys read; `ConfigError` names a key that cannot
    be used. Read as the user Pigeon runs as, which the config check (run as whoever started
    it) may not have been. DKIM's modules are imported here, not with this one: `cryptography`
    takes some 20 ms of a start, which a node without [[dkim]] need not spend."""
    from pigeon.dkim.keys import KeyProblem
    from pigeon.dkim.signing import load_signers

    try:
        return load_signers(configs)
    except KeyProblem as error:
        raise ConfigError(str(error)) from None


def _warn_unbindable_sources(config: Config) -> None:
    """Warn about each `[[source]]` whose address cannot be bound now. Only the node's first
    start refuses one (a typo); afterwards an address may be gone for a while, and the rest
    of the node's mail must go on: the source's mail waits with `451 4.4.1`."""
    for warning in unbindable_sources(config):
        _log.warning("%s", warning)


def _tls_context(config: Config) -> ssl.SSLContext | None:
    smtp = config.smtp
    if not smtp.starttls:
        return None
    if smtp.tls_certificate is not None and smtp.tls_private_key is not None:
        certificate, key = smtp.tls_certificate, smtp.tls_private_key
    else:
        certificate, key = ensure_self_signed(config.spool.path / "tls", smtp.hostname)
    return server_context(certificate, key)


def _addresses(addresses: list[tuple[str, int]]) -> str:
    return ", ".join(host_port(host, port) for host, port in addresses)


def _inbound_route(config: InboundRouteConfig) -> InboundRoute:
    failures = InboundFailures(bounces=config.bounces, hold=config.failed == "hold", held_for=float(config.held_for))
    return InboundRoute(config.target, config.recipient, config.domain, failures)


def _tune_garbage_collector() -> None:
    """Fewer, cheaper cyclic collections: about 5% less CPU per message, measured.

    Everything alive after start-up (modules, config, TLS contexts) lives until exit, so it
    is frozen out of every future collection, and the collector, off while `pigeon serve`
    started, runs again (`pigeon.node.collector`). Messages allocate a few hundred short-lived
    containers each; collecting the youngest generation every 10,000 allocations instead of
    700 costs a few MB at most and skips most collections that would find nothing.
    """
    gc.set_threshold(10_000, 20, 20)
    collector.started()


def _counted(count: int, noun: str) -> str:
    """The count and its noun, which agrees: "1 route", "0 routes", "2 routes"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
