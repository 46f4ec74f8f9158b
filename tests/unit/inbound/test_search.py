"""Reading IMAP search criteria for whether they can match seen mail (the config check's answer)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pigeon.inbound.search import SearchError, excludes_seen, recent_key

_WORDS = ["UNSEEN", "SEEN", "NEW", "ALL", "FLAGGED", "NOT", "OR", "(", ")", "SUBJECT", '"a b"', "1:*", "{3}", '"']


@pytest.mark.parametrize(
    ("criteria", "excludes"),
    [
        ("UNSEEN", True),
        ("not seen", True),
        ("NOT NOT UNSEEN", True),
        ("OR UNSEEN NEW", True),
        ("OR UNSEEN FLAGGED", False),
        ("NOT OR SEEN FLAGGED", True),  # neither seen nor flagged
        ("NOT OR UNSEEN FLAGGED", False),
        ("NOT (SEEN FLAGGED)", False),  # seen unflagged mail matches
        ("NOT ALL", True),  # matches nothing at all
        ("CHARSET UTF-8 SUBJECT caf\u00e9 UNSEEN", True),
        ('UID 1:*,7 HEADER X-A "(not a list)" UNSEEN', True),
    ],
)
def test_a_search_excludes_seen_mail_by_its_meaning_not_its_words(criteria: str, excludes: bool) -> None:
    assert excludes_seen(criteria) is excludes


@given(st.lists(st.sampled_from(_WORDS), max_size=8).map(" ".join))
def test_any_criteria_give_an_answer_or_a_search_error_nothing_else(criteria: str) -> None:
    try:
        answer: object = excludes_seen(criteria)
    except SearchError as error:
        answer = str(error)  # what the config error shows: never empty
    assert answer in (True, False) or (isinstance(answer, str) and answer)


@pytest.mark.parametrize("criteria", ["NOT " * 5000 + "SEEN", "(" * 5000 + "UNSEEN" + ")" * 5000])
def test_criteria_nested_beyond_reason_are_a_search_error_not_a_crash(criteria: str) -> None:
    with pytest.raises(SearchError, match="nested more than 100 deep"):
        excludes_seen(criteria)


@pytest.mark.parametrize(
    ("criteria", "key"),
    [
        ("NEW", "NEW"),
        ("OR UNSEEN (FLAGGED recent)", "RECENT"),
        ("NOT OLD", "OLD"),
        ("UNSEEN", None),
        ("SUBJECT NEW UNSEEN", None),  # an argument, not a key
        ('HEADER X-Tag "recent" UNSEEN', None),
        ("NEW FOO", "NEW"),  # read before what cannot be
        ("(UNSEEN", None),
    ],
)
def test_a_search_that_depends_on_recent_is_told_by_its_keys_not_its_words(criteria: str, key: str | None) -> None:
    assert recent_key(criteria) == key
