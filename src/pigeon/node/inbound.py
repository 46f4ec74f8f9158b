"""The inbound side of a node: targets, arbitration and the mailbox watchers.

Every worker builds the targets, because SMTP-received mail for an `[[inbound]]` route is
delivered from the worker that spooled it. Mailboxes are watched by the first worker only:
more watchers on one node would only contend for the same claims.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pigeon.config.schema import Config
from pigeon.inbound import targets
from pigeon.inbound.arbitration import Arbiter, LocalArbiter, RedisArbiter
from pigeon.inbound.mailbox import SINGLE_NODE_RISK, MailboxWatcher
from pigeon.inbound.targets import Target
from pigeon.logs.writer import LogWriter
from pigeon.metrics import Metrics

_log = logging.getLogger(__name__)


class Inbound:
    def __init__(self, config: Config, log: LogWriter, metrics: Metrics, *, watch: bool) -> None:
        self.config = config
        redis_url = config.redis.url
        self.targets: dict[str, Target] = {t.name: targets.build(t, redis_url) for t in config.target}
        self.arbiter: Arbiter = (
            RedisArbiter(redis_url, prefix=config.redis.key_prefix, timeout=config.redis.timeout)
            if redis_url is not None
            else LocalArbiter()
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
            )
            for mailbox in (config.mailbox if watch else [])
        ]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for target in self.targets.values():
            try:
                await target.start()
            except Exception as error:  # its messages wait and are retried; the node runs on
                _log.error("target %s could not start: %s", target.name, error)
        if self.config.redis.url is None:
            for watcher in self.watchers:
                # Loud: N nodes on one mailbox without Redis hand every message over N times.
                _log.warning(
                    "mailbox %s: %s (run one node per mailbox, or give the nodes a shared [redis] url)",
                    watcher.config.name,
                    SINGLE_NODE_RISK,
                )
        for watcher in self.watchers:
            task = asyncio.create_task(watcher.run(), name=f"mailbox {watcher.config.name}")
            self._tasks.append(task)

    async def stop(self, grace: float) -> None:
        await asyncio.gather(*(w.stop(grace) for w in self.watchers))
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        for target in self.targets.values():
            try:
                await target.close()
            except Exception:
                _log.exception("closing target %s", target.name)
        await self.arbiter.close()

    def health(self) -> dict[str, Any]:
        return {w.config.name: w.health() for w in self.watchers}
