"""The supervisor: Postfix's `master` role for a node of several worker processes.

Python runs one thread of Python at a time, so a node uses one worker process per core. Each
worker is a full `Node` (accepting SMTP on the listening sockets `pigeon serve` bound and
handed down, its own spool shard, its own log segments) and serves its health and metrics on a
private unix socket. The supervisor starts the workers (each, at every start, on the
configuration the node runs, which it hands it: `pigeon.node.handed`), restarts one that dies
(with a back-off that grows while it keeps dying soon after its start) or that has not answered
its heartbeat for `[node] worker_timeout` (killed first, with SIGKILL), serves the public HTTP listener by
asking every worker and merging the answers, forwards SIGHUP (reload) to the workers, and on
SIGTERM stops the workers and waits for them to finish their open transactions. Under systemd
it is the main process: it alone sends sd_notify. A supervisor that dies without stopping them
(SIGKILL) takes its workers along: each has asked the kernel for SIGTERM when its parent dies
(see `parent_death`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import aiohttp
import msgspec
from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError

from pigeon.config.load import ConfigError, load_text, read_text
from pigeon.config.patterns import host_port
from pigeon.config.schema import Config
from pigeon.listener.client_table import client_table_path, create_client_table
from pigeon.listener.http.admin import (
    ISSUED_HEADER,
    SUSPENSIONS_HELD,
    RuleChange,
    body_too_large,
    caller,
    cluster_wide,
    confine,
    confined_answer,
    operation_of,
    refusal_answer,
    refuse_taken_id,
    refuse_taken_operation,
    rule_change,
    validate,
    with_id,
)
from pigeon.listener.http.app import add_api_routes
from pigeon.listener.http.auth import Tokens
from pigeon.listener.http.body import (
    CODING_HEADER,
    TOO_LARGE_HEADER,
    UNDECODABLE_HEADER,
    coding_refusal,
    declared_too_large,
    gone,
    not_decoded,
    read_coded,
    too_large,
    transfer_codings,
    undecodable,
)
from pigeon.listener.http.connections import ConnectionLimits, GuardedRunner
from pigeon.listener.http.content import CONTENT_PATH, HEADERS_PATH
from pigeon.listener.http.errors import json_errors
from pigeon.listener.http.health import DEGRADED, DOWN, OK, STOPPING, brief, http_status, worst
from pigeon.listener.http.inject import FORWARDED_PEER, INJECT_PATHS
from pigeon.listener.http.json_body import require_json
from pigeon.listener.http.listing import PATH as LIST_PATH
from pigeon.listener.http.metrics import cluster_comment, exposition
from pigeon.listener.http.tenancy import sealed_page
from pigeon.message import parse_id, shard_of
from pigeon.node import collector, signals
from pigeon.node.answers import merge_answers, merge_metric_answers
from pigeon.node.descriptors import open_files_limit, share
from pigeon.node.handed import HandedConfig
from pigeon.node.handed import encode as encode_handed
from pigeon.node.notify import sd_notify
from pigeon.node.partial_answer import covered
from pigeon.node.privileges import interpreter_problem
from pigeon.node.sockets import Bound
from pigeon.node.standing import (
    GENERATION_HEADER,
    INTERNAL_PATH,
    Ended,
    NodeRules,
    gather_shard_rules,
    node_rules_path,
    say_run_out,
)
from pigeon.node.standing import encode as encode_standing
from pigeon.node.tally import Tally
from pigeon.queue.listing import merge_page_answers, page_limit
from pigeon.queue.rules import Rule
from pigeon.redaction import redact
from pigeon.shaping.table import create_shared_table, shared_table_path

if TYPE_CHECKING:
    from pigeon.node.broadcast import Broadcast
    from pigeon.node.following import Follower

_log = logging.getLogger(__name__)
_FORWARDED_HEADERS: Final = frozenset({"Authorization", "Content-Type", "Accept"})
_RETURNED_HEADERS: Final = frozenset({"Content-Type", "WWW-Authenticate", "Allow", "Accept-Encoding"})
_HEALTH_WAIT: Final = 0.9
"""Seconds /healthz waits for each worker's own (asked at once): the node answers within about a
second, whatever a worker does; one that has not answered by then is down in the answer."""
_BROADCAST_PATHS: Final = ("/api/v1/admin/", "/api/v1/messages", "/api/v1/queues", "/api/v1/shaping/")
_READY_TIMEOUT = 60.0
_DISK_FULL_RETRY = 2.0  # seconds between tries to make the shared tables on a full disk (as a worker's spool)
_DISK_FULL_REMINDER = 60.0  # seconds between warnings while it stays full
# Restarting a worker that died: the wait doubles from the first to the last while it keeps
# dying soon after its start (a crash loop), and is the first again for one that had answered
# for `_STEADY` seconds since it started (it ran fine: its shard should not wait long).
_FIRST_BACKOFF: Final = 1.0
_LAST_BACKOFF: Final = 30.0
_STEADY: Final = 5.0
_LINGER: Final = 1.0
# What anyone may read without a token: GET (and HEAD) only, and never with a body.
_OPEN_WITHOUT_TOKEN: Final = frozenset({"/api/openapi.json"})
_OPEN_METHODS: Final = frozenset({"GET", "HEAD"})
# Anonymous requests in hand at once: their own few places, apart from the authorised ones'
# `[http] max_open_requests`, so that no number of anonymous clients can keep those busy.
_MAX_OPEN_ANONYMOUS: Final = 8
# How often an injection passed on to a worker looks whether its client is still there.
_CLIENT_WATCH: Final = 0.05
_RULE_LISTS: Final = ("/api/v1/admin/suspend", "/api/v1/admin/bounce")
_BY_WORKER: Final = ("not_held", "added_on")  # members of a node's answer about its workers (`_merged`)


def failure_path(control: Path) -> Path:
    """Where a worker that cannot go on writes why, beside its control socket."""
    return control.with_suffix(".failed")


def exit_reason(worker: Worker, status: int, when: str = "") -> str:
    """Why a worker process ended, for the supervisor's message: what the worker said (or
    why the supervisor killed it), else its exit status or the signal that ended it. `when`:
    words after the verb (" during start-up")."""
    if worker.hung is not None:
        return f"was killed{when}: {worker.hung}"
    try:
        said = failure_path(worker.control).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        said = ""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        how = f"was killed by {name}{when}"
    else:
        how = f"exited with status {status}{when}"
    return f"{how}: {said}" if said else f"{how} (it said no more: see its messages above)"


class Worker:
    """One worker process and how to reach it."""

    def __init__(self, index: int, control: Path) -> None:
        self.index = index
        self.control = control
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.hung: str | None = None
        """Why the supervisor killed the process, if it did (it stopped answering)."""
        self.ended: str | None = None
        """How its last process ended (`exit_reason`), until a new one answers: what `/healthz`
        says of a worker that is down, as the log said it."""
        self.ready = False
        """It has answered since it was started: it handles SIGHUP (until then, it may not)."""
        self.ready_at = 0.0
        self.answered = 0.0
        """When (monotonic) it first and last answered since it was started (if `ready`)."""
        self.reload_asked = False
        """A SIGHUP came while it was starting: it is sent one once ready (`Supervisor.reload`);
        should that start fail instead, the next one is at once (`Supervisor._watch`)."""
        self.behind = 0
        """It missed a change to the node's standing rules: it is handed them once it answers, as
        they are once the supervisor has counted this many changes, or later (0: it lacks none)."""
        self.handing: asyncio.Task[None] | None = None
        self.try_again = asyncio.Event()
        """A SIGHUP came while its process was down: it ends the wait before its next start
        (`Supervisor._wait_to_restart`). Cleared as it is started."""
        self._session: aiohttp.ClientSession | None = None

    async def get(self, path: str, within: float = 5.0) -> tuple[int, bytes]:
        connector = aiohttp.UnixConnector(path=str(self.control))
        async with (
            aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=within)) as http,
            http.get(f"http://worker{path}") as response,
        ):
            return response.status, await response.read()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST `body` to `path` (the control socket's own routes), waiting as long as it takes."""
        connector = aiohttp.UnixConnector(path=str(self.control))
        async with (
            aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http,
            http.post(f"http://worker{path}", data=body) as response,
        ):
            return response.status, await response.read()

    async def forward(
        self,
        request: web.Request,
        body: bytes,
        within: float | None = 600,
        generation: int | None = None,
        *,
        too_large_body: bool = False,
        undecodable_body: bool = False,
        issued: float | None = None,
    ) -> web.Response:
        """Pass an API request to this worker; its answer, as it is. `within`: seconds the
        whole exchange may take (None: no bound of its own; see `Supervisor._to_workers`);
        `generation`: the number of the change to the standing rules it is (`pigeon.node.standing`);
        `too_large_body`: the request's body was over the limit, and `body` is empty;
        `undecodable_body`: it was not coded as its Content-Encoding says, and `body` is empty;
        `issued`: when an admin write reached this process (`ISSUED_HEADER`). A body is passed on
        decoded; the coding the client declared goes as `CODING_HEADER`, for what a refusal says."""
        if self._session is None or self._session.closed:
            # One session per worker: its connections are reused from request to request.
            connector = aiohttp.UnixConnector(path=str(self.control))
            self._session = aiohttp.ClientSession(connector=connector)
        headers = {name: request.headers[name] for name in _FORWARDED_HEADERS if name in request.headers}
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        if isinstance(peer, tuple):
            headers[FORWARDED_PEER] = f"{peer[0]}:{peer[1]}"
        if generation is not None:
            headers[GENERATION_HEADER] = str(generation)
        if too_large_body:
            headers[TOO_LARGE_HEADER] = "1"
        if undecodable_body:
            headers[UNDECODABLE_HEADER] = "1"
        if "Content-Encoding" in request.headers:
            headers[CODING_HEADER] = request.headers["Content-Encoding"]
        if issued is not None:
            headers[ISSUED_HEADER] = repr(issued)
        async with self._session.request(
            request.method,
            f"http://worker{request.rel_url}",
            data=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=within),
        ) as answer:
            return web.Response(
                body=await answer.read(),
                status=answer.status,
                headers={name: answer.headers[name] for name in _RETURNED_HEADERS if name in answer.headers},
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class Supervisor:
    """Runs `workers` worker processes until SIGTERM or SIGINT."""

    def __init__(
        self,
        config: Config,
        config_path: Path | None,
        workers: int,
        listening: Bound | None = None,
        start_text: str | None = None,
    ) -> None:
        """`listening`: sockets bound before a privilege drop; the workers inherit the SMTP ones.
        `start_text`: the text of `config_path` that `config` was loaded from."""
        self.config = config
        self._listening = listening
        self.config_path = config_path
        # What every worker is started on, the first time and every time after: the file's text
        # as the node started, and as of its last reload whose text loaded (`pigeon.node.handed`).
        # Without it a restarted worker would read the file as it is now, keys "for the next
        # restart" and all, and the node would run two configurations at once.
        self._start_text = start_text
        self._reloaded_text: str | None = None
        # Why the config file's text as of the last SIGHUP did not load (None: it did), for
        # /healthz: the workers report their own reloads, but one started again since runs
        # the last text that loaded and knows nothing of the one that did not.
        self._reload_problem: str | None = None
        self.run_dir = config.spool.path / "run"
        self.workers = [Worker(i, self.run_dir / f"worker-{i}.sock") for i in range(workers)]
        self._tally = Tally(workers)
        self._stopping = False
        self._runner: web.AppRunner | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._next_worker = 0
        self._tokens = Tokens.from_config(config)
        self._open_requests = 0
        self._open_anonymous = 0
        self._suspending = asyncio.Lock()
        """Suspensions go to the workers one at a time (see `_to_workers_in_turn`)."""
        # What the writes through here made and ended, for a worker that misses one (`pigeon.node.standing`).
        self._node_rules = NodeRules(node_rules_path(config.spool.path)) if config.delivery.enabled else None
        self._writing: dict[str, list[tuple[int, bool]]] = {}
        """Rule id -> the writes to it on their way to the workers: their numbers, and whether
        each makes the rule (False: ends it)."""
        self._overlapped: set[int] = set()
        """The numbers of writes that were on their way while another write to the same rule was
        (`_record`)."""
        # With [redis], admin operations issued here go to every node (their workers consume).
        self._cluster: Broadcast | None = None
        if config.redis.url and config.delivery.enabled:
            # Imported here: a node without Redis need not spend a tenth of a second on its client.
            from pigeon.node.broadcast import Broadcast

            self._cluster = Broadcast(config)
        # ... and the node's rules learn what the others make and end (`pigeon.node.following`).
        self._follower: Follower | None = None
        self._following: asyncio.Task[None] | None = None
        self._running_out: asyncio.Task[None] | None = None
        if self._cluster is not None and self._node_rules is not None:
            from pigeon.node.following import Follower

            self._follower = Follower(config, self._node_rules, self._cluster.send_unsent)

    async def run(self) -> None:
        # Imported and built: what the supervisor does from here on (start workers, wait for
        # them) is light but may take long, so it collects as usual (`pigeon.node.collector`).
        collector.started()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        held = signals.release()  # what was sent since the process started comes now
        signals.started()  # (its loop acts on a stop at once from here on, its workers' start aside)
        try:
            await self._run(stop)
        finally:
            if held:  # stopped: a late signal must not end the exit (status 129 for a SIGHUP)
                signals.hold()

    async def _make_shared_tables(self, stop: asyncio.Event) -> bool:
        """Make the workers' shared tables afresh: their limits start empty, as nothing a worker
        of an earlier run held is open. On a full disk, say so and try again every
        `_DISK_FULL_RETRY` seconds, as each worker waits for room for its spool (listening on
        nothing meanwhile); False if told to stop first."""
        spool = self.config.spool.path
        said = -_DISK_FULL_REMINDER
        while True:
            try:
                create_shared_table(shared_table_path(spool))
                create_client_table(client_table_path(spool))  # and so do the SMTP clients'
                return True
            except OSError as error:
                if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                if time.monotonic() - said >= _DISK_FULL_REMINDER:
                    said = time.monotonic()
                    _log.warning("cannot start yet: spool %s: its disk is full (%s, making %s): the spool is intact, "
                                 "do not move it; free some space on that file system; trying again every %.0fs",
                                 spool, error.strerror, error.filename, _DISK_FULL_RETRY)  # fmt: skip
                sd_notify(f"STATUS=waiting for room on the disk of {spool}",
                          f"EXTEND_TIMEOUT_USEC={int(_DISK_FULL_REMINDER * 1_000_000)}")  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _DISK_FULL_RETRY)
            if stop.is_set():
                _log.info("stopping while waiting for room on the disk of %s", spool)
                return False

    async def _run(self, stop: asyncio.Event) -> None:
        problem = interpreter_problem(self.config.node.user)
        if problem is not None:
            raise RuntimeError(problem)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not await self._make_shared_tables(stop):
            return  # SIGTERM or SIGINT while waiting for room: a stop like any other
        if self._node_rules is not None:
            # What the shards hold that the node's rules lack (a run with one worker, of a Pigeon
            # that kept no file then): in the file before any worker starts and takes it.
            gather_shard_rules(self._node_rules, self.config.spool.path, time.time())
        if self._follower is not None:
            self._following = asyncio.create_task(self._follower.run(), name="cluster rules")
        if self._node_rules is not None:  # (said here: once for the node, not by each worker)
            self._running_out = asyncio.create_task(say_run_out(self._node_rules, time.time), name="rules running out")
        try:
            for worker in self.workers:
                await self._spawn(worker)
            if not await self._wait_ready(stop):
                return  # SIGTERM or SIGINT during start-up: a stop like any other
            await self._serve_http()
            _log.info("%d workers ready", len(self.workers))
            sd_notify("READY=1", f"STATUS={len(self.workers)} workers serving")
            self._watchers = [asyncio.create_task(self._watch(w)) for w in self.workers]
            await stop.wait()
        finally:
            sd_notify("STOPPING=1")
            await self.stop()

    def reload(self) -> None:
        """SIGHUP: every worker reads the config again (each logs what it took or why not).

        A worker still starting gets its SIGHUP once ready (`_now_ready`): until it has its
        handler, the signal's default action would kill it, and the file may have changed
        since it read it. The text read here is kept for the workers started from now on
        (`_keep_reloaded`), which take it as they start, as the others took it now."""
        if self._stopping:
            return
        self._keep_reloaded()
        running = [w for w in self.workers if w.process is not None and w.process.returncode is None]
        starting = [w for w in running if not w.ready]
        for worker in starting:
            worker.reload_asked = True
        if starting:
            _log.info(
                "reload: forwarding SIGHUP to %d workers now, to %d still starting once they are",
                len(running) - len(starting),
                len(starting),
            )
        else:
            _log.info("reload: forwarding SIGHUP to %d workers", len(running))
        for worker in running:
            if worker.ready:
                self._hang_up(worker)
        # A reload is the operator saying "try again": a worker waiting to be started again (it
        # could not start on a file that did not load, such as a broken policy module, which is
        # maybe fixed now) starts at once rather than when its growing wait runs out.
        waiting = [w for w in self.workers if w.process is not None and w.process.returncode is not None]
        for worker in waiting:
            _log.info("reload: starting worker %d again now, not at the end of its wait", worker.index)
            worker.try_again.set()

    def _keep_reloaded(self) -> None:
        """The config file's text as of this reload, for the workers started from now on; kept
        only if it loads: if it does not, the workers' reload fails too, and they keep running
        what they ran (so does a worker started again)."""
        if self.config_path is None or self._start_text is None:
            return  # no file: the defaults, which no reload changes
        try:
            text = read_text(self.config_path)
            config = load_text(text, self.config_path)
        except Exception as error:  # (not only ConfigError: a defect must not end the SIGHUP's handling)
            if not isinstance(error, ConfigError):
                _log.exception("reload: reading the configuration failed (a defect in Pigeon: please report it)")
            # Said as each worker says it (`pigeon.node.node`): what failed and why first; then
            # what it means for a worker started again, which reads no file of its own.
            _log.error(
                "reload failed; the running configuration stays: %s; a worker started again from now on runs "
                "it too (as of the last reload that loaded), as the others go on doing",
                error,
            )
            self._reload_problem = f"the last reload failed, the configuration before it runs: {error}"
            return
        self._reloaded_text = text
        self._reload_problem = None
        # The API is answered here: its tokens are the supervisor's to take, as each worker
        # takes its own `relay_networks` (a token removed is refused from the next request).
        self._tokens.take(config, self.config.spool.path)

    def _now_ready(self, worker: Worker) -> None:
        """`worker` has answered since it was started: a reload asked for meanwhile is its now."""
        worker.answered = time.monotonic()
        if worker.ready:
            return
        worker.ready = True
        worker.ready_at = worker.answered
        worker.ended = None
        if worker.reload_asked and not self._stopping:
            _log.info("reload: worker %d has started: forwarding the SIGHUP it missed", worker.index)
            self._hang_up(worker)

    @staticmethod
    def _hang_up(worker: Worker) -> None:
        worker.reload_asked = False
        process = worker.process
        if process is not None and process.returncode is None:
            process.send_signal(signal.SIGHUP)

    async def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        for worker in self.workers:
            if worker.handing is not None:
                worker.handing.cancel()
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                worker.process.send_signal(signal.SIGTERM)
        if self._listening is not None:
            # Each worker closes its copy at SIGTERM; while ours stayed open the kernel would
            # go on completing handshakes that no one greets, until the last worker had drained.
            # Closed, new clients are refused at once and try another MX, as with one worker.
            for sock in self._listening.smtp:
                sock.close()
        deadline = self.config.node.shutdown_timeout + 10
        for worker in self.workers:
            process = worker.process
            if process is None:
                continue
            try:
                await asyncio.wait_for(process.wait(), deadline)
            except TimeoutError:
                _log.error("worker %d did not stop in time: killing it", worker.index)
                process.kill()
                await process.wait()
        if self._runner is not None:
            await self._runner.cleanup()
        for worker in self.workers:
            await worker.close()
        for running in (self._following, self._running_out):
            if running is not None:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
        if self._follower is not None:
            await self._follower.close()
        if self._cluster is not None:
            await self._cluster.close()

    # --- workers -----------------------------------------------------------------------
    async def _spawn(self, worker: Worker) -> None:
        # -P: the directory `pigeon serve` runs in is not put first on the workers' import path
        # (as `-m` would), so a file there called dns.py or struct.py cannot stand in for a module.
        args = [
            sys.executable,
            "-P",
            "-m",
            "pigeon",
            "serve",
            "--worker",
            str(worker.index),
            "--workers",
            str(len(self.workers)),
        ]
        handed: bytes | None = None
        if self.config_path is not None:
            args += ["-c", str(self.config_path)]  # (relative paths and messages are the file's)
            if self._start_text is not None:
                args.append("--config-stdin")
                handed = encode_handed(HandedConfig(self._start_text, self._reloaded_text))
        args += ["--control", str(worker.control), "--supervisor", str(os.getpid())]
        inherited = [sock.fileno() for sock in self._listening.smtp] if self._listening is not None else []
        for fd in inherited:
            args += ["--smtp-fd", str(fd)]
        # Workers do not talk to systemd: it ignores them, and READY is the supervisor's to say.
        environment = {name: value for name, value in os.environ.items() if name != "NOTIFY_SOCKET"}
        worker.control.unlink(missing_ok=True)
        failure_path(worker.control).unlink(missing_ok=True)
        worker.hung = None
        # It is handed the texts as of any reload asked for before now, and reads the files they
        # name as they are now: a SIGHUP from here on no longer shortens a wait of its.
        worker.ready = worker.reload_asked = False
        worker.try_again.clear()
        try:
            worker.process = process = await asyncio.create_subprocess_exec(
                *args,
                pass_fds=inherited,
                env=environment,
                stdin=asyncio.subprocess.PIPE if handed is not None else None,
            )
        except PermissionError as error:  # the interpreter out of reach since start-up
            raise RuntimeError(interpreter_problem(self.config.node.user) or f"{sys.executable}: {error}") from error
        _log.info("worker %d started (pid %d)", worker.index, process.pid)
        if handed is not None and process.stdin is not None:
            process.stdin.write(handed)
            # A worker that died before it read them says why itself (`_watch` reads it).
            with contextlib.suppress(ConnectionError):
                await process.stdin.drain()
            process.stdin.close()

    async def _wait_ready(self, stop: asyncio.Event) -> bool:
        """True once every worker answers; False if asked to stop first (a worker that the
        same signal ended, sent to the process group, is then no failure)."""
        deadline = time.monotonic() + _READY_TIMEOUT
        for worker in self.workers:
            while True:
                if stop.is_set():
                    _log.info("stopping while the workers start")
                    return False
                process = worker.process
                if process is not None and process.returncode is not None:
                    raise RuntimeError(
                        f"worker {worker.index} {exit_reason(worker, process.returncode, ' during start-up')}"
                    )
                with contextlib.suppress(OSError, aiohttp.ClientError, TimeoutError):
                    status, _ = await worker.get("/healthz")
                    if status in (200, 503):  # started: it answers, even about a part that is down
                        self._now_ready(worker)
                        break
                if time.monotonic() > deadline:
                    # Alive but not started: it may be waiting for room on a full spool disk,
                    # which it says itself. Giving up would only start it again to wait again.
                    _log.warning("worker %d not ready after %.0fs; still waiting (see its messages)",
                                 worker.index, _READY_TIMEOUT)  # fmt: skip
                    sd_notify(f"STATUS=waiting for worker {worker.index} to start",
                              f"EXTEND_TIMEOUT_USEC={int(2 * _READY_TIMEOUT * 1_000_000)}")  # fmt: skip
                    deadline = time.monotonic() + _READY_TIMEOUT
                await asyncio.sleep(0.05)
        return True

    async def _watch(self, worker: Worker) -> None:
        backoff = _FIRST_BACKOFF
        while not self._stopping:
            process = worker.process
            assert process is not None
            heartbeat = asyncio.create_task(self._heartbeat(worker, process), name=f"heartbeat {worker.index}")
            try:
                status = await process.wait()
            finally:
                heartbeat.cancel()
                await asyncio.gather(heartbeat, return_exceptions=True)
            self._tally.ended(worker.index, process.pid)  # its counters stay in the node's
            if self._stopping:
                return
            worker.restarts += 1
            if worker.ready and worker.answered - worker.ready_at >= _STEADY:
                backoff = _FIRST_BACKOFF  # it ran fine: a crash, not a crash loop
            # Read now: the next start removes what the worker wrote (`failure_path`).
            worker.ended = exit_reason(worker, status)
            if worker.reload_asked:
                # A SIGHUP came after this start began, when the worker may have read the files
                # already, before the operator fixed them: "try again" for it as for a worker
                # waiting (`reload`), which it would have been had it failed a moment sooner.
                worker.try_again.set()
            if worker.try_again.is_set():
                _log.error(
                    "worker %d %s; restarting now: a reload came since it was started, which may have fixed "
                    "what it could not start on",
                    worker.index, worker.ended,
                )  # fmt: skip
            else:
                _log.error("worker %d %s; restarting in %.0fs", worker.index, worker.ended, backoff)
            await self._wait_to_restart(worker, backoff)
            backoff = min(backoff * 2, _LAST_BACKOFF)
            while True:
                try:
                    await self._spawn(worker)
                    break
                except RuntimeError as error:  # its interpreter out of reach since start-up
                    _log.error("worker %d cannot be started: %s; trying again in %.0fs", worker.index, error, backoff)
                    await self._wait_to_restart(worker, backoff)
                    backoff = min(backoff * 2, _LAST_BACKOFF)

    @staticmethod
    async def _wait_to_restart(worker: Worker, backoff: float) -> None:
        """Wait `backoff` seconds before starting `worker` again, or less: until a SIGHUP
        (`reload`), which may have fixed what it could not start on."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(worker.try_again.wait(), backoff)

    async def _heartbeat(self, worker: Worker, process: asyncio.subprocess.Process) -> None:
        """Ask the worker for /healthz over and over; once it has answered (it has started:
        one waiting for room on a full spool disk does not answer yet, and is left to wait), a
        silence of `[node] worker_timeout` means its loop is stuck or the process stopped
        (SIGSTOP, a debugger): kill it, and `_watch` starts it again."""
        timeout = self.config.node.worker_timeout
        interval = min(1.0, timeout / 4)
        answered: float | None = None  # when it last answered
        while process.returncode is None:
            # Each question may take what is left of the timeout: a slow answer is an answer.
            left = timeout if answered is None else answered + timeout - time.monotonic()
            try:
                status, _ = await worker.get("/healthz", within=max(left, interval))
                if status in (200, 503):
                    answered = time.monotonic()
                    self._now_ready(worker)
                    if worker.behind and worker.handing is None:
                        worker.handing = asyncio.create_task(self._hand_rules(worker), name=f"rules {worker.index}")
            except (OSError, aiohttp.ClientError, TimeoutError):
                pass
            if answered is not None and time.monotonic() - answered >= timeout:
                worker.hung = f"it had not answered the supervisor for {timeout:g}s ([node] worker_timeout)"
                _log.error(
                    "worker %d (pid %d) has not answered the supervisor for %gs ([node] worker_timeout): "
                    "killing it (SIGKILL) to start it again",
                    worker.index, process.pid, timeout,
                )  # fmt: skip
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                return
            await asyncio.sleep(interval)

    async def _hand_rules(self, worker: Worker) -> None:
        """Hand `worker`, which missed a change to the node's standing rules, the rules in force
        and those ended (`Admin.adopt`); it stays `behind` (and is handed them again as it next
        answers) until it has taken them as they were once every change it missed was counted.
        A write that went to it meanwhile is no reason to hand them again: it took that write
        itself, and what it was handed cannot undo it (`pigeon.node.standing`)."""
        try:
            if not worker.behind or self._node_rules is None:
                return
            generation = self._node_rules.standing.generation
            body = encode_standing(self._node_rules.standing)
            try:
                status, answer = await worker.post(INTERNAL_PATH, body)
            except (OSError, aiohttp.ClientError, TimeoutError) as error:
                _log.warning("worker %d could not be handed the node's standing rules (%r): again as it answers",
                             worker.index, error)  # fmt: skip
                return
            if status != 200:
                _log.error("worker %d did not take the node's standing rules: %d %s", worker.index, status,
                           answer[:200].decode(errors="replace"))  # fmt: skip
                return
            if worker.behind > generation:
                return  # it missed a change meanwhile: handed the rules again as it next answers
            worker.behind = 0
            _log.info("worker %d, which missed a change to the standing rules, holds the node's again: %s",
                      worker.index, answer.decode(errors="replace"))  # fmt: skip
        finally:
            worker.handing = None

    def _rule_change(self, request: web.Request, body: bytes, issued: float) -> RuleChange | None:
        """The standing rule an admin write `issued` then makes or ends, if it makes or ends one
        and would be carried out (a known token with the scope, a valid request)."""
        if self._node_rules is None or request.method not in ("POST", "DELETE"):
            return None
        if not request.path.startswith("/api/v1/admin/"):
            return None
        try:
            operator = self._tokens.holder(request, "admin")
            validate(request.method, request.path_qs, body)
        except web.HTTPException:
            return None  # refused by every worker: nothing changes
        return rule_change(request.method, request.path, body, operator, issued)

    def _intend(self, change: RuleChange) -> tuple[int, Ended | None]:
        """Number a write to the standing rules before the workers are asked (each is told the
        number, `pigeon.node.standing`), and keep an end at once: a worker that starts, or is
        handed the rules, meanwhile does not take the rule being ended. A rule being made is kept
        once a worker has taken it (`_record`). (The number; what an end ended, for `_record`.)"""
        assert self._node_rules is not None
        generation = self._node_rules.next_generation()
        writing = self._writing.setdefault(change.rule_id, [])
        makes = change.rule is not None
        if writing and (makes or any(made for _, made in writing)):
            # Ends alone (two resumes at once) leave the same whatever order a worker carries
            # them out in: only a rule made beside another write may end up held where it ended.
            self._overlapped.update([number for number, _ in writing] + [generation])
        writing.append((generation, makes))
        if change.rule is not None:
            return generation, None
        before = self._node_rules.end(change.rule_id, change.kind, generation)
        error = self._node_rules.save(time.time())
        if error is not None:
            # Not kept, the end would be undone by the file at the next start of a worker (a
            # cancelled standing bounce back in force): refused, and nothing is changed.
            self._node_rules.restore(before, generation)
            self._on_its_way_no_more(change.rule_id, generation)
            raise web.HTTPServiceUnavailable(
                text=json.dumps(
                    {"error": f"cannot keep the node's standing rules ({error}): nothing was ended; try again"}
                ),
                content_type="application/json",
            )
        return generation, before

    def _on_its_way_no_more(self, rule_id: str, generation: int) -> bool:
        """The write numbered `generation` to `rule_id` has its answers (or was given up): was
        another write to that rule on its way at the same time?"""
        writing = self._writing[rule_id]
        writing[:] = [(number, made) for number, made in writing if number != generation]
        if not writing:
            del self._writing[rule_id]
        overlapped = generation in self._overlapped
        self._overlapped.discard(generation)
        return overlapped

    def _record(
        self,
        change: RuleChange,
        intended: tuple[int, Ended | None],
        results: list[tuple[int, Any] | str],
        overlapped: bool = False,
    ) -> None:
        """Keep what a write did to the standing rules, so that the node's rules and its answer
        agree: a rule made, once a worker took it (as that worker holds it); an end, unless no
        worker carried it out (each refused it, or failed: the answer is an error, and the rule is
        as it was). A worker that missed a change kept (or failed at it) is handed the node's
        rules once it answers (`_hand_rules`)."""
        assert self._node_rules is not None
        generation, before = intended
        missed = [
            worker
            for worker, result in zip(self.workers, results, strict=True)
            if isinstance(result, str) or result[0] >= 500
        ]
        if overlapped:
            # Another write to this rule was on its way too: a worker may have carried the two out
            # in either order (separate connections), and hold a rule the node ended, or lack one it holds, with nothing
            # missed. Every worker is handed the node's rules, which the later write left as they
            # are; what a worker took of that write itself is not undone (`Admin.adopt`).
            missed = self.workers
            _log.warning("admin rules: %s %s written again while this write was on its way: every worker is "
                         "handed the node's rules", change.kind, change.rule_id)  # fmt: skip
        answers = [result for result in results if not isinstance(result, str)]
        if change.rule is not None:
            taken = _taken(change, answers)
            if taken is None:
                return  # no worker took it: the answer is an error, and no worker is handed it
            self._node_rules.taken(taken, generation)
            self._node_rules.save(time.time())
        elif before is not None and not any(status in (200, 404) for status, _ in answers):
            # Kept before the workers were asked: one that started, or was handed the rules,
            # meanwhile may have ended the rule. Every worker is handed them again.
            self._node_rules.restore(before, generation)
            missed = self.workers
            _log.warning("admin rules: no worker ended %s %s (each refused it or failed): it stands", change.kind,
                         change.rule_id)  # fmt: skip
            self._node_rules.save(time.time())
        for worker in missed:
            if not worker.behind and not overlapped:
                _log.warning("worker %d missed a change to the standing rules (%s %s): it is handed them as it "
                             "answers", worker.index, change.kind, change.rule_id)  # fmt: skip
            worker.behind = max(worker.behind, self._node_rules.standing.generation)

    # --- the public HTTP listener ------------------------------------------------------------
    async def _serve_http(self) -> None:
        app = web.Application(
            client_max_size=self.config.http.max_request_size, middlewares=[json_errors, transfer_codings]
        )
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        # The workers' routes: a path or method none of them has is answered here (404, 405
        # with Allow), before any token is asked for, as a worker would.
        add_api_routes(app, self._api)
        # A body left unread (a request refused from its headers) is read and dropped for at
        # most a second after the answer, so the client sees the answer rather than a reset;
        # then the connection closes. aiohttp's default is 10 s of a 64 MiB upload per client.
        shares = share(open_files_limit(), 0, self.config.http.max_connections)
        if shares.warning is not None:
            _log.warning("%s", shares.warning)
        limits = ConnectionLimits.of(self.config.http, shares.http)
        self._runner = GuardedRunner(app, limits, access_log=None, handle_signals=False, lingering_time=_LINGER)
        await self._runner.setup()
        listen = self.config.http.listen
        if self._listening is not None and self._listening.http:
            for sock in self._listening.http:
                await web.SockSite(self._runner, sock).start()
        else:
            await web.TCPSite(self._runner, listen.host, listen.port, reuse_address=True).start()
        _log.info("http listening on %s", host_port(listen.host, listen.port))

    async def _ask_all(self, path: str, within: float) -> list[tuple[int, bytes] | str]:
        """Every worker's answer to `path`, each given `within` seconds (asked at once), or why
        it gave none."""

        async def ask(worker: Worker) -> tuple[int, bytes] | str:
            try:
                return await worker.get(path, within=within)
            except TimeoutError:
                # Its loop blocked, or the process stopped (SIGSTOP): the heartbeat kills it in time.
                return (
                    f"it did not answer within {within:g}s (busy, or stopped: the supervisor kills it once it has not "
                    f"answered for {self.config.node.worker_timeout:g}s, [node] worker_timeout)"
                )
            except (OSError, aiohttp.ClientError):
                return _why_down(worker)

        return await asyncio.gather(*(ask(w) for w in self.workers))

    async def _workers_metrics(self) -> str:
        """Every worker's metrics, added up with what its ended processes counted (`Tally`)."""

        async def ask(worker: Worker) -> bool:
            process = worker.process
            try:
                status, body = await worker.get("/metrics")
            except (OSError, aiohttp.ClientError, TimeoutError):
                return False
            if status != 200 or process is None or worker.process is not process or process.returncode is not None:
                return False  # (an answer of a process that has ended since: `_watch` carried its last)
            try:
                self._tally.answered(worker.index, process.pid, body.decode("utf-8"))
            except ValueError:
                return False
            return True

        answered = await asyncio.gather(*(ask(w) for w in self.workers))
        return self._tally.exposition({w.index for w, ok in zip(self.workers, answered, strict=True) if ok})

    async def _healthz(self, request: web.Request) -> web.Response:
        body = await self._health()
        code = http_status(body["status"])
        if not self._tokens.shows_status(request):
            # (`[http] status_token_required`: the node's status and code alone, as a worker answers.)
            return web.json_response(brief(body["status"]), status=code)
        return web.json_response(body, status=code)

    async def _health(self) -> dict[str, Any]:
        """The node's /healthz: its workers' answers, added up."""
        # A bound on each worker's answer: a probe with a short timeout must hear the node's status,
        # not wait for a worker that does not answer (a stopped one would hold it for seconds).
        answers = await self._ask_all("/healthz", _HEALTH_WAIT)
        workers: list[dict[str, Any]] = []
        for worker, answer in zip(self.workers, answers, strict=True):
            detail: dict[str, Any] | None = None
            if not isinstance(answer, str) and answer[0] in (200, 503):
                with contextlib.suppress(ValueError):
                    detail = json.loads(answer[1])
            if detail is None:  # not answering: restarting, or hung
                why = answer if isinstance(answer, str) else _why_down(worker)
                detail = {"worker": worker.index, "status": DOWN, "error": why}
            elif detail.get("status") == STOPPING:  # going away while the node is not
                detail["status"] = DOWN
            detail["restarts"] = worker.restarts
            workers.append(detail)
        mine = [DEGRADED] if self._reload_problem is not None else []
        status = STOPPING if self._stopping else worst([*(w["status"] for w in workers), *mine])
        body = {
            "status": status,
            "node": self.config.node.name,
            # As a node of one worker says them, so that a probe reading `.log.status` works
            # on either: each the worst of the workers', its counts added up.
            "spool": _merged_component(workers, "spool", ("messages",)),
            "smtp": _merged_component(workers, "smtp", ("connections",)),
            "log": _merged_component(workers, "log", ("pending", "unlogged", "unconfirmed", "lost")),
            "workers": workers,
        }
        inbound = {name: state for w in workers for name, state in w.get("inbound", {}).items()}
        if inbound:
            body["inbound"] = inbound
        targets: dict[str, Any] = {}
        for w in workers:  # each worker hands over its own shard's mail: the worst says
            for name, state in w.get("targets", {}).items():
                if name not in targets or state.get("status") != OK:
                    targets[name] = state
        if targets:
            body["targets"] = targets
        configs = [w["config"] for w in workers if "config" in w]
        if self._reload_problem is not None:  # (the file did not load: every worker's reload failed)
            configs.insert(0, {"status": DEGRADED, "error": self._reload_problem})
        # A reload that failed on any worker: the node runs what it ran before. (No worker
        # answering: the configuration this process runs is the node's, loaded or not.)
        body["config"] = next((c for c in configs if c.get("status") != OK), configs[0] if configs else {"status": OK})
        shaping = [w["shaping"] for w in workers if "shaping" in w]
        if shaping:  # a worker that falls back keeps to the node's share: the node says so
            worst_one = max(shaping, key=lambda s: (s.get("status") != OK, s.get("mode") == "fallback"))
            body["shaping"] = worst_one
        return body

    async def _api(self, request: web.Request) -> web.StreamResponse:
        """An API request goes to one worker, the next one each time; a worker that is down
        (restarting) is skipped. Admin requests concern every worker's shards: they go to all
        of them (see `_broadcast`).

        The body is read only once the headers carry a known token (the worker checks its scope)
        and while fewer than `max_open_requests` are in hand: an anonymous client cannot make
        this process hold up to `max_request_size` per connection it opens. What is open without
        a token (GET of the OpenAPI document) is passed on without its body, if it has one, and
        counts against a small bound of its own.

        A HEAD is asked of the workers as a GET: the answer has the headers the GET's has (its
        Content-Length too), and aiohttp leaves its body out."""
        head = request.method == "HEAD"
        if head:
            request = request.clone(method="GET")
        if request.path in _OPEN_WITHOUT_TOKEN and request.method in _OPEN_METHODS:
            return await self._pass_on_anonymous(request)
        try:
            self._tokens.known(request)
        except web.HTTPException as refusal:
            return _closing(web.Response(status=refusal.status, text=refusal.text, headers=refusal.headers))
        max_size = self.config.http.max_request_size
        if declared_too_large(request, max_size):
            return await self._too_large(request, max_size)
        if self._open_requests >= self.config.http.max_open_requests:
            message = f"{self._open_requests} API requests in progress ([http] max_open_requests): try again shortly"
            return _closing(web.json_response({"error": message}, status=503, headers={"Retry-After": "1"}))
        self._open_requests += 1
        try:
            if (refused := coding_refusal(request)) is not None:
                # Not read: no decoder here. An injection's 415 is a worker's (it logs it), as a 413 is.
                return await self._refused_body(request, refused)
            try:
                body = await read_coded(request)
            except web.HTTPRequestEntityTooLarge:
                return await self._too_large(request, max_size)
            except ConnectionResetError:  # the client went before the end of its body: nobody to answer
                return gone()
            except (ContentEncodingError, web.RequestPayloadError) as error:
                if not not_decoded(request, error):
                    raise
                coding = request.headers.get("Content-Encoding", "").strip().lower()
                return await self._refused_body(request, undecodable(coding), undecodable_body=True)
            if _stored_message(request):
                return await self._from_holder(request, head=head)
            return await self._pass_on(request, body)
        finally:
            self._open_requests -= 1

    async def _refused_body(
        self, request: web.Request, refusal: web.HTTPException, *, undecodable_body: bool = False
    ) -> web.Response:
        """`refusal` of a body in a coding not taken (415) or not coded as it says (400), both
        naming Content-Encoding. An injection's is a worker's to answer, as with one worker: it
        logs the Rejection. It is told without the body (the coding goes as `CODING_HEADER`, and
        `UNDECODABLE_HEADER` says it could not be decoded); if no worker can be asked, `refusal`
        is answered here, unlogged. The connection is closed: the body is not read to its end."""
        if request.path in INJECT_PATHS:
            answer = await self._pass_on(request, b"", undecodable_body=undecodable_body)
            if answer.status < 500:
                return _closing(answer)
        headers = {name: refusal.headers[name] for name in ("Accept-Encoding",) if name in refusal.headers}
        return _closing(web.Response(status=refusal.status, text=refusal.text, headers=headers,
                                     content_type="application/json"))  # fmt: skip

    async def _too_large(self, request: web.Request, max_size: int) -> web.Response:
        """413 for a body over `max_size`. An injection's is a worker's to answer, as with one
        worker: it logs the Rejection (this process keeps no log). It is told without the body
        (`body.TOO_LARGE_HEADER`); if no worker can be asked, the 413 is answered here, unlogged."""
        if request.path not in INJECT_PATHS:
            return too_large(max_size)
        answer = await self._pass_on(request, b"", too_large_body=True)
        return too_large(max_size) if answer.status >= 500 else answer

    async def _pass_on_anonymous(self, request: web.Request) -> web.Response:
        if self._open_anonymous >= _MAX_OPEN_ANONYMOUS:
            message = f"{self._open_anonymous} requests without a token in progress: try again shortly"
            return _closing(web.json_response({"error": message}, status=503, headers={"Retry-After": "1"}))
        self._open_anonymous += 1
        try:
            response = await self._pass_on(request, b"")
        finally:
            self._open_anonymous -= 1
        # A GET's body means nothing here and is not read: close rather than drain it.
        return _closing(response) if request.body_exists else response

    async def _pass_on(
        self, request: web.Request, body: bytes, *, too_large_body: bool = False, undecodable_body: bool = False
    ) -> web.Response:
        if request.path.startswith(_BROADCAST_PATHS):
            return await self._broadcast(request, body)
        for worker in self._in_turn():
            try:
                forwarding = worker.forward(
                    request, body, too_large_body=too_large_body, undecodable_body=undecodable_body
                )
                if request.path in INJECT_PATHS:
                    return await _while_client_stays(request, forwarding)
                return await forwarding
            except aiohttp.ClientConnectorError:
                continue  # not listening (restarting): the request never reached it, try another
            except (OSError, aiohttp.ClientError, TimeoutError) as error:
                # It may have acted on the request before it went away: say so, do not repeat it
                # (`outcome_unknown`: `pigeon inject` must not take this 5xx for "nothing was done").
                message = (
                    f"worker {worker.index} failed during the request ({_in_words(error)}); it may have been applied"
                )
                return web.json_response({"error": message, "field": None, "outcome_unknown": True}, status=502)
        return web.json_response({"error": "no worker is up; try again shortly"}, status=503)

    async def _from_holder(self, request: web.Request, *, head: bool = False) -> web.StreamResponse:
        """A message's stored bytes (`pigeon.listener.http.content`), passed on as the worker that
        holds it sends them, piece by piece: a message of gigabytes is never held here. Asked of
        the worker whose shard made the id first (it holds it, unless another adopted its
        shard), then of the others, until one has it: as `pigeon inspect` finds it on any worker.
        None has it and one could not be asked: 503, partial, as the inspect's answer would be.
        `head`: the client asked HEAD (passed on as a GET): the headers alone, no byte of the body
        (the request, cloned as a GET, no longer tells aiohttp to leave it out)."""
        try:
            shard = shard_of(parse_id(request.match_info.get("id", "")))
        except ValueError:
            shard = 0  # (any worker refuses it, 400)
        timeout = self.config.node.worker_timeout
        headers = {name: request.headers[name] for name in _FORWARDED_HEADERS if name in request.headers}
        missing: dict[int, str] = {}
        absent: web.Response | None = None
        started: web.StreamResponse | None = None
        for worker in sorted(self.workers, key=lambda w: w.index != shard):
            connector = aiohttp.UnixConnector(path=str(worker.control))
            # A bound on each wait (the answer's start, each piece), none on the whole: a large
            # message takes as long as the client takes to read it.
            within = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
            try:
                async with (
                    aiohttp.ClientSession(connector=connector, timeout=within) as http,
                    http.get(f"http://worker{request.rel_url}", headers=headers) as answer,
                ):
                    kept = {name: answer.headers[name] for name in _RETURNED_HEADERS if name in answer.headers}
                    if answer.status != 200:
                        said = web.Response(body=await answer.read(), status=answer.status, headers=kept)
                        if answer.status != 404:
                            return said  # a refusal (the token, the id): every worker's alike
                        absent = said
                        continue
                    started = web.StreamResponse(headers=kept)
                    if answer.content_length is not None or head:
                        started.content_length = answer.content_length or 0
                    await started.prepare(request)
                    if head:
                        await started.write_eof()
                        return started
                    async for piece in answer.content.iter_chunked(64 * 1024):
                        await started.write(piece)
                    await started.write_eof()
                    return started
            except (OSError, aiohttp.ClientError, TimeoutError) as error:
                if started is not None and started.prepared:
                    # Cut mid-message: the client sees it end short of its Content-Length, or of
                    # its last chunk, not a whole message; another worker has no other copy.
                    raise
                missing[worker.index] = f"could not be asked: {_in_words(error)}; it may be restarting"
        if not missing:
            return absent or web.json_response({"error": "no worker is up; try again shortly"}, status=503)
        answered = [worker.index for worker in self.workers if worker.index not in missing]
        told = "; ".join(f"worker {index}: {why}" for index, why in missing.items())
        partial = {
            "error": f"not every worker answered ({told}): the message may be on one that did not",
            "partial": True,
            "answered": answered,
            "missing": [{"worker": index, "error": why} for index, why in missing.items()],
        }
        return web.json_response(partial, status=503)

    def _in_turn(self) -> list[Worker]:
        """The workers a request passed to one worker may try, each once, in this order: from the
        next in the round (`_next_worker`, moved on by one for each request, not for each try) on,
        those that seem up first, then those known down (their process has ended, or has not
        answered since it was started), which a try may yet find up. The walk is the request's
        own: requests forwarded meanwhile move the round on, and must not send this one's next
        try back to the worker that just refused it, or past the one that is up."""
        start = self._next_worker % len(self.workers)
        self._next_worker += 1
        walk = self.workers[start:] + self.workers[:start]
        return sorted(walk, key=_known_down)  # (stable: each part keeps the round's order)

    async def _broadcast(self, request: web.Request, body: bytes) -> web.Response:
        """An admin request goes to every worker (each owns its shards); with [redis], a write
        (or a read given ?cluster=1) goes to every node too (`pigeon.node.broadcast`).

        A write is stamped here, once (`issued`): every worker, and with [redis] every node (the
        stream entry's `time`), makes the standing rule it makes with that `created` and ends it
        its duration after, as the answer says, not each at the moment it reads the request."""
        issued = time.time()
        holder = self._tokens.known(request)  # (known: `_api` asked before reading the body)
        tenants = self._tokens.binding(holder)
        if (refused := body_too_large(body)) is not None:  # before anything here decodes it
            status, answer = refusal_answer(refused)
            return web.json_response(answer, status=status)
        if request.method == "POST" and body:
            # Named (and `via` and `bound_to` set) before it is confined: `_confined` checks the very body every
            # worker and node is told. Checked before `with_id` made `via` valid, a write naming
            # `"via": "curl"` was passed on unconfined, and the other nodes carried it out so.
            body = with_id(body, caller(request), tenants)
        try:
            body = self._confined(request, body, holder, tenants)
        except web.HTTPException as refusal:
            status, answer = refusal_answer(refusal)
            return web.json_response(answer, status=status)
        if request.method == "POST" and body and self._node_rules is not None:
            # One id, one rule: another rule's id is refused before any worker or node is told,
            # and so is an operation that makes no rule under a rule's id.
            in_force = self._node_rules.standing.in_force
            operation = operation_of(request.method, request.path, body)
            try:
                if (change := self._rule_change(request, body, issued)) is not None:
                    refuse_taken_id(change, in_force.get(change.rule_id), issued)
                if operation is not None:
                    refuse_taken_operation(operation, in_force.get(operation[0]), issued)
            except web.HTTPConflict as refusal:
                answer = confined_answer(request.method, request.path, refusal_answer(refusal)[1], tenants)
                return web.json_response(answer, status=refusal.status)
        cluster = self._cluster
        if (
            cluster is not None
            and request.path.startswith(("/api/v1/admin/", "/api/v1/queues"))
            and (request.method != "GET" or cluster_wide(request))
        ):
            try:
                # Checked here, before any other node is told: the others trust the stream.
                operator = self._tokens.holder(request, "read" if request.method == "GET" else "admin")
                if request.method == "POST":
                    require_json(request)
                validate(request.method, request.path_qs, body)
            except web.HTTPException as refusal:
                status, answer = refusal_answer(refusal)
                challenge = {k: v for k, v in refusal.headers.items() if k == "WWW-Authenticate"}
                return web.json_response(answer, status=status, headers=challenge)
            here: dict[str, Any] = {}

            async def local() -> tuple[int, Any]:
                status, answer = await self._to_workers_in_turn(request, body, issued)
                if isinstance(answer, dict):
                    here.update((key, answer[key]) for key in _BY_WORKER if key in answer)
                return status, answer

            status, merged = await cluster.around(request.method, request.path, body, operator, local, issued=issued)
            if isinstance(merged, dict):
                # What this node's workers hold differently: theirs, numbered as this node numbers
                # them (the other nodes' workers answer one by one, and say no such thing).
                for key in _BY_WORKER:
                    merged.pop(key, None)
                merged.update(here)
                if "added_on" in here:
                    merged["already"] = False
        else:
            status, merged = await self._to_workers_in_turn(request, body, issued)
        if tenants is not None and request.method == "GET" and request.path.rstrip("/") == LIST_PATH:
            # Merged on the workers' ids; a bound token is given its cursor sealed, naming no message.
            merged = sealed_page(merged, self._tokens.cursor_key, tenants)
        # (Each worker confined its own answer; the other nodes' are confined here.)
        return web.json_response(confined_answer(request.method, request.path, merged, tenants), status=status)

    def _confined(self, request: web.Request, body: bytes, holder: str, tenants: frozenset[str] | None) -> bytes:
        """An admin write of a token bound to `tenants` confined to them (`admin.confine`), here,
        before any worker or node is told, and before the rule it makes is numbered: every
        worker and node then makes the same rule from the same body (`body`, its id, `via` and
        `bound_to` set: the one they are told).

        Fails closed: a write of such a token that cannot be confined (no `admin` scope, a body
        `validate` refuses, a selector not of its tenants) is refused here, with the answer a
        worker would give (400 or 403 naming the field), and never passed on. Passed on for each
        worker to refuse, it was only as safe as every step after this one: `with_id` made a
        `via` valid after the check, and the other nodes carried out acme's bounce of globex."""
        if tenants is None or request.method not in ("POST", "DELETE") or not request.path.startswith("/api/v1/admin/"):
            return body
        self._tokens.holder(request, "admin")  # (in the order a worker refuses them: `admin.write`)
        if request.method == "POST":
            require_json(request)
        validate(request.method, request.path_qs, body)
        in_force = self._node_rules.standing.in_force if self._node_rules is not None else {}
        routing = self._tokens.routing_domains(holder)
        return confine(request.method, request.path, body, holder, tenants, in_force.get, routing)

    async def _to_workers_in_turn(
        self, request: web.Request, body: bytes, issued: float | None = None
    ) -> tuple[int, Any]:
        """`_to_workers`; a suspension once every worker has answered the one before. Identical
        suspensions asked for at once would otherwise reach the workers in different orders:
        each worker makes the rule for another request, each request finds it `already` made
        on some worker, and no client learns that it was its own that made it. (The rule and
        its id are one either way: `pigeon.queue.rules.standing_rule_id`.) A suspension only
        holds what is in memory, so the next waits for moments, not for a walk of the spool."""
        if request.method == "POST" and request.path.startswith("/api/v1/admin/suspend"):
            async with self._suspending:
                return await self._to_workers(request, body, issued)
        return await self._to_workers(request, body, issued)

    async def _to_workers(self, request: web.Request, body: bytes, issued: float | None = None) -> tuple[int, Any]:
        """Every worker asked at once. One that could not be reached, or went away before it
        answered, makes the answer 503 with `partial: true`: which workers answered, and what
        they said together. `issued`: when a write reached this process (None: now), which each
        worker is told (`ISSUED_HEADER`) and stamps a standing rule it makes with.

        A read waits at most `[node] worker_timeout` for each worker: a stuck one does not hold
        up `pigeon top`. A write (a bulk bounce, retry, rebind: minutes on a large spool, its
        walk resting half the time) waits for each worker's answer however long the operation
        takes, as the API promises; a worker that really hangs stops answering its heartbeat
        too, the watchdog kills it (`_heartbeat`), and the request to it then fails at once."""
        timeout = self.config.node.worker_timeout
        read = request.method in _OPEN_METHODS
        if issued is None:
            issued = time.time()  # (issued here and now: `_broadcast` stamps what a client asks)
        change = None if read else self._rule_change(request, body, issued)

        async def ask(worker: Worker) -> tuple[int, Any] | str:
            try:
                generation = intended[0] if intended is not None else None
                response = await worker.forward(
                    request,
                    body,
                    within=timeout if read else None,
                    generation=generation,
                    issued=None if read else issued,
                )
            except TimeoutError:
                return f"no answer within {timeout:g}s ([node] worker_timeout)"
            except aiohttp.ClientConnectorError as error:
                if isinstance(error.os_error, FileNotFoundError):
                    return "could not be asked: it is restarting (its control socket is missing)"
                return f"could not be asked: {_in_words(error)}; it may be restarting"
            except (OSError, aiohttp.ClientError) as error:
                if read:
                    return f"went away before it answered ({_in_words(error)}); it may be restarting"
                return (
                    f"went away before it answered ({_in_words(error)}); it may have carried out part of the request "
                    "(see `pigeon queue operations`)"
                )
            try:
                return response.status, json.loads(response.body)  # type: ignore[arg-type]
            except ValueError:
                # Not an answer of the API's own: pass on what the worker said, not a riddle.
                text = response.text.strip() if response.text else ""
                return response.status, {"error": text or f"worker {worker.index} answered {response.status}"}

        intended = self._intend(change) if change is not None else None
        overlapped = False
        try:
            results = await asyncio.gather(*(ask(worker) for worker in self.workers))
        finally:
            if change is not None and intended is not None:
                overlapped = self._on_its_way_no_more(change.rule_id, intended[0])
        if change is not None and intended is not None:
            self._record(change, intended, results, overlapped)
        answers = [result for result in results if not isinstance(result, str)]
        missing = {
            worker.index: result
            for worker, result in zip(self.workers, results, strict=True)
            if isinstance(result, str)
        }
        if not missing:
            return self._merged(request, results)
        answered = [
            worker.index for worker, result in zip(self.workers, results, strict=True) if not isinstance(result, str)
        ]
        said = "; ".join(f"worker {index}: {why}" for index, why in missing.items())
        partial: dict[str, Any] = {
            "error": (
                f"not every worker answered ({said}); {covered(answered, this='this')}"
                if answered
                else f"no worker answered ({said})"
            ),
            "partial": True,
            "answered": answered,
            "missing": [{"worker": index, "error": why} for index, why in missing.items()],
        }
        if answers:
            partial["answers"] = self._merged(request, results)[1]
        return 503, partial

    def _merged(self, request: web.Request, results: list[tuple[int, Any] | str]) -> tuple[int, Any]:
        """The workers' answers (those that answered) added up, saying where they differ about a
        standing rule: a list of rules marks each rule a worker does not hold (`not_held`:
        id -> workers), a suspension already in force on some workers says which it was added
        on (`added_on`), not `already`."""
        by_worker = {
            worker.index: result
            for worker, result in zip(self.workers, results, strict=True)
            if not isinstance(result, str)
        }
        path = request.path.rstrip("/")
        if request.method == "GET" and path == LIST_PATH:
            # Pages, not counts: merged on their cursors, oldest first (`pigeon.queue.listing`).
            return merge_page_answers(list(by_worker.values()), page_limit(request.query))
        status, merged = merge_answers(list(by_worker.values()))
        suspensions = {
            index: set(answer.get(SUSPENSIONS_HELD, ()))
            for index, (code, answer) in by_worker.items()
            if code == 200 and isinstance(answer, dict)
        }
        if isinstance(merged, dict):
            merged.pop(SUSPENSIONS_HELD, None)  # the workers' word to this process, not the client's
        if status >= 400 or not isinstance(merged, dict) or len(by_worker) < 2:
            return status, merged
        held = {
            index: {r.get("id") for r in answer.get("rules", ()) if isinstance(r, dict)}
            for index, (code, answer) in by_worker.items()
            if code == 200 and isinstance(answer, dict)
        }
        if request.method == "GET" and path in _RULE_LISTS:
            not_held = {
                rule["id"]: lacking
                for rule in merged.get("rules", ())
                if isinstance(rule, dict)
                and (lacking := [index for index, ids in held.items() if rule.get("id") not in ids])
            }
            if not_held:
                merged["not_held"] = not_held
        elif request.method == "GET" and path == "/api/v1/queues":
            # The suspensions that hold a queue's mail, as each worker that holds some says: marked
            # where a worker lacks one, as the lists are (its share of that mail goes out).
            named = {
                rule["id"]
                for row in (*merged.get("scheduled", ()), *merged.get("ready", ()))
                for rule in row.get("suspended_by", ())
                if isinstance(rule, dict) and "id" in rule
            }
            not_held = {
                rule_id: lacking
                for rule_id in sorted(named)
                if (lacking := [index for index, ids in suspensions.items() if rule_id not in ids])
            }
            if not_held:
                merged["not_held"] = not_held
        elif request.method == "POST" and path == "/api/v1/admin/suspend" and merged.get("already"):
            said = {
                index: answer.get("already")
                for index, (code, answer) in by_worker.items()
                if code == 200 and isinstance(answer, dict)
            }
            added_on = [index for index, already in said.items() if not already]
            if added_on:  # in force elsewhere, not there: added where it lacked
                merged["already"] = False
                merged["added_on"] = added_on
        return status, merged

    async def _metrics(self, request: web.Request) -> web.Response:
        async def workers() -> tuple[int, Any]:
            return 200, {"text": await self._workers_metrics()}

        holder = self._tokens.status_holder(request) if self._tokens.status_token_required else None
        if not cluster_wide(request) or self._cluster is None:
            _, answer = await workers()
            return exposition(answer["text"])
        operator = holder or self._tokens.holder(request, "read")  # every node works for it: not for anyone
        _, answer = await self._cluster.around("GET", "/metrics", b"", operator, workers, merge_metric_answers)
        return exposition(answer["text"] + cluster_comment(answer["cluster"]))


