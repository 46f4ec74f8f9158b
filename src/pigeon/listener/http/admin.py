"""The admin API: bounce, suspend (and resume), retry now, inspect one message.

    POST   /api/v1/admin/bounce           {selector... | messages, reason, duration?}  admin
    GET    /api/v1/admin/bounce           standing bounces                  read
    DELETE /api/v1/admin/bounce/{id}      cancel one                        admin
    POST   /api/v1/admin/suspend          {selector..., reason, duration?}   admin
    GET    /api/v1/admin/suspend          suspensions                       read
    DELETE /api/v1/admin/suspend/{id}     resume                            admin
    POST   /api/v1/admin/retry            {selector... | messages}          admin
    POST   /api/v1/admin/hold             {messages, selector..., reason}   admin
    POST   /api/v1/admin/rebind           {selector..., to_queue?, routing_domain?}  admin
    GET    /api/v1/messages/{id}          one message                       read
    GET    /api/v1/queues                 scheduled and ready queues        read
    GET    /api/v1/admin/operations       bulk operations' progress         read

A rule's `id`, if a client gives one, makes that rule or asks for it again (`already: true`);
under the id of another live rule (another kind, selector or duration) the request is refused,
409 naming that rule, and nothing is done (`pigeon.queue.rules.same_rule`). Checked where it is
issued, against the node's rules and, with `[redis]`, the cluster's; each worker checks too.

A selector names at least one of domain, tenant, campaign, queue (globs). A bounce or a retry
may name messages by id instead (`messages`: `postsuper -d`, `postqueue -i`), or as well (then
only those of them it selects); it acts on them wherever they are, each worker and node on those
it holds, and its answer says of each id what became of it (`result`: bounced, after_attempt,
made_due, already_due, hold_cancelled (being sent, held while it was: that hold cancelled),
suspended, held (a bound token's retry of mail held by a hold it cannot
release: `tenancy.releases`), not_selected: queued but not selected by the selector given
with the ids, whose members that miss it `unmatched` names; not_found). A bounce of messages makes no standing rule: a
duration with them is refused. A hold (`postsuper -h`) names messages by id always (a selector
as well only narrows them: holding what a selector matches is a suspension's work); its rows
say held, after_attempt, already_held, not_selected or not_found. Durations are
seconds or strings ("30m", "2h"), as in the config, more than 0 and at most 365 days. With
several workers the supervisor sends each request to all of them and adds up the answers.
A rule with a duration is `created` when its request was issued (stamped once: by the node's
supervisor as the request reaches it, by its one worker without one; in a cluster, the node asked)
and `expires` that duration after, on every worker and node alike: as the answer says.

Every refusal is a 400 before anything is done, with a `field`: the JSON path of the body's
offending member (`$.duration`, `$.to_queue`, `$.foo` for a member no endpoint knows, `$` for
the body as a whole), or the name of the query parameter. A misspelt member or parameter is
refused rather than ignored: ignoring `"durration": "1h"` would suspend until resumed.

A token bound to tenants (`[[http.token]] tenants`) reaches their mail alone: its writes are
confined to them where they are issued (`confine`), another tenant's rule or message is answered
as absent, and its reads show its tenants' alone (`confined_answer`; see `tenancy`).

With `[redis]`, a write applies on every node of the cluster (`pigeon.node.broadcast`) and
its answer adds up every node's, with `cluster.nodes` saying which answered; a read given
`?cluster=1` (queues, operations, standing rules) does the same.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Collection
from typing import Annotated, Any, Final, Literal, NamedTuple
from urllib.parse import parse_qsl

import msgspec
from aiohttp import web

from pigeon.config.patterns import (
    PatternError,
    api_pattern,
    closed_sets,
    domain_glob,
    domain_name,
    queue_glob,
    site_glob,
)
from pigeon.config.schema import Duration, decode_hook
from pigeon.listener.http import content, tenancy
from pigeon.listener.http.body import read_body
from pigeon.listener.http.context import NODE_KEY, from_supervisor
from pigeon.listener.http.inject import bad_request
from pigeon.listener.http.json_body import (
    lone_surrogate,
    lone_surrogate_refusal,
    number_out_of_range,
    out_of_range_text,
    repeated_member,
    repeated_refusal,
    require_json,
    unique_members,
)
from pigeon.message import SpoolId, parse_id
from pigeon.node.standing import GENERATION_HEADER
from pigeon.queue.admin import Admin, new_rule_id
from pigeon.queue.names import queue_name, queue_name_problem, queue_part_problem
from pigeon.queue.rules import (
    Rule,
    RuleIdTaken,
    Selector,
    bound_rule_id,
    refuse_operation_id,
    standing_rule_id,
    taken_by,
)

_log = logging.getLogger(__name__)
MAX_REASON: Final = 1000
"""The longest `reason` taken, in characters: a note for people (it is kept with the rule and
shown in every list of rules), not a document."""
MAX_SELECTOR: Final = 255
"""The longest domain, tenant, campaign or queue glob taken: what it is matched against is no
longer (a domain name, `pigeon.compose.MAX_NAME`, `pigeon.queue.names.MAX_QUEUE_NAME`)."""
MAX_SITE: Final = 1000
"""The longest site glob taken: a site is several MX host names joined by ","."""
_Glob = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SELECTOR)]
MAX_DURATION: Final = 365 * 86400.0
"""The longest a standing rule may be asked for: longer is surely a slip of the unit (and an
expiry past the year 9999 cannot even be shown)."""
DURATION_LIMITS_TEXT: Final = (
    "duration is more than 0 and at most 365 days: seconds (a number), or whole seconds, minutes, hours "
    '(up to 999h) or days as a string, like "30m", "2h", "7d"'
)
RULE_DURATION: Final = re.compile(
    # "(?:\s*s)?", not "\s*s?": the spaces after a bare number are the final "\s*"'s alone, or
    # every way to share them out would be tried (quadratic time) before a refusal.
    r"\s*(0*[1-9][0-9]{0,6}(?:\s*s)?|0*[1-9][0-9]{0,4}\s*m|0*[1-9][0-9]{0,2}\s*h"
    r"|0*([1-9][0-9]?|[12][0-9]{2}|3[0-5][0-9]|36[0-5])\s*d)\s*"
)
"""A rule's duration as a string: the config's syntax narrowed to what a pattern can keep within
the limits, so that the OpenAPI document can say exactly what is taken."""
_RULE_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")  # it goes into paths: DELETE /api/v1/admin/suspend/ID
_UNKNOWN_FIELD: Final = re.compile(r"^Object contains unknown field `([^`]*)`")
_TOO_LONG: Final = re.compile(r"^Expected `str` of length <= (\d+) - at `\$\.(\w+)`$")


MAX_MESSAGES: Final = 1000
"""The most message ids one bounce or retry names: a stuck message or a few (`postsuper -d`),
not a list to walk; the walk by selector is for many."""


class Selecting(msgspec.Struct, forbid_unknown_fields=True):
    """Which messages: the members every admin write's body has. Each operation's body is its
    own type, so a member it would ignore is refused, and the OpenAPI document says so."""

    domain: _Glob | None = None
    tenant: _Glob | None = None
    campaign: _Glob | None = None
    queue: _Glob | None = None
    id: str | None = None
    """The rule's or bulk operation's id: letters, digits, "-" and "_", at most 64. Left out, one
    is made where the request is issued, so every worker's and node's copy has the same. A key
    for sending a request again safely, not a name to take: under the id of a live rule, the same
    kind, selector and duration is that rule again (`already`), anything else is refused (409)."""
    via: Literal["cli", "api"] | None = None
    """What the request came through, kept with a rule it makes: set where it is issued ("cli":
    a client whose User-Agent names it the `pigeon` command; "api": anything else), whatever a
    client sent. A hint for the audit trail, not an identity: the token's name is that."""
    bound_to: list[str] | None = None
    """The tenants of the token that asked (`[[http.token]] tenants`), sorted; None: unbound.
    Set where the request is issued, whatever a client sent (`with_id`), and kept with a rule
    it makes (`Rule.bound_to`): the other workers and nodes know the request by its body alone."""

    def selector(self) -> Selector:
        site = self.site if isinstance(self, SuspendRequest) else None
        return Selector(domain=self.domain, tenant=self.tenant, campaign=self.campaign, queue=self.queue, site=site)


