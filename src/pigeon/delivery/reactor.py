"""The reactor: what the dispatcher asks of shaping that reacts (`pigeon.shaping.reactions`
and `pigeon.shaping.effects`), per ready queue and per attempt.

* `keys(path, site)`: the keys a ready queue's effects may be on (its site, its source's path
  `source->site`, whatever its domain or TLS policy, its provider);
* `observe(path, site, domain, replies)`: the replies of an attempt (or of a failed connection);
  a reply that matches a rule starts its effect (at the rule's `threshold`-th match, if it has
  one), or meets the one that lives (a repeat);
* `apply(attempt, effect)`: the attempt as the queue should take it under that effect: under
  a suspension, a message that failed for now is tried again when the suspension ends (not at
  its backoff); under a bounce, what failed for now is bounced;
* `suspended(keys)`, `bouncing(keys)`, `limits(keys)`: what lives on a queue's keys.

Suspended mail waits in its ready queue, untried and without an attempt counted (as under an
operator's site suspension); `max_age` still holds there, and an expiry there names the
suspension (`held_text`), as one of a message deferred under it does (`Attempt.held_by`).
When the effect ends, the dispatcher starts whatever waits (`Board.on_end`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Sequence

from pigeon.queue.attempt import Attempt
from pigeon.shaping.effects import Board, Effect
from pigeon.shaping.gcra import Rate
from pigeon.shaping.reactions import Reactions, path_key, provider_key, site_key
from pigeon.smtp.replies import Reply

BOUNCE_CLASS = "PolicyRelated"


@functools.lru_cache(maxsize=256)
def _rate(text: str) -> Rate:
    return Rate.parse(text)  # (checked when the rule was compiled)


def bounce_reply(effect: Effect) -> Reply:
    """What a message bounced by a reaction's effect is told."""
    return Reply(554, "5.7.0", (f"bounced by shaping reaction {effect.rule} ({effect.key}) after: {effect.reply}",))


def held_text(effect: Effect) -> str:
    """What holds mail under `effect` (a suspension), as a message keeps it (`Envelope.held_by`),
    `pigeon inspect` shows it and an expiry names it: the rule, what it holds until when (UTC),
    and the reply that started it, whose words say why the provider wanted less mail."""
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(effect.expires_at))
    return f"shaping reaction {effect.rule} ({effect.action} {effect.key} until {until}) after {effect.reply}"


class Reactor:
    def __init__(self, reactions: Reactions, board: Board) -> None:
        self.reactions = reactions
        self.board = board

    def keys(self, path: str, site: str) -> tuple[str, ...]:
        provider = self.reactions.provider(site)
        keys = (site_key(site), path_key(path))
        return (*keys, provider_key(provider)) if provider is not None else keys

    def observe(self, path: str, site: str, domain: str, replies: Iterable[Reply]) -> Effect | None:
        """The effect the first matching reply starts (or meets), if any."""
        reactions = self.reactions
        if not reactions:
            return None
        seen: set[Reply] = set()
        for reply in replies:
            if reply.code < 400 or reply in seen:
                continue
            seen.add(reply)
            rule = reactions.match(reply, site, domain)
            if rule is None:
                continue
            key = rule.key(path, site, reactions.provider(site))
            if rule.threshold is not None:
                living = self.board.find((key,), rule.action)
                if living is not None:
                    return living  # a repeat: not counted towards the next one
                if not self.board.count(rule.id, key, *rule.threshold):
                    return None  # not yet
            return self.board.trigger(
                rule=rule.id,
                key=key,
                action=rule.action,
                duration=rule.duration,
                reply=str(reply),
                connection_limit=rule.connection_limit,
                max_message_rate=rule.rate_text,
            )
        return None

    def apply(self, attempt: Attempt, effect: Effect) -> Attempt:
        """`attempt` as the queue should take it while `effect` lives (see the module)."""
        transient = [400 <= reply.code < 500 for reply in attempt.replies]
        if not any(transient):
            return attempt
        if effect.action == "suspend":
            return attempt._replace(retry_after=effect.remaining(self.board.now()), held_by=held_text(effect))
        if effect.action == "bounce":
            bounced = bounce_reply(effect)
            replies: Sequence[Reply] = [bounced if t else r for t, r in zip(transient, attempt.replies, strict=True)]
            classes = [BOUNCE_CLASS if t else c for t, c in zip(transient, attempt.classifications, strict=True)]
            bounced_here = {index for index, t in enumerate(transient) if t}
            return attempt._replace(replies=replies, classifications=classes, own=attempt.own | bounced_here)
        return attempt

    # --- what lives on a queue's keys -------------------------------------------------------------
    def suspended(self, keys: tuple[str, ...]) -> bool:
        return self.board.find(keys, "suspend") is not None

    def suspension(self, keys: tuple[str, ...]) -> Effect | None:
        """The suspension that lives on a queue's keys, if any."""
        return self.board.find(keys, "suspend")

    def bouncing(self, keys: tuple[str, ...]) -> Effect | None:
        return self.board.find(keys, "bounce")

    def limits(self, keys: tuple[str, ...]) -> tuple[int | None, Rate | None]:
        """The lowest connection limit and the slowest rate the live limit effects set."""
        connections: int | None = None
        rate: Rate | None = None
        for effect in self.board.of(keys):
            if effect.action != "limit":
                continue
            if effect.connection_limit is not None:
                connections = min(connections or effect.connection_limit, effect.connection_limit)
            if effect.max_message_rate is not None:
                lowered = _rate(effect.max_message_rate)
                if rate is None or lowered.per_second < rate.per_second:
                    rate = lowered
        return connections, rate
