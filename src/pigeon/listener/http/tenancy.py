"""A token bound to tenants (`[[http.token]] tenants`) reaches those tenants' mail alone.

The binding was first of what a token injects (`inject`); an `admin` or `read` token bound to
`acme` could still list globex's queues, inspect its messages and bounce them all. So, at every
endpoint such a token reaches:

- a write (bounce, suspend, retry, rebind, hold) acts on its tenants' mail only: its selector's
  `tenant` must be one of them, written as it is (a glob that could match another, `acm*`,
  is refused); left out, it is filled in when the token has one tenant (`{"domain": "*"}` is
  that tenant's mail in every domain), and refused (403) when it has several, since a selector
  names one tenant. A site suspension, which holds every tenant's mail to the site, is 403;
  so is a rebind to any queue but one of its tenants', `campaign:tenant@domain` or
  `tenant@domain` (`confine_rebind`: a `[[queue]]` block written for another tenant's or no
  tenant's names would take the mail, with its pool and rate); and so is a rebind's
  `routing_domain` other than one the operator listed for the token (`[[http.token]]
  routing_domains`) or "" (`confine_routing`: that domain's `[[route]]` would carry the mail,
  with the smart host AUTH user and password it may have been written with for another customer);
- a rule or message of another tenant is answered as absent (404, the same answer as for an
  id nothing has), so that ids cannot be probed: resume, cancel, inspect; of the messages a
  bounce, retry or hold names by id, `not_found` (not `not_selected`, queued but not selected).
  So is a rule of its tenant that a token bound to no tenant (the operator) or to another
  tenant too made (`reaches`): the ESP's suspension of a customer is not the customer's to lift;
- likewise a hold (`pigeon hold`) of its tenants' mail made by the operator or by a token bound
  to another tenant too (`releases`, on the binding the message's row keeps:
  `Envelope.hold_bound_to`): a retry of its id leaves it held (row `held`), not naming whose hold
  it is; a bounce of it is the token's to make (it sends the recipients nothing);
- the ids its rules and operations get are its binding's own (`admin.with_id`): an id it gives
  never names another's rule, so neither a 409 nor an `already` tells it of one;
- reads show its tenants' scheduled queues, rules and bulk operations only; the ready queues
  (the sites, which every tenant's mail shares) not at all;
- what has no tenant (the shaping effects, of sites) is 403;
- the message list's `next` (GET /api/v1/messages) is a sealed cursor, not a message id
  (`seal_cursor`): a page that ran out of its scan budget ends where it stopped reading, often at
  another tenant's message, whose id the cursor would otherwise name. Its `after` takes such a
  cursor alone (sealed for its tenants), so a forged position, or an id, tells it nothing.

A message, queue, rule or operation is a tenant's as a selector matches it
(`pigeon.queue.rules.Selector.matches`): by the tenant part of its queue's name
(`campaign:tenant@domain`), else (a queue named by a policy or an operator) by the message's
own tenant. A queue named without a tenant part says no tenant, so it is not listed to a bound
token, though its tenant's mail in it is acted on by a selector naming that tenant.

Checked where a request is issued (a node's one worker, the supervisor of several) before any
worker or node is told, failing closed (a write that cannot be confined is refused there, never
passed on for others to refuse), and by each worker again; the cluster's other nodes confine
what they read from the stream themselves, or refuse it (`admin.confine_received`).

A rebind of such a token leaves where it is the mail a rule it cannot end holds (`reaches`):
selectors match a message's queue as it is now, so moving it within its tenant would leave the
operator's suspension of its queue or campaign behind (`Admin.rebind`'s `beyond`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import math
import re
from collections.abc import Collection, Mapping
from typing import Any, Final, TypeGuard

from aiohttp import web

from pigeon.message import parse_id
from pigeon.queue.names import campaign_problem, queue_name, queue_parts
from pigeon.smtp.address import a_label
from pigeon.smtp.address import check as address_problem

_GLOB_CHARACTER: Final = re.compile(r"([*?\[])")
_CURSOR: Final = re.compile(r"[0-9a-f]{48}")
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


def malformed(text: str, field: str) -> web.HTTPBadRequest:
    """400 with the API's JSON error."""
    return web.HTTPBadRequest(text=json.dumps({"error": text, "field": field}), content_type="application/json")


