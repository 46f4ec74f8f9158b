"""Composing injected mail: templates in a sandbox, strict variables, CRLF, headers Pigeon adds."""

from __future__ import annotations

import email
import email.policy
import email.utils
import re
from email.header import decode_header, make_header
from email.message import EmailMessage
from email.policy import default

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pigeon.compose import Composed, ComposeError, Composer, InjectRecipient, InjectRequest, check_request
from pigeon.dkim.canonical import header_fields
from pigeon.dkim.signer import author_domain
from pigeon.smtp.client import Recipient, needs_smtputf8
from pigeon.smtp.framing import check_message

DECODE = msgspec.json.Decoder(InjectRequest)


def _request(content: object, **extra: object) -> InjectRequest:
    body = {"envelope_sender": "a@example.org", "recipients": [{"email": "r@example.net"}], "content": content}
    body.update(extra)
    return DECODE.decode(msgspec.json.encode(body))


def _compose(request: InjectRequest) -> bytes:
    check_request(request)
    return Composer(request, "mx.test", "X-Tenant", "X-Campaign").compose(request.recipients[0]).data


@pytest.mark.parametrize(
    "attack",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{% set x = [] %}{{ x.append(1) }}",  # the sandbox is immutable: no mutating builtins
    ],
)
def test_templates_cannot_reach_python_internals(attack: str) -> None:
    request = _request(f"Subject: x\n\n{attack}\n")
    with pytest.raises(ComposeError):
        _compose(request)


def test_an_undefined_variable_is_an_error_not_an_empty_string() -> None:
    with pytest.raises(ComposeError, match="'first_name' is undefined"):
        _compose(_request("Subject: x\n\nDear {{ first_name }},\n"))


def test_template_false_sends_braces_as_they_are() -> None:
    data = _compose(_request("Subject: {{ literally }}\n\nbody\n", template=False))
    assert b"\r\nSubject: {{ literally }}\r\n" in data


def test_raw_content_keeps_its_own_date_and_message_id() -> None:
    raw = "Date: Mon, 1 Jan 2024 00:00:00 +0000\nMessage-ID: <mine@example.org>\nSubject: x\n\nbody"
    data = _compose(_request(raw))
    assert data.count(b"Date: ") == 1 and data.count(b"Message-ID: ") == 1
    assert b"<mine@example.org>" in data
    assert data.endswith(b"\r\n\r\nbody\r\n")  # a final line break is added


def test_raw_content_with_blanks_before_a_fields_colon_keeps_its_own_date() -> None:
    data = _compose(_request("Date : Mon, 1 Jan 2024 00:00:00 +0000\nMessage-ID :<m@example.org>\n\nbody"))
    assert data.lower().count(b"date") == 1 and data.lower().count(b"message-id") == 1


@pytest.mark.parametrize("raw", ["just a body line\nand another", "\nafter an empty line", "", "<html> no: field"])
def test_raw_content_without_a_header_section_is_all_body(raw: str) -> None:
    data = _compose(_request(raw))
    message = email.message_from_bytes(data, policy=default)
    assert message["Date"] and message["Message-ID"]
    assert message.defects == []
    head, _, body = data.partition(b"\r\n\r\n")
    assert body == _crlf_body(raw.removeprefix("\n")), data
    assert all(b":" in line for line in head.split(b"\r\n")), head


def test_raw_content_whose_header_stops_at_a_line_that_is_no_field_has_its_body_start_there() -> None:
    data = _compose(_request("Hello: world\n folded on\nThis is body text\nmore: body\n", template=False))
    message = email.message_from_bytes(data, policy=default)
    assert message["Hello"] == "world folded on" and message.defects == []
    assert data.endswith(b"Hello: world\r\n folded on\r\n\r\nThis is body text\r\nmore: body\r\n")


def _crlf_body(text: str) -> bytes:
    data = text.replace("\n", "\r\n").encode()
    return data if not data or data.endswith(b"\r\n") else data + b"\r\n"


def test_tenant_and_campaign_become_the_routing_headers() -> None:
    data = _compose(_request("Subject: x\n\nbody\n", tenant="acme", campaign="spring"))
    message = email.message_from_bytes(data, policy=default)
    assert (message["X-Tenant"], message["X-Campaign"]) == ("acme", "spring")


