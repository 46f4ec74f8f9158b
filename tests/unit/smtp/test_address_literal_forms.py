"""An address literal's IPv4 address is four Snums of 1 to 3 decimal digits, each at most 255
(RFC 5321 4.1.3): leading zeros are allowed (`[127.000.0.1]`), at every door. Written any way,
one host is one domain: `[IPv6:::1]` and `[IPv6:0::1]` name one mailbox (one copy, one queue),
and the literal goes on the wire in its one form, the host Pigeon connects to (a next hop
reading `010` as octal, as inet_aton does, would name another)."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pigeon.intake import _unique
from pigeon.listener.http import openapi
from pigeon.message import Recipient
from pigeon.smtp import address
from pigeon.smtp.commands import parse_command
from pigeon.smtp.events import RcptTo
from pigeon.smtp.extensions import Offer

from .harness import http_problem

OFFER = Offer(max_message_size=1 << 20)
_DOCUMENTED = re.compile(
    openapi.document()["components"]["schemas"]["InjectRecipient"]["properties"]["email"]["pattern"]
)


@st.composite
def padded_ipv4(draw: st.DrawFn) -> tuple[str, str]:
    """An IPv4 address written with leading zeros (each Snum 1 to 3 digits), and as usual."""
    octets = draw(st.lists(st.integers(0, 255), min_size=4, max_size=4))
    written = [str(o).zfill(draw(st.integers(len(str(o)), 3))) for o in octets]
    return ".".join(written), ".".join(map(str, octets))


@given(padded_ipv4())
def test_an_ipv4_literal_with_leading_zeros_is_taken_at_every_door_as_one_host(ipv4: tuple[str, str]) -> None:
    written, plain = ipv4
    email = f"u@[{written}]"
    assert address.check(email) is None
    assert isinstance(parse_command(f"RCPT TO:<{email}>".encode(), OFFER), RcptTo)
    assert http_problem(email) is None
    assert _DOCUMENTED.search(email)  # the OpenAPI document's pattern takes it too
    assert address.same_mailbox_key(email) == address.same_mailbox_key(f"u@[{plain}]")
    assert address.with_a_label(email) == f"u@[{plain}]"
    assert Recipient(email).domain == f"[{plain}]"


@pytest.mark.parametrize("snum", ["256", "0256", "1000", "", "+1", "1 ", "٣"])
def test_an_snum_over_255_or_of_other_than_1_to_3_digits_is_refused(snum: str) -> None:
    email = f"u@[1.2.3.{snum}]"
    problem = address.check(email)
    assert problem is not None and problem.kind in (address.Kind.LITERAL, address.Kind.SYNTAX)
    assert not _DOCUMENTED.search(email)


@given(st.ip_addresses(v=6))
def test_an_ipv6_literal_however_written_is_one_mailbox_and_goes_on_the_wire_compressed(
    ip: ipaddress.IPv6Address,
) -> None:
    exploded = f"u@[ipv6:{ip.exploded.upper()}]"
    compressed = f"u@[IPv6:{ip.compressed}]"
    assert address.check(exploded) is None
    assert address.same_mailbox_key(exploded) == address.same_mailbox_key(compressed)
    assert address.with_a_label(exploded) == address.with_a_label(compressed)
    assert address.with_a_label(exploded).startswith("u@[IPv6:")


def test_the_loopback_written_two_ways_is_one_recipient_one_copy() -> None:
    recipients = [Recipient("u@[IPv6:::1]"), Recipient("u@[IPv6:0::1]"), Recipient("u@[IPv6:0:0:0:0:0:0:0:1]")]
    assert [r.address for r in _unique(recipients)] == ["u@[IPv6:::1]"]
    assert [r.address for r in _unique([Recipient("u@[127.0.0.1]"), Recipient("u@[127.000.0.001]")])] == [
        "u@[127.0.0.1]"
    ]
    assert {r.domain for r in recipients} == {"[ipv6:::1]"}
    assert address.with_a_label("u@[IPv6:0::1]") == "u@[IPv6:::1]"
    assert address.with_a_label("u@[127.0.0.010]") == "u@[127.0.0.10]"  # decimal: never the 8 of octal


def test_an_ipv4_mapped_literal_is_written_with_its_ipv4_address() -> None:
    assert address.with_a_label("u@[IPv6:0:0:0:0:0:ffff:c000:0201]") == "u@[IPv6:::ffff:192.0.2.1]"
    assert address.with_a_label("u@[IPv6:::ffff:192.000.2.001]") == "u@[IPv6:::ffff:192.0.2.1]"