def no_tenant(holder: str, tenants: Collection[str], what: str) -> web.HTTPForbidden:
    """403 for an endpoint whose objects belong to no tenant (`what` they are)."""
    text = f"{describe(holder, tenants)}: {what}, which every tenant's mail shares; ask with a token bound to no tenant"
    return forbidden(text, _REFUSED_FIELD)


def confine_selector(
    request: dict[str, Any],
    action: str,
    holder: str,
    tenants: Collection[str],
    routing_domains: Collection[str] = (),
) -> None:
    """A write's JSON body (checked already: `admin.validate`), its selector confined to
    `tenants` in place: its tenant filled in if the token has one and the body names none;
    otherwise refused, 403 naming the member at fault and what to send instead. A rebind's
    `routing_domain` must be one of `routing_domains` (globs: the token's), or ""."""
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
        confine_rebind(to_queue, bound, tenants)
    routing = request.get("routing_domain") if action == "rebind" else None
    if isinstance(routing, str):
        confine_routing(routing, bound, routing_domains)


def confine_routing(routing_domain: str, bound: str, allowed: Collection[str]) -> None:
    """A rebind's `routing_domain` (a domain name: `admin.validate` checked it) as a token bound
    to tenants (`bound`: `describe`'s words) may give it, or 403 naming `$.routing_domain`.

    Mail rebound to be routed as a domain takes that domain's `[[route]]`, its next hop, TLS and
    the smart host's AUTH user and password, and its `[[shaping]]`: what an operator writes for
    one customer (`globex-relay.test`, routed through globex's account at a relay) would carry
    another's mail. Nothing in a route says whose it is, so a bound token may name only the
    domains the operator listed for it (`allowed`: `[[http.token]] routing_domains`, globs
    normalised as the config's are), or "" (routed by its recipients' own domains again, as the
    mail was before anyone rebound it)."""
    if not routing_domain:
        return
    domain = a_label(routing_domain.lower().removesuffix("."))  # (read as the globs were: `domain_glob`)
    if any(fnmatch.fnmatchcase(domain, glob) for glob in allowed):
        return
    listed = f"it allows {', '.join(sorted(allowed))}" if allowed else "it allows none"
    raise forbidden(
        f"{bound}: routing_domain {routing_domain[:60]!r} is not one the operator allows it ([[http.token]] "
        f"routing_domains: {listed}): mail routed as a domain goes by that domain's [[route]] (its next hop and "
        "the smart host account it authenticates as) and [[shaping]], which may be another customer's; leave "
        'routing_domain out, or give "" to route the mail by its recipients\' own domains',
        "$.routing_domain",
    )


