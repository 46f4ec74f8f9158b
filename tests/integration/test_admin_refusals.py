"""What the admin API refuses, through the real HTTP API of a running node: every refusal is a
400 with a `field` (a JSON path or a query parameter's name) and a message that says what to
do, and nothing queued, no rule and no bulk operation changes because of it."""

from __future__ import annotations

import smtplib
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

ADMIN = "admin-token-0123456789"
TOKENS = [{"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]}]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PigeonProcess, list[str]]]:
    """One node (two workers: refusals come through the supervisor), with deferred mail."""
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint, retry_interval="1h")
        root = tmp_path_factory.mktemp("refusals") / "node"
        with PigeonProcess(root, node={"workers": 2}, http={"token": TOKENS}, **config) as pigeon:
            ids = []
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                for n in range(3):
                    client.sendmail("a@example.org", ["tempfail@example.net"], f"Subject: {n}\r\n\r\nhi\r\n".encode())
            wait_until(lambda: len({r["id"] for r in pigeon.records("TransientFailure")}) == 3)
            ids = sorted(m["id"] for m in pigeon.spool_messages())
            yield pigeon, ids


def _state(pigeon: PigeonProcess) -> Any:
    """What a refusal must leave as it was: the spool's rows, the rules, the bulk operations."""
    rules = [pigeon.http_call("GET", f"/api/v1/admin/{kind}", None, ADMIN)[1] for kind in ("bounce", "suspend")]
    operations = pigeon.http_call("GET", "/api/v1/admin/operations", None, ADMIN)[1]
    rows = [(m["id"], m["queue"], m["envelope"]) for m in pigeon.spool_messages()]
    due = [pigeon.http_call("GET", f"/api/v1/messages/{row[0]}", None, ADMIN)[1]["next_due"] for row in rows]
    return rows, due, rules, operations


def _refused(node: tuple[PigeonProcess, list[str]], method: str, path: str, body: Any = None) -> dict[str, Any]:
    pigeon, ids = node
    before = _state(pigeon)
    status, answer = pigeon.http_call(method, path, body, ADMIN)
    assert status == 400, answer
    assert isinstance(answer, dict) and set(answer) == {"error", "field"}, answer
    assert _state(pigeon) == before  # nothing changed
    assert sorted(m["id"] for m in pigeon.spool_messages()) == ids
    assert not pigeon.records("AdminBounce")
    return answer


@pytest.mark.parametrize("duration", [0, -5, "0s", 366 * 86400, 10**30, 1e300, "99999999d", "400d"])
@pytest.mark.parametrize("action", ["suspend", "bounce"])
def test_a_duration_not_above_0_or_over_365_days_is_refused_naming_it(
    node: tuple[PigeonProcess, list[str]], action: str, duration: Any
) -> None:
    answer = _refused(node, "POST", f"/api/v1/admin/{action}", {"domain": "example.net", "duration": duration})
    assert answer["field"] == "$.duration"
    assert "more than 0 and at most 365 days" in answer["error"]
    assert "leave duration out" in answer["error"]  # how to ask for the other thing


def test_a_duration_of_365_days_is_taken(node: tuple[PigeonProcess, list[str]]) -> None:
    pigeon, _ = node
    body = {"domain": "none.test", "duration": "365d"}
    status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", body, ADMIN)
    assert status == 200, answer
    assert pigeon.http_call("DELETE", f"/api/v1/admin/suspend/{answer['rule']['id']}", None, ADMIN)[0] == 200


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/admin/suspend", {"domain": "example.net", "durration": "1h"}, "$.durration"),
        ("/api/v1/admin/bounce", {"domain": "example.net", "reason": "x", "force": True}, "$.force"),
        ("/api/v1/admin/retry", {"domain": "example.net", "now": True}, "$.now"),
        ("/api/v1/admin/rebind", {"domain": "example.net", "to_queue": "parked", "toqueue": "x"}, "$.toqueue"),
        # Known members an action would ignore: a retry "for an hour" does not last.
        ("/api/v1/admin/retry", {"domain": "example.net", "duration": "1h"}, "$.duration"),
        ("/api/v1/admin/rebind", {"domain": "example.net", "to_queue": "parked", "reason": "x"}, "$.reason"),
        ("/api/v1/admin/bounce", {"site": "127.0.0.1:25"}, "$.site"),
    ],
)
def test_a_member_the_endpoint_does_not_take_is_refused_by_name(
    node: tuple[PigeonProcess, list[str]], path: str, body: dict[str, Any], field: str
) -> None:
    answer = _refused(node, "POST", path, body)
    assert answer["field"] == field
    assert field.removeprefix("$.") in answer["error"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/queues?clutser=1"),
        ("GET", "/api/v1/admin/operations?limit=5"),
        ("GET", "/api/v1/admin/bounce?all=1"),
        ("GET", "/api/v1/admin/suspend?cluster=0&x=1"),
        ("GET", "/api/v1/messages/{id}?full=1"),
        ("POST", "/api/v1/admin/bounce?dry_run=1"),
        ("POST", "/api/v1/admin/suspend?duration=1h"),
        ("POST", "/api/v1/admin/retry?cluster=1"),
        ("POST", "/api/v1/admin/rebind?dry_run=1"),
        ("DELETE", "/api/v1/admin/suspend/0123abcd?force=1"),
        ("DELETE", "/api/v1/admin/bounce/0123abcd?force=1"),
    ],
)
def test_an_unknown_query_parameter_is_refused_by_name(
    node: tuple[PigeonProcess, list[str]], method: str, path: str
) -> None:
    _, ids = node
    body = {"domain": "example.net", "to_queue": "parked"} if path.startswith("/api/v1/admin/rebind") else None
    body = body or ({"domain": "example.net"} if method == "POST" else None)
    answer = _refused(node, method, path.format(id=ids[0]), body)
    reads = method == "GET" and "/messages/" not in path  # they take ?cluster=1; nothing else takes any
    (parameter,) = [name for name, _ in parse_qsl(urlsplit(path).query) if not (reads and name == "cluster")]
    assert answer["field"] == parameter
    assert f"unknown query parameter '{parameter}'" in answer["error"]


