"""GET /api/openapi.json: the API's OpenAPI 3.1 document.

The request and response schemas are generated from the very msgspec types the handlers
decode and encode with, so the document cannot drift from what the server accepts.
"""

from __future__ import annotations

import functools
from typing import Any, Final

import msgspec
from aiohttp import web

from pigeon import mime
from pigeon.compose import COMPOSITE_TYPES, CONTENT_ID, SCHEMA_PATTERNS, InjectRequest
from pigeon.config.patterns import api_patterns
from pigeon.config.schema import DURATION_TEXT, Duration
from pigeon.listener.http.admin import (
    MAX_DURATION,
    MAX_MESSAGES,
    MESSAGES_TEXT,
    RULE_DURATION,
    AdminRequest,
    BounceRequest,
    HoldRequest,
    RebindRequest,
    SuspendRequest,
)
from pigeon.listener.http.inject import KUMO_INJECT_PATH, ErrorResponse, InjectResponse
from pigeon.listener.http.kumo import KumoInjectRequest, KumoInjectResponse
from pigeon.listener.http.listing import PATH as LIST_PATH
from pigeon.listener.http.listing import SELECTOR_LENGTH
from pigeon.queue import listing
from pigeon.queue.admin import QueueSummary
from pigeon.queue.names import (
    INBOUND_CAMPAIGN,
    MAX_QUEUE_NAME,
    QUEUE_NAME_TEXT,
    part_value_pattern,
    queue_name_pattern,
)
from pigeon.queue.rules import Rule
from pigeon.shaping.effects import Effect

_REF: Final = "#/components/schemas/{name}"
_DURATION_PATTERN: Final = f"^{DURATION_TEXT.pattern}$"  # the config's syntax, which the API shares
_RULE_ID_PATTERN: Final = "^[A-Za-z0-9_-]{1,64}$"
_ERRORS: Final = {
    "400": (
        "The request is malformed (field: what in it), holds more than 1,000,000 JSON values (field: $), or its "
        "body is not coded as its Content-Encoding says (field: Content-Encoding); nothing was stored",
        "ErrorResponse",
    ),
    "401": ("No token, or an unknown one", "ErrorResponse"),
    "403": (
        "The token lacks the scope (field: Authorization), or it is bound to tenants ([[http.token]] tenants) and "
        "the request names another tenant's mail, or several and names none of them (field: $.tenant), or a "
        "site ($.site), or is a rebind to any queue but one of its tenants', campaign:tenant@domain or "
        "tenant@domain ($.to_queue), or routes mail as a domain its [[http.token]] routing_domains does not list "
        "($.routing_domain), or asks for what is no tenant's, the shaping effects or the cluster's nodes "
        "(Authorization); the error names the token and its tenants; nothing was done",
        "ErrorResponse",
    ),
    "413": (
        "The request body is over [http] max_request_size (the error names the setting), or an admin request's "
        "over 64 KiB (field: $)",
        "ErrorResponse",
    ),
}
_SLOW: Final = (
    "The request's headers took longer than [http] header_timeout, or its body came slower than [http] "
    "min_body_rate beyond [http] body_timeout: answered by the listener itself (field null), and the connection "
    "is closed; nothing was done"
)
_BUSY: Final = (
    "the node is busy: [http] max_open_requests API requests in progress (several workers), or [http] "
    "max_connections open with none idle, both with Retry-After: 1; or no worker is up"
)
_RETRY_AFTER: Final = {
    "Retry-After": {
        "description": "Seconds to wait before trying again (1), when the node is busy",
        "schema": {"type": "integer", "minimum": 0},
    }
}
_TRANSFER_CODING: Final = (
    "The body's Transfer-Encoding has a coding other than chunked (RFC 9112 6.1; field: Transfer-Encoding); "
    "the connection is closed"
)
_NOT_JSON: Final = (
    "The body is not declared 'Content-Type: application/json' (UTF-8; field: Content-Type), or comes in a "
    "Content-Encoding other than gzip or deflate (field: Content-Encoding; Accept-Encoding says which are taken)",
    "ErrorResponse",
)
"""The answer of an operation that takes a body (`json_body.require_json`)."""


_WORKERS: Final = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_SPOOL_ID: Final = {"type": "string", "pattern": "^[0-7][0-9a-fA-F]{15}$"}  # 63-bit


@functools.cache
def document() -> dict[str, Any]:
    (request, response, _, *admin_requests, queues, _, _, kumo_request, kumo_response), components = (
        msgspec.json.schema_components(
            [
                InjectRequest,
                InjectResponse,
                ErrorResponse,
                AdminRequest,
                BounceRequest,
                SuspendRequest,
                RebindRequest,
                HoldRequest,
                QueueSummary,
                Rule,
                Effect,
                KumoInjectRequest,
                KumoInjectResponse,
            ],
            ref_template=_REF,
            schema_hook=_custom,
        )
    )
    _tighten_admin_requests(components)
    _tighten_inject_request(components)
    _tighten_kumo_request(components)
    _spell_for_json_schema(components)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Pigeon",
            "version": "1",
            "description": "Inject mail into Pigeon. Every operation needs 'Authorization: Bearer <token>'. "
            "A token bound to tenants ([[http.token]] tenants) reaches their mail alone: its injections may name no "
            "other tenant; an admin selector without a tenant is its one tenant's (403 when it has several); "
            "another tenant, a site or another tenant's queue in a write is 403; another tenant's message or "
            "rule is 404, as one that does not exist, and so is a rule of its tenant it may not end (one made by "
            "a token bound to no tenant, or to another tenant too: Rule.bound_to); the ids its rules and "
            "operations get are its binding's own (24 hex digits derived from the id it gives), so an id it "
            "gives never names another's rule; reads list its tenants' scheduled queues, rules and "
            "operations only, and no ready queue; the shaping effects are 403. "
            "Every error is an ErrorResponse ({error, field}, field null when no one part of the request is at "
            "fault), whoever answers it: a method a path does not take gets 405 with Allow (before any token is "
            "asked for), a path the API lacks 404, an internal error 500.",
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            **_admin_paths(admin_requests, queues),
            **_stored_message_paths(),
            "/api/v1/inject": {
                "post": {
                    "operationId": "inject",
                    "summary": "Inject mail: a message per recipient (or one for all), answered once all are durable",
                    "description": "Needs the 'inject' scope. Content is raw RFC 5322 text or parts; "
                    "a raw message that is not UTF-8 goes as the base64 of its bytes ('content_encoding' "
                    "'base64', 'template' false), sent as it is. Text "
                    "is a Jinja2 template rendered per recipient unless 'template' is false, and a "
                    "variable it writes out that is not given refuses that recipient (554 5.6.0), as does "
                    "'name' for a recipient without one (use {{ name | default(\"there\") }} for a fallback). "
                    "Addresses are checked as SMTP checks them (400 naming the field, with SMTP's text); "
                    "a recipient named twice is refused the second time (550 5.1.0, duplicate_of). "
                    "Content that fails SMTP reception's content check is refused per recipient with SMTP's "
                    "reply (554 5.6.0, 552 5.3.4); when it is every recipient's alike ('template' false, "
                    "a field given twice in the first recipient's message, or that message over "
                    "max_message_size, rendered or not) the request is refused: 400 "
                    "naming $.content, with that reply. Each message is a submission, as over SMTP after AUTH: "
                    "one without a Date or Message-ID gets Pigeon's, and one without From, or whose Date "
                    "or Message-ID is not of RFC 5322's syntax (3.3 date-time, obsolete forms included; "
                    "3.6.4 <left@right>), is refused so (554 5.6.0 naming the field and what is wrong; "
                    "400 naming $.content in the first recipient's message).",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
                    "responses": {
                        "200": _response("Per recipient: its spool id, or why it was refused", response),
                        "422": _response(
                            "Every recipient was refused for good (5xx; none accepted): by the policy, a template "
                            "(a variable it writes out that is not given: 554 5.6.0), the content check, the "
                            "size, a repeat; each recipient's error says why",
                            response,
                        ),
                        "503": _response(
                            "Nothing was stored: an InjectResponse when no recipient was accepted and a refusal "
                            "was temporary (spool trouble, a 4xx of the policy, [http] max_render_time spent): "
                            f"send those again later; an ErrorResponse when the request was not taken at all: {_BUSY}",
                            {"oneOf": [response, _ref("ErrorResponse")]},
                            headers=_RETRY_AFTER,
                        ),
                        "502": _response(
                            "With several workers: the worker the request was passed to went away before it answered. "
                            "It stores each recipient's message as it goes, so some may have been taken "
                            "(outcome_unknown: true): do not send it again as it is; the event log's Reception "
                            "records say which were",
                            {
                                "allOf": [
                                    _ref("ErrorResponse"),
                                    _object({"outcome_unknown": {"const": True}}, "outcome_unknown"),
                                ]
                            },
                        ),
                        **_injection_refusals(),
                        "403": _response(
                            "The token lacks the 'inject' scope (field: Authorization), or is bound to tenants "
                            "([[http.token]] tenants) and the request names another (field: where it is named: "
                            "$.tenant, $.content, $.content.headers.X-Tenant); nothing was stored",
                            _ref("ErrorResponse"),
                        ),
                    },
                }
            },
            KUMO_INJECT_PATH: {"post": _kumo_operation(kumo_request, kumo_response)},
        },
    }


