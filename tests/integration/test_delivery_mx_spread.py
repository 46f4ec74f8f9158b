"""RFC 5321 5.1: MX hosts of equal preference take a domain's connections in a random order,
each new connection choosing again (not once per cached destination, which sent a site's
every connection to one host for as long as its destination was cached), and so do a host's
addresses (Postfix's `smtp_randomize_addresses`)."""

from __future__ import annotations

import math
import random
import smtplib
from pathlib import Path
from typing import Any

import pytest

from pigeon.delivery.mx import address_order
from pigeon.delivery.routes import Hop, connection_order
from tests.support.dns import DnsServer, Zone
from tests.support.ports import free_port
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, wait_until

_FRESH_CONNECTIONS = 20  # each to one of two hosts by chance: all to one, 2 in a million


@pytest.mark.parametrize(
    "records",
    [
        {
            "spread.test": [("MX", 10, "a.spread.test"), ("MX", 10, "b.spread.test"), ("MX", 20, "c.spread.test")],
            "a.spread.test": [("A", "127.0.0.6")],
            "b.spread.test": [("A", "127.0.0.7")],
            "c.spread.test": [("A", "127.0.0.8")],  # less preferred: never used while the others are up
        },
        {
            "spread.test": [("MX", 10, "mx.spread.test")],
            "mx.spread.test": [("A", "127.0.0.6"), ("A", "127.0.0.7")],
        },
    ],
    ids=["equally-preferred-mx-hosts", "addresses-of-one-mx-host"],
)
def test_each_new_connection_picks_among_equal_choices_at_random(
    tmp_path: Path, records: dict[str, list[tuple[Any, ...]]]
) -> None:
    port = free_port()
    with (
        DnsServer(Zone(records)) as dns,
        ScriptedSink(host="127.0.0.6", port=port) as first,
        ScriptedSink(host="127.0.0.7", port=port) as second,
        ScriptedSink(host="127.0.0.8", port=port) as third,
        PigeonProcess(
            tmp_path / "node",
            delivery={"enabled": True, "smtp_port": port, "tls": "disabled", "idle_timeout": "0.1s"},
            dns={"nameservers": [dns.endpoint], "timeout": "1s"},
        ) as pigeon,
    ):
        for sent in range(1, _FRESH_CONNECTIONS + 1):
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("a@example.org", ["u@spread.test"], b"Subject: spread\r\n\r\nhi\r\n")
            wait_until(lambda: len(first.received) + len(second.received) == sent, timeout=10)  # noqa: B023
            # Closed once idle (idle_timeout): the next message opens a new connection.
            connections = [*first.connections, *second.connections]
            wait_until(lambda: all(c.ended != math.inf for c in connections), timeout=10)  # noqa: B023
        # Each message had a connection of its own (the sinks' own probes say no EHLO), and they went to both.
        opened = [len([c for c in sink.connections if c.helo]) for sink in (first, second)]
        assert sum(opened) == _FRESH_CONNECTIONS
        assert first.received and second.received, (len(first.received), len(second.received))
        assert third.received == []


def test_equal_preferences_are_shuffled_for_each_connection_and_preference_order_kept() -> None:
    hops = (Hop("a", 25, 10), Hop("b", 25, 10), Hop("c", 25, 10), Hop("d", 25, 20), Hop("e", 25, 20))
    rng = random.Random(7)
    orders = {connection_order(hops, rng) for _ in range(200)}
    assert len(orders) == 6 * 2  # every order of the equals, each time chosen again
    for order in orders:
        assert [hop.preference for hop in order] == [10, 10, 10, 20, 20]
    single = (Hop("relay.example", 25),)
    assert connection_order(single, rng) is single


def test_addresses_are_shuffled_within_each_family_ipv4_first() -> None:
    addresses = ["192.0.2.1", "192.0.2.2", "192.0.2.3", "2001:db8::1", "2001:db8::2"]
    rng = random.Random(7)
    orders = {tuple(address_order(addresses, rng)) for _ in range(200)}
    assert len(orders) == 6 * 2
    for order in orders:
        assert sorted(order[:3]) == addresses[:3] and sorted(order[3:]) == addresses[3:]
