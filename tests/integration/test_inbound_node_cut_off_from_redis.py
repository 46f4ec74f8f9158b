"""A node cut off from Redis (its packets dropped, not refused: every call waits out its
timeout) while its webhook handoffs complete. Those accepted while its claims were surely its
own are acknowledged at the source at once, without waiting for their done marks: the node
that takes its claims over once its heartbeat runs out finds them gone, and hands nothing over
again. Those accepted after its heartbeat may have run out, which Redis cannot confirm, are said
(a WARNING) and recorded `repeated_by_takeover`: the other node may have handed them over too."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, redis_in_use_for_a_while, webhook_target
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, RedisServer
from tests.support.sinks import wait_until
from tests.support.tcp_proxy import TcpProxy

_COUNT = 8
_MAYBE = "may have reached the application twice"


def _node(tmp_path: Path, name: str, redis_url: str, app: WebhookApp, dovecot: Dovecot) -> PigeonProcess:
    target = webhook_target(app, headers={"X-Test-Node": name}, timeout="60s")
    box = imap_mailbox(dovecot, "hook", concurrency=4, batch=4, poll_interval="1s")
    # A 3 s timeout: two tries of a done mark (~6 s) outlast the heartbeat (5 s).
    return PigeonProcess(tmp_path / name, node={"name": name}, redis={"url": redis_url, "timeout": "3s"},
                         target=[target], mailbox=[box])  # fmt: skip


@contextlib.contextmanager
def _handoffs_in_flight_at_a_cut_off_node(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer, app: WebhookApp
) -> Iterator[tuple[PigeonProcess, TcpProxy]]:
    """Node mx-a (through a proxy to Redis) with 4 handoffs held in the application, and mx-b."""
    redis_in_use_for_a_while(redis_server)
    app.hold("mx-a")
    dovecot.append("app", [customer_mail(i) for i in range(_COUNT)])  # all found by mx-a's first search
    with (
        TcpProxy(redis_server.port) as proxy,
        _node(tmp_path, "mx-a", proxy.url, app, dovecot) as cut_off,
    ):
        wait_until(lambda: app.started == 4, 20)
        with _node(tmp_path, "mx-b", redis_server.url, app, dovecot):
            try:
                yield cut_off, proxy
            finally:
                app.release("mx-a")
                proxy.thaw()


def test_handoffs_accepted_while_the_claims_were_surely_ours_are_acknowledged_without_waiting_for_redis(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    with (
        WebhookApp() as app,
        _handoffs_in_flight_at_a_cut_off_node(tmp_path, dovecot, redis_server, app) as (cut_off, proxy),
    ):
        proxy.freeze()
        app.release("mx-a")  # accepted at once: mx-a's heartbeat has not run out
        time.sleep(10)  # mx-b takes mx-a's claims over 5 s after its last heartbeat
        proxy.thaw()
        assert app.wait_distinct(_COUNT, 30) == _COUNT
        wait_until(lambda: not dovecot.unseen("app"), 15)
        time.sleep(2)  # a repeat would have come by now
        records = cut_off.wait_records("InboundDelivery", 4, timeout=10)
        logged = cut_off.stderr()
    repeated = {key: n for key, n in app.accepted.items() if n > 1}
    assert not repeated, f"{len(repeated)} messages handed over twice"
    assert app.accepted_from("mx-a") == 4
    assert "could not mark handoffs done" in logged, logged
    assert not [r for r in records if r.get("repeated_by_takeover")], records
    assert _MAYBE not in logged


def test_handoffs_accepted_after_the_heartbeat_may_have_run_out_are_said_and_marked_when_redis_cannot_tell(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    with (
        WebhookApp() as app,
        _handoffs_in_flight_at_a_cut_off_node(tmp_path, dovecot, redis_server, app) as (cut_off, proxy),
    ):
        proxy.freeze()
        # mx-a's heartbeat runs out: mx-b takes its claims over and hands all 8 over.
        wait_until(lambda: app.accepted_from("mx-b") == _COUNT, 30)
        app.release("mx-a")  # mx-a's handoffs are accepted now, Redis still out of its reach
        records = cut_off.wait_records("InboundDelivery", 4, timeout=15)
        said = cut_off.wait_stderr(_MAYBE, 4, timeout=10)
        proxy.thaw()
    assert app.accepted_from("mx-a") == 4
    assert sorted(n for n in app.accepted.values()) == [1] * 4 + [2] * 4
    assert [r.get("repeated_by_takeover") for r in records] == [True] * 4, records
    lines = [line for line in said.splitlines() if _MAYBE in line]
    assert len(lines) == 4 and all("WARNING" in line and "cannot tell" in line for line in lines), lines