MESSAGES_TEXT: Final = (
    "Message ids as Pigeon prints them (16 hex digits: the 250 reply's 'queued as', pigeon logs, pigeon "
    f"inspect), at most {MAX_MESSAGES}: only these messages, on whichever worker and node holds them, and of "
    "them only those the other members select, if any are given. Instead of a selector, or with one; the "
    "answer says of each what became of it (messages), a row per id: each is given once (one given twice, in "
    "either case, is refused: 400 naming the second)"
)


class AdminRequest(Selecting):
    """Which messages to make due now (POST /api/v1/admin/retry)."""

    messages: list[str] | None = None
    """`MESSAGES_TEXT`. Read into spool ids by `message_ids`."""


class RuleRequest(Selecting):
    """What a bounce and a suspension take: why, and for how long the rule they make stands."""

    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)] = ""
    duration: float | str | None = None
    """How long the rule stands (bounce: also new mail; suspend: until then, else until resumed):
    more than 0, at most 365 days."""


class BounceRequest(RuleRequest):
    """Which messages to bounce, why, and whether new mail too (a duration). Each recipient is
    written off with an `AdminBounce` record, and the sender gets no DSN (`postsuper -d`)."""

    messages: list[str] | None = None
    """`MESSAGES_TEXT`: bounced now, never with a duration (which would make a standing rule)."""


class HoldRequest(Selecting):
    """Which messages to hold (POST /api/v1/admin/hold), and why."""

    messages: list[str] | None = None
    """`MESSAGES_TEXT`: held now, until released by id (`pigeon retry --id`). Required."""
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)] = ""
    """Why: kept with each message (`held` in `pigeon inspect` and `pigeon queue list`) and
    written into its `AdminHold` record."""


class SuspendRequest(RuleRequest):
    site: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SITE)] | None = None
    """Deliveries to this site (ready queue) stop; nothing else may be named with it."""


class RebindRequest(Selecting):
    to_queue: str | None = None
    """The scheduled queue to move the messages to (its [[queue]] policy applies from then on):
    one queue name, not a glob (`pigeon.queue.names.QUEUE_NAME_TEXT`). Selectors match them by
    its parts from then on (`Selector.matches`), and `campaign:tenant@domain` gives them that
    tenant and campaign (`RebindMark.envelope`)."""
    routing_domain: str | None = None
    """Route them as if their recipients were in this domain ("" routes them by their own again):
    by its [[route]] and [[shaping]]. From a token bound to tenants, only a domain its [[http.token]]
    routing_domains lists, or "" (403 otherwise: `tenancy.confine_routing`)."""


_REQUESTS: Final[dict[str, type[Selecting]]] = {
    "bounce": BounceRequest,
    "suspend": SuspendRequest,
    "retry": AdminRequest,
    "rebind": RebindRequest,
    "hold": HoldRequest,
}
_DECODERS: Final = {action: msgspec.json.Decoder(kind, dec_hook=decode_hook) for action, kind in _REQUESTS.items()}


async def inspect(request: web.Request) -> web.Response:
    tokens = request.app[NODE_KEY].tokens
    tenants = tokens.binding(tokens.holder(request, "read"))
    admin = _admin(request, None, reads=True)
    _known_query(request.query.keys(), ())
    try:
        spool_id = parse_id(request.match_info["id"])
    except ValueError as error:
        raise bad_request(str(error), "id") from None
    # Another tenant's message is answered as none, word for word, and as soon: told from its
    # queue name before it is read (`Admin.inspect`), its id tells nothing, not even by the time.
    found = admin.inspect(spool_id, tenants)
    if found is None or (tenants is not None and not tenancy.owns_message(tenants, found)):
        return content.no_message_here(request.app[NODE_KEY].config, request.match_info["id"])
    found["subject"] = content.subject(admin, spool_id)
    return web.json_response(found)


ISSUED_HEADER: Final = "Pigeon-Issued"
"""On an admin write the supervisor passes on: when it was issued (`time.time()` as the client's
request reached the supervisor), which a standing rule it makes is stamped with on every worker
(`perform`). Heeded on a worker's control socket only; the supervisor forwards no such header
from a client."""


