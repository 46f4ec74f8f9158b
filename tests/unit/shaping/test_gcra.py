"""Rate limits: parsing "N/period[,burst=B]", and GCRA reservations against a fake clock."""

from __future__ import annotations

import pytest

from pigeon.shaping.gcra import Gcra, Rate


@pytest.mark.parametrize(
    ("text", "per_second", "burst"),
    [
        ("100/s", 100.0, 1),
        ("6,000/min", 100.0, 1),
        ("6_000/minute", 100.0, 1),
        ("500/h", 500 / 3600, 1),
        ("500/hour", 500 / 3600, 1),
        ("10/d", 10 / 86400, 1),
        ("10/day", 10 / 86400, 1),
        ("1.5/sec", 1.5, 1),
        (" 60 / m ", 1.0, 1),
        ("100/s,burst=5", 100.0, 5),
        ("6,000/min,burst=20", 100.0, 20),
    ],
)
def test_rate_parse(text: str, per_second: float, burst: int) -> None:
    rate = Rate.parse(text)
    assert rate.per_second == pytest.approx(per_second)
    assert rate.burst == burst


def test_rate_interval_is_the_spacing_between_events() -> None:
    assert Rate.parse("4/s").interval == 0.25
    assert Rate.parse("60/min").interval == pytest.approx(1.0)


@pytest.mark.parametrize(
    "text", ["", "fast", "100", "100/", "/s", "100/week", "100 per second", "-5/s", "1e3/s", "100/s,burst"]
)
def test_rate_parse_refuses_junk(text: str) -> None:
    with pytest.raises(ValueError, match="is not a rate"):
        Rate.parse(text)


@pytest.mark.parametrize("text", ["0/s", "0.0/min", "0,000/h"])
def test_rate_parse_refuses_zero(text: str) -> None:
    with pytest.raises(ValueError, match="above zero"):
        Rate.parse(text)


@pytest.mark.parametrize("text", ["10/s,burst=0"])
def test_rate_parse_refuses_a_burst_below_one(text: str) -> None:
    with pytest.raises(ValueError, match="burst must be at least 1"):
        Rate.parse(text)


@pytest.mark.parametrize("text", ["10/s,burst=many", "10/s,burst=2.5", "10/s,burst=-3"])
def test_rate_parse_refuses_a_burst_that_is_not_a_number(text: str) -> None:
    with pytest.raises(ValueError, match="needs a whole number"):
        Rate.parse(text)


def test_n_per_second_are_spaced_one_nth_of_a_second_apart() -> None:
    gcra = Gcra(Rate(10.0))
    # Ten requests all at t=100: the first goes now, each next one 0.1 s after the previous.
    delays = [gcra.reserve(100.0) for _ in range(10)]
    assert delays == pytest.approx([0.1 * i for i in range(10)])


def test_requests_arriving_at_the_rate_never_wait() -> None:
    gcra = Gcra(Rate(10.0))
    assert all(gcra.reserve(50.0 + 0.1 * i) == pytest.approx(0.0, abs=1e-9) for i in range(100))


def test_a_burst_allows_that_many_at_once_then_spaces_the_rest() -> None:
    gcra = Gcra(Rate(10.0, burst=5))
    delays = [gcra.reserve(100.0) for _ in range(8)]
    assert delays[:5] == [0.0] * 5
    assert delays[5:] == pytest.approx([0.1, 0.2, 0.3])


def test_waiting_the_returned_delay_then_sending_keeps_to_the_rate() -> None:
    gcra = Gcra(Rate(2.0))  # one every 0.5 s
    now = 100.0
    assert gcra.reserve(now) == 0.0
    wait = gcra.reserve(now)  # booked: go after `wait`
    assert wait == pytest.approx(0.5)
    now += wait  # the booked request goes now; the next one is due one interval later
    assert gcra.reserve(now + 0.5) == pytest.approx(0.0, abs=1e-9)
    assert gcra.reserve(now + 0.5) == pytest.approx(0.5)


def test_a_request_that_waited_its_delay_passes() -> None:
    gcra = Gcra(Rate(4.0))
    assert gcra.reserve(10.0) == 0.0
    wait = gcra.reserve(10.0)
    assert wait == pytest.approx(0.25)
    # After the booked slot and one more interval, a new request goes at once.
    assert gcra.reserve(10.0 + wait + 0.25) == pytest.approx(0.0, abs=1e-9)


def test_an_idle_limiter_refills_its_burst_but_no_more() -> None:
    gcra = Gcra(Rate(1.0, burst=3))
    assert [gcra.reserve(0.0) for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 1.0])
    # An hour idle: the burst is back, but only three, not thousands.
    assert [gcra.reserve(3600.0) for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 1.0])


def test_the_limiter_works_at_any_clock_origin() -> None:
    early, late = Gcra(Rate(10.0)), Gcra(Rate(10.0))
    assert [early.reserve(0.0) for _ in range(3)] == pytest.approx([late.reserve(1e6) for _ in range(3)])


def test_rate_parse_refuses_an_empty_burst() -> None:
    with pytest.raises(ValueError, match="burst"):
        Rate.parse("10/s,burst=")
