"""The address check every door shares (`pigeon.smtp.address`): lengths in octets, address
literals, refused characters; and SMTP and HTTP injection refusing the same addresses with
the same text."""

from __future__ import annotations

import ipaddress
import re
import unicodedata

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pigeon.compose import ComposeError, InjectRecipient, InjectRequest, check_request, recipient_problem
from pigeon.listener.http import openapi
from pigeon.smtp import address
from pigeon.smtp.address import Kind
from pigeon.smtp.commands import parse_command
from pigeon.smtp.errors import SmtpProtocolError
from pigeon.smtp.events import MailFrom, RcptTo
from pigeon.smtp.extensions import Offer

OFFER = Offer(max_message_size=1 << 20)
ATEXT = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-/=?^_`{|}~"

atoms = st.text(ATEXT, min_size=1, max_size=10)
local_parts = st.lists(atoms, min_size=1, max_size=4).map(".".join)
labels = st.from_regex(r"[a-z0-9](?:[a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
domains = st.lists(labels, min_size=1, max_size=4).map(".".join)
valid_addresses = st.builds(lambda local, domain: f"{local}@{domain}", local_parts, domains)

BIDI = [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))]
refused_characters = st.one_of(
    st.characters(min_codepoint=0, max_codepoint=0x1F),  # C0
    st.just("\x7f"),  # DEL
    st.characters(min_codepoint=0x80, max_codepoint=0x9F),  # C1
    st.sampled_from(BIDI),
    st.characters(categories=["Cf"]),  # zero-width, BOM, other format characters
)


def _refusal(line: str) -> tuple[int, str] | None:
    try:
        parse_command(line.encode("utf-8", "surrogatepass"), OFFER)
    except SmtpProtocolError as error:
        return error.reply.code, f"{error.reply.enhanced} {' '.join(error.reply.lines)}"
    return None


def _http_refusal(email: str) -> str | None:
    request = InjectRequest("", [InjectRecipient(email)], "Subject: x\n\nhi\n", template=False)
    try:
        check_request(request)
    except ComposeError as error:
        field, text = error.field, str(error)
    else:
        return None
    assert field == "$.recipients[0].email"
    return text


@given(valid_addresses)
def test_a_well_formed_address_within_the_limits_passes_at_every_door(email: str) -> None:
    if len(email) > address.MAX_ADDRESS or len(email.partition("@")[0]) > address.MAX_LOCAL:
        return
    assert address.check(email) is None
    assert isinstance(parse_command(f"RCPT TO:<{email}>".encode(), OFFER), RcptTo)
    assert isinstance(parse_command(f"MAIL FROM:<{email}>".encode(), OFFER), MailFrom)
    assert _http_refusal(email) is None


@given(valid_addresses, refused_characters, st.integers(min_value=0))
@example("bob@example.net", "\u202e", 1)  # RIGHT-TO-LEFT OVERRIDE
@example("bob@example.net", "\u0085", 3)  # NEXT LINE, a C1 control
@example("bob@example.net", "\u2066", 8)  # LEFT-TO-RIGHT ISOLATE in the domain
def test_a_control_or_format_character_anywhere_is_refused_at_every_door_with_553(
    email: str, char: str, where: int
) -> None:
    where %= len(email) + 1
    bad = email[:where] + char + email[where:]
    problem = address.check(bad)
    assert problem is not None and problem.kind is Kind.CHARACTER
    assert f"U+{ord(char):04X}" in problem.text and "no control or format characters allowed" in problem.text
    if char in "\r\n":  # the end of the command line: no longer one command
        return
    assert _refusal(f"RCPT TO:<{bad}>") == (553, f"5.1.3 {problem.text}")
    assert _refusal(f"MAIL FROM:<{bad}> SMTPUTF8") == (553, f"5.1.7 {problem.text}")
    assert _refusal(f"MAIL FROM:<{bad}>") == (553, f"5.1.7 {problem.text}")  # not "requires SMTPUTF8"
    assert _http_refusal(bad) == problem.text


@pytest.mark.parametrize("char", [chr(c) for c in range(0x80, 0xA0)] + BIDI + ["\u200b", "\ufeff", "\u2028"])
def test_every_c1_control_and_bidi_override_is_refused(char: str) -> None:
    problem = address.check(f"a{char}b@example.net")
    assert problem is not None and problem.kind is Kind.CHARACTER, unicodedata.name(char, hex(ord(char)))


@given(st.integers(min_value=1, max_value=40))
def test_lengths_count_utf8_octets_not_characters(extra: int) -> None:
    # "é" is two octets: 32 of them fill a 64-octet local part, one more is too many.
    assert address.check("é" * 32 + "@example.net") is None
    over = address.check("é" * (32 + extra) + "@example.net")
    assert over == address.Problem(Kind.LENGTH, "Local part is longer than 64 octets (RFC 5321 4.5.3.1.1)")
    domain = ".".join(["ü" * 30] * 4)  # 243 octets, 123 characters
    assert address.check(f"a@{domain}") is None
    too_long = address.check("a" * extra + "@" + domain)
    assert (too_long is None) == (len(("a" * extra + "@" + domain).encode()) <= 254)


def test_the_longest_address_is_254_octets_at_every_door() -> None:
    longest = "a" * 64 + "@" + ".".join(["b" * 61] * 3) + ".ccc"
    assert len(longest) == 254
    assert address.check(longest) is None and _http_refusal(longest) is None
    assert _refusal(f"RCPT TO:<{longest}>") is None
    one_more = "a" + longest[1:-1] + "cc"
    text = "Address is longer than 254 octets (RFC 5321 4.5.3.1.3)"
    assert len(one_more) == 255
    assert _refusal(f"RCPT TO:<{one_more}>") == (501, f"5.1.3 {text}")
    assert _refusal(f"MAIL FROM:<{one_more}>") == (501, f"5.1.7 {text}")
    assert _http_refusal(one_more) == text


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_domain_label_over_63_octets_is_refused_at_every_door_and_63_is_taken(where: str) -> None:
    def domain(label: str) -> str:
        return {"first": f"{label}.example.net", "middle": f"a.{label}.net", "last": f"example.{label}"}[where]

    assert address.check("u@" + domain("b" * 63)) is None and _http_refusal("u@" + domain("b" * 63)) is None
    over = "u@" + domain("b" * 64)
    text = "Domain has a label longer than 63 octets (RFC 1035 2.3.4)"
    assert address.check(over) == address.Problem(Kind.LENGTH, text)
    assert _refusal(f"RCPT TO:<{over}>") == (501, f"5.1.3 {text}")
    assert _refusal(f"MAIL FROM:<{over}>") == (501, f"5.1.7 {text}")
    assert _http_refusal(over) == text


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_the_openapi_document_s_address_pattern_refuses_a_label_over_63_as_the_server_does(where: str) -> None:
    """A client that validates with the published schema is not told `x@<64 a>.com` is fine
    only for the server to refuse it."""
    documented = openapi.document()["components"]["schemas"]["InjectRecipient"]["properties"]["email"]
    pattern = re.compile(documented["pattern"])
    assert "63" in documented["description"]

    def domain(label: str) -> str:
        return {"first": f"{label}.example.net", "middle": f"a.{label}.net", "last": f"example.{label}"}[where]

    assert pattern.search("x@" + domain("a" * 63)) and address.check("x@" + domain("a" * 63)) is None
    assert not pattern.search("x@" + domain("a" * 64)) and address.check("x@" + domain("a" * 64)) is not None


def test_a_u_label_is_measured_as_its_a_label() -> None:
    # 20 "ü" are 40 octets of UTF-8 but a 26-octet A-label; 60 have no A-label within 63.
    assert address.check("u@" + "ü" * 20 + ".example") is None
    assert address.check("u@" + "ü" * 60 + ".example") is not None


@given(st.ip_addresses(v=4))
def test_an_ipv4_literal_is_an_address(ip: ipaddress.IPv4Address) -> None:
    assert address.check(f"postmaster@[{ip}]") is None


@given(st.ip_addresses(v=6), st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True))
def test_an_ipv6_literal_is_an_address_but_not_with_a_zone(ip: ipaddress.IPv6Address, zone: str) -> None:
    assert address.check(f"postmaster@[IPv6:{ip}]") is None
    zoned = f"postmaster@[IPv6:{ip}%{zone}]"
    text = "Not a valid address literal: [IPv4] or [IPv6:...] (RFC 5321 4.1.3)"
    assert address.check(zoned) == address.Problem(Kind.LITERAL, text)
    assert _refusal(f"RCPT TO:<{zoned}>") == (501, f"5.1.3 {text}")
    assert _http_refusal(zoned) == text


@pytest.mark.parametrize("literal", ["[1.2.3]", "[999.1.1.1]", "[IPv6:1.2.3.4]", "[::1]", "[IPv6:fe80::1%eth0]"])
def test_a_malformed_address_literal_is_refused(literal: str) -> None:
    problem = address.check(f"a@{literal}")
    assert problem is not None and problem.kind is Kind.LITERAL


@given(st.text(max_size=300))
def test_any_text_is_an_address_or_a_problem_never_an_exception(text: str) -> None:
    problem = address.check(text)
    assert problem is None or (isinstance(problem, address.Problem) and problem.text.isprintable())
    if problem is None:
        assert _http_refusal(text) is None


def test_the_json_schema_pattern_leaves_out_the_refused_characters() -> None:
    from pigeon.compose import Email

    decoder = msgspec.json.Decoder(Email)
    assert decoder.decode(msgspec.json.encode("jürgen@bücher.example")) == "jürgen@bücher.example"
    for char in ["\u0085", "\u202e", "\u2066", "\u200b", "\ufeff", "\u00ad"]:
        with pytest.raises(msgspec.ValidationError):
            decoder.decode(msgspec.json.encode(f"a{char}b@example.net"))


def test_the_same_mailbox_is_the_same_local_part_and_domain_in_any_case() -> None:
    key = address.same_mailbox_key
    assert key("Bob@Example.NET") == key("Bob@example.net")
    assert key("Bob@example.net") != key("bob@example.net")  # RFC 5321 2.4: the local part is the host's


def test_a_quoted_local_part_that_is_a_dot_string_is_the_same_mailbox_as_the_dot_string() -> None:
    key = address.same_mailbox_key
    assert key('"dd"@example.net') == key("dd@example.net") == key('"d\\d"@Example.NET')
    assert key('"a.b"@example.net') == key("a.b@example.net")
    assert key('"first\\ last"@example.net') == key('"first last"@example.net')  # a quoted pair is its character
    assert key('"a..b"@example.net') != key("a.b@example.net")
    assert key('"DD"@example.net') != key("dd@example.net")  # the local part keeps its case


def test_a_quoted_local_part_goes_bare_when_it_is_a_dot_string_and_quoted_when_it_must() -> None:
    assert address.with_a_label('"dd"@bücher.example') == "dd@xn--bcher-kva.example"
    assert address.with_a_label('"first\\ last"@example.net') == '"first last"@example.net'
    assert address.with_a_label('"a\\"b"@example.net') == '"a\\"b"@example.net'  # what must be quoted, is
    assert address.with_a_label('""@example.net') == '""@example.net'
    assert address.with_a_label('"a@b"@example.net') == '"a@b"@example.net'


def test_a_local_part_s_value_is_a_quoted_string_s_content_with_its_quoted_pairs_resolved() -> None:
    assert address.local_value('"reply+q z"') == "reply+q z"
    assert address.local_value('"a\\"b\\\\c"') == 'a"b\\c'
    assert address.local_value('"dd"') == address.local_value("dd") == "dd"
    assert address.local_value('""') == ""
    assert address.local_value('"') == '"'  # one quote is no quoted string


@pytest.mark.parametrize("route", ["@r1.test:", "@r1.test,@r2.test:", "@[192.0.2.1]:"])
def test_a_source_route_is_taken_off_an_smtp_path_and_refused_in_an_address_saying_so(route: str) -> None:
    """RFC 5321 4.1.1.3 and appendix C: SMTP takes a source route and may ignore it; an API's
    address is no SMTP path, and is told what to send instead of "not a valid mailbox"."""
    command = parse_command(f"RCPT TO:<{route}adsr@rich.test>".encode(), OFFER)
    assert isinstance(command, RcptTo) and command.recipient == "adsr@rich.test"
    command = parse_command(f"MAIL FROM:<{route}adsr@rich.test>".encode(), OFFER)
    assert isinstance(command, MailFrom) and command.sender == "adsr@rich.test"
    problem = address.check(f"{route}adsr@rich.test")
    assert problem == address.Problem(Kind.SYNTAX, address.SOURCE_ROUTE_TEXT)
    assert _http_refusal(f"{route}adsr@rich.test") == address.SOURCE_ROUTE_TEXT


_RECIPIENT_EMAIL = msgspec.json.Decoder(InjectRecipient)


@given(st.one_of(valid_addresses, st.text(max_size=80), st.sampled_from(["postmaster", '"PostMaster"', "a@[1.2.3"])))
@example("x" * 65 + "@rich.test")
@example("adi@[300.1.1.1]")
@example("adi@\u2163.example")
@example("a\U0001f600@example.net")  # beyond the BMP: the schema's pattern has none, the check takes it
def test_the_recipient_problem_a_door_refuses_alone_is_what_the_injection_api_refuses_and_says(text: str) -> None:
    """KumoMTA's door refuses a recipient alone by `recipient_problem`; Pigeon's refuses the
    request by its schema, then `check_request`, with the check's text (else the syntax text)."""
    problem = recipient_problem(text)
    try:
        _RECIPIENT_EMAIL.decode(msgspec.json.encode({"email": text}))
    except msgspec.ValidationError:
        checked = address.check(text)
        assert problem is not None and problem.text == (checked.text if checked else address.SYNTAX_TEXT)
        return
    if re.fullmatch(address.POSTMASTER_PATTERN, text):  # made [smtp] postmaster before it is checked
        assert problem is None
        return
    assert (problem.text if problem else None) == _http_refusal(text)