@pytest.mark.parametrize(
    ("to_queue", "says"),
    [
        ("", "cannot be empty"),
        ("two words", "no white space"),
        ("spring:*", "not a glob"),
        ("tab\there", "no white space"),
        ("x" * 256, "at most 255"),
        ("inbound:helpdesk", "[[inbound]] routes' own"),
        ("acme->mx.example.net", "holds no '->'"),
    ],
)
def test_a_rebind_to_a_malformed_queue_name_is_refused(
    node: tuple[PigeonProcess, list[str]], to_queue: str, says: str
) -> None:
    answer = _refused(node, "POST", "/api/v1/admin/rebind", {"domain": "example.net", "to_queue": to_queue})
    assert answer["field"] == "$.to_queue"
    assert says in answer["error"]


@pytest.mark.parametrize(
    ("path", "raw", "field"),
    [
        ("/api/v1/admin/bounce", b"", "$"),
        ("/api/v1/admin/bounce", b"[]", "$"),
        ("/api/v1/admin/suspend", b"{not json", "$"),
        ("/api/v1/admin/retry", b"{}", "$"),  # no selector
        ("/api/v1/admin/rebind", b'{"domain": "example.net"}', "$"),  # nowhere to
        ("/api/v1/admin/suspend", b'{"domain": 5}', "$.domain"),
        ("/api/v1/admin/suspend", b'{"domain": "example.net", "id": "../../bounce"}', "$.id"),
    ],
)
def test_every_other_refusal_names_a_field_too(
    node: tuple[PigeonProcess, list[str]], path: str, raw: bytes, field: str
) -> None:
    pigeon, _ = node
    before = _state(pigeon)
    status, answer = pigeon.http_post(path, None, ADMIN, raw=raw)
    assert (status, answer.get("field")) == (400, field), answer
    assert answer["error"]
    assert _state(pigeon) == before


def test_a_refused_rebind_leaves_the_mail_where_it_was_and_a_good_one_moves_it(
    node: tuple[PigeonProcess, list[str]],
) -> None:
    pigeon, _ = node
    _refused(node, "POST", "/api/v1/admin/rebind", {"domain": "example.net", "to_queue": "parked *"})
    assert {m["queue"] for m in pigeon.spool_messages()} == {"example.net"}
    status, answer = pigeon.http_call(
        "POST", "/api/v1/admin/rebind", {"domain": "nothing.test", "to_queue": "spring:acme@example.net"}, ADMIN
    )
    assert (status, answer["rebound"]) == (200, 0), answer  # a well-formed name is taken


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/api/v1/queues?cluster=yes", "cluster"),
        ("/api/v1/admin/suspend?cluster=2", "cluster"),
        ("/api/v1/messages/not-an-id", "id"),
    ],
)
def test_a_bad_value_in_a_read_is_refused_naming_the_parameter(
    node: tuple[PigeonProcess, list[str]], path: str, field: str
) -> None:
    answer = _refused(node, "GET", path)
    assert answer["field"] == field