def _kumo_operation(request: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """KumoMTA's injection API (`kumo`): /api/v1/inject's pipeline, KumoMTA's request and answer."""
    return {
        "operationId": "injectKumoMTA",
        "summary": "Inject mail as KumoMTA's POST /api/inject/v1 does: the same pipeline as /api/v1/inject",
        "description": "Needs the 'inject' scope. KumoMTA's request (content as raw RFC 5322 text or a builder "
        "object: text_body, html_body, from, subject, reply_to, headers, attachments), read as /api/v1/inject's "
        "and carried out by it: the same tokens, tenant bindings (the tenant and campaign from the content's "
        "X-Tenant and X-Campaign), limits, policy hooks, checks and records. Templates are Jinja2 (template_dialect"
        " 'Jinja', the default) or none ('Static'); the variables email, name and to_header are predefined. "
        "deferred_generation, deferred_spool and trace_headers are taken, to no effect: the answer comes once "
        "every message taken is durable in the spool.",
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
        "responses": {
            "200": _response(
                "The request was carried out (KumoMTA's answer): how many recipients were taken and which were "
                "not, with why; every one may have been refused (a 4xx error may be sent again later)",
                response,
            ),
            "503": _response(f"The request was not taken: {_BUSY}", _ref("ErrorResponse"), headers=_RETRY_AFTER),
            "502": _response(
                "With several workers: the worker the request was passed to went away before it answered; some "
                "recipients may have been taken (outcome_unknown: true): do not send it again as it is",
                {"allOf": [_ref("ErrorResponse"), _object({"outcome_unknown": {"const": True}}, "outcome_unknown")]},
            ),
            **_injection_refusals(),
            "403": _response(
                "The token lacks the 'inject' scope (field: Authorization), or is bound to tenants ([[http.token]] "
                "tenants) and the request names another (field: where: $.content, $.content.headers.X-Tenant); "
                "nothing was stored",
                _ref("ErrorResponse"),
            ),
        },
    }


def _injection_refusals() -> dict[str, Any]:
    """The refusals both injection APIs answer alike (one pipeline behind them: `inject`)."""
    return {
        "408": _response(_SLOW, _ref("ErrorResponse")),
        "501": _response(_TRANSFER_CODING, _ref("ErrorResponse")),
        **{code: _response(text, _ref(name)) for code, (text, name) in _ERRORS.items()},
        "413": _response(
            "The request body is over [http] max_request_size, or its messages would have the spool store more "
            "than [http] max_stored_size; the error names the setting; nothing was stored",
            _ref("ErrorResponse"),
        ),
        "415": _response(_NOT_JSON[0], _ref(_NOT_JSON[1])),
    }


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=msgspec.json.encode(document()), content_type="application/json")


def _custom(kind: type) -> dict[str, Any]:
    """Schemas of our own types: durations are seconds, or strings with a unit (as in the config)."""
    if kind is Duration:
        return {"anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": _DURATION_PATTERN}]}
    raise NotImplementedError(kind)


def _spell_for_json_schema(schema: Any) -> None:
    """The address patterns as JSON Schema spells them (`compose.SCHEMA_PATTERNS`), in place
    of the ones the server validates with, which match the same addresses."""
    if isinstance(schema, dict):
        if isinstance(pattern := schema.get("pattern"), str) and pattern in SCHEMA_PATTERNS:
            schema["pattern"] = SCHEMA_PATTERNS[pattern]
        for value in schema.values():
            _spell_for_json_schema(value)
    elif isinstance(schema, list):
        for value in schema:
            _spell_for_json_schema(value)


_NO_NUL: Final = "^[^\\u0000]*$"
_NO_NUL_CR_LF: Final = "^[^\\u0000\\r\\n]*$"
# Raw content as text: a header section holding a From field with something in its first line
# (a submission without one, or with an empty one, is refused, RFC 5322 3.6, 3.6.2), fields
# before it in one line or folded, no NUL anywhere. A From the header section holds further
# down, after a field this does not spell, or folded before its address, is taken too: the
# document promises what is surely taken.
_FIELD_LINE: Final = "[!-9;-~]+[\\t ]*:[^\\u0000\\r\\n]*(?:\\r?\\n[\\t ][^\\u0000\\r\\n]*)*\\r?\\n"
_RAW_WITH_FROM: Final = f"^(?:{_FIELD_LINE})*[Ff][Rr][Oo][Mm][\\t ]*:[\\t ]*[^\\u0000\\t\\r\\n ][^\\u0000]*$"
# Base64 that `compose.base64_bytes` surely takes: the alphabet, padded, with ASCII white space
# anywhere (line breaks: base64(1) and MIME write lines of 76 columns, and end with one).
_WHITE: Final = "[\\t\\n\\v\\f\\r ]*"
_SYMBOL: Final = f"[A-Za-z0-9+/]{_WHITE}"
_BASE64: Final = f"^{_WHITE}(?:{_SYMBOL * 4})*(?:{_SYMBOL * 2}={_WHITE}={_WHITE}|{_SYMBOL * 3}={_WHITE})?$"