def test_non_ascii_addresses_need_smtputf8_and_non_ascii_text_does_not() -> None:
    parts = {"from": {"email": "a@example.org"}, "subject": "Grüße", "text": "Grüße"}
    request = _request(parts)
    composed = Composer(request, "mx.test", "X-Tenant", "X-Campaign").compose(request.recipients[0])
    assert composed.data.isascii()  # encoded words and a transfer encoding
    assert not composed.smtputf8
    body = {"envelope_sender": "a@example.org", "recipients": [{"email": "jörg@example.net"}], "content": parts}
    request = DECODE.decode(msgspec.json.encode(body))
    composed = Composer(request, "mx.test", "X-Tenant", "X-Campaign").compose(request.recipients[0])
    assert composed.smtputf8


def test_a_header_name_with_a_colon_or_space_is_refused() -> None:
    for name in ("X-Bad: injected", "X Bad", ""):
        parts = {"from": {"email": "a@example.org"}, "text": "x", "headers": {name: "v"}}
        with pytest.raises(msgspec.ValidationError, match=r"\$\.content\.headers"):
            _request(parts)


def test_parts_headers_set_the_date_and_message_id_once() -> None:
    parts = {
        "from": {"email": "a@example.org"},
        "subject": "S",
        "text": "t",
        "headers": {"message-id": "<inj-{{ 40 + 2 }}@example.org>", "Date": "Mon, 1 Jan 2024 00:00:00 +0000"},
    }
    message = email.message_from_bytes(_compose(_request(parts)), policy=default)
    assert message.get_all("Message-ID") == ["<inj-42@example.org>"]
    assert [str(date) for date in message.get_all("Date")] == ["Mon, 01 Jan 2024 00:00:00 +0000"]
    assert message.get_all("Subject") == ["S"] and message.get_all("From") == ["a@example.org"]


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("From", "content.from"),
        ("subject", "content.subject"),
        ("Reply-To", "content.reply_to"),
        ("MIME-Version", "the parts"),
        ("Content-Type", "the parts"),
        ("content-transfer-encoding", "the parts"),
    ],
)
def test_parts_headers_may_not_write_a_field_pigeon_writes(name: str, where: str) -> None:
    """A second From (or Subject, ...) breaks RFC 5322, and one From a tenant chooses would be
    signed with the sender's DKIM key beside the real one."""
    parts = {"from": {"email": "a@example.org"}, "text": "t", "headers": {name: "evil@other.test"}}
    with pytest.raises(ComposeError, match=f"written by Pigeon from .*{where}") as refused:
        _compose(_request(parts))
    assert refused.value.field == f"$.content.headers.{name}"


_TEAM = ("Team", ["a@example.com", "b@example.com"])