def issued_by_supervisor(request: web.Request) -> float | None:
    """When the supervisor says a write it passes on was issued (`ISSUED_HEADER`), if it does."""
    if not from_supervisor(request):
        return None
    with contextlib.suppress(ValueError):
        issued = float(request.headers.get(ISSUED_HEADER, ""))
        if math.isfinite(issued):
            return issued
    return None


_VIA_VALUES: Final = ("cli", "api", None)
"""What a request's `via` may be (`Selecting.via`)."""
CLI_AGENT: Final = "pigeon-cli/"
"""How the `pigeon` command's requests begin their User-Agent."""


def caller(request: web.Request) -> Literal["cli", "api"]:
    """What a request came through: the `pigeon` command, or any other client of the API."""
    return "cli" if request.headers.get("User-Agent", "").startswith(CLI_AGENT) else "api"


def with_id(body: bytes, via: Literal["cli", "api"] | None = None, bound: frozenset[str] | None = None) -> bytes:
    """A write's body with an `id`: a new standing rule (or bulk operation) gets its id once, where
    it is issued, so every worker and every node stores it under the same. With `via` (where it
    is issued), that too, replacing any a client sent that the schema takes ("cli", "api",
    null): one it does not take (`{}`, `"x"`) is left for `validate` to refuse, naming `$.via`,
    as any other mistyped member is. And `bound_to`: `bound`, the tenants of the token that
    asked (None: unbound, and no `bound_to`).

    A bound token's id, given or made, is one of its binding's own (`bound_rule_id`): an id it
    gives then never names a rule of the operator or of another binding, so a 409 (or an
    `already`) can never tell it that another tenant's rule exists (ids of standing suspensions
    are computed from what they hold: anyone can compute another's).

    What it does never makes a body `validate` would refuse one it takes: it is applied before
    the body is checked and confined (there, the body checked is the one carried out), so an
    `id` that is no id (`"a b"`, `5`) is left as it is too, to be refused naming `$.id`, not
    made one of the binding's ids. `"id": null` is an id left out: one is made (else every
    worker and node would make its own, and a bound token's rule would be made unbound)."""
    with contextlib.suppress(ValueError):  # a member named twice too: left for `validate` to refuse
        decoded = json.loads(body, object_pairs_hook=unique_members)
        if isinstance(decoded, dict) and decoded.get("via") not in _VIA_VALUES:
            return body
        if isinstance(decoded, dict) and not _tenant_list(decoded.get("bound_to")):
            return body  # (mistyped: left for `validate` to refuse, not replaced into a valid body)
        if isinstance(decoded, dict) and decoded.get("id") is not None:
            given = decoded["id"]
            if not isinstance(given, str) or not _RULE_ID.fullmatch(given):
                return body
        if isinstance(decoded, dict) and (decoded.get("id") is None or via is not None):
            if decoded.get("id") is None:
                decoded["id"] = new_rule_id()
            if via is not None:
                decoded["via"] = via  # (whatever a client sent: it is not the client's to say)
                decoded.pop("bound_to", None)  # (nor this)
                if bound is not None and isinstance(decoded["id"], str):
                    decoded["bound_to"] = sorted(bound)
                    decoded["id"] = bound_rule_id(decoded["bound_to"], decoded["id"])
            # (A number too large to hold, `1e400`, is `inf` here, which JSON has no number for:
            # the body is left as it is, for `validate` to refuse naming its member, rather than
            # written as `Infinity` and refused as "malformed JSON".)
            return json.dumps(decoded, allow_nan=False).encode()
    return body


def _tenant_list(value: object) -> bool:
    """Whether `value` is what a body's `bound_to` may be: none, or a list of tenant names."""
    return value is None or (isinstance(value, list) and all(isinstance(item, str) for item in value))


MAX_BODY: Final = 64 * 1024
"""Bytes of an admin request's body. One names a few globs, a reason and a duration (a few
hundred bytes); decoding what `[http] max_request_size` allows (64 MiB of `{},` is 21 million
objects, 61 KB of gzip) would hold the supervisor's loop for minutes and take gigabytes."""


def body_too_large(body: bytes) -> web.HTTPRequestEntityTooLarge | None:
    """413 for an admin body over `MAX_BODY`, before anything decodes it; None if it is not."""
    if len(body) <= MAX_BODY:
        return None
    text = json.dumps({"error": f"an admin request's body is at most {MAX_BODY} bytes", "field": "$"})
    return web.HTTPRequestEntityTooLarge(
        max_size=MAX_BODY, actual_size=len(body), text=text, content_type="application/json"
    )


def validate(method: str, path: str, body: bytes) -> None:
    """Refuse (400, 404, 405) what `perform` would refuse before doing anything: checked where a
    request is issued, so a bad one is not sent to every worker and node first. `path` may
    carry a query string: a parameter the endpoint does not know is refused too."""
    action, _ = _route(method, path)
    _known_query((name for name, _ in parse_qsl(path.partition("?")[2], keep_blank_values=True)), action)
    if (refused := body_too_large(body)) is not None:
        raise refused
    if method == "POST":
        _decode(path, body)


_QUERY: Final = dict.fromkeys(("queues", "operations", "list-bounce", "list-suspend"), ("cluster",))
"""The query parameters each action takes (none, unless named here)."""


def _known_query(names: Any, action_or_known: str | tuple[str, ...]) -> None:
    """400 naming the first query parameter the endpoint does not take."""
    known = action_or_known if isinstance(action_or_known, tuple) else _QUERY.get(action_or_known, ())
    for name in names:
        if name not in known:
            takes = f"it takes only {', '.join(known)}" if known else "it takes none"
            raise bad_request(f"unknown query parameter {name[:40]!r}: {takes}", name[:40])


