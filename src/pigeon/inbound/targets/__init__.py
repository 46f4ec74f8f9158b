"""Inbound targets: where an application receives its mail."""

from __future__ import annotations

from pigeon.config import schema
from pigeon.inbound.targets.base import Handoff, Target, Verdict
from pigeon.inbound.targets.log import LogTarget
from pigeon.inbound.targets.maildir import MaildirTarget
from pigeon.inbound.targets.postgresql import PostgresqlTarget
from pigeon.inbound.targets.sidekiq import SidekiqTarget
from pigeon.inbound.targets.webhook import WebhookTarget

__all__ = ["Handoff", "Target", "Verdict", "build"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def build(config: schema.TargetConfig, redis_url: str | None) -> Target:
    """The target a `[[target]]` table describes."""
    if isinstance(config, schema.SidekiqTarget):
        return SidekiqTarget(config, config.redis_url or redis_url or DEFAULT_REDIS_URL)
    if isinstance(config, schema.WebhookTarget):
        return WebhookTarget(config)
    if isinstance(config, schema.PostgresqlTarget):
        return PostgresqlTarget(config)
    if isinstance(config, schema.MaildirTarget):
        return MaildirTarget(config.name, config.path)
    return LogTarget(config.name, config.path)