@pytest.mark.parametrize(
    ("name", "given", "written", "groups"),
    [
        ("To", "undisclosed-recipients:;", "undisclosed-recipients:;", [("undisclosed-recipients", [])]),
        ("To", "Team: a@example.com, b@example.com;", "Team: a@example.com, b@example.com;", [_TEAM]),
        ("Cc", "undisclosed-recipients:;", "undisclosed-recipients:;", [("undisclosed-recipients", [])]),
        (
            "Cc",
            'Ann <ann@example.net>, Team: a@example.com, "Doe, J" <j@example.net>;, Other:;',
            'Ann <ann@example.net>, Team: a@example.com, "Doe, J" <j@example.net>;, Other:;',
            [(None, ["ann@example.net"]), ("Team", ["a@example.com", "j@example.net"]), ("Other", [])],
        ),
        (
            "Resent-To",
            "Équipe: a@example.com;",
            "=?utf-8?q?=C3=89quipe?=: a@example.com;",
            [("Équipe", ["a@example.com"])],
        ),
    ],
    ids=["to-undisclosed", "to-team", "cc-undisclosed", "cc-mixed", "resent-to-encoded-name"],
)
def test_a_group_in_an_address_field_of_parts_is_written_a_group(
    name: str, given: str, written: str, groups: list[tuple[str | None, list[str]]]
) -> None:
    """Found from outside: `To: undisclosed-recipients:;` (RFC 5322 3.4 group syntax, common in
    bulk mail) was refused, and `Team: a@example.com, b@example.com;` lost its group."""
    parts = {"from": {"email": "a@example.org"}, "text": "t", "headers": {name: given}}
    data = _compose(_request(parts))
    assert check_message(data, max_size=len(data), max_line_length=998) is None  # as SMTP reception would
    assert f"\r\n{name}: {written}\r\n".encode() in data.replace(b"\r\n ", b" ")  # (unfolded)
    message = email.message_from_bytes(data, policy=email.policy.strict)
    assert message.get_all(name) == [message[name]]  # one: a To given replaces the recipient's
    read = [(group.display_name, [m.addr_spec for m in group.addresses]) for group in message[name].groups]
    assert read == groups


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("Sender", "undisclosed-recipients:;", "must be mailboxes, not a group"),
        ("Resent-From", "Team: a@example.com;", "must be mailboxes, not a group"),
        ("To", "Team: a@example.com, b@example.com", 'is not closed: end it with ";"'),
        ("Cc", "A: B: c@example.com;;", "holds another group"),
        ("Cc", "a@example.com Team:;", "a group needs a name before its colon"),
        ("Cc", "Team: nobody;", "address 1 \\('nobody'\\)"),
    ],
    ids=["sender", "resent-from", "unclosed", "nested", "no-comma", "bad-member"],
)
def test_a_group_where_none_may_be_or_a_broken_one_is_refused_naming_the_field(name: str, value: str, why: str) -> None:
    parts = {"from": {"email": "a@example.org"}, "text": "t", "headers": {name: value}}
    with pytest.raises(ComposeError, match=why) as refused:
        check_request(_request(parts))
    assert refused.value.field == f"$.content.headers.{name}"


def test_parts_headers_may_not_name_a_field_twice() -> None:
    parts = {"from": {"email": "a@example.org"}, "text": "t", "headers": {"X-Mailer": "a", "x-mailer": "b"}}
    with pytest.raises(ComposeError, match="again"):
        _compose(_request(parts))


def test_the_date_pigeon_writes_is_utc_with_a_known_zone() -> None:
    for content in ("Subject: x\n\nbody\n", {"from": {"email": "a@example.org"}, "text": "t"}):
        data = _compose(_request(content))
        date = next(line for line in data.split(b"\r\n") if line.startswith(b"Date: "))
        assert date.endswith(b" +0000"), date  # "-0000" says the zone is unknown (RFC 5322 3.3)


def _built(parts: dict[str, object], recipient: str = "r@example.net") -> tuple[Composed, dict[bytes, bytes]]:
    """The composed message and its header fields, each unfolded, by lower-case name."""
    body = {"envelope_sender": "bounce@example.org", "recipients": [{"email": recipient}], "content": parts}
    request = DECODE.decode(msgspec.json.encode(body))
    check_request(request)
    composed = Composer(request, "mx.test", "X-Tenant", "X-Campaign").compose(request.recipients[0])
    head = composed.data[: composed.data.index(b"\r\n\r\n") + 2]
    fields = {field.name: field.raw.replace(b"\r\n ", b" ").rstrip(b"\r\n") for field in header_fields(head)}
    return composed, fields


def test_a_unicode_address_is_an_address_in_the_field_not_part_of_an_encoded_word() -> None:
    # The outside tester's request: From was one encoded word, address and all, so no DKIM
    # signer found its domain and the next hop, without SMTPUTF8, got it unparseable.
    parts = {"from": {"email": "jörg@bücher.example", "name": "Jörg"}, "subject": "s", "text": "b"}
    composed, fields = _built(parts)
    assert fields[b"from"] == "From: =?utf-8?q?J=C3=B6rg?= <jörg@bücher.example>".encode()
    assert author_domain(header_fields(composed.data)) == "xn--bcher-kva.example"
    assert composed.smtputf8  # a local part that is not ASCII has no other form (RFC 6532)


