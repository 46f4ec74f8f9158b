"""Composing injected mail: templates in a sandbox, strict variables, CRLF, headers Pigeon adds."""

from __future__ import annotations

import email
from email.policy import default

import msgspec
import pytest

from pigeon.compose import ComposeError, Composer, InjectRequest, check_request

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
        ("To", "recipients"),
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


def test_parts_headers_may_not_name_a_field_twice() -> None:
    parts = {"from": {"email": "a@example.org"}, "text": "t", "headers": {"X-Mailer": "a", "x-mailer": "b"}}
    with pytest.raises(ComposeError, match="again"):
        _compose(_request(parts))


def test_the_date_pigeon_writes_is_utc_with_a_known_zone() -> None:
    for content in ("Subject: x\n\nbody\n", {"from": {"email": "a@example.org"}, "text": "t"}):
        data = _compose(_request(content))
        date = next(line for line in data.split(b"\r\n") if line.startswith(b"Date: "))
        assert date.endswith(b" +0000"), date  # "-0000" says the zone is unknown (RFC 5322 3.3)
