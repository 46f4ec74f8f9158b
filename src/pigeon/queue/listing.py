"""`pigeon queue list` (GET /api/v1/messages): the queued messages one by one, Postfix's `mailq`.

A page is read from the spool in id order, which is arrival order (ids are time-ordered), by
the primary key: `spool.scan` in batches, resting between them, as the bulk operations walk.
Nothing is read whole: a page reads at most `SCAN_BUDGET` rows of each shard, so a filter that
matches little of a million deferred messages answers a short page (even an empty one) with a
cursor to go on from, rather than holding the worker for seconds. What memory holds of a
message (its state: ready, in flight, ...) is looked up in the active set by id.

A page's `next` is the id up to which every shard it covers was read: the next page starts
after it, so pages neither repeat nor skip a message that stays queued, however the mail moves
meanwhile (a message keeps its id when it is deferred, suspended or rebound). Pages of several
shards, or of several workers (`merge_pages`, in the supervisor), are merged on that cursor.
That id may be any tenant's: a token bound to tenants is given it sealed, naming no message
(`pigeon.listener.http.tenancy.seal_cursor`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any, Final

from pigeon.message import Message, format_id, parse_id
from pigeon.queue.names import queue_parts
from pigeon.queue.rules import Rule
from pigeon.spool.spool import Spool

MAX_LIMIT: Final = 1000
"""The most messages a page holds."""
DEFAULT_LIMIT: Final = 100
SCAN_BUDGET: Final = 20_000
"""Spool rows a page reads of each shard at most, matching or not (about 0.2 s of work, in
batches with rests between them): past it, the page ends short, with a cursor."""
MAX_RECIPIENTS: Final = 100
"""Pending recipients a message's entry names at most (`recipient_count` says how many)."""
_BATCH: Final = 1000

STATES: Final[dict[str, str]] = {
    "deferred": "in the spool, waiting for its next try (after a temporary failure, a site found down, its queue's "
    "rate)",
    "suspended": "held by an operator's suspension (`pigeon resume`), of its queue or of its site",
    "held": "held for an operator: by an operator (`pigeon hold`), or [[inbound]] mail its target refused "
    "(`pigeon retry --id` releases it)",
    "due": "in the spool and due now: the scheduler takes it next",
    "scheduled": "in memory, its route being looked up (or its queue's rate slot waited for)",
    "ready": "in a ready queue, waiting for a connection",
    "in_flight": "taken by a connection: being delivered",
    "settling": "its attempt's outcome being written",
}
"""What a listed message is doing, as `state` says it (and `--state` selects it)."""


def tenant_of(message: Message) -> str | None:
    """Whose mail a message is, as a selector (and a token bound to tenants) sees it: its queue
    name's tenant part, else (a name without one) its own tenant (`tenancy.queue_tenant`)."""
    parts = queue_parts(message.queue)
    if parts is not None:
        return parts[0] or None
    return message.envelope.tenant


def next_due(message: Message, state: str, suspension: Rule | None) -> float | None:
    """When a listed message is next tried: None while an operator holds it (held `[[inbound]]`
    mail; mail a suspension until resumed holds); of mail a suspension with an end holds, that
    end, or its own next retry if that is later. Not the time the suspension looks at it again
    (`HOLD`, a minute on), which is no try and would creep forward every minute."""
    if message.envelope.held is not None:
        return None
    if state != "suspended" or suspension is None:
        return message.due
    return None if suspension.expires is None else max(message.due, suspension.expires)


def listed(
    message: Message,
    state: str,
    suspension: Rule | None,
) -> dict[str, Any]:
    """One message's entry in a page: what `pigeon inspect` says of it, in brief."""
    envelope = message.envelope
    recipients = envelope.recipients
    return {
        "id": format_id(message.id),
        "queue": message.queue,
        "state": state,
        "created": message.created,
        "size": message.size,
        "sender": envelope.sender,
        "recipients": [r.address for r in recipients[:MAX_RECIPIENTS]],
        "recipient_count": len(recipients),
        "attempts": message.attempts,
        "last_response": envelope.last_response,
        "last_attempt": envelope.last_attempt,
        "next_due": next_due(message, state, suspension),
        "suspended_by": suspension.id if suspension is not None else None,
        # Why it is held (state "held"): the operator's hold and reason, or the [[inbound]] refusal.
        "held": envelope.held,
        "tenant": envelope.tenant,
        "campaign": envelope.campaign,
    }


async def shard_page(
    spool: Spool,
    after: int,
    limit: int,
    entry_of: Callable[[Message], dict[str, Any] | None],
    pause: Callable[[float], Awaitable[None]],
    budget: int = SCAN_BUDGET,
) -> dict[str, Any]:
    """Up to `limit` entries of `spool`'s messages after id `after` that `entry_of` lists (None:
    not wanted), reading at most `budget` rows; `next`: where the next page starts (the last
    entry's id when there are more, the last id read when the budget ran out), None at the end."""
    found: list[dict[str, Any]] = []
    read = 0
    last = after
    while True:
        asked = min(_BATCH, budget - read)
        started = time.perf_counter()
        batch = spool.scan(last, asked)
        for message in batch:
            read += 1
            last = message.id
            entry = entry_of(message)
            if entry is not None:
                found.append(entry)
                if len(found) > limit:
                    # One more than asked for, so a full page says there is more only when there is.
                    return {"messages": found[:limit], "next": found[limit - 1]["id"]}
        if len(batch) < asked:
            return {"messages": found, "next": None}  # the shard's end
        if read >= budget:
            return {"messages": found, "next": format_id(last)}
        await pause(time.perf_counter() - started)


def merge_pages(pages: Iterable[Mapping[str, Any]], limit: int) -> dict[str, Any]:
    """One page of several (each in id order, with its `next`, None at its end): in id order, up
    to `limit`, only what every page read up to (the least `next`); its own `next` after that."""
    pages = list(pages)
    ends = [parse_id(page["next"]) for page in pages if page.get("next")]
    bound = min(ends) if ends else None
    rows = sorted(
        (row for page in pages for row in page.get("messages", ()) if bound is None or parse_id(row["id"]) <= bound),
        key=lambda row: parse_id(row["id"]),
    )
    taken = rows[:limit]
    if len(rows) > limit:
        cursor: str | None = taken[-1]["id"]
    else:
        cursor = None if bound is None else format_id(bound)
    return {"messages": taken, "next": cursor}


def merge_page_answers(answers: Collection[tuple[int, Any]], limit: int) -> tuple[int, Any]:
    """The workers' pages as one (`merge_pages`); the first refusal as it is."""
    for status, answer in answers:
        if status >= 400:
            return status, answer
    return 200, merge_pages((answer for _, answer in answers if isinstance(answer, dict)), limit)


def page_limit(query: Mapping[str, str]) -> int:
    """A page's `limit` as a request gives it (checked already where it was issued)."""
    try:
        return max(1, min(MAX_LIMIT, int(query.get("limit", DEFAULT_LIMIT))))
    except ValueError:
        return DEFAULT_LIMIT
