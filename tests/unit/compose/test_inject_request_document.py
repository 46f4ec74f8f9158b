"""The injection request's OpenAPI schema says what the server takes: a client that validates
with the document is not told a value is fine only for the server to refuse it."""

from __future__ import annotations

import json
import re
from typing import Any, Final

import msgspec
import pytest

from pigeon import mime
from pigeon.compose import ComposeError, InjectRequest, check_request
from pigeon.header_section import author_missing_in, end_header_section
from pigeon.listener.http.openapi import document
from pigeon.queue.names import campaign_problem, queue_part_problem


def _property(schema: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = document()["components"]["schemas"][schema]["properties"][name]
    return found


@pytest.mark.parametrize("member", ["tenant", "campaign"])
@pytest.mark.parametrize(
    "value", ["acme", "ünïcode", "a-b_c.d", "a\x82b", "a\x1bb", "a\u200bb", "a\u202eb", "a b", "inbound", "INBOUND"]
)
def test_a_tenant_or_campaign_matches_the_documented_pattern_exactly_when_the_server_takes_it(
    member: str, value: str
) -> None:
    (string,) = [s for s in _property("InjectRequest", member)["anyOf"] if s.get("type") == "string"]
    documented = re.search(string["pattern"], value) is not None
    check = campaign_problem if member == "campaign" else queue_part_problem  # (no campaign `inbound`)
    assert documented == (check(value) is None)


@pytest.mark.parametrize(
    ("value", "taken"),
    [
        ("image/png", True),
        ("text/plain; charset=utf-8", True),
        ('text/plain;charset="utf-8"; format=flowed', True),
        ("application/vnd.openxmlformats-officedocument.spreadsheetml.sheet", True),
        ("text/plain charset=utf-8", False),
        ("text/plain;", False),
        ("text", False),
        ("text/plain; charset=utf 8", False),
    ],
)
def test_an_attachment_s_content_type_matches_the_documented_pattern_exactly_when_it_is_a_media_type(
    value: str, taken: bool
) -> None:
    documented = _property("Attachment", "content_type")
    assert (re.search(documented["pattern"], value) is not None) == taken
    try:
        mime.media_type(value)
    except ValueError:
        assert not taken
    else:
        assert taken


@pytest.mark.parametrize("value", ['multipart/mixed; boundary="x"', "Message/RFC822", "message/partial"])
def test_an_attachment_of_a_composite_type_is_documented_as_refused_as_the_server_refuses_it(value: str) -> None:
    assert re.search(_property("Attachment", "content_type")["pattern"], value) is None
    request = msgspec.convert(
        {
            "envelope_sender": "",
            "recipients": [{"email": "u@example.net"}],
            "content": {"from": {"email": "a@example.org"}, "attachments": [{"content_type": value, "data": "hi"}]},
        },
        InjectRequest,
    )
    with pytest.raises(ComposeError) as refused:
        check_request(request)
    assert refused.value.field == "$.content.attachments[0].content_type"


_ATTACHMENT: Final = {"content_type": "text/plain", "data": "hi"}


@pytest.mark.parametrize(
    "parts",
    [
        {},
        {"text": None, "html": None, "attachments": []},
        {"subject": "only a subject", "headers": {"X-A": "b"}},
        {"text": ""},
        {"html": "<p>hi</p>"},
        {"text": None, "attachments": [_ATTACHMENT]},
    ],
)
def test_parts_are_documented_as_needing_a_text_an_html_or_an_attachment_as_the_server_refuses(
    parts: dict[str, Any],
) -> None:
    # schemathesis's seed 7, at length, sent parts of a subject alone: schema-valid, and refused
    # (400 "parts need a text, an html or an attachment").
    import jsonschema_rs  # schemathesis's own validator, installed with it

    content = {"from": {"email": "app@example.org"}, **parts}
    body = {"envelope_sender": "app@example.org", "recipients": [{"email": "a@example.net"}], "content": content}
    schemas = document()["components"]["schemas"]
    validator = jsonschema_rs.validator_for({"components": {"schemas": schemas}, **schemas["InjectRequest"]})
    try:
        check_request(msgspec.json.decode(json.dumps(body), type=InjectRequest))
    except ComposeError:
        taken = False
    else:
        taken = True
    assert validator.is_valid(body) == taken
    assert taken == bool(parts.get("text") is not None or parts.get("html") is not None or parts.get("attachments"))


@pytest.mark.parametrize("data", ["aGk=", "", "aGk", "a\u00e9Gk=", "\x0f\u00a9\U000dedbch", "a b="])
def test_an_attachment_in_base64_is_taken_exactly_when_its_data_matches_the_documented_pattern(data: str) -> None:
    # schemathesis's seed 7, at length, sent an attachment in base64 whose data was "\x0f©...":
    # schema-valid, and a 500 (b64decode raises ValueError, not binascii.Error, beyond ASCII).
    import jsonschema_rs

    attachment = {"content_type": "text/plain", "data": data, "base64": True}
    content = {"from": {"email": "app@example.org"}, "attachments": [attachment]}
    body = {"envelope_sender": "", "recipients": [{"email": "a@example.net"}], "content": content}
    schemas = document()["components"]["schemas"]
    validator = jsonschema_rs.validator_for({"components": {"schemas": schemas}, **schemas["InjectRequest"]})
    refusal = None
    try:
        check_request(msgspec.json.decode(json.dumps(body), type=InjectRequest))
    except ComposeError as refused:
        refusal = (refused.field, str(refused).startswith("not base64"))
    assert refusal in (None, ("$.content.attachments[0].data", True)), refusal
    assert validator.is_valid(body) == (refusal is None) == (data in ("aGk=", ""))


@pytest.mark.parametrize("content", ["a\u00e9Gk=", "aGk"])
def test_raw_content_in_base64_that_is_not_base64_is_refused_naming_it(content: str) -> None:
    body = {"envelope_sender": "", "recipients": [{"email": "a@example.net"}], "content": content}
    request = msgspec.json.decode(
        json.dumps({**body, "content_encoding": "base64", "template": False}), type=InjectRequest
    )
    with pytest.raises(ComposeError, match=r"^not base64") as refused:
        check_request(request)
    assert refused.value.field == "$.content"


@pytest.mark.parametrize(
    "raw",
    [
        "From: a@example.org\r\n\r\nHello.\r\n",
        "Subject: hi\r\nFROM : a@example.org\r\n\r\nHello.\r\n",
        "Subject: folded\n\tmore\nfrom:a@example.org\n",
        "From:\r\n\r\n",  # empty: no author (RFC 5322 3.6.2), refused as none
        "From: \t \r\n\r\n",
        "From:\r\n a@example.org\r\n\r\n",  # taken, though the document does not promise it
        "Subject: hi\r\n\r\nFrom: in the body\r\n",
        "not a field\nFrom: a@example.org\n",
        "Subject: hi\r\n\r\nHello.\r\n",
        "",
        "From: a@example.org\r\n\r\nA NUL \x00\r\n",
    ],
)
def test_raw_content_matches_the_documented_pattern_only_when_the_server_finds_its_from(raw: str) -> None:
    (string,) = [s for s in _property("InjectRequest", "content")["anyOf"] if s.get("type") == "string"]
    documented = re.search(string["pattern"], raw) is not None
    data, end = end_header_section(raw.replace("\r\n", "\n").replace("\n", "\r\n").encode())
    has_from = not author_missing_in(data[:end] + b"\r\n")
    # What the document takes, the server takes (it may take more: a From further down).
    assert not documented or (has_from and "\x00" not in raw)
    assert documented == (
        raw
        in {
            "From: a@example.org\r\n\r\nHello.\r\n",
            "Subject: hi\r\nFROM : a@example.org\r\n\r\nHello.\r\n",
            "Subject: folded\n\tmore\nfrom:a@example.org\n",
        }
    )