async def perform(
    admin: Admin,
    method: str,
    path: str,
    body: bytes,
    operator: str,
    *,
    issued: float | None = None,
    stamped: float | None = None,
) -> tuple[int, Any]:
    """One admin request applied to this worker's shards: its HTTP status and JSON answer.

    What the HTTP handlers run, and what every other node runs for a request issued on one
    node (`pigeon.node.broadcast`), `issued` then being when (`time.time()` on that node): a
    bounce or a rebind of what is queued leaves alone what this node accepted since. `stamped`:
    when a request issued on this node was (its supervisor's clock as the client's request
    reached it, `ISSUED_HEADER`, or this worker's with no supervisor). A standing rule it makes
    is `created` then (`issued` for another node's), and ends its duration after: every worker
    and node holds the times the answer gives. Refusals are raised as `web.HTTPException`."""
    action, rule_id = _route(method, path)
    if action == "queues":
        return 200, await admin.summary()
    if action == "operations":
        return 200, {"operations": admin.operations()}
    if action in ("list-bounce", "list-suspend"):
        return 200, {"rules": admin.rules(action.removeprefix("list-"))}
    if action in ("cancel-bounce", "cancel-suspend"):
        kind = action.removeprefix("cancel-")
        result = await admin.cancel(rule_id, kind)
        if not result["cancelled"]:
            return no_rule(kind, rule_id)
        return 200, result
    request = _decode(path, body)
    try:
        # (Checked where it was issued too: here for each worker and node, as a rule is by `Rules.add`.)
        refuse_operation_id(operation_of(method, path, body), admin.rule(request.id or ""), time.time())
    except RuleIdTaken as taken:
        raise id_taken(taken) from None
    if isinstance(request, RebindRequest):
        answer = await admin.rebind(
            request.selector(),
            queue=request.to_queue,
            routing_domain=request.routing_domain,
            operator=operator,
            operation=request.id,
            accepted_before=issued,  # (None: issued here, now)
            beyond=_beyond(request.bound_to),
        )
    elif isinstance(request, AdminRequest):
        answer = await admin.retry(
            request.selector(),
            request.id,
            messages=message_ids(request),
            bound_to=request.bound_to,
            kept=_kept(request.bound_to),
        )
    elif isinstance(request, HoldRequest):
        held = message_ids(request) or []  # (`_decode` made sure there are some)
        answer = await admin.hold(
            request.selector(),
            messages=held,
            reason=request.reason,
            operator=operator,
            operation=request.id,
            bound_to=request.bound_to,
        )
    else:
        assert isinstance(request, RuleRequest)
        duration = float(request.duration) if request.duration else None
        new_rule = request.id
        if action == "suspend" and duration is None:
            # Named by what it holds, not by the request: identical ones issued at once reach
            # workers and nodes in different orders, and must still make one rule everywhere.
            new_rule = standing_rule_id("suspend", request.selector(), request.bound_to)
        options: dict[str, Any] = {"issued": issued if issued is not None else stamped}
        if action == "bounce" and duration is None and issued is not None:
            options["accepted_before"] = issued
        if isinstance(request, BounceRequest) and request.messages is not None:
            options["messages"] = message_ids(request)
        operation = admin.bounce if action == "bounce" else admin.suspend
        try:
            answer = await operation(
                request.selector(),
                reason=request.reason,
                operator=operator,
                via=request.via or "api",
                duration=duration,
                rule_id=new_rule,
                bound_to=request.bound_to,
                **options,
            )
        except RuleIdTaken as taken:
            raise id_taken(taken) from None
    if request.id is not None and action != "suspend":
        answer["operation"] = request.id  # its progress: GET /api/v1/admin/operations
    return 200, answer


def _beyond(bound_to: list[str] | None) -> Callable[[Rule], bool] | None:
    """The rules a token bound to `bound_to` cannot end (`tenancy.reaches`: the operator's, or
    a token's bound to another tenant too), which its rebind leaves the mail of where it is
    (`Admin.rebind`); None for a token bound to none (the operator), which ends them all."""
    if bound_to is None:
        return None
    tenants = frozenset(bound_to)
    return lambda rule: not tenancy.reaches(tenants, rule)


def _kept(bound_to: list[str] | None) -> Callable[[list[str] | None], bool] | None:
    """The holds a token bound to `bound_to` cannot release (`tenancy.releases`: the operator's,
    or a token's bound to another tenant too), told by the binding of the token that held
    (`Envelope.hold_bound_to`, or a hold's asked mid-attempt and not applied yet), which its
    retry by id leaves held (`Admin.retry`); None for a token bound to none (the operator),
    which releases them all."""
    if bound_to is None:
        return None
    tenants = frozenset(bound_to)
    return lambda hold_bound_to: not tenancy.releases(tenants, hold_bound_to)


def no_rule(kind: str, rule_id: str) -> tuple[int, Any]:
    """The 404 of a resume or cancel of a rule there is none of (or one a bound token may not see)."""
    what = "standing bounce" if kind == "bounce" else "suspension"
    return 404, {"error": f"no {what} {rule_id}", "field": "id", "cancelled": False}


def confine(
    method: str,
    path: str,
    body: bytes,
    holder: str,
    tenants: frozenset[str] | None,
    rule_of: Callable[[str], Rule | None],
    routing_domains: Collection[str] = (),
) -> bytes:
    """A write (checked already: `validate`) as a token bound to `tenants` may make it
    (`tenancy`): its selector confined to them, the body as it is for an unbound token. A
    resume or cancel of a rule `rule_of` (the rules where it is issued) says is not theirs is
    answered as one of a rule there is none of (404), and so is one out of their reach though its
    selector is theirs (`tenancy.reaches`: the operator's suspension of their mail); a selector
    they cannot confine, or a rebind's routing domain not among the token's `routing_domains`, 403."""
    if tenants is None:
        return body
    action, rule_id = _route(method, path)
    if action in ("cancel-bounce", "cancel-suspend"):
        kind = action.removeprefix("cancel-")
        rule = rule_of(rule_id)
        if rule is None or rule.kind != kind or not tenancy.reaches(tenants, rule):
            raise web.HTTPNotFound(text=json.dumps(no_rule(kind, rule_id)[1]), content_type="application/json")
        return body
    if action not in _WRITES:
        return body
    request = json.loads(body)
    tenancy.confine_selector(request, action, holder, tenants, routing_domains)
    return json.dumps(request).encode()


