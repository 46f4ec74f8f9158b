"""Retry timing: exponential backoff from retry_interval, capped, jittered, never past expiry."""

from __future__ import annotations

import random

import pytest

from pigeon.queue.retry import RetryPolicy

EXACT = RetryPolicy(retry_interval=300.0, max_retry_interval=3600.0, max_age=86400.0, jitter=0.0)


def test_the_first_retry_waits_retry_interval() -> None:
    assert EXACT.delay(1) == 300.0


@pytest.mark.parametrize(
    ("attempts", "delay"),
    [(1, 300.0), (2, 600.0), (3, 1200.0), (4, 2400.0), (5, 3600.0), (6, 3600.0), (50, 3600.0), (10_000, 3600.0)],
)
def test_the_delay_doubles_and_stops_at_max_retry_interval(attempts: int, delay: float) -> None:
    assert EXACT.delay(attempts) == delay


def test_the_delay_never_decreases_as_attempts_grow() -> None:
    delays = [EXACT.delay(n) for n in range(1, 40)]
    assert delays == sorted(delays)
    assert max(delays) == EXACT.max_retry_interval


def test_zero_attempts_is_treated_as_the_first() -> None:
    assert EXACT.delay(0) == EXACT.delay(1) == 300.0


def test_the_default_policy_backs_off_from_five_minutes_to_four_hours() -> None:
    policy = RetryPolicy(jitter=0.0)
    assert policy.delay(1) == 300.0
    assert policy.delay(20) == 4 * 3600.0


@pytest.mark.parametrize("attempts", [1, 2, 3, 8])
def test_jitter_stays_within_plus_or_minus_the_fraction(attempts: int) -> None:
    policy = RetryPolicy(retry_interval=300.0, max_retry_interval=3600.0, jitter=0.2)
    base = EXACT.delay(attempts)
    rng = random.Random(1234)
    delays = [policy.delay(attempts, rng) for _ in range(2000)]
    assert all(base * 0.8 <= d <= base * 1.2 for d in delays)
    # ...and actually spreads: both sides of the base, close to both ends.
    assert min(delays) < base * 0.82
    assert max(delays) > base * 1.18


def test_jitter_is_reproducible_with_a_seeded_rng() -> None:
    policy = RetryPolicy(jitter=0.1)
    first = [policy.delay(3, random.Random(42)) for _ in range(3)]
    assert len(set(first)) == 1
    assert first[0] != EXACT.delay(3)


def test_next_due_is_now_plus_the_delay_while_the_message_is_young() -> None:
    assert EXACT.next_due(created=1000.0, attempts=2, now=5000.0) == 5600.0


def test_next_due_never_goes_past_the_expiry() -> None:
    created = 1000.0
    expires = created + EXACT.max_age
    now = expires - 100.0  # the next retry (3600 s) would fall after expiry
    assert EXACT.expires(created) == expires
    assert EXACT.next_due(created, attempts=9, now=now) == expires


def test_next_due_with_jitter_never_goes_past_the_expiry() -> None:
    policy = RetryPolicy(retry_interval=300.0, max_retry_interval=3600.0, max_age=86400.0, jitter=0.5)
    rng = random.Random(7)
    created = 0.0
    for now in range(0, 86400, 97):
        due = policy.next_due(created, attempts=6, now=float(now), rng=rng)
        assert due is not None
        assert now < due <= created + policy.max_age


def test_next_due_is_none_once_expired() -> None:
    created = 1000.0
    expires = created + EXACT.max_age
    assert EXACT.next_due(created, attempts=3, now=expires) is None
    assert EXACT.next_due(created, attempts=3, now=expires + 1.0) is None
    assert EXACT.next_due(created, attempts=3, now=expires - 0.001) == expires
