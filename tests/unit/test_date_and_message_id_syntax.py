"""A submission's Date and Message-ID are read as RFC 5322 writes them (3.3, 3.6.4, with the
obsolete forms of 4.3 that mailers still write): a value that is one passes, one that is not
gets a reason a sender can act on."""

from __future__ import annotations

import calendar
import datetime
import email.utils
from unittest.mock import ANY

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.header_section import (
    DATE_FORM,
    Malformed,
    date_problem,
    malformed_field,
    malformed_field_in,
    message_id_problem,
)

GOOD_DATES = [
    "Mon, 1 Jan 2024 12:00:00 +0000",
    "Mon, 01 Jan 2024 12:00:00 -0500",
    "1 Jan 2024 12:00:00 +0100",  # no day of the week
    "Mon, 1 Jan 2024 12:00 +0000",  # no seconds
    "Sun, 31 Dec 2023 23:59:60 +0000",  # a leap second (3.3)
    "Thu, 29 Feb 2024 00:00:00 +0000",
    "Tue, 29 Feb 2000 00:00:00 +0000",
    "Mon, 1 Jan 24 12:00:00 GMT",  # a two-digit year, a named zone (4.3)
    "Fri, 1 Jan 99 12:00:00 EST",
    "Mon, 1 Jan 124 12:00:00 UT",  # a three-digit year: 2024
    "Mon, 1 Jan 2024 12:00:00 PDT",
    "Mon, 1 Jan 2024 12:00:00 Z",  # military
    "Mon, 1 Jan 2024 12:00:00 UTC",  # other alphabetic zones, seen in mail (4.3)
    "Mon, 1 Jan 2024 12:00:00 CEST",
    "Mon, 1 Jan 2024 12:00:00 +0000 (UTC)",
    "Mon, 1 Jan 2024 12:00:00 +0000 (Coordinated (Universal) Time \\) )",
    "  Mon ,  1  Jan  2024  12 : 00 : 00  +0000  ",
    "Mon,\t1 Jan 2024 12:00:00 +0000",
    "mon, 1 JAN 2024 12:00:00 gmt",
    "(sent) Mon, 1 Jan 2024 12:00:00 +0000",
    "Mon, 1Jan2024 12:00:00 +0000",
    "Mon, 1 Jan 2024 12:00:00 +1400",
    "Fri, 1 Jan 9999 12:00:00 +0000",
    "Mon, 1 Jan 1900 00:00:00 +0000",
]