def confine_received(
    method: str,
    path: str,
    body: bytes,
    operator: str,
    known_binding: frozenset[str] | None,
    rule_of: Callable[[str], Rule | None],
    routing_domains: Collection[str] = (),
) -> bytes:
    """A write another node was asked for (read from the cluster's stream: `pigeon.node.broadcast`)
    as this node may carry it out: confined here too, or refused (`confine`), never carried out
    unconfined. The node asked confined it before it told the others, but this one does not
    take that on trust: whatever happened to the body on its way (a step of the asking node
    that made an invalid body valid once it was checked, an older node), a bound token's write
    acts on its tenants' mail alone.

    It is a bound token's if its body says so (`bound_to`, set where it was issued: `with_id`),
    or if this node knows `operator` as a token bound to tenants (`known_binding`): a resume or
    cancel has no body. A `bound_to` that is no list of tenants binds it to none, and it is refused;
    one left out of a body of a token known as bound is set, so what it does is that binding's
    (a rebind leaves the mail of rules out of its reach, a rule it makes is not the operator's)."""
    tenants = known_binding
    if method == "POST":
        with contextlib.suppress(ValueError):
            decoded = json.loads(body)
            if isinstance(decoded, dict) and decoded.get("bound_to") is not None:
                bound = decoded["bound_to"]
                tenants = frozenset(bound if _tenant_list(bound) else [])
            elif isinstance(decoded, dict) and tenants is not None:
                # (`allow_nan`: as `with_id`, a number too large to hold is left for `validate` to name)
                body = json.dumps({**decoded, "bound_to": sorted(tenants)}, allow_nan=False).encode()
    if tenants is None or method not in ("POST", "DELETE"):
        return body
    validate(method, path, body)
    # (`routing_domains`: what this node's config lets `operator` route as; the nodes of a
    # cluster share their tokens, so a rebind the asked node allowed is allowed here too.)
    return confine(method, path.partition("?")[0], body, operator, tenants, rule_of, routing_domains)


def confined_answer(method: str, path: str, answer: Any, tenants: frozenset[str] | None) -> Any:
    """An answer as a token bound to `tenants` sees it (`tenancy.confined_answer`): a read's
    showing their queues, rules and operations alone, a write's 409 not naming the rule of
    another tenant that holds the id it gave."""
    if tenants is None:
        return answer
    try:
        action, _ = _route(method, path)
    except web.HTTPException:
        return answer
    return tenancy.confined_answer(action, answer, tenants)


def id_taken(taken: RuleIdTaken) -> web.HTTPConflict:
    """409 naming the rule that has the id asked for (its kind, selector, duration): a client's
    `id` makes that rule or asks for it again, and never takes the id from another."""
    answer = {"error": str(taken), "field": "$.id", "rule": msgspec.to_builtins(taken.held)}
    return web.HTTPConflict(text=json.dumps(answer), content_type="application/json")


def refuse_taken_id(change: RuleChange | None, held: Rule | None, now: float) -> None:
    """409 (`id_taken`) if the rule `change` makes has the id of `held`, another live rule:
    checked where a write is issued, before it is sent to every worker and node."""
    if change is not None and (asked := change.rule) is not None and (other := taken_by(held, asked, now)) is not None:
        taken = RuleIdTaken(other, asked)
        _log.warning("admin %s by %s of %s refused: %s", asked.kind, asked.operator, asked.selector.describe(), taken)
        raise id_taken(taken)


def refuse_taken_operation(operation: tuple[str, str] | None, held: Rule | None, now: float) -> None:
    """409 (`id_taken`) if `operation` (`operation_of`), which makes no rule, has the id of
    `held`, a live rule: checked where a write is issued, before any worker or node acts on it."""
    try:
        refuse_operation_id(operation, held, now)
    except RuleIdTaken as taken:
        _log.warning("admin %s refused: %s", operation[1] if operation else "", taken)
        raise id_taken(taken) from None


def operation_of(method: str, path: str, body: bytes) -> tuple[str, str] | None:
    """A write that makes no standing rule (a bounce without a duration, a retry, a rebind), with
    an id: (its id, what it does, for a refusal). None for anything else, and for a request
    `perform` would refuse."""
    try:
        action, _ = _route(method, path)
        if action not in ("bounce", "retry", "rebind", "hold"):
            return None
        request = _decode(path, body)
    except web.HTTPException:
        return None
    if request.id is None or (isinstance(request, RuleRequest) and request.duration):
        return None
    what = "bounce now" if action == "bounce" else action
    ids = message_ids(request)
    of = request.selector().describe() if ids is None else f"{len(ids)} message(s) by id"
    return request.id, f"{what} of {of} (an operation, not a rule)"


class RuleChange(NamedTuple):
    """What a write does to the standing rules: makes `rule`, or (None) ends the rule `rule_id`."""

    rule_id: str
    kind: str
    rule: Rule | None


def rule_change(method: str, path: str, body: bytes, operator: str, now: float) -> RuleChange | None:
    """The standing rule a write makes or ends (a suspension, a bounce with a duration, their
    cancel), as every node makes it from the same request: the same id, ending `now` plus its
    duration. None for a write that leaves the rules alone (a bounce now, a retry, a rebind)
    and for a request `perform` would refuse."""
    try:
        action, rule_id = _route(method, path)
        if action in ("cancel-bounce", "cancel-suspend"):
            return RuleChange(rule_id, action.removeprefix("cancel-"), None)
        if action not in ("bounce", "suspend"):
            return None
        request = _decode(path, body)
    except web.HTTPException:
        return None
    assert isinstance(request, RuleRequest)
    duration = float(request.duration) if request.duration else None
    if action == "bounce" and duration is None:
        return None  # acts on what is queued now, and is over
    new_rule = request.id
    if action == "suspend" and duration is None:
        new_rule = standing_rule_id("suspend", request.selector(), request.bound_to)  # as `perform` names it
    if new_rule is None:
        return None
    rule = Rule(
        new_rule,
        "bounce" if action == "bounce" else "suspend",
        request.selector(),
        now,
        expires=now + duration if duration else None,
        reason=request.reason,
        operator=operator,
        via=request.via or "api",
        bound_to=request.bound_to,
    )
    return RuleChange(new_rule, rule.kind, rule)


