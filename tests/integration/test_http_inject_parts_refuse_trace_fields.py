"""An injection in parts cannot set what a submission must not carry, nor a malformed
Content-ID: an outside tester's `content_id` of `a>\\tb<c` went out as `Content-ID: <a>\\tb<c>`,
and `headers` could set Return-Path, DKIM-Signature and Bcc (a Bcc every recipient sees)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess

TOKEN = "inject-token-0123456789"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    with PigeonProcess(tmp_path_factory.mktemp("parts") / "node", http={"token": tokens}) as pigeon:
        yield pigeon


def _parts(**content: Any) -> dict[str, Any]:
    return {
        "envelope_sender": "a@example.org",
        "recipients": [{"email": "b@example.net"}],
        "content": {"from": {"email": "a@example.org"}, "subject": "hi", "text": "Hello.", **content},
    }


@pytest.mark.parametrize("content_id", ["a>\tb<c", "a b@c", "<logo@x>", "lo(go)", 'a"b', "a\\b", "caf\u00e9"])
def test_a_content_id_that_is_no_msg_id_inside_is_refused_naming_it(node: PigeonProcess, content_id: str) -> None:
    attachment = {"data": "aW1n", "base64": True, "content_type": "image/png", "content_id": content_id}
    status, answer = node.http_post("/api/v1/inject", _parts(attachments=[attachment]), TOKEN)
    assert status == 400
    assert answer["field"] == "$.content.attachments[0].content_id"
    assert answer["error"].startswith('not a content id: printable ASCII without white space, <, >, (, ), " or \\')
    assert node.spool_messages() == []


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (
            "Return-Path",
            "'Return-Path' is added at final delivery (RFC 5321 4.4), from the envelope: give the bounce"
            " address as $.envelope_sender",
        ),
        ("received", "'received' is a trace field each hop adds of itself (RFC 5321 4.4); Pigeon writes its own"),
        (
            "DKIM-Signature",
            "'DKIM-Signature' is written by Pigeon's [[dkim]] signing, over the message as it is stored",
        ),
        (
            "Bcc",
            "'Bcc' would show the blind copy's address to every recipient: list the address in $.recipients instead",
        ),
    ],
)
def test_a_field_a_submission_must_not_carry_is_refused_saying_why(node: PigeonProcess, name: str, says: str) -> None:
    status, answer = node.http_post("/api/v1/inject", _parts(headers={name: "x@example.org"}), TOKEN)
    assert (status, answer) == (400, {"error": says, "field": f"$.content.headers.{name}"})
    assert node.spool_messages() == []


def test_a_content_id_of_id_left_and_right_goes_out_in_angle_brackets(tmp_path: Path) -> None:
    attachment = {"data": "aW1n", "base64": True, "content_type": "image/png", "content_id": "logo.png@example.org"}
    with PigeonProcess(tmp_path / "node") as pigeon:  # (the module's node stores nothing)
        request = _parts(attachments=[attachment], html="<img src=cid:logo.png@example.org>")
        status, _ = pigeon.http_post("/api/v1/inject", request, pigeon.local_token)
        assert status == 200
        (stored,) = pigeon.spool_messages()
    assert b"\r\nContent-ID: <logo.png@example.org>\r\n" in stored["data"]
