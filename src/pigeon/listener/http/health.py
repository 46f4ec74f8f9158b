"""GET /healthz: is every part of this node doing its job? One status per component.

Each component says "ok", "degraded" (it works, but an operator should look; nothing is
refused or lost meanwhile) or "down" (it cannot do its job). The node's status is the worst
of them, or "stopping" during a graceful stop:

* spool: down while its shard's room is under what an ordinary message needs (1 MiB, less
  only under a very small cap or disk: `Node._room_needed`; MAIL declaring a larger SIZE gets
  452 4.3.1), from a reception refused for an I/O error until one is stored again, and from
  one refused for lack of room until there is plenty (room is looked at when asked);
* log: degraded while the event log cannot be written (records wait in the spool's outbox);
* each mailbox: degraded while it cannot connect, search or claim, down once that has lasted
  `down_after`; degraded too when another node was seen handing its messages over;
* each target of an `[[inbound]]` route (`targets`): degraded while it is known not to work
  (a table missing) or its last handoff of SMTP-received mail failed for now, until one
  works; never down (the mail waits in the spool and is retried);
* each worker (a node of several): down while it does not answer (restarting).

The answer is 200 for "ok" and "degraded", 503 for "down" and "stopping": a probe that only
looks at the code sees a node that cannot do its job.

With `[http] status_token_required`, the components (every tenant's queue and mailbox names,
sources, counts) are shown only to a `read` token bound to no tenant (`Tokens.status_holder`);
anyone else gets the node's status and code alone (`brief`), so a liveness probe needs no token.
The supervisor asking a worker over its control socket is always shown everything.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from aiohttp import web

from pigeon.listener.http.context import NODE_KEY, from_supervisor

OK: Final = "ok"
DEGRADED: Final = "degraded"
DOWN: Final = "down"
STOPPING: Final = "stopping"
_RANK: Final = {OK: 0, DEGRADED: 1, DOWN: 2, STOPPING: 3}


def worst(statuses: Iterable[str]) -> str:
    """The worst of some components' statuses ("ok" for none)."""
    return max(statuses, key=lambda status: _RANK.get(status, _RANK[DOWN]), default=OK)


def http_status(status: str) -> int:
    """The HTTP code /healthz answers with for a node's status."""
    return 200 if status in (OK, DEGRADED) else 503


BRIEF_DETAIL: Final = (
    "the components are shown to a 'read' token bound to no tenant alone ([http] status_token_required)"
)


def brief(status: str) -> dict[str, str]:
    """/healthz's answer to a caller not shown the components: the node's status alone."""
    return {"status": status, "detail": BRIEF_DETAIL}


async def healthz(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    status = node.health()
    code = http_status(status["status"])
    if not from_supervisor(request) and not node.tokens.shows_status(request):
        return web.json_response(brief(status["status"]), status=code)
    return web.json_response(status, status=code)