def _taken(change: RuleChange, answers: list[tuple[int, Any]]) -> Rule | None:
    """The rule a write made, as a worker that took it answers with it (its own clock's expiry;
    for a suspension `already` in force, the one in force); None if no worker took it."""
    for status, answer in answers:
        rule = answer.get("rule") if status == 200 and isinstance(answer, dict) else None
        if isinstance(rule, dict) and rule.get("id") == change.rule_id:
            with contextlib.suppress(msgspec.ValidationError):
                return msgspec.convert(rule, Rule)
    return None


def _stored_message(request: web.Request) -> bool:
    """Whether `request` asks for a message's stored bytes (`Supervisor._from_holder`)."""
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical in (CONTENT_PATH, HEADERS_PATH)


def _known_down(worker: Worker) -> bool:
    """`worker` cannot take a request now, as far as the supervisor knows: its process has ended
    (killed, crashed: restarting), or has not answered since it was started."""
    process = worker.process
    return process is None or process.returncode is not None or not worker.ready


def _merged_component(workers: list[dict[str, Any]], name: str, counts: tuple[str, ...]) -> dict[str, Any]:
    """A component of the node's /healthz made of its workers' (`name` in each answer): the
    worst `status` (a worker's `error` with it: the first worst one's), each of `counts` added
    up, and `uncounted` naming the workers that did not answer (a worker down: its shard's mail
    is still there, only not counted here)."""
    parts = [w[name] for w in workers if isinstance(w.get(name), dict)]
    status = worst(part.get("status", OK) for part in parts)
    merged: dict[str, Any] = {"status": status}
    error = next((part["error"] for part in parts if part.get("status", OK) == status and "error" in part), None)
    if error is not None:
        merged["error"] = error
    for count in counts:
        merged[count] = sum(part.get(count, 0) for part in parts)
    uncounted = [w["worker"] for w in workers if not isinstance(w.get(name), dict)]
    if uncounted:
        merged["uncounted"] = uncounted
    return merged


