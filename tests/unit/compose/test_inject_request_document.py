"""The injection request's OpenAPI schema says what the server takes: a client that validates
with the document is not told a value is fine only for the server to refuse it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pigeon import mime
from pigeon.listener.http.openapi import document
from pigeon.queue.names import queue_part_problem


def _property(schema: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = document()["components"]["schemas"][schema]["properties"][name]
    return found


@pytest.mark.parametrize("member", ["tenant", "campaign"])
@pytest.mark.parametrize("value", ["acme", "ünïcode", "a-b_c.d", "a\x82b", "a\x1bb", "a\u200bb", "a\u202eb", "a b"])
def test_a_tenant_or_campaign_matches_the_documented_pattern_exactly_when_the_server_takes_it(
    member: str, value: str
) -> None:
    (string,) = [s for s in _property("InjectRequest", member)["anyOf"] if s.get("type") == "string"]
    documented = re.search(string["pattern"], value) is not None
    assert documented == (queue_part_problem(value) is None)


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