BAD_DATES = {
    "yesterday": f"is not of the form {DATE_FORM}",
    "": "is empty",
    "  ": "is empty",
    "2024-01-01T12:00:00Z": f"is not of the form {DATE_FORM}",  # ISO 8601, not RFC 5322
    "Mon, 1 Jan 2024": f"is not of the form {DATE_FORM}",  # no time
    "12:00:00 +0000": f"is not of the form {DATE_FORM}",
    "Mon, 1 Jan 2024 12:00:00 +0000 garbage": f"is not of the form {DATE_FORM}",
    "Mon 1 Jan 2024 12:00:00 +0000": f"is not of the form {DATE_FORM}",  # the comma is not optional
    "Mon, 1 Jan 2024 12:00:00 +0000 (unclosed": f"is not of the form {DATE_FORM}",
    "Mon, 1 Jan 2024 12:00:00 +0000 )": f"is not of the form {DATE_FORM}",
    "Mon, 1 Jan 2024 12:00:00": "has no time zone (+hhmm or -hhmm, e.g. +0100, -0500)",
    "Fri, 32 Jan 2024 12:00:00 +0000": "has day 32 (January 2024 has 31 days)",
    "Wed, 29 Feb 2023 12:00:00 +0000": "has day 29 (February 2023 has 28 days)",
    "Thu, 29 Feb 1900 12:00:00 +0000": "has day 29 (February 1900 has 28 days)",
    "Sat, 31 Apr 2024 12:00:00 +0000": "has day 31 (April 2024 has 30 days)",
    "0 Jan 2024 12:00:00 +0000": "has day 0 (January 2024 has 31 days)",
    "001 Jan 2024 12:00:00 +0000": "has day 001 (January 2024 has 31 days)",
    "Mon, 1 Jan 2024 24:00:00 +0000": "has hour 24 (two digits, 00 to 23)",
    "Mon, 1 Jan 2024 9:00:00 +0000": "has hour 9 (two digits, 00 to 23)",
    "Mon, 1 Jan 2024 12:60:00 +0000": "has minute 60 (two digits, 00 to 59)",
    "Mon, 1 Jan 2024 12:00:61 +0000": "has second 61 (two digits, 00 to 60)",
    "Mon, 1 Jan 1899 12:00:00 +0000": "has year 1899 (four digits, 1900 or later)",
    "Mon, 1 Jan 10000 12:00:00 +0000": "has year 10000 (four digits, 1900 or later)",
    "Mon, 1 Jan 4 12:00:00 +0000": "has year 4 (four digits, 1900 or later)",
    "Mon, 1 Jan 2024 12:00:00 +2400": "has time zone +2400 (+hhmm or -hhmm, e.g. +0100, -0500)",
    "Mon, 1 Jan 2024 12:00:00 +0060": "has time zone +0060 (+hhmm or -hhmm, e.g. +0100, -0500)",
    "Mon, 1 Jan 2024 12:00:00 +01": "has time zone +01 (+hhmm or -hhmm, e.g. +0100, -0500)",
    "Mon, 1 Jan 2024 12:00:00 J": 'has time zone "J" (+hhmm or -hhmm, e.g. +0100, -0500)',
    "Mon, 1 Jan 2024 12:00:00 Europe": 'has time zone "Europe" (+hhmm or -hhmm, e.g. +0100, -0500)',
    "Monday, 1 Jan 2024 12:00:00 +0000": 'has "Monday" for a day of the week (Mon to Sun)',
    "Mon, 1 January 2024 12:00:00 +0000": 'has "January" for a month (Jan to Dec)',
    "Mon, 1 Jam 2024 12:00:00 +0000": 'has "Jam" for a month (Jan to Dec)',
    # RFC 5322 3.3: the day of the week MUST be the date's (two-digit years read as 4.3 says)
    "Tue, 1 Jan 2024 12:00:00 +0000": 'has "Tue" for the day of the week, but 1 Jan 2024 is a Monday',
    "Mon, 5 Dec 2026 10:00:00 +0000": 'has "Mon" for the day of the week, but 5 Dec 2026 is a Saturday',
    "sun, 05 DEC 26 10:00 GMT": 'has "sun" for the day of the week, but 5 Dec 2026 is a Saturday',
}

GOOD_IDS = [
    "<1234.5678@example.org>",
    "<CAF=xyz+ab/c_d-e{f}@mail.gmail.com>",
    "  <a@b>  ",
    "(our id) <a@b> (kept)",
    '<"quoted.left"@example.org>',
    '<"a..b."@example.org>',  # any dots inside a quoted string
    '<"quoted".word.x@example.org>',  # words of the obsolete local-part, a dot between each
    "<a@[192..0.2.1.]>",  # a domain literal's text is its own
    '<"with \\" quote"@example.org>'.replace(" ", "_"),
    "<a@[192.0.2.1]>",  # a domain literal
    "<a@[IPv6:2001:db8::1]>",
    "<a@localhost>",
    "<é.ü@exämple.org>",  # UTF-8 (RFC 6532)
    "\t<a@b>",
]

