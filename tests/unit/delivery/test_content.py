"""strip_headers: Pigeon's routing headers come off on the way out; nothing else changes.
render: what will be delivered, after the policy's header edits."""

from __future__ import annotations

import pytest

from pigeon.delivery.content import render, strip_headers
from pigeon.message import Envelope, Recipient

NAMES = (b"x-tenant", b"x-campaign")


def test_named_headers_are_removed_and_the_rest_is_untouched() -> None:
    message = (
        b"From: a@example.org\r\n"
        b"X-Tenant: acme\r\n"
        b"Subject: hi\r\n"
        b"X-Campaign: spring\r\n"
        b"To: b@example.net\r\n"
        b"\r\n"
        b"hello\r\n"
    )
    assert strip_headers(message, NAMES) == (
        b"From: a@example.org\r\nSubject: hi\r\nTo: b@example.net\r\n\r\nhello\r\n"
    )


@pytest.mark.parametrize("name", [b"X-TENANT", b"x-tenant", b"X-tEnAnT"])
def test_header_names_match_whatever_their_case(name: bytes) -> None:
    message = b"From: a@example.org\r\n" + name + b": acme\r\n\r\nbody\r\n"
    assert strip_headers(message, NAMES) == b"From: a@example.org\r\n\r\nbody\r\n"


def test_folded_continuation_lines_go_with_their_field() -> None:
    message = (
        b"X-Tenant: acme\r\n"
        b"  continued\r\n"
        b"\tand again\r\n"
        b"Subject: a long\r\n"
        b" subject\r\n"
        b"X-Campaign: c\r\n"
        b" more\r\n"
        b"\r\n"
        b"body\r\n"
    )
    assert strip_headers(message, NAMES) == b"Subject: a long\r\n subject\r\n\r\nbody\r\n"


@pytest.mark.parametrize("position", ["first", "last"])
def test_a_field_at_either_end_of_the_header_section_is_removed(position: str) -> None:
    message = (
        b"X-Tenant: acme\r\nSubject: hi\r\n\r\nbody\r\n"
        if position == "first"
        else b"Subject: hi\r\nX-Tenant: acme\r\n\r\nbody\r\n"
    )
    assert strip_headers(message, NAMES) == b"Subject: hi\r\n\r\nbody\r\n"


def test_the_body_is_untouched_even_when_a_line_looks_like_a_removed_header() -> None:
    message = (
        b"X-Tenant: acme\r\n"
        b"Subject: hi\r\n"
        b"\r\n"
        b"X-Tenant: this is body text\r\n"
        b" indented body line\r\n"
        b"\r\n"
        b"X-Campaign: also body\r\n"
    )
    assert strip_headers(message, NAMES) == (
        b"Subject: hi\r\n\r\nX-Tenant: this is body text\r\n indented body line\r\n\r\nX-Campaign: also body\r\n"
    )


def test_a_body_line_looking_like_a_header_does_not_trigger_a_rewrite() -> None:
    message = b"Subject: hi\r\n\r\nX-Tenant: body text\r\n"
    assert strip_headers(message, NAMES) is message


def test_nothing_to_remove_returns_the_very_same_object() -> None:
    message = b"From: a@example.org\r\nSubject: hi\r\n\r\nbody\r\n"
    assert strip_headers(message, NAMES) is message


def test_a_field_whose_name_only_starts_like_a_removed_one_stays() -> None:
    message = b"X-Tenant-Id: 7\r\nX-Campaigns: no\r\n\r\nbody\r\n"
    assert strip_headers(message, NAMES) is message


def test_a_name_inside_a_continuation_line_is_not_a_field() -> None:
    message = b"Subject: about\r\n X-Tenant: folded text\r\n\r\nbody\r\n"
    assert strip_headers(message, NAMES) is message


def test_a_message_that_is_all_header_loses_the_field() -> None:
    message = b"Subject: hi\r\nX-Tenant: acme\r\n"
    assert strip_headers(message, NAMES) == b"Subject: hi\r\n"


def test_a_message_with_only_removed_fields_keeps_an_empty_header_section() -> None:
    message = b"X-Tenant: acme\r\nX-Campaign: c\r\n\r\nbody\r\n"
    assert strip_headers(message, NAMES) == b"\r\nbody\r\n"


def test_no_names_removes_nothing() -> None:
    message = b"X-Tenant: acme\r\n\r\nbody\r\n"
    assert strip_headers(message, ()) is message


def test_a_message_without_headers_keeps_its_body_untouched() -> None:
    # The message starts with the blank line: everything after it is body, header-like or not.
    message = b"\r\nX-Tenant: acme\r\n\r\nbody\r\n"
    assert strip_headers(message, NAMES) == message


# --- render: what will be delivered, after policy ---------------------------------------------

STORED = b"Received: from x\r\nFrom: a@example.org\r\nX-Tenant: acme\r\nSubject: hi\r\n\r\nbody\r\n"


