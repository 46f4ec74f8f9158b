"""Mail whose MX (or next hop) is the node itself: not handed back to it a hundred times
until `[smtp] max_hops` refuses it, but bounced at once, `554 5.4.6 ... loops back to myself`
(Postfix's check), and a next MX host that is not the node still used."""

from __future__ import annotations

import smtplib
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.dns import DnsServer, Zone
from tests.support.ports import free_port
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, wait_until


def _node(tmp_path: Path, dns: DnsServer, port: int, **sections: Any) -> PigeonProcess:
    """A node listening on 127.0.0.1:`port` whose MX hosts are on `port` too: an MX with the
    address 127.0.0.1 is the node itself."""
    delivery = {"enabled": True, "smtp_port": port, "retry_interval": "1s", "dsn": True, "tls": "disabled"}
    pigeon = PigeonProcess(
        tmp_path / "node",
        smtp={"listen": [f"127.0.0.1:{port}"]},
        delivery=delivery,
        dns={"nameservers": [dns.endpoint], "timeout": "1s"},
        **sections,
    )
    pigeon.smtp_port = port
    return pigeon


def _zone(more: dict[str, list[tuple[Any, ...]]] | None = None) -> Zone:
    # The sender's domain, whose MX (a sink on 127.0.0.5) takes the DSNs.
    return Zone({"example.org": [("MX", 10, "mx.example.org")], "mx.example.org": [("A", "127.0.0.5")], **(more or {})})


def _send(pigeon: PigeonProcess, recipient: str) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail("a@example.org", [recipient], b"Subject: loop\r\n\r\nhi\r\n")


def _bounced_as_a_loop(pigeon: PigeonProcess, sink: ScriptedSink, domain: str, looped: str) -> None:
    started = time.monotonic()
    (bounce,) = wait_until(lambda: pigeon.records("Bounce"), timeout=10)
    assert time.monotonic() - started < 10
    assert bounce["response"]["code"] == 554
    assert bounce["response"]["enhanced"] == "5.4.6"
    text = f"mail for {domain} loops back to myself ({looped} is this node)"
    assert text in bounce["response"]["text"], bounce
    assert bounce["said_by"] == "pigeon"
    (dsn,) = sink.wait_for(1)
    assert dsn.recipients == ["a@example.org"]
    assert b"5.4.6" in dsn.data
    time.sleep(0.5)  # (nothing more comes)
    # The one delivery is the DSN's, to the sender's MX: none "delivered" the message to the node itself.
    (delivery,) = wait_until(lambda: pigeon.records("Delivery"))
    assert (delivery["recipient"], delivery["sender"]) == ("a@example.org", "")
    assert len(pigeon.records("Reception")) == 2  # the message and its DSN: the node never took it again
    assert len(sink.received) == 1  # the DSN alone


LOOP_ZONE = {"loop.test": [("MX", 10, "mx.loop.test")], "mx.loop.test": [("A", "127.0.0.1")]}


@pytest.mark.parametrize(
    ("recipient", "zone", "looped_host"),
    [
        (
            "u@loop.test",
            {"loop.test": [("MX", 10, "mx.loop.test")], "mx.loop.test": [("A", "127.0.0.1")]},
            "mx.loop.test",
        ),
        # localhost is 127.0.0.1 and ::1 (RFC 6761): the node listens on the first; the host is passed over whole.
        ("u@localhost", {}, "localhost"),
    ],
    ids=["mx-is-this-node", "localhost"],
)
def test_mail_whose_only_host_is_this_node_bounces_at_once_as_a_loop(
    tmp_path: Path, recipient: str, zone: dict[str, list[tuple[Any, ...]]], looped_host: str
) -> None:
    port = free_port()
    with (
        DnsServer(_zone(zone)) as dns,
        ScriptedSink(host="127.0.0.5", port=port) as sink,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon, recipient)
        _bounced_as_a_loop(pigeon, sink, recipient.partition("@")[2], f"{looped_host} [127.0.0.1]:{port}")


def test_a_route_to_this_node_bounces_as_a_loop_and_is_warned_of(tmp_path: Path) -> None:
    port = free_port()
    route = [{"domain": "relay.test", "next_hop": f"127.0.0.1:{port}"}]
    with (
        DnsServer(_zone()) as dns,
        ScriptedSink(host="127.0.0.5", port=port) as sink,
        _node(tmp_path, dns, port, route=route) as pigeon,
    ):
        pigeon.wait_stderr(f"[[route]] for relay.test: next_hop 127.0.0.1:{port} is this node's own SMTP listener")
        _send(pigeon, "u@relay.test")
        _bounced_as_a_loop(pigeon, sink, "relay.test", f"[127.0.0.1]:{port}")