_WRITES: Final = {"bounce", "suspend", "retry", "rebind", "hold"}
_READS: Final = {"queues": "/api/v1/queues", "operations": "/api/v1/admin/operations"}


def _route(method: str, path: str) -> tuple[str, str]:
    """(action, rule id) of an admin request; 404 or 405 if it is none."""
    path = path.partition("?")[0].rstrip("/")
    for action, known in _READS.items():
        if path == known:
            if method != "GET":
                raise web.HTTPMethodNotAllowed(method, ["GET"])
            return action, ""
    prefix = "/api/v1/admin/"
    if path.startswith(prefix):
        name, _, rule_id = path.removeprefix(prefix).partition("/")
        if name in _WRITES and not rule_id:
            if method == "GET" and name in ("bounce", "suspend"):
                return f"list-{name}", ""
            if method != "POST":
                raise web.HTTPMethodNotAllowed(method, ["POST"])
            return name, ""
        if name in ("bounce", "suspend") and rule_id and "/" not in rule_id:
            if method != "DELETE":
                raise web.HTTPMethodNotAllowed(method, ["DELETE"])
            return f"cancel-{name}", rule_id
    raise web.HTTPNotFound(text=json.dumps({"error": f"no admin operation at {path}"}), content_type="application/json")


def message_ids(request: Selecting) -> list[SpoolId] | None:
    """The spool ids a bounce or retry names (`messages`, checked by `_decode`), each once, in
    the order given; None when it names none (it acts on what its selector matches)."""
    given = request.messages if isinstance(request, AdminRequest | BounceRequest | HoldRequest) else None
    if given is None:
        return None
    return list(dict.fromkeys(parse_id(text) for text in given))


def _decode(path: str, body: bytes) -> Selecting:
    action, _ = _route("POST", path)
    if (repeated := repeated_member(body)) is not None:
        raise bad_request(repeated_refusal(repeated), repeated)
    try:
        request: Selecting = _DECODERS[action].decode(body)
    except msgspec.ValidationError as error:
        raise _refusal(error, action, body) from None
    except msgspec.DecodeError as error:
        if (surrogate := lone_surrogate(body)) is not None:  # msgspec says "truncated", naming no member
            path, name = surrogate
            raise bad_request(lone_surrogate_refusal(path, name=name), path) from None
        raise bad_request(f"malformed JSON: {error}", "$") from None
    except RecursionError:
        raise bad_request("JSON nested too deeply", "$") from None
    if isinstance(request, RuleRequest) and request.duration is not None:
        request.duration = _rule_duration(request.duration, action)
    if request.id is not None and not _RULE_ID.fullmatch(request.id):
        raise bad_request("id is letters, digits, '-' and '_', at most 64 (or leave it out: one is made)", "$.id")
    _normalise_globs(request)
    if isinstance(request, HoldRequest) and request.messages is None:
        raise bad_request(
            "messages names the messages to hold, by id (to hold what a selector matches, suspend it: "
            "POST /api/v1/admin/suspend)",
            "$.messages",
        )
    if isinstance(request, AdminRequest | BounceRequest | HoldRequest) and request.messages is not None:
        _check_messages(request.messages)
        if isinstance(request, BounceRequest) and request.duration is not None:
            # A duration makes a standing rule, which would bounce new mail by its selector: the
            # ids name messages queued now, and an id bounce is over once they are bounced.
            raise bad_request(
                "messages are bounced now, and make no standing rule: leave duration out (to bounce new mail "
                "too, bounce by domain, tenant, campaign or queue with a duration)",
                "$.duration",
            )
        return request
    if request.selector().empty():
        site = " (or site, to stop deliveries to a site)" if action == "suspend" else ""
        site = " (or messages: their ids)" if action in ("bounce", "retry") else site
        raise bad_request(f"name at least one of domain, tenant, campaign, queue{site}", "$")
    if isinstance(request, SuspendRequest) and request.site is not None and not request.selector().site_only():
        raise bad_request("site names a ready queue to suspend, on its own", "$.site")
    if isinstance(request, RebindRequest) and request.to_queue is None and request.routing_domain is None:
        raise bad_request("say where to: to_queue, routing_domain or both", "$")
    if isinstance(request, RebindRequest) and request.to_queue is not None:
        problem = queue_name_problem(request.to_queue)
        if problem is not None:
            raise bad_request(f"to_queue {request.to_queue[:60]!r}: {problem}", "$.to_queue")
        request.to_queue = queue_name(request.to_queue)
    return request


def _check_messages(given: list[str]) -> None:
    """400 naming the first id of `messages` that is none (`MESSAGES_TEXT`), or given twice, or an empty list."""
    if not given:
        raise bad_request("messages names at least one message id (or leave it out, and select by domain, ...)",
                          "$.messages")  # fmt: skip
    if len(given) > MAX_MESSAGES:
        raise bad_request(f"messages names at most {MAX_MESSAGES} ids: bounce or retry more by a selector "
                          "(hold more: suspend)", "$.messages")  # fmt: skip
    first: dict[int, int] = {}  # spool id -> where it was first given
    for index, text in enumerate(given):
        try:
            spool_id = parse_id(text)
        except ValueError as error:
            raise bad_request(f"messages[{index}]: {error}", f"$.messages[{index}]") from None
        if spool_id in first:
            # Refused as a member given twice is: the answer has one row per id given, and two
            # rows of one message would say twice what was done once.
            raise bad_request(f"messages[{index}]: {text[:40]!r} is given already, at messages[{first[spool_id]}]: "
                              "name each message once", f"$.messages[{index}]")  # fmt: skip
        first[spool_id] = index


