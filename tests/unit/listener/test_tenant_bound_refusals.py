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


INSTEAD = (
    "move it to a queue of its tenant, written with it ('campaign:acme@domain' or 'acme@domain'): a [[queue]] "
    "block written for another tenant's queues, or for names without a tenant, could govern mail in any other "
    "(its pool, its rate)"
)


def test_a_rebind_to_a_queue_of_no_tenant_says_which_queues_it_may_move_mail_to() -> None:
    # It used to end "or to one named without a tenant part": `x:@example.net` is one such.
    body = refusal({"tenant": "acme", "to_queue": "x:@example.net"}, "rebind", ["acme"])
    assert body["field"] == "$.to_queue"
    assert body["error"] == (
        f"token 'acme-admin' is bound to tenant acme: to_queue 'x:@example.net' would make the mail no tenant's; "
        f"{INSTEAD}"
    )


@pytest.mark.parametrize(
    ("to_queue", "why"),
    [
        # `[[queue]] name = "*:globex@*"` matches these, though no part reading sees globex in them.
        ("a:b:globex@pool.test", "more than one ':' before its '@'"),
        (":globex@dest.test", "nothing before its ':'"),
        ("globex@x@dest.test", "more than one '@'"),
        ("@dest.test", "no tenant before its '@'"),
        # Named outright: `[[queue]] name = "vip"` (another tenant's pool, no rate) governs it.
        ("vip", "no '@domain' in it: a queue named outright, or a domain's, which names no tenant"),
        ("globex", "no '@domain' in it: a queue named outright, or a domain's, which names no tenant"),
        ("example.net", "no '@domain' in it: a queue named outright, or a domain's, which names no tenant"),
    ],
)
def test_a_rebind_to_a_name_of_no_tenants_queue_is_refused_saying_why(to_queue: str, why: str) -> None:
    body = refusal({"tenant": "acme", "to_queue": to_queue}, "rebind", ["acme"])
    assert body == {
        "error": f"token 'acme-admin' is bound to tenant acme: to_queue {to_queue!r} is no name of the form "
        f"[campaign:]tenant@domain ({why}); {INSTEAD}",
        "field": "$.to_queue",
    }


def test_a_rebind_to_a_queue_of_its_tenant_whose_domain_is_none_is_malformed() -> None:
    for to_queue in ("acme@x_y", "c:acme@a..b", "acme@[1.2.3]", "acme@x:globex"):
        with pytest.raises(web.HTTPBadRequest) as caught:
            confine_selector({"tenant": "acme", "to_queue": to_queue}, "rebind", "acme-admin", ["acme"])
        body = json.loads(caught.value.text or "")
        assert body["field"] == "$.to_queue", body
        assert body["error"].startswith(f"to_queue {to_queue!r}: its domain part "), body


def test_a_selector_without_a_tenant_from_a_token_of_several_says_to_name_one() -> None:
    body = refusal({"domain": "zz.test"}, "suspend", ["acme", "beta"])
    assert body == {
        "error": "token 'acme-admin' is bound to tenants acme, beta: name one of them in tenant ('acme', 'beta'): "
        "a write acts on the mail of one tenant at a time",
        "field": "$.tenant",
    }


def test_a_rebind_within_its_tenants_queues_is_allowed() -> None:
    # The names its tenants' own mail is in: whatever [[queue]] block governs them governs that.
    for to_queue in ("news:acme@example.net", "acme@example.net", "acme@Bücher.example.", "c:beta@[IPv6:0::1]"):
        request = {"tenant": "acme", "to_queue": to_queue}
        confine_selector(request, "rebind", "acme-admin", ["acme", "beta"])


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