def test_an_ascii_local_part_goes_with_the_a_label_and_the_message_needs_no_smtputf8() -> None:
    parts = {
        "from": {"email": "joerg@bücher.example", "name": "Jörg"},
        "reply_to": {"email": "help@bücher.example", "name": "Hilfe für Bücher"},
        "subject": "s",
        "text": "b",
    }
    composed, fields = _built(parts, recipient="bob@bücher.example")
    assert fields[b"from"] == b"From: =?utf-8?q?J=C3=B6rg?= <joerg@xn--bcher-kva.example>"
    assert fields[b"to"] == b"To: bob@xn--bcher-kva.example"
    assert fields[b"reply-to"] == b"Reply-To: =?utf-8?q?Hilfe_f=C3=BCr_B=C3=BCcher?= <help@xn--bcher-kva.example>"
    assert composed.data.isascii()
    assert author_domain(header_fields(composed.data)) == "xn--bcher-kva.example"
    # Nothing asks for SMTPUTF8, and delivery (which sends the envelope with A-labels too)
    # finds no need of it: the mail goes to any server.
    assert not composed.smtputf8
    recipients = [Recipient("bob@bücher.example")]
    assert not needs_smtputf8("bounce@example.org", recipients)


def test_a_unicode_reply_to_asks_for_smtputf8_too() -> None:
    # Only From and the recipient were looked at: UTF-8 in Reply-To went to any server.
    parts = {"from": {"email": "a@example.org"}, "reply_to": {"email": "jörg@bücher.example"}, "text": "b"}
    composed, fields = _built(parts)
    assert fields[b"reply-to"] == "Reply-To: <jörg@bücher.example>".encode()
    assert composed.smtputf8


@pytest.mark.parametrize("length", [70, 75, 200, 2000])
def test_a_long_ascii_name_without_spaces_keeps_the_address_parseable(length: int) -> None:
    composed, fields = _built({"from": {"email": "a@example.org", "name": "x" * length}, "text": "b"})
    if length < 998 - len("From: "):  # as it is, on a line of its own
        assert fields[b"from"] == f"From: {'x' * length} <a@example.org>".encode()
    else:  # too long for any line: RFC 2047 words, which readers join again (RFC 2047 6.2)
        name, addr = email.utils.parseaddr(fields[b"from"].decode().removeprefix("From: "))
        assert (str(make_header(decode_header(name))), addr) == ("x" * length, "a@example.org")
    assert max(len(line) for line in composed.data.split(b"\r\n")) <= 998
    assert author_domain(header_fields(composed.data)) == "example.org"