FORM = '(the form is "<1234.5678@example.org>")'
DOT = "(RFC 5322 3.6.4: a dot only between two other characters)"
BAD_IDS = {
    "foo": f"is not in angle brackets {FORM}",
    "foo@example.org": f"is not in angle brackets {FORM}",
    "x <a@b>": f'has text before its "<" {FORM}',
    "<no-at-sign>": f'has no "@" {FORM}',
    "<no-at-sign": f'has no "@" {FORM}',
    "<@example.org>": 'has nothing before its "@"',
    "<a@>": 'has nothing after its "@"',
    "<a@": 'has nothing after its "@"',
    "<a@(comment": 'is not of the form "<1234.5678@example.org>": a comment\'s parentheses do not match',
    "<>": f'has no "@" {FORM}',
    "<a@b": 'has no closing ">"',
    "<a b@example.org>": "has white space inside its angle brackets",
    "<a@example .org>": "has white space inside its angle brackets",
    '<"a b"@example.org>': "has white space inside its angle brackets",
    "<a@b@c>": 'has more than one "@"',
    "<a@b> <c@d>": 'has more after its ">" (one msg-id only)',
    "<a@b>x": 'has more after its ">" (one msg-id only)',
    "<a,b@c>": 'has "," inside its angle brackets, where RFC 5322 3.6.4 allows none',
    "<<a@b>>": 'has "<" inside its angle brackets, where RFC 5322 3.6.4 allows none',
    '<a"@b>': "has a quoted string that does not end",
    "<a@[192.0.2.1>": "has a domain literal that does not end",
    "<a\x01@b>": 'has "\\x01" inside its angle brackets, where RFC 5322 3.6.4 allows none',
    "<a\udcff@b>": 'has "\\xff" inside its angle brackets, where RFC 5322 3.6.4 allows none',  # not UTF-8
    "": "is empty",
    "(only a comment)": "is empty",
    # RFC 5322 3.6.4: each side is dot-atom-text (or a quoted string, a literal): no empty word
    "<a..b@example.org>": f'has ".." before its "@" {DOT}',
    "<a.@example.org>": f'has "." just before its "@" {DOT}',
    "<.a@example.org>": f'has "." just after its "<" {DOT}',
    '<"a".@example.org>': f'has "." just before its "@" {DOT}',
    "<a@example.org.>": f'has "." just before its ">" {DOT}',
    "<a@.example.org>": f'has "." just after its "@" {DOT}',
    "<a@example..org>": f'has ".." after its "@" {DOT}',
    "<a.,b@c>": 'has "," inside its angle brackets, where RFC 5322 3.6.4 allows none',  # said first
}


@pytest.mark.parametrize("value", GOOD_DATES)
def test_a_date_of_rfc_5322_or_its_obsolete_forms_passes(value: str) -> None:
    assert date_problem(value) is None


@pytest.mark.parametrize("value", list(BAD_DATES))
def test_what_is_not_a_date_is_refused_saying_what_is_wrong(value: str) -> None:
    assert date_problem(value) == BAD_DATES[value]


@pytest.mark.parametrize("value", GOOD_IDS)
def test_a_msg_id_of_rfc_5322_or_as_mailers_write_it_passes(value: str) -> None:
    assert message_id_problem(value) is None


@pytest.mark.parametrize("value", list(BAD_IDS))
def test_what_is_not_a_msg_id_is_refused_saying_what_is_wrong(value: str) -> None:
    assert message_id_problem(value) == BAD_IDS[value]


moments = st.datetimes(min_value=datetime.datetime(1900, 1, 2), max_value=datetime.datetime(9999, 12, 30))
zones = st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59).map(
    lambda minutes: datetime.timezone(datetime.timedelta(minutes=minutes))
)


@given(moments, zones)
def test_every_date_pythons_email_package_writes_passes(moment: datetime.datetime, zone: datetime.timezone) -> None:
    written = [
        email.utils.format_datetime(moment.replace(tzinfo=zone)),  # "+hhmm"
        email.utils.format_datetime(moment.replace(tzinfo=datetime.UTC), usegmt=True),  # "GMT"
        email.utils.format_datetime(moment),  # a naive moment: "-0000", zone unknown (3.3)
    ]
    for value in written:
        assert date_problem(value) is None, value


