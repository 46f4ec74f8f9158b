"""A token bound to tenants (`[[http.token]] tenants`) reaches those tenants' mail alone.

The binding was first of what a token injects (`inject`); an `admin` or `read` token bound to
`acme` could still list globex's queues, inspect its messages and bounce them all. So, at every
endpoint such a token reaches:

- a write (bounce, suspend, retry, rebind, hold) acts on its tenants' mail only: its selector's
  `tenant` must be one of them, written as it is (a glob that could match another, `acm*`,
  is refused); left out, it is filled in when the token has one tenant (`{"domain": "*"}` is
  that tenant's mail in every domain), and refused (403) when it has several, since a selector
  names one tenant. A site suspension, which holds every tenant's mail to the site, is 403;
  so is a rebind to a queue of another tenant (the mail would take that tenant);
- a rule or message of another tenant is answered as absent (404, the same answer as for an
  id nothing has), so that ids cannot be probed: resume, cancel, inspect; of the messages a
  bounce, retry or hold names by id, `not_found` (not `not_selected`, queued but not selected).
  So is a rule of its tenant that a token bound to no tenant (the operator) or to another
  tenant too made (`reaches`): the ESP's suspension of a customer is not the customer's to lift;
- the ids its rules and operations get are its binding's own (`admin.with_id`): an id it gives
  never names another's rule, so neither a 409 nor an `already` tells it of one;
- reads show its tenants' scheduled queues, rules and bulk operations only; the ready queues
  (the sites, which every tenant's mail shares) not at all;
- what has no tenant (the shaping effects, of sites) is 403.

A message, queue, rule or operation is a tenant's as a selector matches it
(`pigeon.queue.rules.Selector.matches`): by the tenant part of its queue's name
(`campaign:tenant@domain`), else (a queue named by a policy or an operator) by the message's
own tenant. A queue named without a tenant part says no tenant, so it is not listed to a bound
token, though its tenant's mail in it is acted on by a selector naming that tenant.

Checked where a request is issued (a node's one worker, the supervisor of several) before any
worker or node is told, and by each worker again; the cluster's other nodes carry out the
request as confined there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any, Final

from aiohttp import web

from pigeon.queue.names import queue_name, queue_parts

_GLOB_CHARACTER: Final = re.compile(r"([*?\[])")
_REFUSED_FIELD: Final = "Authorization"
"""The `field` of a refusal of the token itself (what it asked for has no tenant): as the 403
of a missing scope names it."""


def tenant_glob(tenant: str) -> str:
    """The selector glob that matches `tenant` alone (its `*`, `?` and `[` as sets)."""
    return _GLOB_CHARACTER.sub(r"[\1]", tenant)


def owns(tenants: Collection[str], glob: str | None) -> bool:
    """Whether a selector's tenant glob names one of `tenants` and nothing else."""
    return glob is not None and glob in {tenant_glob(tenant) for tenant in tenants}


def queue_tenant(queue: str, tenant: str | None = None) -> str | None:
    """The tenant of a queue's mail as a selector matches it: its name's tenant part, else (a
    name without one: `bulk`, `example.net`) the message's own `tenant`, if known."""
    parts = queue_parts(queue)
    if parts is not None:
        return parts[0] or None
    return tenant


def describe(holder: str, tenants: Collection[str]) -> str:
    """`token 'acme-admin' is bound to tenant acme` (or `tenants acme, beta`)."""
    names = ", ".join(sorted(tenants)) or "none"
    return f"token {holder!r} is bound to tenant{'' if len(tenants) == 1 else 's'} {names}"


def forbidden(text: str, field: str) -> web.HTTPForbidden:
    """403 with the API's JSON error."""
    return web.HTTPForbidden(text=json.dumps({"error": text, "field": field}), content_type="application/json")


def no_tenant(holder: str, tenants: Collection[str], what: str) -> web.HTTPForbidden:
    """403 for an endpoint whose objects belong to no tenant (`what` they are)."""
    text = f"{describe(holder, tenants)}: {what}, which every tenant's mail shares; ask with a token bound to no tenant"
    return forbidden(text, _REFUSED_FIELD)


def confine_selector(request: dict[str, Any], action: str, holder: str, tenants: Collection[str]) -> None:
    """A write's JSON body (checked already: `admin.validate`), its selector confined to
    `tenants` in place: its tenant filled in if the token has one and the body names none;
    otherwise refused, 403 naming the member at fault and what to send instead."""
    bound = describe(holder, tenants)
    if request.get("site") is not None:
        raise forbidden(
            f"{bound}: a site suspension holds every tenant's mail to that site; suspend its tenant's mail "
            "instead (tenant, domain), or ask with a token bound to no tenant",
            "$.site",
        )
    tenant = request.get("tenant")
    if tenant is None:
        if len(tenants) != 1:
            names = ", ".join(repr(t) for t in sorted(tenants))
            reason = f"{bound}: name one of them in tenant ({names}): a write acts on the mail of one tenant at a time"
            raise forbidden(reason, "$.tenant")
        request["tenant"] = tenant_glob(next(iter(tenants)))
    elif not owns(tenants, tenant):
        raise forbidden(
            f"{bound}: it may act on the mail of its own tenant{'' if len(tenants) == 1 else 's'} only, not on "
            f"tenant {tenant[:60]!r} (name one of its tenants as it is, no glob, or leave tenant out when it has one)",
            "$.tenant",
        )
    to_queue = request.get("to_queue") if action == "rebind" else None
    if isinstance(to_queue, str):
        moved_to = queue_tenant(queue_name(to_queue))
        if queue_parts(queue_name(to_queue)) is not None and (moved_to is None or moved_to not in tenants):
            whose = "no tenant's" if moved_to is None else f"tenant {moved_to!r}'s"
            # What it may write, with its own tenant in the examples: `x:@example.net` has a
            # tenant part (an empty one), so "a name without a tenant part" would not tell.
            own = sorted(tenants)[0] if tenants else "tenant"
            raise forbidden(
                f"{bound}: to_queue {to_queue[:60]!r} would make the mail {whose}; move it to a queue of its "
                f"tenant, written with it ('campaign:{own}@domain' or '{own}@domain'), or to a queue whose name has "
                "no tenant part at all, not of the form [campaign:]tenant@domain ('example.net', 'bulk'), where the "
                "mail keeps its tenant",
                "$.to_queue",
            )