def _delivered_once(
    tmp_path: Path, zone: Zone, port: int, sink_host: str, recipient: str
) -> tuple[str, int, PigeonProcess]:
    """Mail to `recipient` from a node listening on `port`, with a sink on `sink_host` at that
    port too: the peer its Delivery names, what the sink received, and the node (stopped)."""
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host=sink_host, port=port) as sink,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon, recipient)
        (delivery,) = wait_until(lambda: pigeon.records("Delivery"), timeout=10)
        return delivery["peer"], len(sink.received), pigeon


@pytest.mark.parametrize(
    "other_preference",
    [20, 10],
    ids=["a-less-preferred-host", "an-equally-preferred-host"],
)
def test_mail_whose_most_preferred_mx_host_is_this_node_bounces_as_a_loop(
    tmp_path: Path, other_preference: int
) -> None:
    # RFC 5321 5.1: this node is an MX host of the domain, so only hosts more preferred than it
    # may take the mail. The other host (another node with the same MX view) would send it back
    # here: the two passed it to each other until max_hops refused it (554 5.4.6 Too many hops).
    port = free_port()
    zone = _zone(
        {
            "loop.test": [("MX", 10, "mx1.loop.test"), ("MX", other_preference, "mx2.loop.test")],
            "mx1.loop.test": [("A", "127.0.0.1")],  # this node
            "mx2.loop.test": [("A", "127.0.0.6")],
        }
    )
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.5", port=port) as sink,
        ScriptedSink(host="127.0.0.6", port=port) as backup,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon, "u@loop.test")
        _bounced_as_a_loop(pigeon, sink, "loop.test", f"mx1.loop.test [127.0.0.1]:{port}")
        assert backup.received == []


def test_only_hosts_more_preferred_than_this_node_take_the_mail(tmp_path: Path) -> None:
    # A more preferred host takes it; one less preferred than this node never does, even while
    # the more preferred one is down: the mail waits (deferred) rather than going round.
    port = free_port()
    zone = _zone(
        {
            "up.test": [("MX", 10, "mx0.up.test"), ("MX", 20, "self.up.test"), ("MX", 30, "mx9.up.test")],
            "down.test": [("MX", 10, "mx0.down.test"), ("MX", 20, "self.up.test"), ("MX", 30, "mx9.up.test")],
            "mx0.up.test": [("A", "127.0.0.6")],
            "mx0.down.test": [("A", "127.0.0.8")],  # nothing listens there
            "self.up.test": [("A", "127.0.0.1")],  # this node
            "mx9.up.test": [("A", "127.0.0.7")],
        }
    )
    with (
        DnsServer(zone) as dns,
        ScriptedSink(host="127.0.0.6", port=port) as preferred,
        ScriptedSink(host="127.0.0.7", port=port) as backup,
        _node(tmp_path, dns, port) as pigeon,
    ):
        _send(pigeon, "u@up.test")
        (delivery,) = wait_until(lambda: pigeon.records("Delivery"), timeout=10)
        assert delivery["peer"] == f"mx0.up.test [127.0.0.6]:{port}"
        _send(pigeon, "u@down.test")
        (deferred, *_) = wait_until(lambda: pigeon.records("TransientFailure"), timeout=10)
        assert deferred["recipient"] == "u@down.test"
        assert "127.0.0.8" in deferred["response"]["text"], deferred
        time.sleep(1.5)  # (a retry, at retry_interval 1s, goes nowhere else either)
        assert len(preferred.received) == 1
        assert backup.received == []
        assert not pigeon.records("Bounce")
        assert len(pigeon.records("Reception")) == 2


def test_another_node_on_the_same_port_at_another_loopback_address_is_no_loop(tmp_path: Path) -> None:
    # Only this node's exact address and port count: 127.0.0.7 on the same port is someone else.
    port = free_port()
    zone = _zone({"other.test": [("MX", 10, "mx.other.test")], "mx.other.test": [("A", "127.0.0.7")]})
    peer, received, _ = _delivered_once(tmp_path, zone, port, "127.0.0.7", "u@other.test")
    assert (peer, received) == (f"mx.other.test [127.0.0.7]:{port}", 1)