def _why_down(worker: Worker) -> str:
    """Why `worker` does not answer, for `/healthz`: how its last process ended (a worker that
    cannot start says why at every try: `configuration error: ...`), redacted as the log is
    (the text is the worker's own, and /healthz is public)."""
    process = worker.process
    running = process is not None and process.returncode is None
    if worker.ended is None:
        return "it does not answer the supervisor" if running else "it is not running"
    return redact(f"starting again after it {worker.ended}" if running else f"it {worker.ended}")


def _in_words(error: BaseException) -> str:
    """Why a worker could not be asked or did not answer, as an operator reads it ("connection
    refused"), not as Python prints it (an aiohttp exception's repr, which `pigeon top` cuts off)."""
    cause = error.os_error if isinstance(error, aiohttp.ClientConnectorError) else error
    if isinstance(cause, OSError) and cause.errno is not None and cause.errno > 0:
        return os.strerror(cause.errno).lower()  # "connection refused", "connection reset by peer"
    if isinstance(error, TimeoutError):
        return "it took too long"
    return "the connection to it was lost"  # aiohttp's ServerDisconnectedError, a cut-off answer


def _closing(response: web.Response) -> web.Response:
    """`response`, after which the connection closes: an unread body is not drained."""
    response.force_close()
    return response


async def _while_client_stays(request: web.Request, forwarding: Awaitable[web.Response]) -> web.Response:
    """An injection's answer from the worker it was passed to. Should its client go first, the
    connection to the worker is closed too: the worker then stores nothing more for it, as one
    worker does for a client of its own (`pigeon.listener.http.inject`), since the client never
    hears what was taken and will send the request again."""
    task = asyncio.ensure_future(forwarding)
    try:
        while not (await asyncio.wait({task}, timeout=_CLIENT_WATCH))[0]:
            if request.transport is None:
                task.cancel()
                await asyncio.wait({task})
                if task.cancelled():  # (an answer that came meanwhile is given as any other)
                    return web.Response(status=499, text="client gone")  # no one hears it
    finally:
        if not task.done():  # this handler cancelled (a stop): the forward goes with it
            task.cancel()
            task.add_done_callback(_retrieved)
    return task.result()


def _retrieved(task: asyncio.Future[web.Response]) -> None:
    """Take a forward's ending that no one waits for any more (its error, if any, was the
    stop's doing), so that asyncio does not report it as never retrieved."""
    if not task.cancelled():
        task.exception()
