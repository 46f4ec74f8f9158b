"""The intake's read of a header section as it arrives: the Received fields and the routing
headers are found however long the section is and however the writes split it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.header_section import KEPT, HeaderSection, RoutingNames, received_fields
from pigeon.header_section import _first_value as _checked_value
from pigeon.intake import _routing_value

ROUTING = RoutingNames((b"x-tenant", b"x-campaign"))
BIG = b"X-Big: " + b"b" * 900 + b"\r\n"
FIELDS = [
    b"Received: from a.test; Mon, 1 Jan 2024 00:00:00 +0000\r\n",
    b"RECEIVED:by b.test\r\n",
    b"Received :from c.test\r\n",  # the obsolete form (RFC 5322 4.5): a Received field all the same
    b"received\t \t:by d.test\r\n",
    b"Received-SPF: pass\r\n",
    b"X-Received: not one\r\n",
    b"Subject: Received: not one either\r\n",
    b"X-Tenant: acme\r\n",
    b"x-tenant :\r\n\tother\r\n",
    b"X-Tenant-Id: not a routing field\r\n",
    b"X-Campaign:\r\n spring\r\n  sale\r\n",
    b"Comments: folded\r\n received: a continuation, not a field\r\n",
    BIG,
    b"X-Date: not one\r\n",
]
# What a submission is checked by, read wherever it is (a message with two of one is refused
# for that first: the scan past the kept part may stop looking then).
CHECKED = [
    [b"Date: Mon, 1 Jan 2024 00:00:00 +0000\r\n", b"DATE :\r\n yesterday\r\n"],
    [b"From: a@example.org\r\n", b"from:\r\n\t\r\n"],
    [b"Message-Id\t:<x" + b"\r\n y" * 300 + b"@z>\r\n", b"Message-ID: <a@b>\r\n"],
]


def _feed(message: bytes, cuts: list[int]) -> HeaderSection:
    section = HeaderSection(ROUTING)
    at = 0
    for cut in [*sorted(cuts), len(message)]:
        if not section.ended:
            section.feed(message[at:cut])
        at = cut
    return section


def _header_section(message: bytes) -> bytes:
    end = message.find(b"\r\n\r\n")
    return b"\n" + (message if end < 0 else message[: end + 2])


def _value(section: HeaderSection, marker: bytes) -> str | None:
    head = b"\n" + bytes(section.head)
    return _routing_value(head, head.lower(), marker, section.late_fields)


def _count_fields(header_section: bytes, name: bytes) -> int:
    """How many fields called `name` the header section has: the slow, plain way."""
    starts = [line.partition(b":") for line in header_section.split(b"\r\n") if line[:1] not in (b" ", b"\t")]
    return sum(1 for key, colon, _ in starts if colon and key.rstrip(b" \t").lower() == name)


def _first_field(header_section: bytes, name: bytes) -> list[bytes] | None:
    """The first field called `name`: its value's first line, then its continuation lines,
    the slow, plain way."""
    lines = header_section.split(b"\r\n")
    for number, line in enumerate(lines):
        key, colon, value = line.partition(b":")
        if line[:1] in (b" ", b"\t") or not colon or key.rstrip(b" \t").lower() != name:
            continue
        more = []
        for following in lines[number + 1 :]:
            if following[:1] not in (b" ", b"\t"):
                break
            more.append(following)
        return [value, *more]
    return None


def _first_raw_value(header_section: bytes, name: bytes) -> tuple[bytes, bool] | None:
    """The value of the first field called `name`, unfolded (its CRLFs out), and True (whole)."""
    field = _first_field(header_section, name)
    return (b"".join(field), True) if field is not None else None


def _first_value(header_section: bytes, name: bytes) -> str | None:
    """The value of the first field called `name`, unfolded, as a queue name part."""
    field = _first_field(header_section, name)
    if field is None:
        return None
    return "_".join(b" ".join(field).decode().split()).replace(":", "_").replace("@", "_") or None


@settings(max_examples=300, deadline=None)
@given(
    fields=st.lists(st.sampled_from(FIELDS), max_size=300),
    big=st.integers(0, 150),
    ends=st.booleans(),
    data=st.data(),
)
def test_received_fields_and_routing_headers_are_found_however_the_writes_split_the_section(
    fields: list[bytes], big: int, ends: bool, data: st.DataObject
) -> None:
    # Big fields first, so that most examples run past the kept part.
    head = b"Received: by us\r\n" + BIG * big + b"".join(fields)  # ours first, as the intake writes it
    message = head + (b"\r\nReceived: in the body\r\nX-Tenant: body\r\n" if ends else b"")
    # Writes of one size (a field split between two writes in every way, some time or other),
    # and a few cuts anywhere.
    step = data.draw(st.integers(5, 3000))
    cuts = [*range(step, len(message), step), *data.draw(st.lists(st.integers(0, len(message)), max_size=10))]
    section = _feed(message, cuts)
    whole = _header_section(message)
    counted = received_fields((b"\n" + bytes(section.head)).lower()) + section.late_received
    assert counted == _count_fields(whole[1:], b"received")
    assert section.ended == ends
    assert bytes(section.head) == whole[1 : KEPT + 1]
    for name in (b"x-tenant", b"x-campaign"):
        assert _value(section, b"\n" + name + b":") == _first_value(whole[1:], name)


def test_a_routing_field_past_the_kept_part_is_read_whole_even_split_byte_by_byte() -> None:
    message = BIG * 80 + b"X-Campaign\t :\r\n spring\r\nX-Tenant: acme\r\nSubject: s\r\n\r\nbody\r\n"
    section = _feed(message, list(range(len(message))))
    assert section.late_routing and len(section.head) == KEPT
    assert bytes(section.late_fields[b"x-campaign"].text) == b"X-Campaign\t :\r\n spring\r\n"
    assert (_value(section, b"\nx-tenant:"), _value(section, b"\nx-campaign:")) == ("acme", "spring")


def test_a_short_header_section_is_kept_whole_and_nothing_is_found_past_it() -> None:
    message = b"Received: by a\r\nX-Tenant: acme\r\n\r\nReceived: in the body\r\n"
    section = _feed(message, [3, 17, 31, 32, 33])
    assert section.ended and bytes(section.head) == b"Received: by a\r\nX-Tenant: acme\r\n"
    assert (section.late_received, section.late_routing, section.late_fields) == (0, False, {})


def test_a_header_section_that_ends_about_where_the_kept_part_does_is_kept_whole() -> None:
    for length in range(KEPT - 6, KEPT + 6):
        filler = b"X-Big: " + b"b" * (length - 9) + b"\r\n"  # a header section of `length` bytes
        message = filler + b"\r\nReceived: in the body\r\n"
        for cuts in ([], [KEPT], [KEPT - 1, KEPT + 1], list(range(KEPT - 5, KEPT + 5))):
            section = _feed(message, cuts)
            assert section.ended and bytes(section.head) == filler[:KEPT], (length, cuts)
            assert (section.late_received, section.late_routing) == (0, False)


def test_a_routing_field_the_kept_part_cuts_off_is_read_whole() -> None:
    for before in range(KEPT - 30, KEPT + 2):
        filler = b"X-Big: " + b"b" * (before - 9) + b"\r\n"  # the routing field starts at `before`
        message = filler + b"X-Tenant: acme\r\n corp\r\nX-Tenant: other\r\n\r\n"
        for cuts in ([], [KEPT + 7], list(range(KEPT - 5, KEPT + 40))):
            assert _value(_feed(message, cuts), b"\nx-tenant:") == "acme_corp", (before, cuts)


def test_a_date_the_kept_part_cuts_off_is_read_whole_wherever_it_starts() -> None:
    """The Date a submission is checked by, cut off by the kept part's end: its start in the
    last bytes of the kept part or far before them (a long folded comment), or its name split."""
    date = b"Date: Mon, 1 Jan 2024 12:00:00 +0000 (" + b"\r\n c" * 700 + b")\r\n"
    for before in [*range(KEPT - 30, KEPT + 2), KEPT - 2000]:
        filler = b"X-Big: " + b"b" * (before - 9) + b"\r\n"  # the Date starts at `before`
        message = filler + date + b"Date: second\r\n\r\n"
        for cuts in ([], [KEPT + 7], list(range(KEPT - 5, KEPT + 40))):
            section = _feed(message, cuts)
            kept = b"\n" + bytes(section.head)
            found = _checked_value(kept, kept.lower(), b"date", True, section.late_checked)
            assert found == (date[5:-2].replace(b"\r\n", b""), True), (before, cuts)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.lists(st.sampled_from([field for field in FIELDS if not field.startswith(b"Subject")]), max_size=100),
    big=st.integers(0, 150),
    data=st.data(),
)
def test_the_first_from_date_and_message_id_are_read_whole_however_the_writes_split_the_section(
    fields: list[bytes], big: int, data: st.DataObject
) -> None:
    fields = list(fields)
    for forms in CHECKED:  # one of each, or none, anywhere
        if (form := data.draw(st.sampled_from([None, *forms]))) is not None:
            fields.insert(data.draw(st.integers(0, len(fields))), form)
    message = b"Received: by us\r\n" + BIG * big + b"".join(fields) + b"\r\nDate: in the body\r\n"
    step = data.draw(st.integers(5, 3000))
    cuts = [*range(step, len(message), step), *data.draw(st.lists(st.integers(0, len(message)), max_size=10))]
    section = _feed(message, cuts)
    whole = _header_section(message)
    kept = b"\n" + bytes(section.head)
    for name in (b"from", b"date", b"message-id"):
        found = _checked_value(kept, kept.lower(), name, len(section.head) >= KEPT, section.late_checked)
        assert found == _first_raw_value(whole[1:], name), name
