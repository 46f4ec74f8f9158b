"""Attachments and multipart structure of a message injected in parts, as delivered, read by
Python's email package with `policy.strict` (an outside tester's findings):

- a file name that is not plain short ASCII, or looks like an RFC 2047 word, went as encoded
  words in quotes (RFC 2047 5 forbids them there: strict readers showed them raw, and the
  literal name "=?utf-8?b?ZXZpbC5leGU=?=" was shown as evil.exe); now RFC 2231's form;
- a control character in a file name was written raw into the header: now 400;
- text given as a string went without a charset, or in UTF-8 whatever the charset it named;
- multipart/related named no type (RFC 2387 3.1); two parts could share a Content-ID;
- a text part of multipart mail lost its last line break to the boundary (RFC 2046 5.1.1).
"""

from __future__ import annotations

import email
import email.policy
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

TOKEN = "attachment-token-0123456789"


@pytest.fixture(scope="module")
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    config = delivery_config(sink.endpoint)
    with PigeonProcess(Path(tmp_path_factory.mktemp("attachments")) / "node", http=http, **config) as pigeon:
        yield pigeon


def _request(**content: Any) -> dict[str, Any]:
    return {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "r@example.net"}],
        "content": {"from": {"email": "app@example.org"}, "subject": "files", **content},
        "template": False,
    }


def _delivered(node: PigeonProcess, sink: ScriptedSink, **content: Any) -> tuple[bytes, Message]:
    """The message as the sink got it, and as a strict reader reads it (no defect anywhere)."""
    before = len(sink.received)
    status, answer = node.http_post("/api/v1/inject", _request(**content), TOKEN)
    assert status == 200, answer
    data = sink.wait_for(before + 1)[before].data
    message = email.message_from_bytes(data, policy=email.policy.strict)
    defects = [(part.get_content_type(), defect) for part in message.walk() for defect in part.defects]
    defects += [(name, d) for part in message.walk() for name, value in part.items() for d in value.defects]
    assert defects == []
    return data, message


def _refused(node: PigeonProcess, **content: Any) -> dict[str, Any]:
    before = len(node.spool_messages())
    status, answer = node.http_post("/api/v1/inject", _request(**content), TOKEN)
    assert status == 400, answer
    assert len(node.spool_messages()) == before
    return answer


NAMES = [
    "Grüße café €.pdf",
    "x" * 1100 + ".bin",
    "y" * 150 + ".pdf",
    "=?utf-8?b?ZXZpbC5leGU=?=",
    'quote " and back\\slash.txt',
]


def test_any_attachment_name_reads_back_exactly_with_no_encoded_word_in_quotes_and_short_lines(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    attachments = [{"data": "x", "file_name": name} for name in NAMES]
    data, message = _delivered(node, sink, text="see attached", attachments=attachments)
    assert [part.get_filename() for part in message.iter_attachments()] == NAMES
    assert [part.get_param("name") for part in message.iter_attachments()] == NAMES
    assert b'="=?' not in data and b"=?utf-8?" not in data.lower()  # (the look-alike: percent-encoded)
    assert max(len(line) for line in data.split(b"\r\n")) <= 78


def test_a_file_name_with_a_control_character_gets_400_naming_it(node: PigeonProcess) -> None:
    for name in ["a\tb\x01c\x7fd\x1be.txt", "bell\x07.txt", "c1\x85.txt"]:
        attachments = [{"data": "x", "file_name": "fine.txt"}, {"data": "x", "file_name": name}]
        answer = _refused(node, text="t", attachments=attachments)
        assert answer["field"] == "$.content.attachments[1].file_name", answer
        assert "control character" in answer["error"], answer


def test_a_text_attachment_goes_in_its_charset_and_reads_back_as_the_text(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    attachments = [
        {"data": "café €\n", "content_type": "text/plain", "file_name": "n.txt"},
        {"data": "café\n", "content_type": "text/plain; charset=iso-8859-1", "file_name": "l.txt"},
        {"data": "bytes as they are", "content_type": "application/json", "file_name": "j.json"},
    ]
    _, message = _delivered(node, sink, text="t", attachments=attachments)
    utf8, latin1, json = message.iter_attachments()
    assert utf8.get_param("charset") == "utf-8" and utf8.get_content() == "café €\n"
    assert latin1.get_param("charset") == "iso-8859-1" and latin1.get_payload(decode=True) == b"caf\xe9\n"
    assert latin1.get_content() == "café\n"
    assert json.get_param("charset") is None and json.get_content() == b"bytes as they are"
    euro = [{"data": "5 €", "content_type": "text/plain; charset=iso-8859-1", "file_name": "e.txt"}]
    answer = _refused(node, text="t", attachments=euro)
    assert answer["field"] == "$.content.attachments[0].data", answer
    assert "iso-8859-1" in answer["error"]
    unknown = [{"data": "x", "content_type": "text/plain; charset=x-no-such", "file_name": "u.txt"}]
    assert _refused(node, text="t", attachments=unknown)["field"] == "$.content.attachments[0].content_type"


def test_multipart_related_names_the_type_of_its_root(node: PigeonProcess, sink: ScriptedSink) -> None:
    logo = {"data": "aW1n", "base64": True, "content_type": "image/png", "content_id": "logo@example.org"}
    for content, root in [
        ({"text": "t", "html": '<img src="cid:logo@example.org">'}, "multipart/alternative"),
        ({"html": '<img src="cid:logo@example.org">'}, "text/html"),
    ]:
        _, message = _delivered(node, sink, attachments=[logo], **content)
        assert message.get_content_type() == "multipart/related"
        assert message.get_param("type") == root
        assert next(iter(message.iter_parts())).get_content_type() == root


def test_two_parts_with_one_content_id_get_400_naming_the_second(node: PigeonProcess) -> None:
    image = {"data": "aW1n", "base64": True, "content_type": "image/png"}
    attachments = [{**image, "content_id": "i1"}, {**image, "content_id": "i2"}, {**image, "content_id": "i1"}]
    answer = _refused(node, html='<img src="cid:i1">', attachments=attachments)
    assert answer["field"] == "$.content.attachments[2].content_id", answer
    assert "$.content.attachments[0]" in answer["error"]


def test_a_text_in_multipart_mail_keeps_its_last_line_break(node: PigeonProcess, sink: ScriptedSink) -> None:
    data, message = _delivered(
        node, sink, text="Regards,\nFrom me\n", html="<p>Hi</p>\n", attachments=[{"data": "x", "file_name": "a"}]
    )
    assert b"From me\r\n\r\n--=_pigeon_" in data
    plain, html = message.get_body(("plain",)), message.get_body(("html",))
    assert plain is not None and plain.get_content() == "Regards,\r\nFrom me\r\n"
    assert html is not None and html.get_content() == "<p>Hi</p>\r\n"