def _tighten_inject_request(components: dict[str, Any]) -> None:
    """What an injection's checks (`compose.check_request`) refuse that its types do not say:
    a NUL in any text (a CR or LF too in what goes into a header as it is), parts with nothing
    to send, an attachment's data in base64 that is not base64, and raw content in base64
    (`content_encoding`) that is not base64, or is said to be a template."""
    text = [("Parts", "subject"), ("Parts", "text"), ("Parts", "html"), ("Address", "name")]
    text += [("InjectRecipient", "name")]
    as_is = [("Attachment", "file_name")]
    for pattern, members in ((_NO_NUL, text), (_NO_NUL_CR_LF, as_is)):
        for name, member in members:
            schema = components[name]["properties"][member]
            strings = [s for s in schema.get("anyOf", [schema]) if s.get("type") == "string"]
            assert len(strings) == 1, (name, member)
            strings[0]["pattern"] = pattern
    components["Parts"]["properties"]["headers"]["additionalProperties"]["pattern"] = _NO_NUL
    # No composite type (`compose.COMPOSITE_TYPES`, in any case): an attachment is base64.
    composite = "|".join("".join(f"[{c.upper()}{c}]" for c in kind) for kind in COMPOSITE_TYPES)
    content_type = components["Attachment"]["properties"]["content_type"]
    content_type["pattern"] = f"^(?!(?:{composite})/){mime.MEDIA_TYPE.removeprefix('^')}"
    content_id = components["Attachment"]["properties"]["content_id"]["anyOf"]
    [string] = [s for s in content_id if s.get("type") == "string"]
    string["pattern"] = f"^{CONTENT_ID.pattern}$"
    raw = [s for s in components["InjectRequest"]["properties"]["content"]["anyOf"] if s.get("type") == "string"]
    assert len(raw) == 1
    raw[0]["pattern"] = _RAW_WITH_FROM
    components["Attachment"]["if"] = {"properties": {"base64": {"const": True}}, "required": ["base64"]}
    components["Attachment"]["then"] = {"properties": {"data": {"type": "string", "pattern": _BASE64}}}
    # Something to send: a text, an html or an attachment ("parts need ..."; null is left out).
    components["Parts"]["anyOf"] = [
        {"required": ["text"], "properties": {"text": {"type": "string"}}},
        {"required": ["html"], "properties": {"html": {"type": "string"}}},
        {"required": ["attachments"], "properties": {"attachments": {"minItems": 1}}},
    ]
    components["InjectRequest"]["if"] = {
        "properties": {"content_encoding": {"const": "base64"}},
        "required": ["content_encoding"],
    }
    components["InjectRequest"]["then"] = {
        "properties": {"content": {"type": "string", "pattern": _BASE64}, "template": {"const": False}},
        "required": ["template"],
    }


def _tighten_kumo_request(components: dict[str, Any]) -> None:
    """KumoMTA's request as Pigeon takes it: `_tighten_inject_request`'s rules by KumoMTA's names
    (its Address and Attachment are Pigeon's), and what Pigeon does not do refused: a builder
    without From, an AMP part, a template dialect other than Jinja or Static."""
    content = components["KumoContent"]
    for member in ("subject", "text_body", "html_body"):
        [string] = [s for s in content["properties"][member]["anyOf"] if s.get("type") == "string"]
        string["pattern"] = _NO_NUL
    [headers] = [s for s in content["properties"]["headers"]["anyOf"] if s.get("type") == "object"]
    headers["additionalProperties"]["pattern"] = _NO_NUL
    [name] = [s for s in components["KumoRecipient"]["properties"]["name"]["anyOf"] if s.get("type") == "string"]
    name["pattern"] = _NO_NUL
    amp = content["properties"]["amp_html_body"]
    content["properties"]["amp_html_body"] = {"type": "null", "description": amp.get("description", "")}
    content["properties"]["from"] = {"$ref": _REF.format(name="Address"), "description": "A message needs a From"}
    content["required"] = ["from"]
    content["anyOf"] = [
        {"required": ["text_body"], "properties": {"text_body": {"type": "string"}}},
        {"required": ["html_body"], "properties": {"html_body": {"type": "string"}}},
        {"required": ["attachments"], "properties": {"attachments": {"type": "array", "minItems": 1}}},
    ]
    properties = components["KumoInjectRequest"]["properties"]
    [raw] = [s for s in properties["content"]["anyOf"] if s.get("type") == "string"]
    raw["pattern"] = _RAW_WITH_FROM
    dialect = properties["template_dialect"]
    properties["template_dialect"] = {"enum": ["Jinja", "Static", None], "description": dialect["description"]}