def _normalise_globs(request: Selecting) -> None:
    """Read the selector's globs as the config reads the same globs (`config.patterns`): a
    domain or site in lower case and without a final dot, as the names they are matched
    against are written. One no domain or site could match ("@", white space, an empty label,
    a port that is no number), or no tenant or campaign ("a b"), is refused, rather than stored
    as a rule that holds nothing (`--site shop.example@mx.example`); so is a routing domain that
    is no domain name."""
    kinds = {"domain": domain_glob, "site": site_glob}
    for member, normalise in kinds.items():
        pattern = getattr(request, member, None)
        if pattern is None:
            continue
        try:
            normalised, problem = normalise(pattern), ""
        except PatternError as error:
            # A finer flaw the OpenAPI pattern cannot say (a label over 63 characters) matches
            # nothing either; if the pattern takes it, it is kept, in lower case.
            normalised, problem = pattern.lower(), str(error)
        if not api_pattern(member).fullmatch(pattern):
            problem = problem or ("is not a domain glob" if member == "domain" else "is not a site glob (hosts[:port])")
            raise bad_request(f"{member} {pattern[:60]!r} {problem}", f"$.{member}")
        setattr(request, member, normalised)
    for member in ("tenant", "campaign", "queue"):  # globs on any text: only a set left open is refused
        pattern = getattr(request, member)
        if pattern is None:
            continue
        try:
            closed_sets(pattern)
        except PatternError as error:
            raise bad_request(f"{member} {pattern[:60]!r} {error}", f"$.{member}") from None
    for member in ("tenant", "campaign"):
        # Refused as a tenant or campaign is at every door: no queue has one with white space.
        part: str | None = getattr(request, member)
        if part is not None and (refused := queue_part_problem(part)) is not None:
            raise bad_request(f"{member} {part[:60]!r} {refused} (no queue name has it)", f"$.{member}")
    if request.queue is not None:
        # A control or format character neither: no queue name made at any door holds one, and a
        # rule holding one would stand for nothing (and carry it into logs and listings). Asked
        # first: the pattern refuses them too (as the OpenAPI document says), but says white space.
        odd = next((c for c in request.queue if not c.isspace() and c not in ":@" and queue_part_problem(c)), None)
        if odd is not None:
            text = f"queue {request.queue[:60]!r} contains {odd!r}: no control or format character allowed"
            raise bad_request(f"{text} (no queue name has it)", "$.queue")
    if request.queue is not None and not api_pattern("queue_glob").fullmatch(request.queue):
        space = next((char for char in request.queue if char.isspace() or char == "\ufeff"), " ")
        raise bad_request(
            f"queue {request.queue[:60]!r} contains {space!r}: no white space allowed (no queue name has it)", "$.queue"
        )
    if request.queue is not None:
        with contextlib.suppress(PatternError):  # a glob on queue names: any text may be one
            request.queue = queue_glob(request.queue)
    if isinstance(request, RebindRequest) and request.routing_domain is not None:
        routing = request.routing_domain
        if not api_pattern("routing_domain").fullmatch(routing):
            raise bad_request(
                f'routing_domain {routing[:60]!r} is not a domain name (or "" to route by their own again)',
                "$.routing_domain",
            )
        if routing:
            try:  # what no domain holds (a label over 63, a name over 253): retried until max_age else
                domain_name(routing)
            except PatternError as error:
                text = (
                    f'routing_domain {routing[:60]!r} is not a domain name: {error} (or "" to route by their own again)'
                )
                raise bad_request(text, "$.routing_domain") from None
        request.routing_domain = routing.lower().removesuffix(".")


def _refusal(error: msgspec.ValidationError, action: str, body: bytes) -> web.HTTPBadRequest:
    """A decoding error as a 400 whose `field` always says where, and a message that says what to do."""
    message = str(error)
    number = number_out_of_range(body, message)
    if number is not None and number != "$.duration":
        return bad_request(out_of_range_text(), number)
    if (unknown := _UNKNOWN_FIELD.match(message)) is not None:
        name = unknown.group(1)
        # (`via` and `bound_to` are set where a request is issued: not members for a client to send)
        set_here = ("via", "bound_to")
        known = ", ".join(f.name for f in msgspec.structs.fields(_REQUESTS[action]) if f.name not in set_here)
        return bad_request(f"unknown member {name[:40]!r}: {action} takes {known}", f"$.{name[:40]}")
    if message.endswith("`$.via`"):
        text = 'via is "cli", "api" or null: what the request came through, set by the node whatever it says'
        return bad_request(f"{text} (best left out)", "$.via")
    if (too_long := _TOO_LONG.match(message)) is not None:
        limit, name = too_long.groups()
        return bad_request(f"{name} is at most {limit} characters", f"$.{name}")
    if message.endswith("`$.duration`"):
        # msgspec's "Number out of range" (1e999) or the config's own wording: say the limits.
        return bad_request(f"{DURATION_LIMITS_TEXT}{_unbounded(action)}", "$.duration")
    return bad_request(error, None if " - at `$" in message else "$")


def _unbounded(action: str) -> str:
    if action == "suspend":
        return "; to suspend until resumed, leave duration out"
    if action == "bounce":
        return "; to bounce only what is queued now, leave duration out"
    return ""


def _rule_duration(value: float | str, action: str) -> float:
    """A rule's duration in seconds, or a 400 that says what is taken."""
    seconds = (
        float(decode_hook(Duration, value)) if isinstance(value, str) and RULE_DURATION.fullmatch(value) else value
    )
    if isinstance(seconds, str) or not 0 < seconds <= MAX_DURATION:
        given = f"{seconds:.0f} seconds" if isinstance(seconds, float) and abs(seconds) < 1e15 else f"{value!r:.40}"
        raise bad_request(f"{DURATION_LIMITS_TEXT}, not {given}{_unbounded(action)}", "$.duration")
    return seconds