@given(st.dates(min_value=datetime.date(1900, 1, 1)), st.integers(0, 6))
def test_a_day_of_the_week_is_refused_exactly_when_it_is_not_the_dates(date: datetime.date, weekday: int) -> None:
    day = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[weekday]
    value = f"{day}, {date.day} {calendar.month_abbr[date.month]} {date.year} 12:00 +0000"
    assert (date_problem(value) is None) == (date.weekday() == weekday), value


@given(st.integers(1900, 9999), st.integers(1, 12), st.integers(1, 99))
def test_a_day_is_refused_exactly_when_its_month_has_none_of_that_number(year: int, month: int, day: int) -> None:
    value = f"{day} {calendar.month_abbr[month]} {year} 12:00:00 +0000"
    days = calendar.monthrange(year, month)[1]
    assert (date_problem(value) is None) == (day <= days), value


@settings(max_examples=300)
@given(st.text(alphabet=st.sampled_from('Mon,JanGMT0123456789 :+-()\\<>@"[]. \tx\x01é')))
def test_any_text_gets_an_answer_and_never_an_error(value: str) -> None:
    for problem in (date_problem(value), message_id_problem(value)):
        assert problem is None or problem


def test_a_long_run_of_blanks_is_read_in_linear_time() -> None:
    """A header section holds up to 64 KiB of a folded value: two runs of blanks that meet in
    the pattern would cost its square (minutes), not milliseconds."""
    blanks = " \t" * 32768
    assert date_problem(f"1 {blanks}x") == f"is not of the form {DATE_FORM}"
    assert date_problem(f"Mon, 1 Jan 2024 12:00{blanks}:x") == f"is not of the form {DATE_FORM}"
    assert message_id_problem(f"<a{blanks}b@c>") == "has white space inside its angle brackets"
    assert message_id_problem(f"<a@b>{blanks}x") == 'has more after its ">" (one msg-id only)'


def test_the_first_bad_field_of_a_message_is_named_with_its_unfolded_value() -> None:
    message = (
        b"From: a@example.org\r\nDate: Mon, 1 Jan\r\n 2024 12:00:00 +0000\r\nMessage-ID: <x>\r\n\r\nDate: body\r\n"
    )
    assert malformed_field_in(message) == Malformed("Message-ID", " <x>", f'has no "@" {FORM}')
    message = b"Subject: s\r\nDATE :\r\n yesterday\r\nMessage-ID: <x>\r\n\r\n"
    assert malformed_field_in(message) == Malformed("Date", " yesterday", f"is not of the form {DATE_FORM}")
    assert malformed_field_in(b"From: a@example.org\r\n\r\nDate: yesterday\r\nMessage-ID: x\r\n") is None
    assert malformed_field_in(b"X-Date: yesterday\r\nX-Message-ID: x\r\n\r\n") is None


def test_a_field_the_kept_part_cuts_off_is_not_judged() -> None:
    """`cut`: the header section goes on past `head`, so its last field may go on too."""
    head = b"\nFrom: a@example.org\r\nMessage-ID: <a@b>\r\nDate: Mon, 1 Jan 2024 12:00:00 +0000 (UT"
    assert malformed_field(head, head.lower(), cut=True) is None
    assert malformed_field(head, head.lower()) == Malformed("Date", " Mon, 1 Jan 2024 12:00:00 +0000 (UT", ANY)
    folded = b"\nFrom: a@example.org\r\nDate: Mon, 1 Jan 2024\r\n"  # a continuation may come next
    assert malformed_field(folded, folded.lower(), cut=True) is None
    before = b"\nDate: yesterday\r\nFrom: a@example.org\r\nSubject: cut he"
    assert malformed_field(before, before.lower(), cut=True) == Malformed("Date", " yesterday", ANY)