def test_what_a_rule_came_through_is_set_by_the_node_not_the_client(node: tuple[PigeonProcess, list[str]]) -> None:
    pigeon, _ = node
    body = {"domain": "none.test", "via": "cli"}  # a client that is not the pigeon command says it is
    status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", body, ADMIN)
    assert (status, answer["rule"]["via"], answer["rule"]["operator"]) == (200, "api", "ops"), answer
    assert pigeon.http_call("DELETE", f"/api/v1/admin/suspend/{answer['rule']['id']}", None, ADMIN)[0] == 200
    # A value the schema does not take ("cli", "api", null) is refused naming it, as any other
    # mistyped member is: found from outside, every write took `{}`, `[1, 2]` or "curl" (and a
    # write made valid only once it was replaced escaped a tenant-bound token's confinement).
    for path, body in (
        ("/api/v1/admin/suspend", {"domain": "none.test", "via": "curl"}),
        ("/api/v1/admin/hold", {"messages": ["0000000000000000"], "via": {}}),
        ("/api/v1/admin/bounce", {"domain": "none.test", "via": {"a": 1}}),
        ("/api/v1/admin/retry", {"domain": "none.test", "via": 1}),
        ("/api/v1/admin/suspend", {"domain": "none.test", "via": {"a": 1}}),
        ("/api/v1/admin/rebind", {"domain": "none.test", "to_queue": "x.test", "via": [1, 2]}),
    ):
        answer = _refused(node, "POST", path, body)
        assert answer == {
            "error": 'via is "cli", "api" or null: what the request came through, set by the node whatever it says'
            " (best left out)",
            "field": "$.via",
        }, (path, answer)
    # So is a mistyped `bound_to` (set where a write is issued, as `via` is): it was dropped, and
    # the body so made valid (found by the OpenAPI fuzzing: `"bound_to": "x"` answered 200).
    for bound_to in ("acme", 1, {"a": 1}, [1]):
        answer = _refused(node, "POST", "/api/v1/admin/retry", {"domain": "none.test", "bound_to": bound_to})
        assert answer["field"].startswith("$.bound_to"), (bound_to, answer)
    # ... and a refusal of an unknown member does not offer it as one the request takes.
    answer = _refused(node, "POST", "/api/v1/admin/suspend", {"domain": "none.test", "colour": "red"})
    assert answer["field"] == "$.colour"
    assert "suspend takes domain, tenant, campaign, queue, id, reason, duration, site" in answer["error"], answer


