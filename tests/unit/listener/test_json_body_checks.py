"""The checks a JSON request body gets besides its schema (`pigeon.listener.http.json_body`),
at the speed of the decoder whatever the body holds: a member named twice and a lone surrogate
found with their paths in a small body, by key or at `$` in a large one; too many values refused
by counting bytes, strings not counted."""

from __future__ import annotations

import time

from pigeon.listener.http.json_body import MAX_VALUES, lone_surrogate, repeated_member, too_many_values


def test_a_member_named_twice_is_found_with_its_path() -> None:
    assert repeated_member(b'{"a":1,"b":[{"c":1},{"c":1,"d":2,"c":3}]}') == "$.b[1].c"
    assert repeated_member(b'{"a":1,"b":[{"c":1},{"c":2}]}') is None
    assert repeated_member(b'{"a":') is None  # no JSON: the decoder says what is wrong


def test_in_a_large_body_a_member_named_twice_is_found_fast_and_named_by_its_key() -> None:
    body = b'{"x":[' + b",".join([b"{}"] * 1_000_000) + b'],"y":{"k":1,"k":2}}'
    started = time.process_time()
    assert repeated_member(body) == "$..k"
    assert repeated_member(body.replace(b'"k":2', b'"l":2')) is None
    assert time.process_time() - started < 3  # (the path walk took over 2 s for each)


def test_a_lone_surrogate_is_found_with_its_path_in_a_small_body_and_at_the_root_in_a_large_one() -> None:
    assert lone_surrogate(b'{"a":["ok","\\ud800"]}') == ("$.a[1]", False)
    assert lone_surrogate(b'{"a":"\\ud83d\\ude00"}') is None  # a pair is one character
    assert lone_surrogate(b'{"a":"\\\\ud800"}') is None  # an escaped backslash, then text
    large = b'{"x":[' + b",".join([b'"a"'] * 200_000) + b'],"y":"\\udc00"}'
    assert lone_surrogate(large) == ("$", False)
    assert lone_surrogate(large.replace(b"\\udc00", b"z")) is None


def test_more_values_than_allowed_are_refused_and_commas_in_strings_do_not_count() -> None:
    assert too_many_values(b"[" + b",".join([b"1"] * MAX_VALUES) + b"]") is not None
    assert too_many_values(b"[" + b",".join([b"1"] * (MAX_VALUES - 1)) + b"]") is None
    text = b'{"html":"' + b"{a},[b]," * MAX_VALUES + b'"}'  # CSS, prose: not values
    assert too_many_values(text) is None