def _envelope(**fields: object) -> Envelope:
    return Envelope("a@example.org", [Recipient("b@example.net")], **fields)  # type: ignore[arg-type]


def test_render_gives_the_stored_bytes_themselves_when_nothing_changes() -> None:
    stored = b"From: a@example.org\r\n\r\nbody\r\n"
    assert render(stored, _envelope()) is stored


def test_render_takes_the_routing_headers_off_when_the_intake_found_one() -> None:
    assert render(STORED, _envelope(tenant="acme")) == (
        b"Received: from x\r\nFrom: a@example.org\r\nSubject: hi\r\n\r\nbody\r\n"
    )


@pytest.mark.parametrize(
    ("field", "envelope"),
    [
        (b"X-Tenant:", {"headers_removed": ["x-campaign", "x-tenant"]}),
        (b"X-Tenant:   ", {"headers_removed": ["x-campaign", "x-tenant"]}),
        (b"X-Campaign: \t", {"headers_removed": ["x-campaign", "x-tenant"]}),
        (b"X-Tenant : acme", {"tenant": "acme"}),
        (b"x-campaign\t: spring", {"campaign": "spring"}),
    ],
    ids=["empty", "blank", "tab", "space before the colon", "tab before the colon"],
)
def test_render_takes_a_routing_header_off_in_any_form_the_intake_found_it(
    field: bytes, envelope: dict[str, object]
) -> None:
    # As the intake leaves the envelope: the value it found, or the names to take off when
    # the field names no queue.
    stored = b"From: a@example.org\r\n" + field + b"\r\nSubject: hi\r\n\r\nbody\r\n"
    assert render(stored, _envelope(**envelope)) == b"From: a@example.org\r\nSubject: hi\r\n\r\nbody\r\n"


def test_render_never_sends_a_routing_header_the_policy_added() -> None:
    envelope = _envelope(headers_added=["X-Campaign: sneaky", "List-Id: <l.example.org>", "x-tenant : sneaky2"])
    assert render(b"From: a\r\n\r\nbody\r\n", envelope) == b"List-Id: <l.example.org>\r\nFrom: a\r\n\r\nbody\r\n"


def test_render_puts_added_headers_on_top_in_order_and_takes_removed_ones_off() -> None:
    envelope = _envelope(
        tenant="acme", headers_added=["X-First: 1", "X-Second: é"], headers_removed=["subject", "received"]
    )
    # Pigeon's own Received (the first) stays, the earlier hops' go: a next hop counts hops by them.
    stored = STORED.replace(b"\r\nFrom:", b"\r\nReceived: from y\r\n\tby z\r\nFrom:")
    expected = "Received: from x\r\nX-First: 1\r\nX-Second: é\r\nFrom: a@example.org\r\n\r\nbody\r\n"
    assert render(stored, envelope) == expected.encode()


def test_render_removes_every_field_of_a_removed_name_with_its_folded_lines() -> None:
    stored = b"Subject: one\r\n two\r\nTo: b@example.net\r\nsubject: again\r\n\r\nSubject: in the body\r\n"
    assert render(stored, _envelope(headers_removed=["subject"])) == (
        b"To: b@example.net\r\n\r\nSubject: in the body\r\n"
    )


def test_render_of_a_message_with_no_header_section_still_adds_headers() -> None:
    assert render(b"\r\nbody\r\n", _envelope(headers_added=["X-A: 1"])) == b"X-A: 1\r\n\r\nbody\r\n"


def test_render_puts_the_dkim_signatures_above_the_policys_headers() -> None:
    envelope = _envelope(headers_added=["X-A: 1"], dkim_signatures=b"DKIM-Signature: v=1\r\n")
    assert render(b"From: a\r\n\r\nbody\r\n", envelope) == b"DKIM-Signature: v=1\r\nX-A: 1\r\nFrom: a\r\n\r\nbody\r\n"


@pytest.mark.parametrize(
    ("stored", "delivered"),
    [
        (b"From: a\r\nSubject: no body\r\n", b"From: a\r\nSubject: no body\r\n\r\n"),
        (b"From: a\r\nSubject: no final CRLF", b"From: a\r\nSubject: no final CRLF\r\n\r\n"),
        (b"From: a\r\n\r\n", b"From: a\r\n\r\n"),
        (b"\r\nbody\r\n", b"\r\nbody\r\n"),
    ],
    ids=["header only", "header only without its CRLF", "empty body", "no header"],
)
def test_render_ends_a_message_that_is_all_header_with_the_empty_line(stored: bytes, delivered: bytes) -> None:
    # RFC 5322 lets the empty line go when there is no body; OpenDKIM then fails `simple`
    # header signatures that dkimpy passes. Delivered with it, the message is the same one.
    signatures = b"DKIM-Signature: v=1\r\n"
    assert render(stored, _envelope(dkim_signatures=signatures)) == signatures + delivered