async def write(request: web.Request) -> web.Response:
    """A write: applied here, and (with [redis], when this process is the one that was asked)
    on every other node of the cluster."""
    tokens = request.app[NODE_KEY].tokens
    operator = tokens.holder(request, "admin")
    tenants = tokens.binding(operator)
    admin = _admin(request, None)
    # Issued here unless the supervisor passed it on (having stamped it from the client's request).
    supervised = from_supervisor(request)
    issued = issued_by_supervisor(request) if supervised else time.time()
    if request.method == "POST":
        require_json(request)
    body = await read_body(request) if request.method == "POST" else b""
    path = request.path
    if request.method == "POST" and body_too_large(body) is None:
        # Say what it came through, and who asked (the ids of a bound token's own: `with_id`),
        # before it is checked and confined: what is checked is what this worker carries out
        # and, asked here (one worker), what the other nodes are told. (As the supervisor does.)
        body = with_id(body, None if supervised else caller(request), tenants)
    validate(request.method, request.path_qs, body)
    # Refused whole if it cannot be confined (fails closed: nothing after this makes it valid).
    # (Confined by the supervisor too, if it passed it on: the same body again, kept as it is.)
    body = confine(request.method, path, body, operator, tenants, admin.rule, tokens.routing_domains(operator))
    if request.method == "POST" and not supervised:
        # Asked here (one worker, no supervisor): a taken id is refused before the cluster is told.
        assert issued is not None
        change = rule_change(request.method, path, body, operator, issued)
        operation = operation_of(request.method, path, body)
        try:
            refuse_taken_id(change, admin.rule(change.rule_id) if change is not None else None, issued)
            refuse_taken_operation(operation, admin.rule(operation[0]) if operation is not None else None, issued)
        except web.HTTPConflict as refusal:
            status, answer = refusal_answer(refusal)
            return _json((status, confined_answer(request.method, path, answer, tenants)))
    generation = request.headers.get(GENERATION_HEADER, "") if supervised else ""
    if generation.isdigit():
        # Noted before it is carried out: a hand-over of the node's rules from before this write
        # may reach this worker while it is (`pigeon.node.standing`).
        change = rule_change(request.method, path, body, operator, 0.0)
        if change is not None:
            admin.written(change.rule_id, int(generation))
    try:
        status, answer = await _front(request, request.method, path, body, operator, admin, issued)
    except web.HTTPConflict as refusal:  # (an id taken, found by `perform`)
        status, answer = refusal_answer(refusal)
    return _json((status, confined_answer(request.method, path, answer, tenants)))


SUSPENSIONS_HELD: Final = "suspensions_held"
"""In a worker's queue summary for its supervisor: the suspensions it holds, of which the
supervisor marks those some workers lack (`not_held`, as in the lists of rules), and drops."""


async def read(request: web.Request) -> web.Response:
    """A read: this worker's part; with `?cluster=1` every node's, added up."""
    tokens = request.app[NODE_KEY].tokens
    operator = tokens.holder(request, "read")
    tenants = tokens.binding(operator)
    admin = _admin(request, None, reads=True)
    supervised = from_supervisor(request)
    validate("GET", request.path_qs, b"")
    node = request.app[NODE_KEY]
    if cluster_wide(request) and node.admin is None and node.config.redis.url:
        # Not in the cluster's admin stream (it joins it with delivery): it cannot ask the others.
        raise _unavailable(NOT_FOR_THE_CLUSTER)
    if not cluster_wide(request):
        status, answer = await perform(admin, "GET", request.path, b"", operator)
    else:
        status, answer = await _front(request, "GET", request.path, b"", operator, admin)
    if supervised and status == 200 and isinstance(answer, dict) and request.path.rstrip("/") == "/api/v1/queues":
        answer[SUSPENSIONS_HELD] = admin.suspensions()
    return _json((status, confined_answer("GET", request.path, answer, tenants)))


def cluster_wide(request: web.Request) -> bool:
    """Whether a read asks for the whole cluster (`?cluster=1`); 400 for what is not a yes or no."""
    if "cluster" not in request.query:
        return False
    value = request.query["cluster"].lower()
    if value not in ("0", "1", "true", "false"):
        raise bad_request(f"cluster is 1 or 0 (true or false), not {value[:20]!r}", "cluster")
    return value in ("1", "true")


async def _front(
    request: web.Request,
    method: str,
    path: str,
    body: bytes,
    operator: str,
    admin: Admin,
    issued: float | None = None,
) -> tuple[int, Any]:
    """`perform` here, and with [redis] on every node (this process being the one asked): a write
    `issued` then (`perform`'s `stamped`), the time the stream entry carries to the other nodes."""
    broadcast = request.app[NODE_KEY].broadcast_front
    if broadcast is None:
        return await perform(admin, method, path, body, operator, stamped=issued)
    return await broadcast.around(
        method, path, body, operator, lambda: _caught(admin, method, path, body, operator, issued), issued=issued
    )


async def _caught(
    admin: Admin, method: str, path: str, body: bytes, operator: str, issued: float | None = None
) -> tuple[int, Any]:
    """`perform`, with a refusal as an answer rather than an exception (to be added up)."""
    try:
        return await perform(admin, method, path, body, operator, stamped=issued)
    except web.HTTPException as refusal:
        return refusal_answer(refusal)


def refusal_answer(refusal: web.HTTPException) -> tuple[int, Any]:
    """A raised refusal as (status, JSON answer): to be added up with other answers."""
    try:
        return refusal.status, json.loads(refusal.text or "")
    except ValueError:
        return refusal.status, {"error": refusal.text or refusal.reason}


def _json(answer: tuple[int, Any]) -> web.Response:
    return web.json_response(answer[1], status=answer[0])


DELIVERY_DISABLED: Final = "delivery is disabled on this node ([delivery] enabled = false)"
NO_WRITES: Final = (
    f"{DELIVERY_DISABLED}: it keeps its spool as it is, and takes no bounce, suspend, resume, retry or "
    "rebind (reads answer: queues, messages, standing rules); to act on its mail, enable delivery and restart it"
)
NOT_FOR_THE_CLUSTER: Final = (
    f"{DELIVERY_DISABLED}: it answers for its own spool only, not for the cluster (leave out ?cluster=1)"
)


def _unavailable(error: str) -> web.HTTPServiceUnavailable:
    return web.HTTPServiceUnavailable(text=json.dumps({"error": error}), content_type="application/json")


def _admin(request: web.Request, scope: Any, *, reads: bool = False) -> Admin:
    """This node's admin, once the token grants `scope` (None: the caller has checked it).
    The token comes first: who may not ask learns 401 or 403, not whether the node delivers.
    `reads`: for a read, which a node that does not deliver answers too (from its spool);
    a write there is refused, 503, saying so."""
    node = request.app[NODE_KEY]
    if scope is not None:
        node.tokens.holder(request, scope)
    admin = node.reader if reads else node.admin
    if admin is None:
        raise _unavailable(NO_WRITES if not reads else DELIVERY_DISABLED)
    return admin
