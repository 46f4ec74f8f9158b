"""How `pigeon queue list` and `queue summary` show an age or a wait: one rule, whole seconds
below a minute, then minutes, hours and days to one decimal, the unit chosen by the value as
shown. An outside tester saw two messages about a second apart listed as `(1.0m)` and `(60s)`:
59.6 s was rounded to "60s" after the unit had been chosen for it."""

from __future__ import annotations

from typing import Any

import pytest

from pigeon.cli.admin import _age, _listed


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0s"),
        (-0.3, "0s"),  # (a clock a little behind: not "-0s")
        (0.4, "0s"),
        (1, "1s"),
        (59, "59s"),
        (59.4, "59s"),
        (59.6, "1.0m"),  # not "60s"
        (60, "1.0m"),
        (60.4, "1.0m"),
        (90, "1.5m"),
        (3569, "59.5m"),
        (3596, "59.9m"),
        (3598, "1.0h"),  # 59.97 minutes: not "60.0m"
        (3600, "1.0h"),
        (5400, "1.5h"),
        (86219, "23.9h"),
        (86260, "1.0d"),  # 23.96 hours: not "24.0h"
        (86400, "1.0d"),
        (30 * 86400, "30.0d"),
        (400 * 86400, "400.0d"),
    ],
)
def test_an_age_is_shown_by_one_rule_across_each_units_boundary(seconds: float, shown: str) -> None:
    assert _age(seconds) == shown


def test_ages_never_go_back_as_they_grow() -> None:
    """An older message never looks younger, whichever unit each is shown in."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    previous = 0.0
    for tenths in range(0, 2 * 86400 * 10, 7):
        shown = _age(tenths / 10)
        value = float(shown[:-1]) * units[shown[-1]]
        assert value >= previous, (tenths / 10, shown)
        previous = value


def _message(number: int, created: float) -> dict[str, Any]:
    """A message as `GET /api/v1/messages` gives it."""
    return {
        "id": f"03826100000000{number:02d}",
        "state": "deferred",
        "size": 100,
        "created": created,
        "sender": "sender@example.org",
        "queue": "example.net",
        "attempts": 1,
        "next_due": created + 600,
        "recipients": ["rcpt@example.net"],
        "recipient_count": 1,
    }


def test_messages_about_a_second_apart_at_the_minute_are_listed_in_one_form() -> None:
    now = 1_800_000_000.0
    rows = [_listed(_message(number, now - age), now) for number, age in enumerate((60.3, 59.6, 58.7))]
    assert ["(1.0m)" in rows[0], "(1.0m)" in rows[1], "(59s)" in rows[2]] == [True, True, True], rows
    assert not any("(60s)" in row for row in rows)
