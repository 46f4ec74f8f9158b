"""The inbound side of a node: targets, arbitration and the mailbox watchers.

Every worker builds the targets, because SMTP-received mail for an `[[inbound]]` route is
delivered from the worker that spooled it. Mailboxes are watched by the first worker only:
more watchers on one node would only contend for the same claims. With `[delivery] enabled =
false` that SMTP-received mail waits in the spool (the node only accepts), which the first
worker says at start.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import logging
from typing import Any

from pigeon.config.schema import Config
from pigeon.inbound import targets
from pigeon.inbound.arbitration import Arbiter, LocalArbiter, RedisArbiter
from pigeon.inbound.mailbox import MailboxWatcher
from pigeon.inbound.marks import marks_path
from pigeon.inbound.notes import Notes, RedisNotes
from pigeon.inbound.routes import PREFIX
from pigeon.inbound.targets import Target
from pigeon.logs.outbox import Outbox
from pigeon.logs.writer import LogWriter
from pigeon.metrics import Metrics
from pigeon.redaction import redact

_log = logging.getLogger(__name__)


def inbound_max_age(config: Config, target: str) -> float:
    """The `max_age` of a target's SMTP-received mail: that of the first `[[queue]]` whose name
    matches its queue, `inbound:<target>`, as the queue's own policy picks it, else `[delivery]`'s."""
    name = PREFIX + target
    queue = next((q for q in config.queue if fnmatch.fnmatchcase(name, q.name)), None)
    return float(queue.max_age if queue is not None and queue.max_age is not None else config.delivery.max_age)


class Inbound:
    def __init__(
        self, config: Config, log: LogWriter, metrics: Metrics, *, watch: bool, outbox: Outbox | None = None
    ) -> None:
        self.config = config
        redis_url = config.redis.url
        self.targets: dict[str, Target] = {
            t.name: targets.build(t, redis_url, max_age=inbound_max_age(config, t.name)) for t in config.target
        }
        self.arbiter: Arbiter
        if redis_url is not None:
            self.arbiter = RedisArbiter(
                redis_url, prefix=config.redis.key_prefix, timeout=config.redis.timeout, node=config.node.name
            )
        elif watch and config.mailbox:
            # Done marks outlive the process in the spool, as they would in Redis: the next
            # start acknowledges what this one handed over and could not acknowledge. One
            # writer: only this worker watches mailboxes.
            self.arbiter = LocalArbiter(marks_path(config.spool.path), node=config.node.name)
        else:
            self.arbiter = LocalArbiter()
        self.notes: Notes = (
            RedisNotes(redis_url, prefix=config.redis.key_prefix, timeout=config.redis.timeout)
            if redis_url is not None and watch and config.mailbox
            else Notes()
        )
        configs = {t.name: t for t in config.target}
        self.watchers = [
            MailboxWatcher(
                mailbox,
                self.targets[mailbox.target],
                self.arbiter,
                log,
                metrics,
                retry_interval=configs[mailbox.target].retry_interval,
                max_retry_interval=configs[mailbox.target].max_retry_interval,
                node=config.node.name,
                notes=self.notes,
                outbox=outbox,
            )
            for mailbox in (config.mailbox if watch else [])
        ]
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        for target in self.targets.values():
            try:
                await target.start()
            except Exception as error:  # its messages wait and are retried; the node runs on
                _log.error("target %s could not start: %s", target.name, error)
        # (What it says of its configuration, worker 0 says with the rest: `config_warnings`.)
        for watcher in self.watchers:
            self._watch(watcher)

    def _watch(self, watcher: MailboxWatcher) -> None:
        task = asyncio.create_task(watcher.run(), name=f"mailbox {watcher.config.name}")
        self._tasks.append(task)
        task.add_done_callback(functools.partial(self._watcher_ended, watcher))

    def _watcher_ended(self, watcher: MailboxWatcher, task: asyncio.Task[None]) -> None:
        """A watcher ends only when the node stops. One that ends otherwise (a bug) would leave
        its mailbox unwatched with nothing said: it is logged, and started again."""
        self._tasks.remove(task)
        if self._stopping:
            return
        error = None if task.cancelled() else task.exception()
        _log.error("mailbox %s: its watcher ended unexpectedly; starting it again", watcher.config.name,
                   exc_info=error)  # fmt: skip
        asyncio.get_running_loop().call_later(1.0, self._restart, watcher)

    def _restart(self, watcher: MailboxWatcher) -> None:
        if not self._stopping:
            self._watch(watcher)

    def halt(self) -> None:
        """The node stops: no handoff starts from now on, from a mailbox or from the spool (mail
        of an `[[inbound]]` route); those in flight finish. Said first thing in a stop, before
        the node waits for its SMTP sessions: nothing is handed over meanwhile that the next
        start (or another node) would hand over too."""
        self._stopping = True
        for target in self.targets.values():
            target.halt()
        for watcher in self.watchers:
            watcher.halt()

    async def stop(self, grace: float) -> None:
        self.halt()
        await asyncio.gather(*(w.stop(grace) for w in self.watchers))
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        for target in self.targets.values():
            try:
                await target.close()
            except Exception:
                _log.exception("closing target %s", target.name)
        await self.arbiter.close()
        await self.notes.close()

    def health(self) -> dict[str, Any]:
        return {w.config.name: w.health() for w in self.watchers}

    def routed_health(self) -> dict[str, Any]:
        """/healthz's part for each target of an `[[inbound]]` route (mail received over SMTP):
        "degraded" while it is known not to work (`Target.problem`, found when it first
        connected) or while its last handoff failed for now (`Target.failing`), until one
        works; never "down", as with mailboxes: the mail waits in the spool and is retried, and
        a 503 would take the SMTP listener that receives it out of a load balancer."""
        names = dict.fromkeys(route.target for route in self.config.inbound)
        health: dict[str, Any] = {}
        for name in names:
            target = self.targets.get(name)
            if target is None:  # (refused at load)
                continue
            error = target.failing or target.problem
            health[name] = {"status": "degraded" if error else "ok", "error": redact(error) if error else None}
        return health
