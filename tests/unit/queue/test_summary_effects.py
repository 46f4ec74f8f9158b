"""`queue summary`'s ready queues and the reactions' effects living on them."""

from __future__ import annotations

from typing import Any

import msgspec

from pigeon.cli.admin import _effect_text
from pigeon.listener.http.openapi import document
from pigeon.queue.admin import Admin, QueueSummary, ReadyQueueRow
from pigeon.queue.rules import Rules
from pigeon.shaping.effects import Effect


class _Queue:
    def __init__(self, site: str, queued: int) -> None:
        self.site = site
        self.path = f"default->{site}"
        self._queued = queued
        self.domain = ""
        self.own = False

    def __len__(self) -> int:
        return self._queued


def _effect(key: str) -> Effect:
    reply = "421 4.7.0 rate limited"
    return Effect(
        id="e1", rule="rate-limited", key=key, action="suspend", created=0, expires_at=60, reply=reply, node="a"
    )


async def test_an_empty_ready_queue_under_an_effect_is_listed_with_it() -> None:
    # The message whose reply started a suspension waits in its scheduled queue, not the
    # ready one: the site's row is where the summary says why it waits.
    suspended, idle = _Queue("mx.suspended.test", 0), _Queue("mx.idle.test", 0)
    effects = {suspended.path: [_effect("site:mx.suspended.test")]}
    none: Any = None  # what summary() does not use
    spools: Any = {}
    active: Any = []
    queues: Any = [suspended, idle]
    admin = Admin(
        spools=spools,
        primary=none,
        active=active,
        settlement=none,
        rules=Rules(spools=spools, settlement=none, clock=lambda: 0.0),  # none
        ready=queues,
        rewind=lambda due: None,
        kick=lambda: None,
        promote=lambda entry: None,
        effects=lambda path: effects.get(path, []),
        clock=lambda: 0.0,
    )
    summary = await admin.summary()
    ready = summary["ready"]
    assert [(row["site"], row["queued"], [e["rule"] for e in row["effects"]]) for row in ready] == [
        ("mx.suspended.test", 0, ["rate-limited"])
    ]
    # what the API answers is what its OpenAPI document describes (QueueSummary's schema)
    assert msgspec.convert(summary, QueueSummary) == QueueSummary([], [msgspec.convert(ready[0], ReadyQueueRow)])
    [row] = document()["paths"]["/api/v1/queues"]["get"]["responses"]["200"]["content"]["application/json"]["schema"][
        "allOf"
    ][:1]
    assert row == {"$ref": "#/components/schemas/QueueSummary"}
    assert set(document()["components"]["schemas"]["ScheduledQueue"]["required"]) >= {"in_flight", "settling", "held"}


def test_a_limit_effect_counts_its_connections_in_words() -> None:
    one = {"action": "limit", "connection_limit": 1, "max_message_rate": "10/min", "expires_at": 0, "rule": "slow"}
    assert _effect_text(one).startswith("limit 1 connection, 10/min until ")
    assert _effect_text(one | {"connection_limit": 2}).startswith("limit 2 connections, 10/min until ")
