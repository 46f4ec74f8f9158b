"""The fields RFC 5322 3.6 allows once, found twice however long the header section and
however the writes split it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.header_section import KEPT, HeaderSection, RoutingNames, repeated_field, repeated_field_in

ROUTING = RoutingNames((b"x-tenant", b"x-campaign"))
BIG = b"X-Big: " + b"b" * 900 + b"\r\n"
FIELDS = [
    b"From: a@example.org\r\n",
    b"FROM :b@evil.test\r\n",
    b"from\t: c@evil.test\r\n",
    b"Subject: hello\r\n",
    b"Subject: Re : the obsolete form's look-alike\r\n",
    b"In-Reply-To: <x@y>\r\n",
    b"X-From: not one\r\n",
    b"Resent-From: may repeat\r\n",
    b"Comments: folded\r\n from: a continuation, not a field\r\n",
    b"Received: from a.test\r\n",
    BIG,
]
SINGLE = {b"from", b"sender", b"reply-to", b"to", b"message-id", b"subject", b"date"}


def _repeated(header_section: bytes) -> set[str]:
    """The once-only fields the header section has more than once: the slow, plain way."""
    counts: dict[bytes, int] = {}
    for line in header_section.split(b"\r\n"):
        name, colon, _ = line.partition(b":")
        name = name.rstrip(b" \t").lower()
        if colon and line[:1] not in (b" ", b"\t") and name in SINGLE:
            counts[name] = counts.get(name, 0) + 1
    return {name.decode() for name, count in counts.items() if count > 1}


@settings(max_examples=300, deadline=None)
@given(fields=st.lists(st.sampled_from(FIELDS), max_size=200), big=st.integers(0, 150), data=st.data())
def test_a_repeated_field_is_found_however_far_down_and_however_the_writes_split_it(
    fields: list[bytes], big: int, data: st.DataObject
) -> None:
    head = b"Received: by us\r\n" + BIG * big + b"".join(fields)
    message = head + b"\r\nFrom: in the body\r\nFrom: again\r\n"
    step = data.draw(st.integers(5, 3000))
    cuts = [*range(step, len(message), step), *data.draw(st.lists(st.integers(0, len(message)), max_size=10))]
    section = HeaderSection(ROUTING)
    at = 0
    for cut in [*sorted(cuts), len(message)]:
        if not section.ended:
            section.feed(message[at:cut])
        at = cut
    found = repeated_field((b"\n" + bytes(section.head)).lower(), section.late_single)
    expected = _repeated(head)
    assert (found is not None) == bool(expected)
    assert found is None or found.lower() in expected
    assert len(section.late_single) <= len(SINGLE) + 1  # no more are kept once one repeats


def test_a_second_field_just_past_the_kept_part_is_found() -> None:
    for before in range(KEPT - 30, KEPT + 2):
        filler = b"From: a@example.org\r\nX-Big: " + b"b" * (before - 30) + b"\r\n"
        message = filler + b"From: b@evil.test\r\n\r\n"
        for cuts in ([], [KEPT + 3], list(range(KEPT - 5, KEPT + 20))):
            section = HeaderSection(ROUTING)
            at = 0
            for cut in [*cuts, len(message)]:
                section.feed(message[at:cut])
                at = cut
            assert repeated_field((b"\n" + bytes(section.head)).lower(), section.late_single) == "From", (before, cuts)


def test_the_names_are_given_as_rfc_5322_spells_them() -> None:
    assert repeated_field_in(b"message-id: <a@b>\r\nMESSAGE-ID: <c@d>\r\n\r\n") == "Message-ID"
    assert repeated_field_in(b"Reply-To: a@b\r\nreply-to: c@d\r\n") == "Reply-To"  # no body at all
    assert repeated_field_in(b"From: a@b\r\nSubject: x\r\n\r\nFrom: in the body\r\n") is None