def _tighten_admin_requests(components: dict[str, Any]) -> None:
    """What the admin requests' checks refuse that their types do not say: a rule's duration
    (more than 0, at most 365 days), a rule id's alphabet, a selector's domain, site, tenant and
    campaign (an injection's too), its other globs' `[...]` sets (closed), a rebind's queue name. Kept out of
    the types so that the server's refusals say what to do rather than quote a pattern."""
    for name in ("AdminRequest", "BounceRequest", "SuspendRequest", "RebindRequest", "HoldRequest"):
        properties = components[name]["properties"]
        properties["id"]["anyOf"][0].update(pattern=_RULE_ID_PATTERN)
        properties["id"]["description"] = (
            "The rule's or bulk operation's id, a key for sending the request again safely; left out, one is "
            "made. From a token bound to tenants, the rule or operation gets one of its binding's own instead, "
            "24 hex digits derived from it (the answer's rule.id or operation): no one else's rule has it"
        )
        properties["bound_to"]["description"] = (
            "Set by the node that takes the request (the tenants of its token): whatever a client sends is replaced"
        )
        if "duration" in properties:
            number = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DURATION}
            text = {"type": "string", "pattern": f"^{RULE_DURATION.pattern}$"}
            properties["duration"] = {
                "anyOf": [number, text, {"type": "null"}],
                "default": None,
                "description": "More than 0, at most 365 days: seconds, or whole seconds, minutes, hours or days "
                "as a string (30m, 2h, 7d). "
                "Left out: a suspension lasts until resumed, a bounce acts on what is queued now only.",
            }
    components["Rule"]["properties"]["bound_to"]["description"] = (
        "Who made it: the tenants of the token that asked ([[http.token]] tenants); absent or null: a token "
        "bound to no tenant, the operator's. A token bound to tenants ends only the rules of tokens bound to "
        "none but its tenants: another rule of its tenant it sees, but a DELETE of it is 404"
    )
    for name in ("AdminRequest", "BounceRequest"):  # a bounce's or retry's messages, by id
        ids = {"type": "array", "items": _SPOOL_ID, "minItems": 1, "maxItems": MAX_MESSAGES, "uniqueItems": True}
        components[name]["properties"]["messages"] = {
            "anyOf": [ids, {"type": "null"}],
            "default": None,
            "description": MESSAGES_TEXT,
        }
    # A hold's messages are required: it holds messages by id, never what a selector matches alone.
    hold = components["HoldRequest"]
    hold["properties"]["messages"] = {
        "type": "array",
        "items": _SPOOL_ID,
        "minItems": 1,
        "maxItems": MAX_MESSAGES,
        "uniqueItems": True,
        "description": f"{MESSAGES_TEXT}. Held until released by id (POST /api/v1/admin/retry with messages)",
    }
    hold["required"] = ["messages"]
    admin_bodies = ("AdminRequest", "BounceRequest", "SuspendRequest", "RebindRequest", "HoldRequest")
    hosts = [(name, "domain") for name in admin_bodies]
    for name, member in [*hosts, ("SuspendRequest", "site"), ("RebindRequest", "routing_domain")]:
        components[name]["properties"][member]["anyOf"][0].update(pattern=f"^{api_patterns()[member]}$")
    for name, _ in hosts:
        components[name]["properties"]["queue"]["anyOf"][0].update(pattern=f"^{api_patterns()['queue_glob']}$")
    # A tenant or campaign names a queue, at every door: its globs can hold no more than it does,
    # and a selector's have their sets closed too.
    for name in ("InjectRequest", *admin_bodies):
        part = part_value_pattern() if name == "InjectRequest" else api_patterns()["part_glob"]
        for member in ("tenant", "campaign"):
            components[name]["properties"][member]["anyOf"][0].update(pattern=f"^{part}$")
    # An injection's campaign is no `inbound`, in any case (`names.campaign_problem`).
    inbound = "".join(f"[{c.upper()}{c}]" for c in INBOUND_CAMPAIGN)
    campaign = components["InjectRequest"]["properties"]["campaign"]["anyOf"][0]
    campaign.update(pattern=f"^(?!{inbound}$){part_value_pattern()}$")
    to_queue = components["RebindRequest"]["properties"]["to_queue"]
    to_queue["anyOf"][0].update(pattern=f"^{queue_name_pattern()}$", maxLength=MAX_QUEUE_NAME)
    to_queue["description"] = (
        f"One queue to move the mail to (not a glob): {QUEUE_NAME_TEXT}. Moved to campaign:tenant@domain, "
        "the mail takes that tenant and campaign, and selectors match it by those parts and that domain. From a "
        "token bound to tenants, only campaign:tenant@domain or tenant@domain with one of them (403 otherwise: a "
        "[[queue]] block for another tenant's names, or for names without a tenant, could govern the mail), its "
        "domain part a domain name or an address literal (400 otherwise)"
    )


