"""`[[queue]] max_message_rate`: a tenant's or campaign's mail leaves at its queue's rate, whatever
its destination, while other queues' mail to the same site goes at full speed; the rate holds
for the node, whichever of its workers holds the mail (their shared throttle table)."""

from __future__ import annotations

import os
import signal
import smtplib
import time
from pathlib import Path

from pigeon.message import parse_id, shard_of
from tests.support.process import PigeonProcess, to_toml
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

RATE = 5  # a second: "5/s", burst 1
SLOW_QUEUE = {"name": "slow:acme@*", "max_message_rate": f"{RATE}/s"}


def _message(campaign: str, n: int) -> bytes:
    return (
        f"Message-ID: <{campaign}.{n}@pigeon.test>\r\nX-Tenant: acme\r\nX-Campaign: {campaign}\r\n"
        f"Subject: {campaign} {n}\r\n\r\nhi\r\n"
    ).encode()


def _send(pigeon: PigeonProcess, campaign: str, numbers: range) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
        for n in numbers:
            client.sendmail("a@src.test", [f"user{n}@dst.test"], _message(campaign, n))


def _arrivals(sink: ScriptedSink, campaign: str) -> list[float]:
    return sorted(
        arrival.at
        for received, arrival in zip(sink.received, sink.arrivals, strict=True)
        if received.email["Subject"].startswith(campaign + " ")
    )


def _busiest_second(times: list[float]) -> int:
    """The most arrivals within one second."""
    return max(sum(1 for t in times if start <= t < start + 1.0) for start in times)


def test_a_campaign_with_a_queue_rate_leaves_at_that_rate_while_another_to_the_same_site_goes_at_full_speed(
    tmp_path: Path,
) -> None:
    count = 15
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint)
        with PigeonProcess(tmp_path / "node", queue=[SLOW_QUEUE], **config) as pigeon:
            _send(pigeon, "slow", range(count))
            _send(pigeon, "fast", range(count))
            sink.wait_for(2 * count, timeout=30)
            deliveries = pigeon.wait_records("Delivery", 2 * count)
    slow, fast = _arrivals(sink, "slow"), _arrivals(sink, "fast")
    assert len(slow) == len(fast) == count
    # 5/s with a burst of 1: 15 messages need (15 - 1) / 5 = 2.8 s at least; a second holds
    # at most 5 of them, 2 more allowed for a connection that took two slots' mail together.
    assert slow[-1] - slow[0] >= 2.4, slow
    assert _busiest_second(slow) <= RATE + 2, slow
    # The other campaign, to the same site, sent after it, is not held behind it.
    assert fast[-1] - fast[0] < 1.5, fast
    assert fast[-1] < slow[-1]
    assert {r["queue"] for r in deliveries} == {"slow:acme@dst.test", "fast:acme@dst.test"}


def _send_through(pigeon: PigeonProcess, worker: int, numbers: range) -> None:
    """Mail sent to the node while only `worker` takes connections (the workers share the
    listening socket: the other is stopped, SIGSTOP, for the while). A worker stopped while it
    holds the node's shared table (a flock, for a moment) holds up the other until it goes on:
    then the connection times out before its greeting, and the rest goes again after a while."""
    other = pigeon.shard_owner(1 - worker)
    left = list(numbers)
    for _ in range(5):
        os.kill(other, signal.SIGSTOP)
        try:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=3) as client:
                while left:
                    client.sendmail("a@src.test", [f"user{left[0]}@dst.test"], _message("slow", left[0]))
                    left.pop(0)
            return
        except (smtplib.SMTPServerDisconnected, OSError):
            pass
        finally:
            os.kill(other, signal.SIGCONT)
        time.sleep(0.5)
    raise AssertionError(f"{len(left)} messages could not be sent through worker {worker}")


def test_a_queue_rate_holds_for_the_node_whichever_of_its_two_workers_holds_the_mail(tmp_path: Path) -> None:
    each = 12
    count = 2 * each
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint)
        with PigeonProcess(tmp_path / "node", node={"workers": 2}, queue=[SLOW_QUEUE], **config) as pigeon:
            _send_through(pigeon, 0, range(each))
            _send_through(pigeon, 1, range(each, count))
            sink.wait_for(count, timeout=40)
            deliveries = pigeon.wait_records("Delivery", count)
    assert {shard_of(parse_id(r["id"])) for r in deliveries} == {0, 1}, "both workers held some of the mail"
    slow = _arrivals(sink, "slow")
    assert len(slow) == count
    # 24 messages at 5/s for the node: 4.6 s at least (each worker at 5/s of its own: about half).
    assert slow[-1] - slow[0] >= 3.8, slow
    assert _busiest_second(slow) <= RATE + 2, slow


def test_sighup_applies_a_changed_queue_rate_to_mail_already_waiting(tmp_path: Path) -> None:
    count = 12
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint)
        queue = [{"name": "slow:*", "max_message_rate": "1/s"}]
        with PigeonProcess(tmp_path / "node", queue=queue, **config) as pigeon:
            _send(pigeon, "slow", range(count))
            sink.wait_for(2, timeout=10)
            assert len(sink.received) < 6  # one a second
            pigeon.config["queue"][0]["max_message_rate"] = "100/s"
            pigeon.config_path.write_text(to_toml(pigeon.config))
            before = pigeon.stderr().count("reloaded:")
            assert pigeon.process is not None
            pigeon.process.send_signal(signal.SIGHUP)
            wait_until(lambda: pigeon.stderr().count("reloaded:") > before, timeout=10)
            sink.wait_for(count, timeout=5)  # at the old rate, the 8 or so left would take 8 s
        assert "takes effect at the next restart" not in pigeon.stderr()


POOLING_POLICY = """
from pigeon.policy import Changes

def on_message(message):
    # One queue per tenant, whatever the campaign and the recipients' domain: its [[queue]] rate
    # is then the tenant's. (A name without '@': selectors still match the mail by its own
    # tenant, campaign and domain.)
    if message.tenant:
        return Changes(queue=f"{message.tenant}-paced")
    return None
"""


def test_a_policy_that_puts_a_tenants_mail_in_one_queue_paces_the_tenant_whatever_its_campaigns_and_domains(
    tmp_path: Path,
) -> None:
    # `name = "*:acme@*"` gives each campaign and domain of acme a rate of its own: acme would
    # multiply its rate by varying X-Campaign. One queue for the tenant is one rate for it.
    module = tmp_path / "policy.py"
    module.write_text(POOLING_POLICY)
    paced = {"name": "acme-paced", "max_message_rate": f"{RATE}/s"}
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint)
        with PigeonProcess(tmp_path / "node", queue=[paced], policy={"module": str(module)}, **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                for n in range(15):
                    campaign, domain = f"c{n % 5}", ("dst.test", "dst2.test")[n % 2]
                    client.sendmail("a@src.test", [f"user{n}@{domain}"], _message(campaign, n))
            sink.wait_for(15, timeout=30)
            deliveries = pigeon.wait_records("Delivery", 15)
    times = sorted(arrival.at for arrival in sink.arrivals if arrival.at)
    # Five campaigns to two domains, ten queues with a glob's rate each: one rate here.
    assert times[-1] - times[0] >= 2.4, times
    assert _busiest_second(times) <= RATE + 2, times
    assert {r["queue"] for r in deliveries} == {"acme-paced"}
