"""Choosing a message's egress source: smooth weighted round-robin within its pool, the
default pool, the implicit source, and a pool nobody configured."""

from __future__ import annotations

import itertools
import logging

import pytest

from pigeon.delivery.egress import Egress, WeightedRoundRobin
from pigeon.delivery.routes import Destination, Hop, Kind, TlsPolicy
from pigeon.queue.attempt import Unroutable

SMTP = Destination("mx.example.net", (Hop("mx.example.net", 25),), TlsPolicy.OPPORTUNISTIC, False)
TARGET = Destination("inbound:app", (), TlsPolicy.DISABLED, False, Kind.TARGET, "app")


def test_weights_three_to_one_interleave_rather_than_bunch() -> None:
    chooser = WeightedRoundRobin([("ip-2", 3), ("ip-3", 1)])
    assert [chooser.next() for _ in range(8)] == ["ip-2", "ip-2", "ip-3", "ip-2"] * 2


@pytest.mark.parametrize(
    "weights",
    [[3, 1], [1, 1], [5, 3, 2], [1, 1, 1, 7], [10, 1], [2, 3, 5, 7, 11]],
)
def test_every_prefix_is_within_one_message_of_the_weights(weights: list[int]) -> None:
    """The proportions hold over any count, however small: no member is ever a whole message
    ahead of or behind its share (a random draw of 40 messages at 3:1 is off by 3 or more
    about a third of the time)."""
    names = [f"s{i}" for i in range(len(weights))]
    chooser = WeightedRoundRobin(list(zip(names, weights, strict=True)))
    total = sum(weights)
    counts = dict.fromkeys(names, 0)
    for n in range(1, 50 * total + 1):
        counts[chooser.next()] += 1
        for name, weight in zip(names, weights, strict=True):
            assert abs(counts[name] - n * weight / total) < 1, (n, counts)
        if n % total == 0:
            assert list(counts.values()) == [weight * n // total for weight in weights]


@pytest.mark.parametrize("members", [[], [("a", 0)], [("a", 2), ("b", -1)]])
def test_a_round_robin_needs_members_with_positive_weights(members: list[tuple[str, int]]) -> None:
    with pytest.raises(ValueError, match="weight of at least 1"):
        WeightedRoundRobin(members)


def test_the_message_pool_is_used_else_the_default_pool() -> None:
    egress = Egress({"bulk": [("ip-2", 3), ("ip-3", 1)], "vip": [("ip-9", 1)]}, default_pool="bulk")
    assert [egress.choose(None, SMTP) for _ in range(4)] == ["ip-2", "ip-2", "ip-3", "ip-2"]
    assert egress.choose("vip", SMTP) == "ip-9"


def test_without_any_pool_mail_takes_the_implicit_source() -> None:
    egress = Egress({"bulk": [("ip-2", 1)]})
    assert egress.choose(None, SMTP) is None


def test_mail_for_an_application_target_takes_the_implicit_source() -> None:
    egress = Egress({"bulk": [("ip-2", 1)]}, default_pool="bulk")
    assert egress.choose("bulk", TARGET) is None


def test_an_unknown_pool_is_a_transient_failure_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    egress = Egress({"bulk": [("ip-2", 1)]})
    caplog.set_level(logging.WARNING, "pigeon.delivery.egress")
    for _ in itertools.repeat(None, 3):
        with pytest.raises(Unroutable) as caught:
            egress.choose("blk", SMTP)
        reply = caught.value.reply
        assert (reply.code, reply.enhanced, reply.text) == (
            451,
            "4.3.5",
            "egress pool 'blk' is not configured ([[pool]])",
        )
    assert [r.getMessage() for r in caplog.records] == [
        "mail names the egress pool 'blk', which is not configured: it waits in the spool"
    ]
