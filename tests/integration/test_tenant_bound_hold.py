"""An operator's hold (`pigeon hold`) of a tenant's mail is out of reach of a token bound to that
tenant, as the operator's suspension is: `acme-admin`'s retry of the id released it, answered
`made_due`, and the mail went out. It is left held now (its row `held`, counted in `on_hold`),
the binding of whoever held it kept in the message's row (`hold_bound_to`), across a restart.

And a retry by id of mail held both by a hold and by a suspension answered `made_due` while the
suspension went on holding it: its row says `suspended` now, and the counts agree."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pigeon.listener.http import tenancy
from pigeon.message import ENVELOPE_DECODER, ENVELOPE_ENCODER, AfterAttempt, Envelope, Recipient
from pigeon.queue.settlement import held_envelope
from pigeon.queue.state import AdminMark
from tests.integration.test_admin_by_id import DeferringSink
from tests.integration.test_tenant_bound_admin import ACME, DUO, OPS, TOKENS
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

REASON = "abuse review: do not send"  # the operator's own words, for no tenant to read in a retry's answer


@pytest.fixture
def sink() -> Iterator[DeferringSink]:
    with ScriptedSink() as running:
        yield DeferringSink(running)


def _node(root: Path, sink: DeferringSink, workers: int = 1) -> PigeonProcess:
    # Deferred until the sink takes mail, and retried in an hour: only a release sends it sooner.
    config = delivery_config(sink.sink.endpoint, retry_interval="1h")
    return PigeonProcess(root, node={"workers": workers}, http={"token": TOKENS}, **config)


def _inject(node: PigeonProcess, count: int) -> list[str]:
    """`count` messages of acme, each deferred once: their spool ids."""
    ids = []
    for n in range(count):
        status, answer = node.http_post(
            "/api/v1/inject",
            {
                "envelope_sender": "app@example.org",
                "tenant": "acme",
                "template": False,
                "content": f"From: app@example.org\r\nSubject: acme {n}\r\n\r\nhello\r\n",
                "recipients": [{"email": f"user{n}@tb.test"}],
            },
            node.local_token,
        )
        assert (status, answer["accepted"]) == (200, 1), answer
        ids.append(answer["recipients"][0]["id"])
    wait_until(lambda: set(ids) <= {r["id"] for r in node.records("TransientFailure")}, 30)
    return ids


def _api(node: PigeonProcess, method: str, path: str, body: Any = None, token: str = ACME) -> tuple[int, Any]:
    return node.http_call(method, path, body, token)


def _hold(node: PigeonProcess, spool_id: str, token: str, reason: str = REASON) -> None:
    # (A token bound to several tenants names the one it acts on.)
    body = {"messages": [spool_id], "reason": reason, **({"tenant": "acme"} if token == DUO else {})}
    status, answer = _api(node, "POST", "/api/v1/admin/hold", body, token)
    assert (status, answer["messages"][0]["result"]) == (200, "held"), answer


def _delivered(node: PigeonProcess) -> set[str]:
    return {r["id"] for r in node.records("Delivery")}


def _seen(node: PigeonProcess, spool_id: str) -> Any:
    return _api(node, "GET", f"/api/v1/messages/{spool_id}", token=OPS)[1]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_token_bound_to_a_tenant_cannot_release_the_operators_hold_of_its_mail(
    tmp_path: Path, sink: DeferringSink, workers: int
) -> None:
    with _node(tmp_path / "node", sink, workers) as node:
        theirs, own, duos, bounced = _inject(node, 4)
        _hold(node, theirs, OPS)
        _hold(node, own, ACME, "mine")
        _hold(node, duos, DUO, "ours")  # (a token bound to acme and another tenant too)
        _hold(node, bounced, OPS)
        assert (_seen(node, theirs)["hold_operator"], _seen(node, theirs)["hold_bound_to"]) == ("ops", None)
        assert (_seen(node, own)["hold_operator"], _seen(node, own)["hold_bound_to"]) == ("acme-admin", ["acme"])
        assert _seen(node, duos)["hold_bound_to"] == ["acme", "beta"]
        sink.take()

        # Its retry releases its own hold alone: the operator's (and the wider binding's) hold.
        status, retried = _api(node, "POST", "/api/v1/admin/retry", {"messages": [theirs, own, duos]})
        assert status == 200, retried
        assert retried["messages"] == [
            {"id": theirs, "result": "held"},
            {"id": own, "result": "made_due"},
            {"id": duos, "result": "held"},
        ]
        assert (retried["made_due"], retried["on_hold"], retried["suspended"]) == (1, 2, 0), retried
        assert REASON not in json.dumps(retried) and "ops" not in json.dumps(retried)
        wait_until(lambda: own in _delivered(node), 30)
        # The same through the pigeon command, which says why it is left.
        said = node.cli("retry", "--id", theirs, "--token", ACME)
        assert "left held: held by someone this token cannot release" in said, said
        assert REASON not in said
        # A token bound to acme and beta cannot release the operator's either; its own it can.
        status, retried = _api(node, "POST", "/api/v1/admin/retry", {"messages": [theirs, duos], "tenant": "acme"}, DUO)
        assert status == 200, retried
        assert [row["result"] for row in retried["messages"]] == ["held", "made_due"], retried
        wait_until(lambda: duos in _delivered(node), 30)
        time.sleep(2)
        assert theirs not in _delivered(node)
        seen = _seen(node, theirs)
        assert (seen["state"], seen["held"], seen["hold_operator"]) == (
            "held",
            f"held by operator 'ops': {REASON}",
            "ops",
        )

        # Bouncing is not sending: the tenant may end its own mail the operator held (its sender
        # gets the DSN, nothing goes to the recipient).
        status, answer = _api(node, "POST", "/api/v1/admin/bounce", {"messages": [bounced], "reason": "withdrawn"})
        assert (status, answer["messages"][0]["result"]) == (200, "bounced"), answer
        assert bounced in {r["id"] for r in node.wait_records("AdminBounce")}

        # The operator releases its own hold.
        status, retried = _api(node, "POST", "/api/v1/admin/retry", {"messages": [theirs]}, OPS)
        assert (status, retried["messages"][0]["result"]) == (200, "made_due"), retried
        wait_until(lambda: theirs in _delivered(node), 30)
        assert bounced not in _delivered(node)


def test_who_held_a_message_is_kept_across_a_restart(tmp_path: Path, sink: DeferringSink) -> None:
    node = _node(tmp_path / "node", sink)
    with node:
        theirs, own = _inject(node, 2)
        _hold(node, theirs, OPS)
        _hold(node, own, ACME, "mine")
    sink.take()
    with node:
        status, retried = _api(node, "POST", "/api/v1/admin/retry", {"messages": [theirs, own]})
        assert status == 200, retried
        assert [row["result"] for row in retried["messages"]] == ["held", "made_due"], retried
        wait_until(lambda: own in _delivered(node), 30)
        time.sleep(2)
        assert theirs not in _delivered(node)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_retry_by_id_of_held_mail_a_suspension_holds_too_says_suspended(
    tmp_path: Path, sink: DeferringSink, workers: int
) -> None:
    with _node(tmp_path / "node", sink, workers) as node:
        (spool_id,) = _inject(node, 1)
        _hold(node, spool_id, OPS)
        status, held = _api(node, "POST", "/api/v1/admin/suspend", {"tenant": "acme", "reason": "ABUSE"}, OPS)
        assert status == 200, held
        sink.take()
        status, retried = _api(node, "POST", "/api/v1/admin/retry", {"messages": [spool_id]}, OPS)
        assert status == 200, retried
        assert retried["messages"] == [{"id": spool_id, "result": "suspended"}], retried
        assert (retried["made_due"], retried["suspended"]) == (0, 1), retried
        # Its hold is released (what was asked); the suspension holds it, as the row said.
        wait_until(lambda: _seen(node, spool_id)["state"] == "suspended", 30)
        assert (_seen(node, spool_id)["suspended_by"], _seen(node, spool_id)["held"]) == (held["rule"]["id"], None)
        assert spool_id not in _delivered(node)
        # Resumed, it goes.
        status, resumed = _api(node, "DELETE", f"/api/v1/admin/suspend/{held['rule']['id']}", token=OPS)
        assert (status, resumed["made_due"]) == (200, 1), resumed
        wait_until(lambda: spool_id in _delivered(node), 30)


def test_a_hold_stored_before_its_holders_binding_was_kept_is_the_operators() -> None:
    envelope = Envelope("a@example.org", [Recipient("b@example.net")], held="held by operator 'x'", hold_operator="x")
    older = ENVELOPE_DECODER.decode(ENVELOPE_ENCODER.encode(envelope))  # (no element for it: as stored before)
    assert older.hold_bound_to is None
    assert not tenancy.releases({"acme"}, older.hold_bound_to)
    assert tenancy.releases({"acme", "beta"}, ["acme"])
    assert not tenancy.releases({"acme"}, ["acme", "beta"])


def test_a_hold_asked_while_an_attempt_was_on_the_wire_keeps_its_holders_binding() -> None:
    envelope = Envelope("a@example.org", [Recipient("b@example.net")])
    pending = AfterAttempt("hold", "mine", "acme-admin", ["acme"])
    row = msgspec.structs.replace(envelope, after_attempt=pending)
    stored = ENVELOPE_DECODER.decode(ENVELOPE_ENCODER.encode(row))  # (as a stop or a crash leaves it)
    assert stored.after_attempt is not None
    held = held_envelope(stored, AdminMark.of(stored.after_attempt))
    assert (held.hold_operator, held.hold_bound_to) == ("acme-admin", ["acme"])