def confine_rebind(to_queue: str, bound: str, tenants: Collection[str]) -> None:
    """A rebind's `to_queue` (a queue name: `admin.validate` checked it) as a token bound to
    `tenants` (`bound`: `describe`'s words) may give it, or a refusal naming `$.to_queue`.

    It must be a queue of one of them, `campaign:tenant@domain` or `tenant@domain`, read as
    strictly as the README's "Queue names" gives them: the names its tenants' own mail is in.
    Moved there, the mail takes that tenant and is governed by the `[[queue]]` blocks (pool,
    rate, retries) that govern its tenant's mail anyway. Of any other name, a block written for
    another tenant's queues could take it (`*:globex@*` matches `a:b:globex@x`, which no part
    reading sees as globex's), or one written for names without a tenant (`vip`), and its mail
    would leave from that tenant's pool at that block's rate: 403, saying why. A name of its
    tenant whose domain part is no domain mail is sent to (`x_y`, `a..b`) is malformed: 400."""
    name = queue_name(to_queue)
    shown = repr(to_queue[:60])
    own = sorted(tenants)[0] if tenants else "tenant"
    instead = (
        f"move it to a queue of its tenant, written with it ('campaign:{own}@domain' or '{own}@domain'): a "
        "[[queue]] block written for another tenant's queues, or for names without a tenant, could govern mail "
        "in any other (its pool, its rate)"
    )
    parts = queue_parts(name)
    if parts is None:
        why = _not_a_tenants_queue(name)
        raise forbidden(f"{bound}: to_queue {shown} is no name of the form [campaign:]tenant@domain ({why}); {instead}",
                        "$.to_queue")  # fmt: skip
    tenant, campaign, domain = parts
    if tenant not in tenants:
        whose = f"tenant {tenant!r}'s" if tenant else "no tenant's"
        raise forbidden(f"{bound}: to_queue {shown} would make the mail {whose}; {instead}", "$.to_queue")
    # (What no queue name holds `admin.validate` refused: this is what no campaign holds besides.)
    if campaign and (problem := campaign_problem(campaign)) is not None:
        raise malformed(f"to_queue {shown}: its campaign {campaign[:60]!r} {problem}", "$.to_queue")
    if address_problem(f"postmaster@{domain}") is not None:
        raise malformed(
            f"to_queue {shown}: its domain part {domain[:60]!r} is no domain mail is sent to (a domain name, "
            "labels of letters, digits and '-', or an address literal, [IPv4] or [IPv6:...])",
            "$.to_queue",
        )


def _not_a_tenants_queue(name: str) -> str:
    """Why `name` (of which `queue_parts` reads no parts) names no tenant's queue, in a few words."""
    local, at, domain = name.rpartition("@")
    if not at or not domain:
        return "no '@domain' in it: a queue named outright, or a domain's, which names no tenant"
    if "@" in local:
        return "more than one '@'"
    campaign, colon, tenant = local.partition(":")
    if ":" in tenant:
        return "more than one ':' before its '@'"
    if colon and not campaign:
        return "nothing before its ':'"
    return "no tenant before its '@'"


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


def releases(tenants: Collection[str], hold_bound_to: list[str] | None) -> bool:
    """Whether a token bound to `tenants` may release (retry by id) a message its tenants' that a
    token bound to `hold_bound_to` held (`Envelope.hold_bound_to`), as `reaches` says it of a rule:
    a token bound to none but them. A hold by a token bound to no tenant (the operator, and every
    hold stored before the binding was kept) or to another tenant too is out of its reach: the
    operator held that mail so that it would not go, and a release would send it. (It may still
    bounce it: a bounce sends nothing but the DSN its own sender gets.)"""
    if not isinstance(hold_bound_to, list) or not hold_bound_to:
        return False
    return set(hold_bound_to) <= set(tenants)


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
        # While a node of the cluster has not answered, a row nothing found is `pending`, naming
        # it: another tenant's is said alike, so the two are not told apart.
        nodes = answer.get("cluster", {}).get("nodes") if isinstance(answer.get("cluster"), dict) else None
        pending = sorted(node for node, state in nodes.items() if state == "pending") if isinstance(nodes, dict) else []
        answer["messages"] = [_message_row(row, pending) for row in answer["messages"]]
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
            coarse_times(op)
            for op in answer["operations"]
            if isinstance(op, dict) and owns_rule(tenants, op.get("selector", {}))
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