@pytest.mark.parametrize(
    ("path", "body", "field", "says"),
    [
        ("/api/v1/admin/suspend", {"site": "shop.example@mx.example"}, "$.site", "holds '@'"),
        ("/api/v1/admin/bounce", {"domain": "ann@example.net"}, "$.domain", "holds '@'"),
        ("/api/v1/admin/suspend", {"domain": "example .net"}, "$.domain", "white space"),
        ("/api/v1/admin/suspend", {"site": "MX.Dead.TEST:27025."}, "$.site", "is not a number"),
        ("/api/v1/admin/suspend", {"site": "127.0.0.9:99999"}, "$.site", "port 99999 is out of range: a port is 1 to"),
        ("/api/v1/admin/suspend", {"site": "127.0.0.9:0"}, "$.site", "port 0 is out of range"),
        ("/api/v1/admin/suspend", {"site": "[::1]:65536"}, "$.site", "port 65536 is out of range"),
        ("/api/v1/admin/suspend", {"site": "mx.example:025"}, "$.site", "leading zero: write 25"),
        ("/api/v1/admin/retry", {"queue": "c[12:t4@*"}, "$.queue", "'[' set that is not closed"),
        ("/api/v1/admin/suspend", {"queue": "zz\x1b]0;x\x07"}, "$.queue", "no control or format character"),
        ("/api/v1/admin/bounce", {"queue": "c:t@x\u200e.test"}, "$.queue", "no control or format character"),
        ("/api/v1/admin/bounce", {"tenant": "t[!]"}, "$.tenant", "'[' set that is not closed"),
        ("/api/v1/admin/suspend", {"campaign": "spring["}, "$.campaign", "'[' set that is not closed"),
        ("/api/v1/admin/suspend", {"domain": "a..b"}, "$.domain", "empty label"),
        # fnmatch reads a "[" left open as itself, which no domain or site holds: a rule for nothing.
        ("/api/v1/admin/bounce", {"domain": "[abc"}, "$.domain", "'[' set that is not closed"),
        ("/api/v1/admin/retry", {"domain": "exa[mple.net"}, "$.domain", "'[' set that is not closed"),
        ("/api/v1/admin/suspend", {"site": "mx[1.test"}, "$.site", "'[' set that is not closed"),
        ("/api/v1/admin/suspend", {"site": "mx1.test:25[0-9"}, "$.site", "'[' set that is not closed"),
        ("/api/v1/admin/suspend", {"site": "[::1"}, "$.site", "'[' set that is not closed"),
        ("/api/v1/admin/rebind", {"domain": "example.net", "routing_domain": "Ok2@Test"}, "$.routing_domain", "not a"),
        ("/api/v1/admin/rebind", {"domain": "example.net", "routing_domain": "*.relay"}, "$.routing_domain", "not a"),
        # What the pattern lets through but no domain holds (a policy's route is refused alike).
        (
            "/api/v1/admin/rebind",
            {"domain": "example.net", "routing_domain": "abcd." * 60 + "test"},
            "$.routing_domain",
            "253",
        ),
    ],
)
def test_a_selector_no_domain_or_site_can_match_is_refused(
    node: tuple[PigeonProcess, list[str]], path: str, body: dict[str, str], field: str, says: str
) -> None:
    answer = _refused(node, "POST", path, body)
    assert answer["field"] == field
    assert says in answer["error"]


@pytest.mark.parametrize(
    ("action", "body"),
    [("bounce", {"reason": "x"}), ("retry", {}), ("rebind", {"to_queue": "parked"}), ("suspend", {"reason": "x"})],
)
def test_a_request_naming_no_messages_is_told_of_site_only_when_it_is_a_suspension(
    node: tuple[PigeonProcess, list[str]], action: str, body: dict[str, Any]
) -> None:
    # `pigeon bounce` without a selector was told "(or site, to suspend)".
    answer = _refused(node, "POST", f"/api/v1/admin/{action}", body)
    assert answer["field"] == "$"
    assert answer["error"].startswith("name at least one of domain, tenant, campaign, queue")
    assert ("site" in answer["error"]) == (action == "suspend"), answer
    assert "suspend" not in answer["error"] or action == "suspend", answer


@pytest.mark.parametrize(("field", "value", "shown"), [("tenant", "a b", "' '"), ("campaign", "spring:*", "':'")])
@pytest.mark.parametrize("action", ["suspend", "bounce", "retry"])
def test_a_tenant_or_campaign_glob_no_queue_could_have_is_refused_naming_it(
    node: tuple[PigeonProcess, list[str]], action: str, field: str, value: str, shown: str
) -> None:
    """As at every door that takes a tenant (a routing header's white space, ':' and '@' become '_')."""
    answer = _refused(node, "POST", f"/api/v1/admin/{action}", {field: value})
    error = f"{field} {value!r} contains {shown}: no white space, ':' or '@' allowed (no queue name has it)"
    assert answer == {"error": error, "field": f"$.{field}"}


@pytest.mark.parametrize(("value", "quoted"), [("a\x1bb", r"'a\x1bb'"), ("a\\ b", r"'a\\ b'")])
def test_a_refusal_quoting_a_control_or_a_backslash_is_printed_escaped_once(
    node: tuple[PigeonProcess, list[str]], value: str, quoted: str
) -> None:
    # The node's text quotes the value as Python does ('a\x1bb'); the command escaped its
    # backslash again: `pigeon suspend --tenant $'a\x1bb'` printed "tenant 'a\\x1bb'".
    pigeon, _ = node
    command = ["suspend", "-c", str(pigeon.config_path), "--token", ADMIN]
    result = zygote.run([*command, "--tenant", value], text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"pigeon: 400: tenant {quoted} contains" in result.stderr, result.stderr
    assert "\x1b" not in result.stderr
