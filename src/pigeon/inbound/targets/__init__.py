"""Inbound targets: where an application receives its mail.

Each kind's module is imported when a target of that kind is built, not with this package:
the clients of some (Redis for Sidekiq, asyncpg for PostgreSQL) take tens of milliseconds to
import, which every node would otherwise spend at start whether it has such a target or not.
"""

from __future__ import annotations

from pigeon.config import schema
from pigeon.inbound.targets.base import Handoff, Target, Verdict

__all__ = ["Handoff", "Target", "Verdict", "build"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def build(config: schema.TargetConfig, redis_url: str | None, *, max_age: float | None = None) -> Target:
    """The target a `[[target]]` table describes. `max_age`: how long its SMTP-received mail
    may be retried (its `inbound:<name>` queue's), which a Sidekiq target's push markers outlive."""
    if isinstance(config, schema.SidekiqTarget):
        from pigeon.inbound.targets.sidekiq import SidekiqTarget, marker_ttl

        url = config.redis_url or redis_url or DEFAULT_REDIS_URL
        return SidekiqTarget(config, url, marker_ttl=marker_ttl(max_age))
    if isinstance(config, schema.WebhookTarget):
        from pigeon.inbound.targets.webhook import WebhookTarget

        return WebhookTarget(config)
    if isinstance(config, schema.PostgresqlTarget):
        from pigeon.inbound.targets.postgresql import PostgresqlTarget

        return PostgresqlTarget(config)
    if isinstance(config, schema.MaildirTarget):
        from pigeon.inbound.targets.maildir import MaildirTarget

        return MaildirTarget(config.name, config.path)
    from pigeon.inbound.targets.log import LogTarget

    return LogTarget(config.name, config.path)
