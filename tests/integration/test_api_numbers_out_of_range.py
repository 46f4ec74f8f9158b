"""A JSON number too large to hold (an integer of more than 4300 digits, `1e400`) is valid JSON:
every door that decodes a request's body refuses it with a 400 naming the member that holds it
and saying so, as any other malformed request, through the real HTTP API of a running node.

Found from outside: in `substitutions` (which hold any JSON) the injection APIs answered 500
"internal error" and logged a RecursionError of ~975 frames (the refusal of msgspec's
"Number out of range", a DecodeError too, decoded the body again and refused that, and again);
an admin write of `"duration": 1e400` was re-encoded as `Infinity` before it was checked,
and refused as "malformed JSON: ... invalid character (byte 33)" naming `$`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

INJECT = "numbers-inject-0123456789"
ADMIN = "numbers-admin-0123456789"
BOUND = "numbers-bound-0123456789"
TOKENS = [
    {"name": "app", "token": INJECT, "scopes": ["inject"]},
    {"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]},
    {"name": "shop", "token": BOUND, "scopes": ["admin", "read"], "tenants": ["shop"]},
]
HUGE_INTEGER = "9" * 4301  # one digit past what Python (and so msgspec) makes an int of
NUMBERS = [HUGE_INTEGER, "-" + HUGE_INTEGER, "1e400", "-1e400"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """Two workers: an admin write comes through the supervisor, as it does in production.
    (Delivery on: a node that does not deliver refuses every admin write, 503, before its body.)"""
    root = tmp_path_factory.mktemp("numbers") / "node"
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint)
        with PigeonProcess(root, node={"workers": 2}, http={"token": TOKENS}, **config) as running:
            yield running


def _inject_body(number: str, *, where: str) -> bytes:
    """An injection whose `where` holds `number` (as it is written: no encoder would write it)."""
    recipient = '{"email": "a@x.test"' + (f', "substitutions": {{"x": {number}}}' if where == "recipient" else "")
    if where == "metadata":
        recipient += f', "metadata": {{"u": "v", "w": {number}}}'
    if where == "nested":
        recipient += f', "substitutions": {{"ok": 1, "x": {{"y": [1, {number}]}}}}'
    top = f', "substitutions": {{"s p": {number}}}' if where == "top" else ""
    return (
        f'{{"envelope_sender": "news@example.org", "recipients": [{recipient}}}]{top},'
        ' "content": "From: a@example.org\\r\\n\\r\\nx{{x}}"}'
    ).encode()


def _assert_no_traceback(node: PigeonProcess) -> None:
    stderr = node.stderr()
    assert "RecursionError" not in stderr and "Traceback" not in stderr, stderr[-3000:]


_PLACES = [
    ("recipient", "$.recipients[0].substitutions.x"),
    ("top", '$.substitutions["s p"]'),
    ("metadata", "$.recipients[0].metadata.w"),
    ("nested", "$.recipients[0].substitutions.x.y[1]"),
]
_DOORS = [
    (path, where, field)
    for path in ("/api/v1/inject", "/api/inject/v1")
    for where, field in _PLACES
    if not (path == "/api/inject/v1" and where == "metadata")  # (KumoMTA's request has no metadata)
]


@pytest.mark.parametrize("number", NUMBERS)
@pytest.mark.parametrize(("path", "where", "field"), _DOORS)
def test_a_number_out_of_range_in_an_injection_is_refused_naming_its_member(
    node: PigeonProcess, path: str, where: str, field: str, number: str
) -> None:
    status, answer = node.http_post(path, None, INJECT, raw=_inject_body(number, where=where))
    assert (status, answer["field"]) == (400, field), answer
    assert "number out of range" in answer["error"], answer
    assert "send it as a string" in answer["error"], answer
    _assert_no_traceback(node)


@pytest.mark.parametrize("path", ["/api/v1/inject", "/api/inject/v1"])
def test_a_body_cut_off_after_a_number_out_of_range_is_refused_for_the_number(node: PigeonProcess, path: str) -> None:
    """msgspec stops at the number, the rest unread: what it names is said (the map it is in)."""
    cut = _inject_body("1e400", where="recipient").partition(b"1e400")[0] + b"1e400"
    status, answer = node.http_post(path, None, INJECT, raw=cut)
    assert (status, answer["field"]) == (400, "$.recipients[0].substitutions"), answer
    assert "number out of range" in answer["error"], answer
    _assert_no_traceback(node)


def test_a_refused_injection_of_a_number_out_of_range_is_logged_naming_its_envelope(node: PigeonProcess) -> None:
    status, answer = node.http_post("/api/v1/inject", None, INJECT, raw=_inject_body("1e400", where="recipient"))
    assert status == 400, answer
    text = f"{answer['error']} ({answer['field']})"

    def found() -> list[dict[str, Any]]:
        return [r for r in node.records("Rejection") if r["response"]["text"] == text]

    record = wait_until(found)[-1]
    assert (record["sender"], record["recipients"]) == ("news@example.org", ["a@x.test"])


@pytest.mark.parametrize("token", [ADMIN, BOUND])
@pytest.mark.parametrize("action", ["bounce", "suspend"])
@pytest.mark.parametrize("number", NUMBERS)
def test_an_admin_duration_out_of_range_gets_the_duration_refusal(
    node: PigeonProcess, action: str, number: str, token: str
) -> None:
    raw = f'{{"domain": "x.test", "duration": {number}}}'.encode()
    status, answer = node.http_post(f"/api/v1/admin/{action}", None, token, raw=raw)
    assert (status, answer["field"]) == (400, "$.duration"), answer
    assert "more than 0 and at most 365 days" in answer["error"], answer
    _assert_no_traceback(node)


@pytest.mark.parametrize("number", ["1e400", HUGE_INTEGER])
def test_an_admin_member_holding_a_number_out_of_range_is_refused_naming_it(node: PigeonProcess, number: str) -> None:
    for path, body, field in [
        ("/api/v1/admin/bounce", f'{{"domain": "x.test", "reason": {number}}}', "$.reason"),
        ("/api/v1/admin/retry", f'{{"domain": {number}}}', "$.domain"),
        ("/api/v1/admin/hold", f'{{"messages": ["a", {number}]}}', "$.messages[1]"),
    ]:
        status, answer = node.http_post(path, None, ADMIN, raw=body.encode())
        assert (status, answer["field"]) == (400, field), (path, answer)
        assert "number out of range" in answer["error"], (path, answer)
    # Nothing was made of any of them.
    rules = [node.http_call("GET", f"/api/v1/admin/{kind}", None, ADMIN)[1] for kind in ("bounce", "suspend")]
    assert json.dumps(rules).count('"id"') == 0, rules
    _assert_no_traceback(node)