def coarse_times(operation: dict[str, Any]) -> dict[str, Any]:
    """A bulk operation's times as a token bound to tenants reads them: whole seconds, `started`
    the second it began in, `finished` that plus how long it ran rounded up to whole seconds (at
    least one). Precise, they would time the worker's look at each id an operation names, and an
    id of another tenant's message (read, then answered `not_found`) takes it 10-40 times as long
    as one of none: one sample would tell the two apart. Rounded so, any operation on a few ids
    reads as `started` t, `finished` t + 1. Its other members are left as they are (`rule_created`
    is when a rule was made, not how long a look took). Applied again to times that are whole
    already (a cluster's answers, each confined by its node, then added up), it changes nothing.
    A copy: `operation` may be the worker's own record of it (`Admin.operations`), which the
    operator reads too, and a running operation goes on writing."""
    started, finished = operation.get("started"), operation.get("finished")
    if not _finite(started):
        return operation
    shown = {**operation, "started": math.floor(started)}
    if _finite(finished):
        shown["finished"] = shown["started"] + max(1, math.ceil(finished - started))
    return shown


def _finite(value: Any) -> TypeGuard[float]:
    """Whether `value` is a time: a number (JSON's: not a bool), finite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _message_row(row: Any, pending: list[str]) -> Any:
    """A write's row for a message named by id, as a token bound to tenants sees it: one its
    selector's `tenant` (one of the token's tenants: `confine_selector`) does not match is
    another tenant's mail, answered as one nothing holds, not as queued but not selected (nor
    on which node: `pending`, a row nothing found while a node had not answered, says it alike)."""
    if isinstance(row, dict) and row.get("result") == "not_selected" and "tenant" in row.get("unmatched", ()):
        if pending:
            return {"id": row.get("id"), "result": "pending", "pending_on": pending}
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


def seal_cursor(key: bytes, tenants: Collection[str], position: int) -> str:
    """A position in the spool's id order (`pigeon.queue.listing`: where a page stopped reading)
    as the cursor a token bound to `tenants` is given: 48 hex digits that name no message. The
    position enciphered (with a pad drawn from the tag), and a tag of the position and the
    tenants (keyed: `Tokens.cursor_key`), so it cannot be read, nor made or altered to start
    elsewhere, nor taken by a token of other tenants. The same position gives the same cursor."""
    plain = position.to_bytes(8, "big")
    tag = _cursor_tag(key, tenants, plain)
    pad = hashlib.blake2b(tag, key=key, digest_size=8, person=b"pigeon-cursor-p").digest()
    return (bytes(a ^ b for a, b in zip(plain, pad, strict=True)) + tag).hex()


def open_cursor(key: bytes, tenants: Collection[str], cursor: str) -> int | None:
    """The position `seal_cursor` sealed in `cursor` for `tenants`; None if it sealed none (a
    message id, a cursor altered or of other tenants, anything else), whatever it is instead."""
    if not _CURSOR.fullmatch(cursor):
        return None
    sealed = bytes.fromhex(cursor)
    tag = sealed[8:]
    pad = hashlib.blake2b(tag, key=key, digest_size=8, person=b"pigeon-cursor-p").digest()
    plain = bytes(a ^ b for a, b in zip(sealed[:8], pad, strict=True))
    if not hmac.compare_digest(tag, _cursor_tag(key, tenants, plain)):
        return None
    return int.from_bytes(plain, "big")


def _cursor_tag(key: bytes, tenants: Collection[str], plain: bytes) -> bytes:
    whose = "\0".join(sorted(tenants)).encode("utf-8", "surrogateescape")
    return hashlib.blake2b(plain + b"\0" + whose, key=key, digest_size=16, person=b"pigeon-cursor-t").digest()


def sealed_page(answer: Any, key: bytes, tenants: Collection[str]) -> Any:
    """A message list's answer (its workers' pages merged, a partial one's `answers` too) as a
    token bound to `tenants` is given it: its `next` sealed (`seal_cursor`)."""
    if not isinstance(answer, dict):
        return answer
    if isinstance(answer.get("answers"), dict):
        answer["answers"] = sealed_page(answer["answers"], key, tenants)
    if isinstance(answer.get("next"), str):
        answer["next"] = seal_cursor(key, tenants, parse_id(answer["next"]))
    return answer
