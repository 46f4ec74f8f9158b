"""MTA-STS's texts (RFC 8461 3.1, 3.2) and its MX patterns (4.1), without a socket."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pigeon.delivery.mta_sts import (
    MAX_AGE_CAP,
    Mode,
    NoRecord,
    PolicyError,
    matches,
    media_type_is_text,
    parse_policy,
    parse_record,
)

_POLICY = "version: STSv1\r\nmode: enforce\r\nmx: mail.example.com\r\nmx: *.example.net\r\nmax_age: 86400\r\n"


def test_a_record_gives_its_id_and_other_txt_records_are_not_ours() -> None:
    assert parse_record(["v=spf1 -all", "v=STSv1; id=20160831085700Z;"]) == "20160831085700Z"
    assert parse_record(["v=STSv1;id=abc"]) == "abc"
    assert parse_record(["v=STSv1 ; id=abc ; ext=value;"]) == "abc"


@pytest.mark.parametrize(
    "texts",
    [
        [],
        ["v=spf1 -all"],
        ["v=STSv10; id=1"],  # another version
        [" v=STSv1; id=1"],  # not at the start
    ],
)
def test_no_record_of_ours_is_no_policy_and_nothing_to_warn_of(texts: list[str]) -> None:
    with pytest.raises(NoRecord):
        parse_record(texts)


@pytest.mark.parametrize(
    "texts",
    [
        ["v=STSv1; id=1", "v=STSv1; id=2"],  # two records: none counts
        ["v=STSv1;"],  # no id
        ["v=STSv1; id=abc-def"],  # an id of letters and digits only
        ["v=STSv1; id=" + "a" * 33],  # at most 32
        ["v=STSv1; nonsense"],
    ],
)
def test_an_invalid_record_is_no_policy(texts: list[str]) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_record(texts)
    assert not isinstance(caught.value, NoRecord)


def test_a_policy_parses_with_crlf_or_lf_and_its_mx_patterns() -> None:
    policy = parse_policy(_POLICY)
    assert policy.mode is Mode.ENFORCE
    assert policy.mx == ("mail.example.com", "*.example.net")
    assert policy.max_age == 86400
    assert parse_policy(_POLICY.replace("\r\n", "\n")) == policy
    assert parse_policy(_POLICY + "future_key: some value\n") == policy  # extensions are ignored


def test_max_age_is_capped_at_a_year_and_none_mode_needs_no_mx() -> None:
    assert parse_policy(_POLICY.replace("86400", "9999999999")).max_age == MAX_AGE_CAP
    policy = parse_policy("version: STSv1\nmode: none\nmax_age: 10\n")
    assert policy.mode is Mode.NONE and policy.mx == ()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (_POLICY.replace("STSv1", "STSv2"), "version"),
        (_POLICY.replace("enforce", "Enforce"), "mode"),
        (_POLICY.replace("86400", "-1"), "max_age"),
        (_POLICY.replace("max_age: 86400\r\n", ""), "max_age"),
        ("version: STSv1\nmode: testing\nmax_age: 5\n", "no mx"),
        (_POLICY + "no colon here\n", "line 6"),
        (_POLICY.replace("*.example.net", "mail.*.example.net"), "mx"),
        ("<html>not found</html>", "line 1"),
    ],
)
def test_an_invalid_policy_says_why(text: str, why: str) -> None:
    with pytest.raises(PolicyError, match=why):
        parse_policy(text)


def test_a_wildcard_matches_one_leftmost_label_only() -> None:
    assert matches("*.example.net", "mx1.example.net")
    assert matches("*.example.net", "MX1.Example.NET.")
    assert not matches("*.example.net", "example.net")
    assert not matches("*.example.net", "a.b.example.net")
    assert not matches("*.example.net", "mx1.example.network")
    assert matches("mail.example.com", "mail.example.com.")
    assert not matches("mail.example.com", "xmail.example.com")


_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)


@given(st.lists(_LABEL, min_size=1, max_size=4), st.lists(_LABEL, min_size=1, max_size=4))
def test_a_wildcard_matches_exactly_the_names_one_label_longer(prefix: list[str], domain: list[str]) -> None:
    host = ".".join(prefix + domain)
    assert matches("*." + ".".join(domain), host) == (len(prefix) == 1)
    assert matches(host, host.upper())


def test_the_policy_is_served_as_text_plain() -> None:
    assert media_type_is_text("text/plain")
    assert media_type_is_text("Text/Plain; charset=utf-8")
    assert not media_type_is_text("text/html")
    assert not media_type_is_text(None)
