"""The admin requests' OpenAPI schemas say exactly what the server takes: a client generated
from the document sends nothing the server refuses, and learns of everything it refuses."""

from __future__ import annotations

import json
import re
from typing import Any, Final

import pytest
from aiohttp import web

from pigeon.listener.http.admin import validate
from pigeon.listener.http.openapi import document

_DURATIONS = ["1", "90s", " 30 m ", "2h", "999h", "7d", "365d", "0365d", "0", "0s", "366d", "1000h", "1.5h"]
_DURATIONS += ["250ms", "99999999d", "31536000", "soon", ""]


def _taken(path: str, body: dict[str, Any]) -> bool:
    try:
        validate("POST", path, json.dumps(body).encode())
    except web.HTTPBadRequest:
        return False
    return True


def _property(schema: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = document()["components"]["schemas"][schema]["properties"][name]
    return found


@pytest.mark.parametrize("duration", _DURATIONS)
def test_a_duration_string_is_taken_exactly_when_the_documented_pattern_matches(duration: str) -> None:
    (string,) = [s for s in _property("SuspendRequest", "duration")["anyOf"] if s.get("type") == "string"]
    documented = re.search(string["pattern"], duration) is not None
    assert _taken("/api/v1/admin/suspend", {"domain": "example.net", "duration": duration}) == documented


@pytest.mark.parametrize("seconds", [0, -1, 0.5, 31536000, 31536001, 10**30])
def test_a_duration_number_is_taken_exactly_within_the_documented_bounds(seconds: float) -> None:
    (number,) = [s for s in _property("BounceRequest", "duration")["anyOf"] if s.get("type") == "number"]
    documented = number["exclusiveMinimum"] < seconds <= number["maximum"]
    assert _taken("/api/v1/admin/bounce", {"domain": "example.net", "duration": seconds}) == documented


_SETS: Final = ("c[12:t4@*", "c[12]:t4@*", "[[]x", "[]]", "[!]]", "[!]", "[]", "[!!]", "a]b", "x[", "[a][b", "plain")
_WHITE: Final = ("a b*", "[ ]x", "a\u3000b", "a\tb")


@pytest.mark.parametrize("glob", [*_SETS, *_WHITE])
@pytest.mark.parametrize("member", ["queue", "tenant", "campaign"])
def test_a_glob_is_taken_exactly_when_its_sets_are_closed_as_documented(member: str, glob: str) -> None:
    # fnmatch reads a "[" that opens no closed set as itself: `c[12:t4@*` matched nothing.
    (string,) = [s for s in _property("AdminRequest", member)["anyOf"] if s.get("type") == "string"]
    documented = re.search(string["pattern"], glob) is not None
    open_set = glob in ("c[12:t4@*", "[!]", "[]", "x[", "[a][b")
    # and no tenant or campaign holds ':' or '@' (they separate a queue name's parts), nor any
    # queue name white space (a glob with it would match nothing)
    white = any(char.isspace() for char in glob)
    assert documented == (not open_set and not white and (member == "queue" or not {":", "@"} & set(glob)))
    assert _taken("/api/v1/admin/retry", {member: glob}) == documented


_SITES_TAKEN = ["127.0.0.9:65535", "127.0.0.9:1", "[::1]:2525", "mx.test:2[0-9]*", "mx.test"]
_SITES_REFUSED = ["127.0.0.9:99999", "127.0.0.9:65536", "127.0.0.9:0", "mx.test:025", "[::1]:70000", "mx.test:25-26"]


@pytest.mark.parametrize("site", [*_SITES_TAKEN, *_SITES_REFUSED])
def test_a_site_port_is_taken_exactly_when_it_is_one_a_site_can_have_as_documented(site: str) -> None:
    # A port out of 1-65535 (or with a leading zero: sites are named "host:2525") matches no site.
    (string,) = [s for s in _property("SuspendRequest", "site")["anyOf"] if s.get("type") == "string"]
    documented = re.search(string["pattern"], site) is not None
    assert documented == (site in _SITES_TAKEN)
    assert _taken("/api/v1/admin/suspend", {"site": site}) == documented


@pytest.mark.parametrize(
    "name",
    [
        *("parked", "spring:acme@example.net", "inbound:helpdesk", "Inbound:x", "a->b", "", "a b", "x*"),
        *("é" * 255, "a\u202eb", "a\u00a0b"),
    ],
)
def test_a_rebind_queue_name_is_taken_exactly_when_the_documented_pattern_matches(name: str) -> None:
    (string,) = [s for s in _property("RebindRequest", "to_queue")["anyOf"] if s.get("type") == "string"]
    documented = re.search(string["pattern"], name) is not None and len(name) <= string["maxLength"]
    assert _taken("/api/v1/admin/rebind", {"domain": "example.net", "to_queue": name}) == documented


def test_each_write_documents_only_the_members_it_takes() -> None:
    schemas = document()["components"]["schemas"]
    members = {name: set(schemas[name]["properties"]) for name in ("AdminRequest", "BounceRequest", "RebindRequest")}
    assert "duration" not in members["AdminRequest"] and "reason" not in members["RebindRequest"]
    assert all(schemas[name]["additionalProperties"] is False for name in members)
    assert not _taken("/api/v1/admin/retry", {"domain": "example.net", "duration": "1h"})
    retry = document()["paths"]["/api/v1/admin/retry"]["post"]["requestBody"]["content"]["application/json"]
    assert retry["schema"]["allOf"][0] == {"$ref": "#/components/schemas/AdminRequest"}


def test_queue_rows_document_suspended_by_as_rules() -> None:
    schemas = document()["components"]["schemas"]
    for row in ("ScheduledQueue", "ReadyQueueRow"):
        assert schemas[row]["properties"]["suspended_by"]["items"] == {"$ref": "#/components/schemas/Rule"}


@pytest.mark.parametrize(
    ("member", "value"),
    [
        *(("domain", d) for d in ("example.net", "*.Example.NET.", "a..b", "a@b", "bücher.de", "x y")),
        *(("site", d) for d in ("mx.example.net:2525", "MX.a.TEST:27025.", "127.0.0.1:*", "[::1]:25", "m:abc")),
    ],
)
def test_a_suspend_selector_is_taken_exactly_when_the_documented_pattern_matches(member: str, value: str) -> None:
    (string,) = [s for s in _property("SuspendRequest", member)["anyOf"] if s.get("type") == "string"]
    documented = re.search(string["pattern"], value) is not None
    assert _taken("/api/v1/admin/suspend", {member: value}) == documented


@pytest.mark.parametrize("routing", ["", "relay.example", "Relay.Example.", "ok2@test", "*.x", "a..b"])
def test_a_routing_domain_is_taken_exactly_when_the_documented_pattern_matches(routing: str) -> None:
    (string,) = [s for s in _property("RebindRequest", "routing_domain")["anyOf"] if s.get("type") == "string"]
    documented = re.search(string["pattern"], routing) is not None
    assert _taken("/api/v1/admin/rebind", {"domain": "example.net", "routing_domain": routing}) == documented


_LIMITED = [
    ("BounceRequest", "bounce", "reason"),
    ("SuspendRequest", "suspend", "reason"),
    ("AdminRequest", "retry", "domain"),
    ("AdminRequest", "retry", "tenant"),
    ("AdminRequest", "retry", "campaign"),
    ("AdminRequest", "retry", "queue"),
    ("SuspendRequest", "suspend", "site"),
]


@pytest.mark.parametrize(("schema", "action", "member"), _LIMITED)
def test_a_reason_or_selector_over_its_documented_max_length_is_refused_naming_it(
    schema: str, action: str, member: str
) -> None:
    found = _property(schema, member)
    (string,) = [s for s in found.get("anyOf", [found]) if s.get("type") == "string"]
    limit = string["maxLength"]
    assert limit <= 1000
    selector = {"domain": "example.net"} if member == "reason" else {}  # (a selector member is one alone)
    path = f"/api/v1/admin/{action}"
    assert _taken(path, {**selector, member: "a" * limit})
    with pytest.raises(web.HTTPBadRequest) as refused:
        validate("POST", path, json.dumps({**selector, member: "a" * (limit + 1)}).encode())
    answer = json.loads(refused.value.text or "")
    assert answer == {"error": f"{member} is at most {limit} characters", "field": f"$.{member}"}


@pytest.mark.parametrize("member", ["tenant", "campaign"])
def test_a_tenant_or_campaign_glob_is_taken_exactly_when_the_documented_pattern_matches(member: str) -> None:
    # No tenant or campaign holds a control or format character (`queue_part_problem`), so no
    # glob of one may: the document said any character but white space, ':' and '@', and
    # schemathesis's seed 2 sent {"tenant": "[!]\x0f\U00097a74]\x89"} to /api/v1/admin/retry.
    (string,) = [s for s in _property("AdminRequest", member)["anyOf"] if s.get("type") == "string"]
    pattern = re.compile(string["pattern"] + r"\Z")  # "$" at its end as JSON Schema reads it: not before a "\n"
    # Every character of the BMP but the surrogates (a JSON body cannot carry one alone), and
    # some beyond it (which the pattern takes, as the server does); inside a set too, those
    # that are ASCII or unprintable (the others are all taken alike).
    characters = [chr(point) for point in range(0x10000) if not 0xD800 <= point <= 0xDFFF]
    characters += ["\U0001f600", "\U00097a74", "\U0010fffd", "\U00020000"]
    in_sets = [f"x[{char}]" for char in characters if (char.isascii() or not char.isprintable()) and char not in "!]"]
    for glob in (*characters, *in_sets):
        documented = pattern.search(glob) is not None
        assert _taken("/api/v1/admin/retry", {member: glob}) == documented, (member, ascii(glob), documented)


_ID: Final = "0382610d06800000"
_BY_ID: Final = [
    {"messages": [_ID]},
    {"messages": [_ID, "0382610D06800001"], "reason": "stuck"},
    {"messages": [_ID, _ID]},  # one message twice (uniqueItems; in other cases too, which no schema can say)
    {"messages": [_ID], "domain": "example.net"},
    {"messages": [_ID], "duration": "1h"},
    {"messages": [_ID], "duration": None},
    {"messages": []},
    {"messages": ["xyz"]},
    {"messages": ["8382610d06800000"]},  # past 63 bits
    {"messages": [f" {_ID}"]},
    {"messages": [_ID] * 1001},
    {"messages": None},
    {"messages": None, "domain": "example.net"},
]


@pytest.mark.parametrize("body", _BY_ID, ids=range(len(_BY_ID)))
@pytest.mark.parametrize("action", ["bounce", "retry"])
def test_messages_by_id_are_taken_exactly_when_the_documented_schema_says(action: str, body: dict[str, Any]) -> None:
    import jsonschema_rs  # schemathesis's own validator, installed with it

    if action == "retry":
        body = {key: value for key, value in body.items() if key not in ("reason", "duration")}
    posted = document()["paths"][f"/api/v1/admin/{action}"]["post"]["requestBody"]["content"]["application/json"]
    schema = {"components": document()["components"], **posted["schema"]}
    documented = jsonschema_rs.validator_for(schema).is_valid(body)
    assert _taken(f"/api/v1/admin/{action}", body) == documented, body