def _admin_paths(bodies: list[dict[str, Any]], queues: dict[str, Any]) -> dict[str, Any]:
    retry_body, bounce_body, suspend_body, rebind_body, hold_body = bodies
    errors = {code: _response(text, _ref(name)) for code, (text, name) in _ERRORS.items()}
    workers = _WORKERS
    missing = {
        "type": "array",
        "items": _object({"worker": {"type": "integer"}, "error": {"type": "string"}}, "worker", "error"),
    }
    partial = _object(
        {
            "error": {"type": "string"},
            "partial": {"const": True},
            "answered": workers,
            "missing": missing,
            "answers": {"type": "object"},
        },
        "error",
        "partial",
        "answered",
        "missing",
        doc="answered: the workers that answered; missing: each other worker and why; answers: what those that "
        "answered said together, as a whole answer would (absent when none did)",
    )
    errors["503"] = _response(
        "Delivery is disabled on this node ([delivery] enabled = false): it takes no write (its reads answer from "
        "its spool), nor, with [redis], a read with ?cluster=1; or, with several workers, one did not answer within "
        f"[node] worker_timeout (partial: true); or {_BUSY}",
        {"anyOf": [_ref("ErrorResponse"), partial]},
        headers=_RETRY_AFTER,
    )
    errors["408"] = _response(_SLOW, _ref("ErrorResponse"))
    count = {"type": "integer", "minimum": 0}
    operation_id = {"type": "string", "description": "The bulk operation's id: GET /api/v1/admin/operations"}
    rule_or_none = {"anyOf": [_ref("Rule"), {"type": "null"}]}

    def by_id(results: dict[str, str], recipients: bool = False) -> dict[str, Any]:
        results = {**results, "pending": pending, "unknown": unknown}
        said = "; ".join(f"{result}: {meaning}" for result, meaning in results.items())
        members: dict[str, Any] = {"id": {"type": "string"}, "result": {"enum": list(results)}}
        members["node"] = {
            "type": "string",
            "description": "With [redis]: the node that holds it ([node] name; absent of not_found, pending, unknown)",
        }
        members["pending_on"] = {
            "type": "array",
            "items": {"type": "string"},
            "description": "Of pending: the nodes that did not answer (cluster.nodes says pending)",
        }
        members["not_found_on"] = {
            "type": "array",
            "items": {"type": "string"},
            "description": "Of unknown: the node asked, which does not hold it (the others were not reached)",
        }
        members["unmatched"] = {
            "type": "array",
            "items": {"enum": ["queue", "tenant", "campaign", "domain"]},
            "description": "Of not_selected: the selector's members that do not match it",
        }
        if recipients:
            members["recipients"] = {**count, "description": "Of bounced and after_attempt: its recipients"}
        row = _object(members, "id", "result", doc=said)
        return {
            "type": "array",
            "items": row,
            "description": "With messages (ids): what became of each, in the order asked, each once",
        }

    pending = (
        "with [redis], no node that answered holds it, and a node of the cluster did not answer (pending_on: "
        "not running, or not in time): it may hold it, and then applies this when it gets to it, or starts again "
        "(a one-off write within [redis] late_operations)"
    )
    unknown = (
        "with [redis], Redis cannot be reached: the node asked (not_found_on) does not hold it, and the other "
        "nodes were not reached (cluster.others_unreached): one of them may hold it, and was not told"
    )
    not_found = (
        "no worker or node that answered holds it: delivered, bounced or expired already, or no such message "
        "(or, to a token bound to tenants, another tenant's)"
    )
    not_selected = (
        "queued, but the selector given with the ids does not match it (`unmatched` says which of its members "
        "miss it): left as it was"
    )
    # With [redis], an answer adds up the nodes (`pigeon.node.broadcast`), and says whose it holds.
    last_there = {"type": "number", "description": "When it was last there (Unix time)"}
    redis_error = {
        "type": "string",
        "description": "Redis could not be reached: this node's answer only, and what becomes of the others",
    }
    unreached = {
        "type": "boolean",
        "description": "Redis could not be reached (true; absent otherwise): this answer does not cover the other "
        "nodes, whichever there are (none was asked); the command exits 75",
    }
    cluster_write = {
        "cluster": _object(
            {
                "nodes": {
                    "type": "object",
                    "additionalProperties": {"enum": ["done", "pending", "at_start"]},
                    "description": "Each node ([node] name): done (its answer is added up); pending (not in time, "
                    "or not running: it applies this when it gets to it, or starts, a one-off write within [redis] "
                    "late_operations only; the command exits 75); at_start (a rule made or ended, on a node not "
                    "running: it takes the cluster's rules, this one included, when it starts, before it delivers)",
                },
                "not_running": {
                    "type": "object",
                    "additionalProperties": last_there,
                    "description": "The nodes known to the cluster but not running (stopped, or killed, within a "
                    "day; `DELETE /api/v1/cluster/nodes/{node}` forgets one): node -> when it was last there",
                },
                "others_unreached": unreached,
                "error": redis_error,
            },
            "nodes",
            doc="With [redis]: which nodes this answer adds up",
        )
    }
    bounced = _object(
        {
            "bounced": count,
            "after_attempt": count,
            "rule": rule_or_none,
            "already": {"type": "boolean"},
            "operation": operation_id,
            "messages": by_id(
                {
                    "bounced": "bounced now, every recipient (AdminBounce records, no DSN)",
                    "after_attempt": "being sent: what that attempt does not deliver is bounced when it ends",
                    "not_selected": not_selected,
                    "not_found": not_found,
                },
                recipients=True,
            ),
        },
        "bounced",
        "after_attempt",
        "rule",
        doc="bounced: messages bounced; after_attempt: how many of them were being sent, bounced only as far as "
        "that attempt does not deliver them; rule: the standing bounce (with a duration), else null; "
        "already (with a duration): the same bounce was asked for under this id before: this is it, unchanged",
    )
    held = _object(
        {"held": count, "rule": rule_or_none, "already": {"type": "boolean"}, "added_on": workers},
        "held",
        "rule",
        doc="held: messages it holds now (put back to the spool, and those deferred there already); "
        "already: the same suspension (until resumed, or asked for before under this id) was in force: this is "
        "it, unchanged; added_on (several workers): it was in force on the other workers but not on these, and is now",
    )
    id_taken = _response(
        "The id names another live rule (another kind, selector or duration): nothing was done; `rule` is that "
        "rule (absent when it is not one a token bound to tenants may end; such a token's ids are its binding's "
        "own, and meet no one else's). A client's id only lets a "
        "request be sent again safely: the same kind, selector and duration under the same id is the same "
        "rule (200, already: true)",
        {"allOf": [_ref("ErrorResponse"), _object({"rule": _ref("Rule")})]},
    )
    id_not_free = _response(
        "The id names a live rule (a standing bounce or a suspension): nothing was done; `rule` is that rule "
        "(absent when it is not one a token bound to tenants may end). An id names one thing: leave it "
        "out, or give one of your own that no rule has",
        {"allOf": [_ref("ErrorResponse"), _object({"rule": _ref("Rule")})]},
    )
    cancelled = _object(
        {"cancelled": {"type": "boolean"}, "made_due": count, "bounced": count, "suspended": count},
        "cancelled",
        doc="made_due: released; bounced (a resume): of what it held, the messages a live standing bounce covers, "
        "bounced as they come due instead; suspended (a resume, when there are any): of what it held, the "
        "messages another suspension still holds (not named: to a token bound to tenants, perhaps the "
        "operator's, which it cannot end)",
    )
    rebound = _object(
        {
            "rebound": count,
            "after_attempt": count,
            "inbound_left": count,
            "held_left": count,
            "reserved_left": count,
            "operation": operation_id,
        },
        "rebound",
        "after_attempt",
        "inbound_left",
        doc="rebound: messages moved, due now; after_attempt: how many of them were being sent, moved as far as "
        "that attempt leaves them; inbound_left: matching messages of [[inbound]] routes, left as they are: they "
        "go to their target from their own queue; held_left (a token bound to tenants only): matching messages "
        "a suspension or standing bounce it cannot end holds (the operator's: not named), left where they are; "
        "reserved_left (when the routing_domain's [[route]] is reserved with tenants): matching messages of "
        "other tenants, or of none, left where they are: moved, they would bounce, not be sent",
    )
    retried = by_id(
        {
            "made_due": "deferred (or held), due now",
            "already_due": "due already: waiting for its turn or a connection, or being sent",
            "hold_cancelled": "being sent, and held (POST /api/v1/admin/hold) while it was: that hold, not applied "
            "yet, is cancelled (in its row too), and what the attempt does not deliver is retried as usual",
            "suspended": "a suspension holds it: left held by it (held by an operator too: that hold is "
            "released, and the suspension holds it until its end or resume)",
            "held": "a token bound to tenants only: an operator's hold it cannot release holds it (one made by a "
            "token bound to no tenant, or to another tenant too; or one asked while it was being sent, which then "
            "holds it when that attempt ends): left held, counted in on_hold",
            "bounced": "a live standing bounce covers it: bounced as it comes due now; or, being sent, it was "
            "bounced (POST /api/v1/admin/bounce) while it was: a retry does not take a bounce back, and what that "
            "attempt does not deliver is bounced when it ends",
            "not_selected": not_selected,
            "not_found": not_found,
        }
    )
    made_due = _object(
        {"made_due": count, "suspended": count, "bounced": count, "operation": operation_id, "messages": retried},
        "made_due",
        doc="made_due: messages due now; suspended: matching messages a suspension holds, left held by it (those "
        "held for an operator too are released from that hold all the same: they go when it ends); bounced: "
        "matching messages a live standing bounce covers, bounced as they come due now, and those being sent that "
        "an operator bounced meanwhile (bounced when that attempt ends)",
    )
    on_hold = {
        **count,
        "description": "Without messages: matching messages an operator held (POST /api/v1/admin/hold), left "
        "held (those being sent, held when their attempt ends): only a retry of their ids releases them. With "
        "messages, from a token bound to tenants: those held by a hold it cannot release (rows held). Absent: none",
    }
    made_due["properties"]["on_hold"] = on_hold
    held_by_id = _object(
        {
            "held": count,
            "after_attempt": count,
            "operation": operation_id,
            "messages": by_id(
                {
                    "held": "held now, untried, until released by id (an AdminHold record)",
                    "after_attempt": "being sent: what that attempt does not deliver is held when it ends",
                    "already_held": "held already (by an operator, or an [[inbound]] route's hold): left as it was",
                    "not_selected": not_selected,
                    "not_found": not_found,
                },
                recipients=True,
            ),
        },
        "held",
        "after_attempt",
        "messages",
        doc="held: messages held; after_attempt: how many of them were being sent, held only as far as that "
        "attempt does not deliver them. Held mail does not expire while held; released (POST /api/v1/admin/retry "
        "with its id), it is as old as it is: past its queue's max_age, it expires at its next turn, with a DSN",
    )
    for write in (bounced, held, cancelled, rebound, made_due, held_by_id):
        write["properties"].update(cluster_write)
    cluster_member = {
        "cluster": _object(
            {
                "nodes": {
                    "type": "object",
                    "additionalProperties": {"enum": ["done", "missing"]},
                    "description": "Each node: done (added up), or missing (not in time: its part is not in this)",
                },
                "held_by": {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": {"type": "string"}},
                    "description": "Of a list of rules: the nodes that hold each (by id)",
                },
                "others_unreached": unreached,
                "error": redis_error,
            },
            "nodes",
            doc="With ?cluster=1: whose answers were added up",
        )
    }
    not_held = {
        "type": "object",
        "additionalProperties": workers,
        "description": "With several workers: each rule (by id) that some workers that answered do not hold, and "
        "which (it applies on the others only until they take it)",
    }
    rules = _object(
        {"rules": {"type": "array", "items": _ref("Rule")}, "not_held": not_held, **cluster_member}, "rules"
    )
    progress = _object(
        {
            "operation": {"type": "string"},
            "kind": {"type": "string", "description": "bounce, rebind, retry, ..."},
            "selector": {"type": "object"},
            "looked_at": {
                **count,
                "description": "Messages looked at; of a selector naming a tenant (every one a token bound to tenants "
                "makes), that tenant's alone",
            },
            "acted_on": count,
            "waited": count,
            "after_attempt": count,
            "running": {"type": "integer", "minimum": 0, "description": "workers still at it (0: done)"},
            "started": {
                "type": "number",
                "description": "Unix time; to a token bound to tenants, the whole second it began in",
            },
            "finished": {
                "type": "number",
                "description": "Unix time; to a token bound to tenants, started plus how long it ran rounded up to "
                "whole seconds (at least 1): how long it looked at each id is not told",
            },
            "rule_created": {
                "type": "number",
                "description": "A resume: when the suspension it ended was made (each resume of a rule id is a row)",
            },
        },
        "operation",
        "kind",
        "looked_at",
        "acted_on",
        "running",
    )
    operations = _object({"operations": {"type": "array", "items": progress}, **cluster_member}, "operations")
    text_or_none = {"type": ["string", "null"]}
    number_or_none = {"type": ["number", "null"]}
    message = _object(
        {
            "id": {"type": "string"},
            "queue": {"type": "string"},
            "state": {"type": "string"},
            "in_memory": {"type": "boolean"},
            "site": text_or_none,
            "source": text_or_none,
            "sender": {"type": "string"},
            "original_sender": {
                "type": ["string", "null"],
                "description": "The sender it came with, where the policy's on_message changed it "
                "(Changes(sender=...)); null: it did not",
            },
            "recipients": {"type": "array", "items": {"type": "string"}},
            "routing_domain": {
                "type": ["string", "null"],
                "description": "The domain it is routed as (a rebind's routing_domain, a policy's Reroute); "
                "null: its recipients' own",
            },
            "size": count,
            "created": {"type": "number"},
            "attempts": count,
            "next_due": number_or_none,
            "held": {
                **text_or_none,
                "description": "Why an operator must release it (null: not held): an operator's hold ('held by "
                "operator <token>: <reason>', POST /api/v1/admin/hold) or an [[inbound]] target's refusal or expiry",
            },
            "hold_operator": {**text_or_none, "description": "Who held it (POST /api/v1/admin/hold); null: no one"},
            "hold_bound_to": {
                "type": ["array", "null"],
                "items": {"type": "string"},
                "description": "The tenants of the token that held it ([[http.token]] tenants), sorted; null: a "
                "token bound to none (the operator), or not held by POST /api/v1/admin/hold. A token bound to "
                "tenants releases (retries by id) only a hold of a token bound to none but its tenants",
            },
            "held_until": number_or_none,
            "last_response": text_or_none,
            "tenant": text_or_none,
            "campaign": text_or_none,
            "metadata": {"type": ["object", "null"]},
            "egress_pool": {
                "type": ["string", "null"],
                "description": "The [[pool]] it leaves from (null: the implicit source, or an application's target)",
            },
            "egress_pool_from": {
                "type": ["string", "null"],
                "enum": ["policy", "queue", "delivery", None],
                "description": "What named that pool: the policy hook, its [[queue]], or [delivery] pool",
            },
            "suspended_by": text_or_none,
            "subject": {
                "type": ["string", "null"],
                "description": "Its Subject, decoded (RFC 2047); null: none in its first 64 KiB",
            },
            "held_by_effect": {
                "type": ["string", "null"],
                "description": "The shaping reaction's suspension that holds it (or held it when it was last "
                "deferred): 'shaping reaction <rule> (suspend <key> until <time>) after <reply>'",
            },
        },
        "id",
        "queue",
        "state",
        "sender",
        "recipients",
        "size",
        "attempts",
    )
    mode = {"type": "string", "description": "How far effects reach: this node's workers, or the cluster's"}
    effects = _object({"effects": {"type": "array", "items": _ref("Effect")}, "mode": mode}, "effects", "mode")
    ended = _object({"ended": _ref("Effect"), "mode": mode}, "ended", "mode")
    rule_id = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
    known_node = _object(
        {
            "node": {"type": "string"},
            "running": {"type": "boolean", "description": "Its presence renewed within 10 s"},
            "last_seen": {
                "type": "number",
                "description": "Running: its last renewal; else when it stopped, or was last there (Unix time)",
            },
            "left": {
                "type": "boolean",
                "description": "Not running: true, it stopped gracefully; false, its presence ran out (killed, "
                "or cut off from Redis)",
            },
            "forgotten_at": {
                "type": "number",
                "description": "Not running: when the cluster forgets it by itself, a day after it was last there",
            },
            "workers": count,
            "spool": {"type": ["string", "null"], "description": "Its spool's id (null: an earlier Pigeon)"},
            "entry": {"type": "string", "description": "Its field in the presence hash (<prefix>:admin:nodes)"},
        },
        "node",
        "running",
        "last_seen",
        "workers",
        "spool",
        "entry",
    )
    nodes_known = {"type": "array", "items": known_node}
    known = _object(
        {"node": {"type": "string", "description": "The node asked"}, "nodes": nodes_known}, "node", "nodes"
    )
    forgotten = _object({"forgotten": nodes_known, "by": {"type": "string"}}, "forgotten", "by")
    cluster_errors = {
        **errors,
        "409": _response(
            "The node is running (stop it first); or this node has no [redis] url: it is in no cluster",
            _ref("ErrorResponse"),
        ),
        "503": _response("Redis cannot be reached", _ref("ErrorResponse")),
    }
    id_schema = _SPOOL_ID
    spool_id = [{"name": "id", "in": "path", "required": True, "schema": id_schema}]

    cluster = [
        {
            "name": "cluster",
            "in": "query",
            "required": False,
            "description": "1: every node's answer (nodes sharing [redis]), added up; `cluster.nodes` says whose",
            "schema": {"type": "string", "enum": ["0", "1", "true", "false"]},
        }
    ]

    def operation(
        op_id: str,
        summary: str,
        scope: str,
        answered: dict[str, Any],
        answered_with: str = "Done; counts of what it touched",
        **extra: Any,
    ) -> dict[str, Any]:
        responses = {"200": _response(answered_with, answered), **errors}
        if "requestBody" in extra:
            responses["415"] = _response(_NOT_JSON[0], _ref(_NOT_JSON[1]))
            responses["501"] = _response(_TRANSFER_CODING, _ref("ErrorResponse"))
        if "parameters" in extra:
            responses["404"] = _response(
                "No such rule, message or effect; or, to a token bound to tenants, another tenant's, or a rule of "
                "its tenant made by a token bound to no tenant or to another tenant too (Rule.bound_to), which it "
                "may not end (answered alike, word for word: its id tells nothing)",
                _ref("ErrorResponse"),
            )
        elif op_id in ("listBounces", "listSuspensions", "operations", "queues"):
            extra["parameters"] = cluster
        return {"operationId": op_id, "summary": f"{summary} (scope '{scope}')", "responses": responses, **extra}

    # At least one message selector (a bounce of "everything" must be spelled out: queue "*");
    # `site` (suspend only) stands alone. Absent and null are the same to the server.
    fields = ("domain", "tenant", "campaign", "queue")
    messages = {"anyOf": [{"required": [name], "properties": {name: {"type": "string"}}} for name in fields]}
    site_null = {"properties": {"site": {"type": "null"}}}
    site_only = {
        "required": ["site"],
        "properties": {"site": {"type": "string"}, **{f: {"type": "null"} for f in fields}},
    }

    def posted_with(selector: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        schema = {"allOf": [request, selector]}
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}

    where_to = {
        "anyOf": [
            {"required": [name], "properties": {name: {"type": "string"}}} for name in ("to_queue", "routing_domain")
        ]
    }
    posted_rebind = posted_with({"allOf": [messages, where_to]}, rebind_body)

    # Or messages by id instead (a bounce's with no duration: it would make a standing rule).
    ids = {"required": ["messages"], "properties": {"messages": {"type": "array"}}}
    by_id_or_selected = {"anyOf": [*messages["anyOf"], ids]}
    posted_bounce = posted_with(
        {"allOf": [by_id_or_selected, {"if": ids, "then": {"properties": {"duration": {"type": "null"}}}}]},
        bounce_body,
    )
    posted_retry = posted_with(by_id_or_selected, retry_body)
    posted_hold: dict[str, Any] = {
        "requestBody": {"required": True, "content": {"application/json": {"schema": hold_body}}}
    }
    posted_suspend = posted_with({"anyOf": [{"allOf": [messages, site_null]}, site_only]}, suspend_body)
    paths = {
        "/api/v1/admin/bounce": {
            "post": operation(
                "bounce",
                "Bounce matching queued mail, or messages by id; with a duration new mail too",
                "admin",
                bounced,
                # "Bounce" says "the sender is told" to someone used to other MTAs: this is postsuper -d.
                description="Each recipient is written off with an AdminBounce record (with the reason), and "
                "the sender gets no DSN, as with Postfix's postsuper -d. A message being sent ends as that attempt "
                "leaves it: what it does not deliver is written off when it ends.",
                **posted_bounce,
            ),
            "get": operation("listBounces", "Standing bounces", "read", rules, "The standing bounces"),
        },
        "/api/v1/admin/bounce/{id}": {
            "delete": operation("cancelBounce", "End a standing bounce", "admin", cancelled, parameters=rule_id),
        },
        "/api/v1/admin/suspend": {
            "post": operation(
                "suspend",
                "Hold matching mail (or a site's deliveries) until resumed or the duration ends",
                "admin",
                held,
                **posted_suspend,
            ),
            "get": operation("listSuspensions", "Suspensions", "read", rules, "The suspensions"),
        },
        "/api/v1/admin/suspend/{id}": {
            "delete": operation(
                "resume", "Resume: what the suspension held is due now", "admin", cancelled, parameters=rule_id
            ),
        },
        "/api/v1/admin/rebind": {
            "post": operation(
                "rebind", "Move matching mail to another queue and/or route", "admin", rebound, **posted_rebind
            ),
        },
        "/api/v1/admin/retry": {
            "post": operation(
                "retry", "Make matching deferred mail, or messages by id, due now", "admin", made_due, **posted_retry
            ),
        },
        "/api/v1/admin/hold": {
            "post": operation(
                "hold",
                "Hold messages by id, untried, until released by id (Postfix's postsuper -h)",
                "admin",
                held_by_id,
                **posted_hold,
            ),
        },
        "/api/v1/admin/operations": {
            "get": operation(
                "operations", "Recent bulk operations and how far they got", "read", operations, "Running and done"
            ),
        },
        "/api/v1/queues": {
            "get": operation(
                "queues",
                "Scheduled queues (messages, due, oldest) and ready queues",
                "read",
                # with ?cluster=1, a `cluster` member too (whose answers were added up)
                # with several workers, `not_held`: the suspensions named in `suspended_by` that some
                # workers that answered do not hold (id -> workers), as the lists of rules say
                {
                    "allOf": [
                        queues,
                        {
                            "properties": {
                                **cluster_member,
                                "not_held": {
                                    "type": "object",
                                    "additionalProperties": _WORKERS,
                                    "description": "With several workers: each suspension named in a suspended_by "
                                    "(by id) that some workers that answered do not hold, and which",
                                },
                            }
                        },
                    ]
                },
                "Every scheduled queue with its counts, and the ready queues with mail, connections or effects, "
                "or whose site is down",
            ),
        },
        "/api/v1/messages/{id}": {
            "get": operation(
                "inspect", "One message: envelope, state, attempts", "read", message, "The message", parameters=spool_id
            ),
        },
        "/api/v1/cluster/nodes": {
            "get": {
                "operationId": "clusterNodes",
                "summary": "The nodes the cluster knows (sharing [redis]), running or not (scope 'read', a token "
                "bound to no tenant)",
                "responses": {"200": _response("Every node known, by name", known), **cluster_errors},
            },
        },
        "/api/v1/cluster/nodes/{node}": {
            "delete": {
                "operationId": "forgetNode",
                "summary": "Forget a node that is not running (decommissioned): admin writes no longer name it "
                "pending (scope 'admin', a token bound to no tenant)",
                "parameters": [{"name": "node", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {
                    "200": _response("Forgotten: its entries (one per spool it ran on), as they were", forgotten),
                    **cluster_errors,
                    "404": _response("No node of that name is known to the cluster", _ref("ErrorResponse")),
                },
            },
        },
        "/api/v1/shaping/effects": {
            "get": operation(
                "shapingEffects",
                "Live effects of shaping reactions (suspend, limit, bounce) and their reach",
                "read",
                effects,
                answered_with="The live effects (every worker's, each once) and how far they reach (mode)",
            ),
        },
        "/api/v1/shaping/effects/{id}": {
            "delete": operation(
                "endShapingEffect",
                "End a shaping effect early, on every worker and node: what it held is started",
                "admin",
                ended,
                answered_with="The effect, with ended_at and ended_by, and how far the end reached (mode)",
                parameters=rule_id,
            ),
        },
    }
    listed = operation(
        "listMessages",
        "The queued messages, oldest first, with why they wait (Postfix's mailq), a page at a time",
        "read",
        _message_page(),
        "A page: its messages, and where the next starts",
        parameters=_list_parameters(),
    )
    del listed["responses"]["404"]  # (a filter that matches nothing is an empty page)
    paths[LIST_PATH] = {"get": listed}
    for making in ("/api/v1/admin/bounce", "/api/v1/admin/suspend"):
        paths[making]["post"]["responses"]["409"] = id_taken
    # A one-off (retry, rebind) under a live rule's id is refused too (`rules.refuse_operation_id`).
    for one_off in ("/api/v1/admin/retry", "/api/v1/admin/rebind", "/api/v1/admin/hold"):
        paths[one_off]["post"]["responses"]["409"] = id_not_free
    return paths


def _list_parameters() -> list[dict[str, Any]]:
    """GET /api/v1/messages's query: the admin selectors (globs, as the writes take them), state, limit, after."""

    def glob(name: str, kind: str, what: str) -> dict[str, Any]:
        pattern = f"^{api_patterns()[kind]}$"
        schema = {"type": "string", "minLength": 1, "maxLength": SELECTOR_LENGTH, "pattern": pattern}
        return {"name": name, "in": "query", "required": False, "description": what, "schema": schema}

    one_state = f"(?:{'|'.join(listing.STATES)})"
    return [
        glob("domain", "domain", "Mail to domains this glob matches, as the admin writes' domain"),
        glob("tenant", "part_glob", "Mail of tenants this glob matches"),
        glob("campaign", "part_glob", "Mail of campaigns this glob matches"),
        glob("queue", "queue_glob", "Mail of scheduled queues this glob matches"),
        {
            "name": "state",
            "in": "query",
            "required": False,
            "description": "Only messages in these states, comma-separated: "
            + "; ".join(f"{state}: {what}" for state, what in listing.STATES.items()),
            "schema": {"type": "string", "pattern": f"^{one_state}(?:,{one_state})*$"},
        },
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "description": f"The most messages the page holds (default {listing.DEFAULT_LIMIT})",
            "schema": {"type": "integer", "minimum": 1, "maximum": listing.MAX_LIMIT},
        },
        {
            "name": "after",
            "in": "query",
            "required": False,
            "description": "The `next` of the page before: this page starts after that message (to a token bound to "
            "tenants, after where that page stopped: its sealed cursor, as it was given; anything else is 400)",
            "schema": {"type": "string", "pattern": "^(?:[0-7][0-9a-fA-F]{15}|[0-9a-f]{48})$"},
        },
    ]


def _message_page() -> dict[str, Any]:
    """GET /api/v1/messages's answer."""
    text_or_none = {"type": ["string", "null"]}
    number_or_none = {"type": ["number", "null"]}
    count = {"type": "integer", "minimum": 0}
    message = _object(
        {
            "id": {"type": "string"},
            "queue": {"type": "string"},
            "state": {"type": "string", "enum": list(listing.STATES)},
            "created": {"type": "number", "description": "Its arrival (Unix time)"},
            "size": count,
            "sender": {"type": "string"},
            "recipients": {
                "type": "array",
                "items": {"type": "string"},
                "description": f"The recipients still to do (the first {listing.MAX_RECIPIENTS})",
            },
            "recipient_count": count,
            "attempts": count,
            "last_response": {**text_or_none, "description": "The last failed attempt's reply, as inspect shows it"},
            "last_attempt": number_or_none,
            "next_due": {
                **number_or_none,
                "description": "When it is tried next (null: held for an operator: held [[inbound]] mail, or mail a "
                "suspension holds until resumed; of mail a suspension with an end holds, that end, or its own retry "
                "if later)",
            },
            "suspended_by": {**text_or_none, "description": "The id of the operator's suspension that holds it"},
            "held": {
                **text_or_none,
                "description": "State held: why (an operator's hold and reason, or an [[inbound]] target's refusal)",
            },
            "tenant": text_or_none,
            "campaign": text_or_none,
        },
        "id",
        "queue",
        "state",
        "created",
        "size",
        "sender",
        "recipients",
        "recipient_count",
        "attempts",
        "next_due",
    )
    return _object(
        {
            "messages": {"type": "array", "items": message},
            "next": {
                "type": ["string", "null"],
                "description": "Give it as `after` for the next page; null: no more. A page may be short (even "
                "empty) and have one: a worker reads a bounded part of its spool for each page. The last message "
                "read (an id); to a token bound to tenants, a sealed cursor (48 hex digits) that names no message",
            },
        },
        "messages",
        "next",
    )


def _stored_message_paths() -> dict[str, Any]:
    """GET /api/v1/messages/{id}/content and /headers (`pigeon.listener.http.content`)."""
    spool_id = [
        {
            "name": "id",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": "^[0-7][0-9a-fA-F]{15}$"},
        }
    ]
    as_stored = (
        "as stored: the bytes that leave, before the edits made as they leave (the tenant and campaign headers "
        "taken off, the policy's header edits, a submission's added Date and Message-ID, the DKIM signatures on top)"
    )

    def operation(op_id: str, summary: str, kind: str, what: str) -> dict[str, Any]:
        errors = {code: _response(text, _ref(name)) for code, (text, name) in _ERRORS.items() if code != "413"}
        return {
            "operationId": op_id,
            "summary": f"{summary} (scope 'read')",
            "description": f"{what}, {as_stored}. A large message is sent as it is read (chunked for the header "
            "section).",
            "parameters": spool_id,
            "responses": {
                "200": {"description": what, "content": {kind: {"schema": {"type": "string", "format": "binary"}}}},
                **errors,
                "404": _response(
                    "No such message here; or, to a token bound to tenants, another tenant's (answered alike, word "
                    "for word: its id tells nothing)",
                    _ref("ErrorResponse"),
                ),
                "408": _response(_SLOW, _ref("ErrorResponse")),
                "503": _response(
                    "With several workers: none that answered holds it, and one did not answer (partial: true); "
                    f"or {_BUSY}",
                    _ref("ErrorResponse"),
                    headers=_RETRY_AFTER,
                ),
            },
        }

    return {
        "/api/v1/messages/{id}/content": {
            "get": operation("messageContent", "One message's stored bytes", "message/rfc822", "The whole message"),
        },
        "/api/v1/messages/{id}/headers": {
            "get": operation(
                "messageHeaders",
                "One message's stored header section",
                "text/rfc822-headers",
                "Its header fields, each ending CRLF, without the empty line after them",
            ),
        },
    }


def _ref(name: str | None) -> dict[str, Any] | None:
    return {"$ref": _REF.format(name=name)} if name else None


def _response(description: str, schema: dict[str, Any] | None, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description}
    if schema is not None:
        answer["content"] = {"application/json": {"schema": schema}}
    if headers:
        answer["headers"] = headers
    return answer


def _object(properties: dict[str, Any], *required: str, doc: str | None = None) -> dict[str, Any]:
    """An answer's schema: these members, those `required` always there (others may be added)."""
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": list(required)}
    if doc:
        schema["description"] = doc
    return schema
