"""What a token bound to tenants is told when an admin write would reach beyond them: the 403's
`error` says what it may send instead, in words that fit the request it sent."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from aiohttp import web

from pigeon.listener.http.tenancy import confine_selector, reaches
from pigeon.queue.rules import Rule, Selector, decode_rule


def refusal(request: dict[str, Any], action: str, tenants: list[str]) -> dict[str, str]:
    with pytest.raises(web.HTTPForbidden) as caught:
        confine_selector(request, action, "acme-admin", tenants)
    body: dict[str, str] = json.loads(caught.value.text or "")
    return body


def test_a_rebind_to_a_queue_of_no_tenant_says_which_queues_it_may_move_mail_to() -> None:
    # It used to end "or to one named without a tenant part": `x:@example.net` is one such.
    body = refusal({"tenant": "acme", "to_queue": "x:@example.net"}, "rebind", ["acme"])
    assert body["field"] == "$.to_queue"
    assert body["error"] == (
        "token 'acme-admin' is bound to tenant acme: to_queue 'x:@example.net' would make the mail no tenant's; "
        "move it to a queue of its tenant, written with it ('campaign:acme@domain' or 'acme@domain'), or to a "
        "queue whose name has no tenant part at all, not of the form [campaign:]tenant@domain ('example.net', "
        "'bulk'), where the mail keeps its tenant"
    )


def test_a_selector_without_a_tenant_from_a_token_of_several_says_to_name_one() -> None:
    body = refusal({"domain": "zz.test"}, "suspend", ["acme", "beta"])
    assert body == {
        "error": "token 'acme-admin' is bound to tenants acme, beta: name one of them in tenant ('acme', 'beta'): "
        "a write acts on the mail of one tenant at a time",
        "field": "$.tenant",
    }


def test_a_rebind_within_its_tenant_or_to_a_queue_named_outright_is_allowed() -> None:
    for to_queue in ("news:acme@example.net", "acme@example.net", "example.net", "bulk"):
        request = {"tenant": "acme", "to_queue": to_queue}
        confine_selector(request, "rebind", "acme-admin", ["acme"])


def test_a_rule_stored_before_bindings_were_kept_is_the_operators_out_of_a_bound_tokens_reach() -> None:
    # As an earlier Pigeon stored it (spool, Redis): no `bound_to`. It loads, as the operator's.
    stored = {"id": "d28dd3ce3c52", "kind": "suspend", "selector": {"tenant": "acme"}, "created": 1.0}
    for blob, decoded in (
        (msgspec.msgpack.encode(stored), decode_rule),
        (msgspec.json.encode(stored), msgspec.json.Decoder(Rule).decode),
    ):
        rule = decoded(blob)
        assert rule.bound_to is None
        assert not reaches(["acme"], rule)
        assert not reaches(["acme"], msgspec.to_builtins(rule))
    made = Rule("x", "suspend", Selector(tenant="acme"), 1.0, bound_to=["acme"])
    assert reaches(["acme"], made) and reaches(["acme", "beta"], made)
    assert not reaches(["beta"], made)
    assert not reaches(["acme"], msgspec.structs.replace(made, bound_to=["acme", "beta"]))
