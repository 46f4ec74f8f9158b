"""An injected attachment is sent in base64, which RFC 2045 6.4 (and RFC 2046 5.2.1 for
message/rfc822) forbids for the composite types: one declaring `multipart/*` or `message/*`
was taken and went out base64-encoded with that type, which a reader may not decode. It is
refused, 400 naming its `content_type`, nothing stored (README: Injection)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.support.process import PigeonProcess

TOKEN = "composite-token-0123456789"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    with PigeonProcess(tmp_path_factory.mktemp("composite") / "node", http=http) as pigeon:
        yield pigeon


def _request(*content_types: str) -> dict[str, object]:
    return {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "u@hold.example"}],
        "content": {
            "from": {"email": "app@example.org"},
            "subject": "attached",
            "text": "see attached",
            "attachments": [{"data": "hello", "content_type": kind, "file_name": "a"} for kind in content_types],
        },
    }


@pytest.mark.parametrize(
    "content_type", ['multipart/mixed; boundary="x"', "Multipart/Alternative", "message/rfc822", "MESSAGE/partial"]
)
def test_an_attachment_of_a_composite_type_is_refused_naming_the_field(node: PigeonProcess, content_type: str) -> None:
    before = len(node.spool_messages())
    status, answer = node.http_post("/api/v1/inject", _request("text/plain", content_type), TOKEN)
    assert status == 400, answer
    assert answer["field"] == "$.content.attachments[1].content_type"
    kind = content_type.partition(";")[0]
    assert answer["error"].startswith(f"{kind} is a composite media type (multipart/*, message/*)"), answer
    assert len(node.spool_messages()) == before


def test_a_discrete_type_is_taken_and_sent_in_base64(node: PigeonProcess) -> None:
    status, answer = node.http_post("/api/v1/inject", _request("application/octet-stream"), TOKEN)
    assert status == 200, answer
    [stored] = [m for m in node.spool_messages() if m["id"] == answer["recipients"][0]["id"]]
    part = rb"Content-Type: application/octet-stream;.*?Content-Transfer-Encoding: base64"
    assert re.search(part, stored["data"], re.S)