def owns_rule(tenants: Collection[str], selector: Mapping[str, Any] | Any) -> bool:
    """Whether a rule's or operation's selector (a `Selector`, or its JSON) is of `tenants` alone."""
    glob = selector.get("tenant") if isinstance(selector, Mapping) else getattr(selector, "tenant", None)
    site = selector.get("site") if isinstance(selector, Mapping) else getattr(selector, "site", None)
    return site is None and owns(tenants, glob)


def reaches(tenants: Collection[str], rule: Mapping[str, Any] | Any) -> bool:
    """Whether a token bound to `tenants` may end a rule (a `Rule`, or its JSON): one of theirs
    (`owns_rule`) made by a token bound to none but them (`Rule.bound_to`). One made by an
    unbound token (or before the binding was kept), or by a token bound to another tenant too,
    is out of its reach, though it may see it: the operator suspended that mail."""
    bound_to = rule.get("bound_to") if isinstance(rule, Mapping) else getattr(rule, "bound_to", None)
    selector = rule.get("selector", {}) if isinstance(rule, Mapping) else getattr(rule, "selector", None)
    if not isinstance(bound_to, list) or not bound_to or not set(bound_to) <= set(tenants):
        return False
    return owns_rule(tenants, selector)


def owns_message(tenants: Collection[str], found: Mapping[str, Any]) -> bool:
    """Whether an inspected message (`Admin.inspect`'s answer) is of `tenants`."""
    tenant = queue_tenant(str(found.get("queue", "")), found.get("tenant"))
    return tenant is not None and tenant in tenants


def confined_answer(action: str, answer: Any, tenants: Collection[str]) -> Any:
    """A read's answer (`admin.perform`'s, or several added up) showing `tenants`' alone: their
    scheduled queues, rules and bulk operations, no ready queue. A partial answer's `answers` too."""
    if not isinstance(answer, dict):
        return answer
    if isinstance(answer.get("answers"), dict):
        answer["answers"] = confined_answer(action, answer["answers"], tenants)
    if isinstance(answer.get("rule"), dict) and answer.get("field") == "$.id":
        # A 409: the id asked for is another rule's. Not one of theirs, it is not shown. (A bound
        # token's ids are its binding's own, `admin.with_id`: only a rule it reaches has one.)
        held = answer["rule"]
        if not reaches(tenants, held):
            answer.pop("rule")
            answer["error"] = (
                f"id {str(held.get('id'))[:64]!r} names a rule already: leave id out (one is made), or give another"
            )
    if action in ("bounce", "retry", "hold") and isinstance(answer.get("messages"), list):
        answer["messages"] = [_message_row(row) for row in answer["messages"]]
    if action == "queues":
        if "scheduled" in answer:
            answer["scheduled"] = [
                row for row in answer["scheduled"] if isinstance(row, dict) and _queue_of(row, tenants)
            ]
        if "ready" in answer:
            answer["ready"] = []  # the sites': every tenant's mail waits in them
        named = {rule.get("id") for row in answer.get("scheduled", ()) for rule in row.get("suspended_by", ())}
        _keep_not_held(answer, named)
    elif action == "operations" and isinstance(answer.get("operations"), list):
        answer["operations"] = [
            op for op in answer["operations"] if isinstance(op, dict) and owns_rule(tenants, op.get("selector", {}))
        ]
    elif action in ("list-bounce", "list-suspend") and isinstance(answer.get("rules"), list):
        answer["rules"] = [
            rule for rule in answer["rules"] if isinstance(rule, dict) and owns_rule(tenants, rule.get("selector", {}))
        ]
        shown = {rule.get("id") for rule in answer["rules"]}
        _keep_not_held(answer, shown)
        cluster = answer.get("cluster")
        if isinstance(cluster, dict) and isinstance(cluster.get("held_by"), dict):
            # (rule id -> the nodes that hold it: another tenant's ids are not told here either)
            cluster["held_by"] = {rule_id: nodes for rule_id, nodes in cluster["held_by"].items() if rule_id in shown}
    return answer


def _message_row(row: Any) -> Any:
    """A write's row for a message named by id, as a token bound to tenants sees it: one its
    selector's `tenant` (one of the token's tenants: `confine_selector`) does not match is
    another tenant's mail, answered as one nothing holds, not as queued but not selected."""
    if isinstance(row, dict) and row.get("result") == "not_selected" and "tenant" in row.get("unmatched", ()):
        return {"id": row.get("id"), "result": "not_found"}
    return row


def _queue_of(row: Mapping[str, Any], tenants: Collection[str]) -> bool:
    tenant = queue_tenant(str(row.get("queue", "")))
    return tenant is not None and tenant in tenants


def _keep_not_held(answer: dict[str, Any], named: set[Any]) -> None:
    """`not_held` (rule id -> workers) of the rules still shown only."""
    if isinstance(answer.get("not_held"), dict):
        answer["not_held"] = {rule_id: at for rule_id, at in answer["not_held"].items() if rule_id in named}
        if not answer["not_held"]:
            del answer["not_held"]
