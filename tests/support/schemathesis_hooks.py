"""Loaded into the `schemathesis` process by the conformance tests (SCHEMATHESIS_HOOKS).

Each regex strategy is built once per run, not once per operation and mode. Hypothesis turns
a character class into its set of characters by adding a range's code points one at a time;
the document's address, domain and queue-name patterns spell most of the BMP in ranges, so
each build of one takes seconds, and schemathesis builds them again for every operation that
has such a member (about 28 builds of the two address patterns in a run: ~80% of its CPU).

A strategy depends only on the pattern, its flags and the alphabet it draws from, and is not
changed by drawing from it, so a build can be shared: the run sends the same requests, from
the same strategies, only sooner.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis.strategies import SearchStrategy
from hypothesis.strategies._internal import regex
from hypothesis.strategies._internal.lazy import unwrap_strategies

# A Hypothesis that no longer builds through this function would make the run slow again, not
# wrong; failing here says to look at this file.
assert hasattr(regex, "base_regex_strategy"), "hypothesis moved base_regex_strategy: update this hook"
_build = regex.base_regex_strategy
_built: dict[tuple[Any, ...], SearchStrategy[Any]] = {}


def _alphabet_key(alphabet: SearchStrategy[Any] | None) -> Any:
    if alphabet is None:
        return None
    intervals = getattr(unwrap_strategies(alphabet), "intervals", None)
    return tuple(intervals.intervals) if intervals is not None else alphabet  # else by identity


def _shared_regex_strategy(
    pattern: re.Pattern[Any], *, parsed: Any = None, alphabet: SearchStrategy[Any] | None
) -> SearchStrategy[Any]:
    key = (type(pattern.pattern), pattern.pattern, pattern.flags, _alphabet_key(alphabet))
    strategy = _built.get(key)
    if strategy is None:
        strategy = _built[key] = _build(pattern, parsed=parsed, alphabet=alphabet)
    return strategy


regex.base_regex_strategy = _shared_regex_strategy