_LINE_LIMITS = st.integers(78, 998)
# Any text, and long words and lines (of up to 1,500 characters) that ask for folding.
_TEXT = st.text(max_size=200) | st.builds(
    lambda word, count, between: between.join([word] * count),
    st.text(alphabet="xü-", min_size=1, max_size=300),
    st.integers(1, 5),
    st.sampled_from([" ", "", "\n"]),
)
_ADDRESSES = st.sampled_from(["a@example.org", "jörg@bücher.example", "x" * 30 + "@" + "d" * 30 + ".example"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_line=_LINE_LIMITS,
    text=_TEXT,
    html=_TEXT,
    subject=_TEXT,
    names=st.tuples(_TEXT, _TEXT, _TEXT),
    addresses=st.tuples(_ADDRESSES, _ADDRESSES, _ADDRESSES),
    header_value=_TEXT,
    # (A control character in a file name is refused: test_a_file_name_with_a_control_character_is_refused.)
    file_name=_TEXT.filter(lambda name: name.strip() and not re.search("[\x00-\x1f\x7f-\x9f]", name)),
    tenant=st.from_regex(r"[a-zü]{1,255}", fullmatch=True),
)
# The outside tester's: max_line_length 200 and a text (or HTML) of one 250-character line,
# which went out as 7bit and was refused by the content check, 554 5.6.0.
@example(200, "x" * 250, "y" * 250, "s", ("", "", ""), ("a@example.org",) * 3, "v", "f", "acme")
@example(78, "x" * 79, "<p>" + "y" * 76, "word " * 40, ("x" * 150, "ü" * 80, "y " * 60), ("a@example.org",) * 3,
         "z" * 100, "n" * 300 + ".pdf", "t" * 255)  # fmt: skip
@example(78, "", "", "", ("", "", ""), ("a@example.org",) * 3, "", "0 ", "a")  # (CI's: a file name ending in a blank)
def test_what_the_composer_writes_passes_the_content_check_at_any_max_line_length(
    max_line: int,
    text: str,
    html: str,
    subject: str,
    names: tuple[str, str, str],
    addresses: tuple[str, str, str],
    header_value: str,
    file_name: str,
    tenant: str,
) -> None:
    """Pigeon refuses no message it composed itself: the text goes quoted-printable when a
    line of it is over the node's limit, and every field it writes is folded within it."""
    clean = [value.replace("\0", "") for value in (text, html, subject, *names, header_value, file_name)]
    text, html, subject, from_name, to_name, reply_name, header_value, file_name = clean
    attachments = [
        {"data": "x", "file_name": file_name or "f", "content_type": "application/pdf"},
        {"data": "aW1n", "base64": True, "content_type": "image/png", "content_id": "logo", "file_name": file_name},
    ]
    parts = {
        "from": {"email": addresses[0], "name": from_name},
        "reply_to": {"email": addresses[2], "name": reply_name},
        "subject": subject,
        "text": text,
        "html": html,
        "headers": {"X-Long-Header-Name-" + "n" * 40: header_value},
        "attachments": attachments,
    }
    recipient = {"email": addresses[1], "name": to_name}
    tenant = tenant.encode()[: max_line - 1].decode("utf-8", "ignore")  # (one word: longer, it is refused)
    body = {"envelope_sender": "a@example.org", "recipients": [recipient], "content": parts, "tenant": tenant}
    body["template"] = False  # (the text as it is: rendering is not what is tested)
    request = DECODE.decode(msgspec.json.encode(body))
    check_request(request, max_line_length=max_line)
    hostname = "mx." + "h" * 49  # the longest the configuration lets through at 78 (pigeon.config.load)
    composer = Composer(request, hostname, "X-Tenant", "X-Campaign", max_line_length=max_line)
    data = composer.compose(request.recipients[0]).data
    assert check_message(data, max_size=len(data), max_line_length=max_line) is None
    message = email.message_from_bytes(data, policy=default)
    assert isinstance(message, EmailMessage)
    plain = message.get_body(("plain",))
    # (A text that does not end with a line break gets one: SMTP carries lines.)
    written = text.replace("\r\n", "\n").replace("\r", "\n").removesuffix("\n") + "\n"
    assert plain is not None and plain.get_content().replace("\r\n", "\n") == written
    (attached,) = list(message.iter_attachments())
    # (Written whole, `filename="0 "`; Python's parser drops the blanks around a quoted value.)
    assert attached.get_filename() == (file_name or "f").strip()


LONG_ADDRESS = "a" * 64 + "@" + "b" * 63 + "." + "c" * 63 + ".example"  # 200 octets


@pytest.mark.parametrize(
    ("change", "field", "octets"),
    [
        ({"recipients": [{"email": LONG_ADDRESS}]}, "$.recipients[0].email", len(f" <{LONG_ADDRESS}>")),
        ({"from": {"email": LONG_ADDRESS}}, "$.content.from.email", len(f" <{LONG_ADDRESS}>")),
        ({"reply_to": {"email": LONG_ADDRESS}}, "$.content.reply_to.email", len(f" <{LONG_ADDRESS}>")),
        ({"headers": {"X-" + "n" * 197: "v"}}, "$.content.headers.X-" + "n" * 197, len("X-" + "n" * 197 + ": ")),
        ({"tenant": "t" * 200}, "$.tenant", len(" " + "t" * 200)),
        (
            {"attachments": [{"data": "x", "content_type": "application/" + "x" * 200}]},
            "$.content.attachments[0].content_type",
            len("Content-Type: application/" + "x" * 200 + ";"),
        ),
        (
            {"attachments": [{"data": "x", "content_id": "c" * 200}]},
            "$.content.attachments[0].content_id",
            len(" <" + "c" * 200 + ">"),
        ),
    ],
)
def test_what_cannot_be_folded_within_max_line_length_is_refused_naming_the_field(
    change: dict[str, object], field: str, octets: int
) -> None:
    """An address, a field name, a content type or id has no place to fold at: too long for a
    line, every message made of it would be refused by the content check, so the request is."""
    parts: dict[str, object] = {"from": {"email": "a@example.org"}, "text": "t"}
    body: dict[str, object] = {"envelope_sender": "a@example.org", "recipients": [{"email": "r@example.net"}]}
    outside = ("recipients", "tenant")
    body.update((key, value) for key, value in change.items() if key in outside)
    body["content"] = parts | {key: value for key, value in change.items() if key not in outside}
    request = DECODE.decode(msgspec.json.encode(body))
    check_request(request)  # within 998
    with pytest.raises(ComposeError) as refused:
        check_request(request, max_line_length=200)
    assert refused.value.field == field
    assert str(refused.value) == (
        f"too long for a header line, where it cannot be folded: {octets} octets on its line, over [smtp]"
        " max_line_length (200), which the message would be refused for"
    )


@pytest.mark.parametrize("recipient", [{}, {"name": ""}, {"name": "  "}], ids=["none", "empty", "blank"])
def test_a_recipient_without_a_name_is_refused_by_a_template_that_writes_its_name(recipient: dict[str, str]) -> None:
    """`name` defaulted to "": "Hello {{ name }}" sent "Hello " to every recipient without one."""
    request = _request({"from": {"email": "a@example.org"}, "subject": "Hello {{ name }}", "text": "x"})
    request.recipients[0] = msgspec.convert({"email": "r@example.net", **recipient}, InjectRecipient)
    with pytest.raises(ComposeError) as refused:
        _compose(request)
    assert str(refused.value) == (
        """template subject: 'name' is undefined: the recipient has no name (give it one, or write"""
        """ {{ name | default("...") }})"""
    )


@pytest.mark.parametrize(
    "subject",
    [
        'Hello {{ name | default("there") }}',
        'Hello {{ name or "there" }}',
        "Hello {% if name %}{{ name }}{% else %}there{% endif %}",
        "Hello {{ name if name is defined else 'there' }}",
    ],
)
def test_a_template_may_give_a_recipient_without_a_name_a_fallback(subject: str) -> None:
    parts = {"from": {"email": "a@example.org"}, "subject": subject, "text": "x"}
    recipients = [{"email": "ann@example.net", "name": "Ann"}, {"email": "r@example.net"}]
    request = _request(parts, recipients=recipients)
    check_request(request)
    composer = Composer(request, "mx.test", "X-Tenant", "X-Campaign")
    subjects = [_fields(composer.compose(recipient).data)[b"subject"] for recipient in request.recipients]
    assert subjects == [b"Subject: Hello Ann", b"Subject: Hello there"]


def _fields(data: bytes) -> dict[bytes, bytes]:
    head = data[: data.index(b"\r\n\r\n") + 2]
    return {field.name: field.raw.rstrip(b"\r\n") for field in header_fields(head)}


def _own_lines(data: bytes, names: tuple[bytes, ...]) -> int:
    """The octets of the fields `names` in `data`'s header section (each on one line here)."""
    head = data[: data.index(b"\r\n\r\n") + 2]
    return sum(len(line) + 2 for line in head.split(b"\r\n") if line.lower().startswith(names))


@pytest.mark.parametrize("tenant", [None, "acme"])
def test_raw_content_counts_as_the_client_gave_it(tenant: str | None) -> None:
    """max_message_size counts the client's octets: not Pigeon's Date and Message-ID, nor the
    request's tenant field, nor the empty line it put in (`Composed.own`)."""
    content = "From: a@example.org\r\nSubject: hi\r\nbody without an empty line before it\r\n"
    request = _request(content, template=False, **({"tenant": tenant} if tenant else {}))
    composed = Composer(request, "mx.test", "X-Tenant", "X-Campaign").compose(request.recipients[0])
    assert len(composed.data) - composed.own == len(content)
    own = _request("Date: Mon, 1 Jan 2024 00:00:00 +0000\r\nMessage-ID: <a@example.org>\r\n" + content, template=False)
    assert Composer(own, "mx.test", "X-Tenant", "X-Campaign").compose(own.recipients[0]).own == 2  # the empty line


@pytest.mark.parametrize("given", [False, True])
def test_parts_count_the_composed_message_without_pigeons_date_and_message_id(given: bool) -> None:
    headers = {"Date": "Mon, 1 Jan 2024 00:00:00 +0000", "Message-ID": "<a@example.org>"} if given else {}
    parts = {"from": {"email": "a@example.org"}, "subject": "hi", "text": "body", "headers": headers}
    request = _request(parts, tenant="acme")
    composed = Composer(request, "mx.test", "X-Tenant", "X-Campaign").compose(request.recipients[0])
    pigeons = (b"x-tenant:",) if given else (b"date:", b"message-id:", b"x-tenant:")
    assert composed.own == _own_lines(composed.data, pigeons) > 0


_UNSUBSCRIBE = (  # (a comma in a URL is the URL's)
    "<https://example.com/unsubscribe?t=0123456789abcdef0123456789ab&l=1,2,3>, <mailto:u@example.com,v@example.com>"
)
_LONG_ID = "<" + "r" * 90 + "@example.org>"


def test_structured_headers_of_parts_keep_their_addresses_msg_ids_and_urls_readable() -> None:
    """An outside tester's report: every value not plain short ASCII was made one RFC 2047
    word, a List-Unsubscribe URL, a Cc's addresses and a long In-Reply-To with it (RFC 2047 5
    allows none there): one-click unsubscribe and threading broke, the Cc read as garbage."""
    message_id = "<" + "m" * 100 + "@example.org>"
    parts = {
        "from": {"email": "a@example.org"},
        "subject": "件名\u3000テスト\u00a0ok  two  spaces",
        "text": "t",
        "headers": {
            "List-Unsubscribe": _UNSUBSCRIBE,
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
            "Cc": 'Zoë Ünïcode <zoe@example.net>, "Doe, J" <j@example.net>',
            "Sender": "Zoë Ünïcode <zoe@example.net>",
            "List-Id": "Zoë's list <list.example.net>",
            "In-Reply-To": _LONG_ID,
            "References": f"<a@example.org> {_LONG_ID}",
            "Message-ID": message_id,
            "X-Note": "Zoë",
        },
    }
    data = _compose(_request(parts))
    assert check_message(data, max_size=len(data), max_line_length=998) is None  # as SMTP reception would
    message = email.message_from_bytes(data, policy=email.policy.strict)
    assert message["List-Unsubscribe"] == _UNSUBSCRIBE
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    cc = [(a.display_name, a.addr_spec) for a in message["Cc"].addresses]
    assert cc == [("Zoë Ünïcode", "zoe@example.net"), ("Doe, J", "j@example.net")]
    assert [(a.display_name, a.addr_spec) for a in message["Sender"].addresses] == [("Zoë Ünïcode", "zoe@example.net")]
    assert message["List-Id"] == "Zoë's list <list.example.net>" and "<list.example.net>" in data.decode()
    assert message["In-Reply-To"] == _LONG_ID and message["References"] == f"<a@example.org> {_LONG_ID}"
    assert message.get_all("Message-ID") == [message_id]
    assert message["X-Note"] == "Zoë"
    assert message["Subject"] == "件名\u3000テスト\u00a0ok  two  spaces"


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("In-Reply-To", "<ü@example.org>", "must be printable ASCII"),
        ("List-Unsubscribe", "<https://bücher.example/u>", "must be printable ASCII"),
        ("Cc", "nobody", "Not a valid mailbox"),
        ("References", "<" + "x" * 1000 + "@example.org>", "max_line_length"),
        ("List-Id", "no brackets", "angle brackets"),
        ("List-Unsubscribe", "https://example.org/u", "URLs in angle brackets"),
        ("Sender", "a@example.net, b@example.net", "must be one address, not 2"),
    ],
)
def test_a_structured_header_that_cannot_be_written_unencoded_is_refused_naming_it(
    name: str, value: str, why: str
) -> None:
    parts = {"from": {"email": "a@example.org"}, "text": "t", "headers": {name: value}}
    with pytest.raises(ComposeError, match=why) as refused:
        check_request(_request(parts))
    assert refused.value.field == f"$.content.headers.{name}"
