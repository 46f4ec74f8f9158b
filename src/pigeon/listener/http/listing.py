"""GET /api/v1/messages: the queued messages, a page at a time (`pigeon queue list`, `mailq`).

    GET /api/v1/messages?domain=&tenant=&campaign=&queue=&state=&limit=&after=     read

The selector parameters are the admin writes' (globs, read and refused alike: `admin._decode`),
none of them needed; `state` is one or more of `listing.STATES`, comma-separated; `limit` 1 to
1000 (100); `after` the `next` of the page before. The answer: `messages`, oldest first, and
`next` (null: no more). A page may be short, even empty, and still have a `next`: each worker
reads at most `listing.SCAN_BUDGET` rows of its spool for one page (see `pigeon.queue.listing`).

With several workers the supervisor asks each and merges their pages on the cursor
(`listing.merge_page_answers`). A token bound to tenants lists its tenants' mail alone, and
pages by sealed cursors, not ids (`tenancy.seal_cursor`): a page that ran out of its budget
would otherwise end on another tenant's message, named as `next`. Sealed by whichever process
answers the client (a worker answering its supervisor gives the id, which the supervisor merges
on, then seals); opened by each worker, which share the key (`Tokens.cursor_key`).
"""

from __future__ import annotations

import json
from typing import Any, Final

from aiohttp import web

from pigeon.listener.http import tenancy
from pigeon.listener.http.admin import MAX_SELECTOR, AdminRequest, _admin, _known_query, _normalise_globs
from pigeon.listener.http.context import NODE_KEY, from_supervisor
from pigeon.listener.http.inject import bad_request
from pigeon.message import parse_id
from pigeon.queue import listing

PATH: Final = "/api/v1/messages"
_SELECTORS: Final = ("domain", "tenant", "campaign", "queue")
PARAMETERS: Final = (*_SELECTORS, "state", "limit", "after")
SELECTOR_LENGTH: Final = MAX_SELECTOR
"""The longest selector glob taken, as in the admin writes' bodies."""


class ListRequest:
    """A listing's query, checked."""

    __slots__ = ("after", "limit", "selector", "states")

    def __init__(self, query: Any, sealed: tuple[bytes, frozenset[str]] | None = None) -> None:
        """`sealed`: the cursor key and the tenants of a token bound to them, whose `after` is a
        cursor sealed for them (`tenancy.open_cursor`), not an id."""
        _known_query(query.keys(), PARAMETERS)
        for name in PARAMETERS:
            if len(query.getall(name, ())) > 1:
                raise bad_request(f"{name} is given more than once: give it once", name)
        given: dict[str, str] = {}
        for name in _SELECTORS:
            value = query.get(name)
            if value is None:
                continue
            if not value or len(value) > MAX_SELECTOR:
                raise bad_request(f"{name} is 1 to {MAX_SELECTOR} characters", name)
            given[name] = value
        request = AdminRequest(
            domain=given.get("domain"),
            tenant=given.get("tenant"),
            campaign=given.get("campaign"),
            queue=given.get("queue"),
        )
        try:
            _normalise_globs(request)  # (the writes' own reading of the globs)
        except web.HTTPBadRequest as refusal:
            answer = json.loads(refusal.text or "{}")
            field = str(answer.get("field", "")).removeprefix("$.")  # a parameter here, not a member
            raise bad_request(answer.get("error", "bad selector"), field) from None
        self.selector = request.selector()
        self.states: frozenset[str] | None = None
        if (states := query.get("state")) is not None:
            asked = frozenset(part.strip() for part in states.split(","))
            unknown = sorted(asked - listing.STATES.keys())
            if unknown:
                raise bad_request(
                    f"state {unknown[0][:40]!r} is none of {', '.join(listing.STATES)} (one or more, comma-separated)",
                    "state",
                )
            self.states = asked
        self.limit = listing.DEFAULT_LIMIT
        if (limit := query.get("limit")) is not None:
            # ASCII digits only: str.isdecimal and int take any script's ("١٠" read as 10), and
            # int refuses over 4300 digits (a 500); no number in a query is written so.
            if (
                not (limit.isascii() and limit.isdigit() and len(limit) <= 9)
                or not 1 <= int(limit) <= listing.MAX_LIMIT
            ):
                raise bad_request(f"limit is a whole number from 1 to {listing.MAX_LIMIT}, not {limit[:20]!r}", "limit")
            self.limit = int(limit)
        self.after = 0
        if (after := query.get("after")) is not None and sealed is not None:
            position = tenancy.open_cursor(*sealed, after)
            if position is None:
                # One answer for whatever it is instead (an id, another tenant's, one altered):
                # the refusal tells nothing of the spool.
                raise bad_request(
                    "after is the `next` of the page before, as it was given (a token bound to tenants pages by "
                    "cursor, not by message id): give it as it is, or leave after out to start from the oldest",
                    "after",
                )
            self.after = position
        elif after is not None:
            try:
                self.after = parse_id(after)
            except ValueError as error:
                raise bad_request(f"after is the `next` of the page before: {error}", "after") from None


async def list_messages(request: web.Request) -> web.Response:
    tokens = request.app[NODE_KEY].tokens
    tenants = tokens.binding(tokens.holder(request, "read"))
    admin = _admin(request, None, reads=True)
    sealed = (tokens.cursor_key, tenants) if tenants is not None else None
    asked = ListRequest(request.query, sealed)
    page = await admin.list_messages(
        asked.selector, states=asked.states, tenants=tenants, after=asked.after, limit=asked.limit
    )
    if sealed is not None and not from_supervisor(request):  # (the supervisor merges on ids, then seals)
        page = tenancy.sealed_page(page, *sealed)
    return web.json_response(page)
