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
