"""A hold or a bounce by id of a message being sent, then a stop or a crash before that attempt
ends: after the start, the message is held (resp. bounced), as the operator was told, and not
delivered.

The sink stalls the message's first recipient at RCPT (before any content goes) for a minute;
the operator holds or bounces it by id, answered `after_attempt`; then the node gets SIGTERM
(its `shutdown_timeout` cuts the stalled connection, and the attempt is tried again "as if never
sent"), or a kill -9 (the whole node, or the worker that holds the message alone, which its
supervisor starts again). The sink takes everything from then on. Before the fix the mark
lived in the worker's memory alone, and the message went out at once after the start.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.test_admin_by_id import ADMIN, TOKENS, _one_outcome_each, _send
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

RECIPIENTS = ["slow@example.net", "ok@example.net", "ok2@example.net"]


def _node(root: Path, sink: ScriptedSink) -> PigeonProcess:
    config = delivery_config(sink.endpoint)
    node = {"workers": 2, "shutdown_timeout": "2s"}  # (the stop cuts the stalled connection at 2 s)
    return PigeonProcess(root, node=node, http={"token": TOKENS}, **config)


def _end(pigeon: PigeonProcess, how: str, spool_id: str) -> None:
    """Stop the node (`sigterm`), or kill -9 it (`kill`), and start it again; or kill -9 the
    worker holding the message (`worker`), which its supervisor starts again."""
    if how == "worker":
        shard = int(spool_id, 16) & 63
        killed = pigeon.shard_owner(shard)
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: pigeon.shard_owner(shard) != killed, timeout=30)
        return
    if how == "sigterm":
        assert pigeon.stop() == 0
    else:
        pigeon.kill()
    pigeon.start()


@pytest.mark.parametrize("how", ["sigterm", "kill", "worker"])
@pytest.mark.parametrize("operation", ["hold", "bounce"])
def test_a_message_held_or_bounced_while_being_sent_stays_so_through_a_stop_or_a_crash(
    tmp_path: Path, operation: str, how: str
) -> None:
    with ScriptedSink(slow=60.0) as sink:
        pigeon = _node(tmp_path / "node", sink)
        with pigeon:
            (sending,) = _send(pigeon, RECIPIENTS)
            wait_until(lambda: "slow@example.net" in sink.rcpt_log)  # on the wire, no content sent
            body = {"messages": [sending], "reason": "runaway"}
            status, answer = pigeon.http_call("POST", f"/api/v1/admin/{operation}", body, ADMIN)
            assert status == 200, answer
            assert answer["messages"] == [{"id": sending, "result": "after_attempt", "recipients": 3}]
            _end(pigeon, how, sending)
            sink.slow = 0.0  # the sink takes everything now
            if operation == "hold":
                (held,) = pigeon.wait_records("AdminHold", timeout=30)
                assert (held["id"], held["reason"], held["operator"]) == (sending, "runaway", "ops")
                assert sorted(held["recipients"]) == sorted(RECIPIENTS)
                time.sleep(3)  # (retried every second, were it not held)
                seen = pigeon.http_call("GET", f"/api/v1/messages/{sending}", None, ADMIN)[1]
                assert (seen["hold_operator"], seen["held"]) == ("ops", "held by operator 'ops': runaway")
            else:
                bounced = pigeon.wait_records("AdminBounce", 3, timeout=30)
                assert {(r["id"], r["reason"], r["operator"]) for r in bounced} == {(sending, "runaway", "ops")}
                assert sorted(r["recipient"] for r in bounced) == sorted(RECIPIENTS)
                time.sleep(1)
                assert pigeon.spool_messages() == []
            assert not pigeon.records("Delivery") and not sink.received, "delivered after the restart"
            if operation == "hold":
                # Held, not lost: its release delivers it, once.
                assert pigeon.cli("retry", "--id", sending)
                wait_until(lambda: len(pigeon.records("Delivery")) == 3, timeout=30)
                assert pigeon.spool_messages() == []
            _one_outcome_each(pigeon)
