"""Raw content templates: a value must not put a line break into the header section.

A recipient's name of "Bob\\nX-Injected: yes" rendered into `To:` used to start a header of its
own (DKIM-signed); now the render is refused, naming the variable, whatever way the value
took, while the template's own text (a folded header, `{% raw %}`) and the body are free.
"""

from __future__ import annotations

import email
from email.policy import default
from typing import Any

import msgspec
import pytest

from pigeon import rendering
from pigeon.compose import Composer, HeaderValueError, InjectRequest, check_request

DECODE = msgspec.json.Decoder(InjectRequest)
BAD = "Bob\nX-Injected: yes"


def _render(source: str, **variables: Any) -> str:
    template = rendering.environment(False).from_string(source)
    return rendering.render(template, variables, max_output=100_000, header=True)


@pytest.mark.parametrize(
    "source",
    [
        "To: {{ name }}\n\nHi\n",
        "To: {{ name|upper }}\n\nHi\n",  # a filter chain
        "To: {{ first|default(name) }}\n\nHi\n",
        "To: {{ name|safe }}\n\nHi\n",
        "To: {{ 'x' ~ name }}\n\nHi\n",
        "{% macro m(v) %}<{{ v }}>{% endmacro %}To: {{ m(name) }}\n\nHi\n",
        "{% set x = name %}To: {{ x }}\n\nHi\n",
        "{% set x %}{{ name }}{% endset %}To: {{ x }}\n\nHi\n",
        "{% filter replace('X', name) %}To: X{% endfilter %}\n\nHi\n",  # no {{ }} puts it out
        "{% macro m() %}{{ caller() }}{% endmacro %}To: {% call m() %}{{ name }}{% endcall %}\n\nHi\n",
        "{% for n in [name] %}To: {{ n }}\n{% endfor %}\nHi\n",
        "To: {{ name }}",  # no body: all of it is header
    ],
)
def test_a_line_break_from_a_value_in_the_header_is_refused_whatever_way_it_came(source: str) -> None:
    with pytest.raises(rendering.HeaderBreak, match="LF in a value rendered into the header section"):
        _render(source, name=BAD)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("Eve\r\nReply-To: attacker@evil.test", "CR"),
        ("Eve\r\n\r\nfake body", "CR"),
        ("Eve\rX: y", "CR"),
        ("Eve\x85X: y", "NEL"),
        ("Eve\u2028X: y", "LINE SEPARATOR"),
        ("Eve\x1b[31m", r"U\+001B"),
        ("Eve\x00", "NUL"),
    ],
)
def test_every_character_no_header_may_hold_is_refused(value: str, named: str) -> None:
    with pytest.raises(rendering.HeaderBreak, match=named):
        _render("Subject: Hello {{ first }}\n\nHi\n", first=value)


def test_values_in_the_body_and_the_templates_own_text_keep_their_line_breaks() -> None:
    source = (
        "Subject: a long subject\n folded by the template {{ name }}\n"
        "{% raw %}X-Raw: {{ kept }}{% endraw %}\n"
        "{{ 'X-Literal: one\n two' }}\n"
        "X-Tab: {{ tabbed }}\n"
        "\n"
        "Dear {{ name }},\n{{ address }}\n{% filter upper %}{{ address }}{% endfilter %}\n"
    )
    text = _render(source, name="Ann", tabbed="a\tb", address="1 High St\r\nTown\n\nCountry")
    assert text.startswith("Subject: a long subject\n folded by the template Ann\nX-Raw: {{ kept }}\n")
    assert "X-Literal: one\n two\nX-Tab: a\tb\n\nDear Ann,\n1 High St\r\nTown\n\nCountry\n1 HIGH ST" in text


@pytest.mark.parametrize("blank", ["\n\n", "\r\n\r\n", "\r\r", "\n\r\n", "\n{{ '' }}\n", "\r{{ '' }}\n\n"])
def test_the_header_ends_at_the_first_empty_line_however_its_line_ends_are_written(blank: str) -> None:
    assert _render(f"To: a{blank}{{{{ name }}}}", name=BAD).endswith(BAD)
    assert _render("\n{{ name }}", name=BAD) == "\n" + BAD  # an empty first line: no header at all


def test_parts_are_not_checked_here_but_folded_by_mime() -> None:
    template = rendering.environment(False).from_string("Hello {{ name }}")
    assert rendering.render(template, {"name": BAD}, max_output=1000) == "Hello " + BAD


def _request(content: str, recipients: list[dict[str, Any]], **extra: Any) -> InjectRequest:
    body = {"envelope_sender": "a@example.org", "recipients": recipients, "content": content, **extra}
    request = DECODE.decode(msgspec.json.encode(body))
    check_request(request)
    return request


RAW = "From: a@example.org\r\nTo: {{ name }} <{{ email }}>\r\nSubject: Hello {{ first|default(name) }}\r\n\r\nHi\r\n"


@pytest.mark.parametrize(
    ("recipients", "shared", "field"),
    [
        ([{"email": "ok@example.net"}, {"email": "b@example.net", "name": BAD}], {}, "$.recipients[1].name"),
        (
            [
                {
                    "email": "e@example.net",
                    "name": "Eve",
                    "substitutions": {"first": "Eve\r\nReply-To: attacker@evil.test"},
                }
            ],
            {},
            "$.recipients[0].substitutions.first",
        ),
        ([{"email": "e@example.net", "name": "Eve"}], {"first": "Eve\r\n\r\nfake body"}, "$.substitutions.first"),
        ([{"email": "e@example.net"}], {"name": "x\nFrom: ceo@bank"}, "$.substitutions.name"),
    ],
)
def test_the_request_is_refused_before_composing_naming_the_value(
    recipients: list[dict[str, Any]], shared: dict[str, Any], field: str
) -> None:
    request = _request(RAW, recipients, substitutions=shared)
    composer = Composer(request, "mx.test", "X-Tenant", "X-Campaign")
    with pytest.raises(HeaderValueError) as refused:
        composer.check_header_values()
    assert refused.value.field == field
    variable = field.rsplit(".", 1)[-1]
    assert str(refused.value).startswith(f"template variable {variable!r}: ")
    with pytest.raises(HeaderValueError):  # and compose itself refuses it too
        composer.compose(request.recipients[-1])


def test_a_multi_line_value_in_the_body_is_delivered_as_crlf_lines() -> None:
    recipients = [{"email": "b@example.net", "name": "Bob", "substitutions": {"note": "line 1\nline 2"}}]
    request = _request("To: {{ name }} <{{ email }}>\nSubject: x\n\n{{ note }}\n", recipients)
    composer = Composer(request, "mx.test", "X-Tenant", "X-Campaign")
    composer.check_header_values()
    data = composer.compose(request.recipients[0]).data
    message = email.message_from_bytes(data, policy=default)
    assert message["To"] == "Bob <b@example.net>"
    assert data.endswith(b"\r\n\r\nline 1\r\nline 2\r\n")
