"""A rebind of a message being sent, then a stop or a crash before that attempt ends: after the
start, the message goes to the route and queue the operator asked, once, with its `Rebind`
record; never to the old route.

Two sinks: the old route's (every domain) stalls the message's first recipient at RCPT (before
any content goes) for a minute; `relay.test`'s is the new route. The operator rebinds the mail
(`POST /api/v1/admin/rebind`, `to_queue` and `routing_domain`), answered `after_attempt` 1; then
the node gets SIGTERM (its `shutdown_timeout` cuts the stalled connection, and the attempt is
tried again "as if never sent"), or a kill -9 (the whole node, or the worker that holds the
message alone, which its supervisor starts again). The old sink takes everything from then on
(its stalled RCPT sleeps on).
Before the fix the rebind lived in the worker's memory alone: the restarted node loaded the
message in its old queue and delivered it to the old sink.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.test_admin_by_id import ADMIN, TOKENS, _one_outcome_each, _send
from tests.integration.test_admin_mark_through_a_stop import _end
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

RECIPIENTS = ["slow@example.net", "ok@example.net", "ok2@example.net"]


def _node(root: Path, old: ScriptedSink, new: ScriptedSink) -> PigeonProcess:
    config = delivery_config(old.endpoint)
    config["route"] = [{"domain": "relay.test", "next_hop": new.endpoint, "tls": "disabled"}, *config["route"]]
    node = {"workers": 2, "shutdown_timeout": "2s"}  # (the stop cuts the stalled connection at 2 s)
    return PigeonProcess(root, node=node, http={"token": TOKENS}, **config)


@pytest.mark.parametrize("how", ["sigterm", "kill", "worker"])
def test_a_message_rebound_while_being_sent_goes_to_its_new_route_after_a_stop_or_a_crash(
    tmp_path: Path, how: str
) -> None:
    with ScriptedSink(slow=60.0) as old, ScriptedSink() as new:
        pigeon = _node(tmp_path / "node", old, new)
        with pigeon:
            (sending,) = _send(pigeon, RECIPIENTS)
            wait_until(lambda: "slow@example.net" in old.rcpt_log)  # on the wire, no content sent
            body = {"domain": "example.net", "to_queue": "parked", "routing_domain": "relay.test"}
            status, answer = pigeon.http_call("POST", "/api/v1/admin/rebind", body, ADMIN)
            assert status == 200, answer
            assert (answer["rebound"], answer["after_attempt"]) == (1, 1), answer
            # The old route takes everything from now on (the stalled RCPT sleeps on): mail that
            # went there after the start would show, not wait a minute.
            old.slow = 0.0
            _end(pigeon, how, sending)
            delivered = pigeon.wait_records("Delivery", 3, timeout=30)
            assert not old.received, "delivered at the old route after the restart"
            assert sorted(r["recipient"] for r in delivered) == sorted(RECIPIENTS)
            assert {(r["id"], r["queue"]) for r in delivered} == {(sending, "parked")}
            assert [sorted(m.recipients) for m in new.received] == [sorted(RECIPIENTS)], "not once at the new route"
            (moved,) = pigeon.records("Rebind")
            assert (moved["id"], moved["queue"], moved["from_queue"]) == (sending, "parked", "example.net")
            assert (moved["route"], moved["operator"]) == ("relay.test", "ops")
            assert sorted(moved["recipients"]) == sorted(RECIPIENTS)
            time.sleep(1)  # (nothing more goes anywhere)
            assert len(new.received) == 1 and not old.received
            assert pigeon.spool_messages() == []
            _one_outcome_each(pigeon)
