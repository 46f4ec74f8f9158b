"""The units a rate (`max_message_rate`) is written in: the README names every spelling the
parser takes, and one it does not take is refused naming them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pigeon.shaping.gcra import Rate
from tests.integration.test_config_errors_point_at_the_fix import refused
from tests.support.readme import README


def test_the_readme_lists_every_spelling_of_a_rate_unit_the_parser_takes() -> None:
    # Found from outside: "100/sec" and "100/hour" were taken; the README named s, m/min, h, d.
    row = next(line for line in README.read_text().splitlines() if line.startswith("| `[delivery] max_message_rate`"))
    documented = set(re.findall(r"`(\w+)`", row.split("then optionally", 1)[0]))
    for unit in ("s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day"):
        assert unit in documented, unit
        Rate.parse(f"100/{unit}")
    for unit in ("secs", "seconds", "mins", "minutes", "hours", "days", "S", "hr", "w"):
        with pytest.raises(ValueError, match="a count per s"):
            Rate.parse(f"100/{unit}")


def test_a_rate_in_a_unit_not_taken_is_refused_listing_the_units(tmp_path: Path) -> None:
    said = refused(tmp_path, '[delivery]\nmax_message_rate = "100/hours"\n')
    assert said == (
        "line 2: [delivery] max_message_rate: '100/hours' is not a rate: a count per s, m, h or d (or sec, second,"
        ' min, minute, hour, day), like "100/s", "6000/min" or "500/h"'
    )
