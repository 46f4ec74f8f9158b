"""POST /api/v1/inject against a real node: what is stored, delivered, logged and answered."""

from __future__ import annotations

import base64
import email
import email.policy
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

TOKEN = "inject-token-0123456789"
ADMIN = "admin-token-0123456789"
TOKENS = [
    {"name": "app", "token": TOKEN, "scopes": ["inject"]},
    {"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]},
]


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture
def pigeon(tmp_path: Path, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", http={"token": TOKENS}, **config) as process:
        yield process


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """`pigeon`'s node, shared by the tests whose requests are all refused or only read: each
    still finds the spool empty after its own request (a start is about a second of CPU)."""
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint)
        with PigeonProcess(tmp_path_factory.mktemp("refusing") / "node", http={"token": TOKENS}, **config) as node:
            yield node


def _parts_request(**overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "envelope_sender": "news@example.org",
        "recipients": [
            {"email": "ann@example.net", "name": "Ann", "substitutions": {"code": "A-1"}, "metadata": {"user": "42"}},
            {"email": "bob@example.com"},
        ],
        "content": {
            "from": {"email": "news@example.org", "name": "News for {{ name or 'you' }}"},
            "subject": "Hello {{ name or 'friend' }}",
            "text": "Your code: {{ code }}\n",
            "html": "<p>Your code: {{ code }}</p>\n",
            "headers": {"X-Code": "{{ code }}"},
        },
        "substitutions": {"code": "<none>"},
        "tenant": "acme",
        "campaign": "spring",
    }
    request.update(overrides)
    return request


def test_parts_are_rendered_per_recipient_stored_durably_and_delivered(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    status, answer = pigeon.http_post("/api/v1/inject", _parts_request(), TOKEN)
    assert status == 200, answer
    assert (answer["accepted"], answer["failed"]) == (2, 0)
    ids = {r["email"]: r["id"] for r in answer["recipients"]}
    # Durable before the answer: both are in the spool (or already delivered from it).
    receptions = pigeon.wait_records("Reception", 2)
    assert {r["id"]: r["recipients"] for r in receptions} == {
        ids["ann@example.net"]: ["ann@example.net"],
        ids["bob@example.com"]: ["bob@example.com"],
    }
    assert {r["queue"] for r in receptions} == {"spring:acme@example.net", "spring:acme@example.com"}
    assert all(r["protocol"] == "HTTP" and r["auth_user"] == "app" for r in receptions)
    by_rcpt = {m.recipients[0]: m for m in sink.wait_for(2)}
    ann, bob = by_rcpt["ann@example.net"].email, by_rcpt["bob@example.com"].email
    assert by_rcpt["ann@example.net"].sender == "news@example.org"
    assert ann["Subject"] == "Hello Ann" and bob["Subject"] == "Hello friend"
    assert ann["To"] == "Ann <ann@example.net>" and bob["To"] == "bob@example.com"
    assert ann["From"] == "News for Ann <news@example.org>"
    assert ann["X-Code"] == "A-1" and bob["X-Code"] == "<none>"
    assert ann["Message-ID"] and ann["Date"] and ann["Message-ID"] != bob["Message-ID"]
    assert "X-Tenant" not in ann and "X-Campaign" not in ann  # routing headers stay with us
    text = ann.get_body(("plain",)).get_content()
    assert text.splitlines() == ["Your code: A-1"]
    html = bob.get_body(("html",)).get_content()
    assert html.splitlines() == ["<p>Your code: &lt;none&gt;</p>"]  # HTML templates escape what they insert
    deliveries = wait_until(lambda: len(pigeon.records("Delivery")) == 2 and pigeon.records("Delivery"))
    assert {r["recipient"]: r.get("meta") for r in deliveries} == {
        "ann@example.net": {"user": "42"},
        "bob@example.com": None,
    }


def test_raw_content_gets_crlf_line_endings_a_date_and_a_message_id(pigeon: PigeonProcess, sink: ScriptedSink) -> None:
    raw = "From: <app@example.org>\nSubject: raw {{ n }}\n\nline one\n.line two\n"
    request = {
        "envelope_sender": "",
        "recipients": [{"email": "r@example.net", "substitutions": {"n": 7}}],
        "content": raw,
    }
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["accepted"]) == (200, 1), answer
    (received,) = sink.wait_for(1)
    assert received.sender == "<>"
    data = received.data
    assert b"\n" not in data.replace(b"\r\n", b"")  # no bare LF went out
    assert data.startswith(b"Received: from [127.0.0.1]\r\n\tby mx.pigeon.test (Pigeon) with HTTP id ")
    assert b"\r\nSubject: raw 7\r\n" in data
    assert data.endswith(b"\r\n\r\nline one\r\n.line two\r\n")
    assert received.email["Message-ID"].endswith("@mx.pigeon.test>")
    assert received.email["Date"]


def test_attachments_and_inline_images_are_built_into_mime(pigeon: PigeonProcess, sink: ScriptedSink) -> None:
    pdf = b"%PDF-1.4 not really\x00\xff"
    png = b"\x89PNG\r\n\x1a\nfake"
    content = {
        "from": {"email": "app@example.org"},
        "subject": "files",
        "text": "see attached",
        "html": '<img src="cid:logo">',
        "attachments": [
            {"data": base64.b64encode(pdf).decode(), "base64": True, "content_type": "application/pdf",
             "file_name": "invoice.pdf"},
            {"data": base64.b64encode(png).decode(), "base64": True, "content_type": "image/png",
             "content_id": "logo"},
        ],
    }  # fmt: skip
    request = {"envelope_sender": "app@example.org", "recipients": [{"email": "r@example.net"}], "content": content}
    assert pigeon.http_post("/api/v1/inject", request, TOKEN)[0] == 200
    (received,) = sink.wait_for(1)
    message = received.email
    assert message.get_content_type() == "multipart/mixed"
    (attachment,) = list(message.iter_attachments())
    assert attachment.get_filename() == "invoice.pdf"
    assert attachment.get_content() == pdf
    related = next(p for p in message.walk() if p.get_content_type() == "multipart/related")
    image = next(p for p in related.walk() if p.get_content_type() == "image/png")
    assert image["Content-ID"] == "<logo>" and image.get_content() == png


def test_an_attachment_s_media_type_keeps_its_parameters_and_a_malformed_one_is_refused_saying_what_one_is(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    def request(content_type: str, file_name: str | None = "notes.txt") -> dict[str, Any]:
        attachment = {"data": "grüße\n", "content_type": content_type, "file_name": file_name}
        content = {"from": {"email": "app@example.org"}, "subject": "notes", "text": "see attached",
                   "attachments": [attachment]}  # fmt: skip
        return {"envelope_sender": "app@example.org", "recipients": [{"email": "r@example.net"}], "content": content}

    long_type = 'text/plain; charset=utf-8; format=flowed; x-comment="a value with; a semicolon and spaces"'
    status, answer = pigeon.http_post("/api/v1/inject", request(long_type), TOKEN)
    assert (status, answer["accepted"]) == (200, 1), answer
    (received,) = sink.wait_for(1)
    (attachment,) = list(received.email.iter_attachments())
    assert attachment.get_content_type() == "text/plain"
    assert attachment.get_param("charset") == "utf-8" and attachment.get_param("format") == "flowed"
    assert attachment.get_param("x-comment") == "a value with; a semicolon and spaces"
    assert attachment.get_filename() == "notes.txt" and attachment.get_content() == "grüße\n"
    assert all(len(line) <= 78 for line in received.data.split(b"\r\n")[:40])  # folded between parameters
    field = "$.content.attachments[0].content_type"
    refusals = {
        "text/plain charset=utf-8": "Not a media type: type/subtype, then any parameters",
        "text/plain;": "Not a media type: type/subtype, then any parameters",
        "text/plain; charset=utf-8; Charset=latin1": "names the parameter 'Charset' twice",
        'text/plain; name="other.txt"': "has a name parameter, and Pigeon writes it from file_name",
    }
    for content_type, error in refusals.items():
        status, answer = pigeon.http_post("/api/v1/inject", request(content_type), TOKEN)
        assert (status, answer["field"]) == (400, field), answer
        assert answer["error"].startswith(error), answer
    assert 'e.g. "text/plain; charset=utf-8"' in pigeon.http_post("/api/v1/inject", request("text"), TOKEN)[1]["error"]
    # Without a file_name, a name parameter is the caller's own.
    assert pigeon.http_post("/api/v1/inject", request('text/plain; name="n.txt"', None), TOKEN)[0] == 200


def test_a_request_without_a_valid_token_gets_401_or_403_and_stores_nothing(refusing: PigeonProcess) -> None:
    request = _parts_request()
    status, answer = refusing.http_post("/api/v1/inject", request)
    assert status == 401 and "Bearer" in answer["error"]
    status, answer = refusing.http_post("/api/v1/inject", request, "inject-token-0123456780")  # one digit off
    assert (status, answer) == (401, {"error": "unknown token", "field": "Authorization"})
    status, answer = refusing.http_post("/api/v1/inject", request, ADMIN)
    assert (status, answer) == (403, {"error": "token 'ops' lacks the 'inject' scope", "field": "Authorization"})
    assert refusing.spool_messages() == []
    assert refusing.metric("pigeon_messages_received_total") == 0


@pytest.mark.parametrize(
    ("change", "field", "error"),
    [
        ({"recipients": []}, "$.recipients", "length >= 1"),
        ({"recipients": [{"email": 7}]}, "$.recipients[0].email", "Expected `str`"),
        ({"recipients": [{"email": "not an address"}]}, "$.recipients[0].email", "Not a valid mailbox"),
        ({"envelope_sender": "bad@@example.org"}, "$.envelope_sender", "Not a valid mailbox"),
        ({"colour": "blue"}, "$.colour", "unknown field `colour`"),
        ({"recipients": [{"email": "a@example.net", "colour": 1}]}, "$.recipients[0].colour", "unknown field"),
        ({"recipients": [{"email": "a@example.net", "metadata": {"u": 1}}]}, "$.recipients[0].metadata.u", "`str`"),
        (
            {"recipients": [{"email": "a@example.net", "metadata": {"a": "1", "u v": {}}}]},
            '$.recipients[0].metadata["u v"]',
            "Expected `str`, got `object`",
        ),
        ({"recipients": [{"name": "Ann"}]}, "$.recipients[0].email", "missing required field `email`"),
        (
            {"content": {"from": {"email": "a@example.org"}, "text": "x", "headers": {"X-A": "1", "x-a": "2"}}},
            "$.content.headers.x-a",
            "'x-a' is 'X-A' again (names are case-insensitive)",
        ),
        (
            {"content": {"from": {"email": "a@example.org"}, "subject": "{{ oops", "text": "x"}},
            "$.content.subject",
            "syntax",
        ),
        ({"content": {"from": {"email": "a@example.org"}}}, "$.content", "text, an html or an attachment"),
        (
            {"content": {"from": {"email": "a@example.org"}, "attachments": [{"data": "@@", "base64": True}]}},
            "$.content.attachments[0].data",
            "not base64",
        ),
        (
            {"content": {"from": {"email": "a@example.org"}, "text": "x", "headers": {"Bad Name": "v"}}},
            "$.content.headers",
            "header field name is printable ASCII, without a colon or a space",
        ),
    ],
)
def test_a_malformed_request_gets_400_naming_the_field_and_stores_nothing(
    refusing: PigeonProcess, change: dict[str, Any], field: str, error: str
) -> None:
    status, answer = refusing.http_post("/api/v1/inject", _parts_request(**change), TOKEN)
    assert status == 400, answer
    assert answer["field"] == field
    assert error in answer["error"]
    assert refusing.spool_messages() == []


@pytest.mark.parametrize("depth", [1, 999, 5000])
@pytest.mark.parametrize(
    ("email", "field", "error"),
    [
        ("a@example.net", "$.recipients[0].metadata.a", "Expected `str`, got `object`"),
        ("not an address", "$.recipients[0].email", "Not a valid mailbox"),
    ],
    ids=["metadata", "address-beside-it"],
)
def test_a_metadata_value_nested_however_deep_is_named_by_its_key(
    refusing: PigeonProcess, depth: int, email: str, field: str, error: str
) -> None:
    """`{"a": {"a": ...}}` is named `$.recipients[0].metadata.a` at any depth: 5,000 levels got
    `...metadata[...]` (finding the key decoded the whole body, past Python's recursion limit);
    an address refused beside such metadata got a 500, the same decoding in its refusal."""
    nested = '{"a": ' * depth + '"x"' + "}" * depth
    raw = (
        '{"envelope_sender": "app@example.org", "template": false, "content": "From: a@example.org\\r\\n\\r\\nx",'
        f' "recipients": [{{"email": "{email}", "metadata": {{"b": "1", "a": {nested}}}}}]}}'
    )
    status, answer = refusing.http_post("/api/v1/inject", None, TOKEN, raw=raw.encode())
    assert (status, answer["field"]) == (400, field), answer
    assert error in answer["error"], answer
    assert refusing.spool_messages() == []


def test_a_missing_envelope_sender_gets_400_naming_it(refusing: PigeonProcess) -> None:
    request = _parts_request()
    del request["envelope_sender"]
    status, answer = refusing.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer) == (
        400,
        {"error": "Object missing required field `envelope_sender`", "field": "$.envelope_sender"},
    )


def test_malformed_json_gets_400(refusing: PigeonProcess) -> None:
    status, answer = refusing.http_post("/api/v1/inject", None, TOKEN, raw=b'{"envelope_sender": ')
    assert status == 400 and answer["error"].startswith("malformed JSON")


def test_a_request_whose_every_recipient_is_refused_for_good_gets_422_whatever_refused_them(
    pigeon: PigeonProcess,
) -> None:
    # Not the policy here: a template that names a value no recipient has, and substitutions
    # that write a line over 998 octets into each recipient's message (SMTP's content check).
    # 200 would tell a client that checks the status that all went well.
    request = _parts_request(substitutions={})
    request["recipients"] = [{"email": "bob@example.com"}, {"email": "carl@example.com"}]
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert status == 422, answer
    assert (answer["accepted"], answer["failed"]) == (0, 2)
    assert all("'code' is undefined" in r["error"] for r in answer["recipients"])
    long = {"envelope_sender": "news@example.org", "content": "From: news@example.org\nSubject: hi\n\n{{ code }}\n",
            "recipients": [{"email": "bob@example.com", "substitutions": {"code": "b" * 999}},
                           {"email": "carl@example.com", "substitutions": {"code": "c" * 999}}]}  # fmt: skip
    status, answer = pigeon.http_post("/api/v1/inject", long, TOKEN)
    assert status == 422, answer
    assert all(r["error"].startswith("554 5.6.0 Message has a line longer") for r in answer["recipients"]), answer
    # Content over max_message_size is no recipient's: the first one's message refuses the
    # request, 400 with SMTP's reply, template or not (test_inject_content_refused_whole.py).
    big = _parts_request(substitutions={"code": "x"})
    big["content"]["text"] = "a long line of text\n" * 2_000_000  # 40 MB
    status, answer = pigeon.http_post("/api/v1/inject", big, TOKEN)
    assert (status, answer["field"]) == (400, "$.content"), answer
    assert answer["error"].startswith("552 5.3.4 "), answer


def test_an_undefined_variable_refuses_only_that_recipient(pigeon: PigeonProcess, sink: ScriptedSink) -> None:
    request = _parts_request(substitutions={})  # bob has no code now; ann has her own
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200
    assert (answer["accepted"], answer["failed"]) == (1, 1)
    ann, bob = answer["recipients"]
    assert ann["id"] and "error" not in ann
    assert bob["error"].startswith("554 5.6.0 ") and "'code' is undefined" in bob["error"]
    (received,) = sink.wait_for(1)
    assert received.recipients == ["ann@example.net"]
    # Logged and counted as every refused recipient is.
    (rejection,) = pigeon.wait_records("Rejection")
    assert (rejection["command"], rejection["recipients"]) == ("inject", [bob["email"]])
    assert rejection["response"]["code"] == 554 and "undefined" in rejection["response"]["text"]
    assert pigeon.metric('pigeon_rejections_total{code="554",command="inject"}') == 1


def test_the_local_token_is_private_and_lets_commands_on_this_machine_in(tmp_path: Path, sink: ScriptedSink) -> None:
    with PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        token_file = pigeon.spool_path / "api-token"
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        status, answer = pigeon.http_post("/api/v1/inject", _parts_request(), pigeon.local_token)
        assert (status, answer["accepted"]) == (200, 2)
    with PigeonProcess(tmp_path / "node", http={"local_token": False}) as pigeon:
        assert pigeon.http_post("/api/v1/inject", _parts_request(), pigeon.local_token)[0] == 401


def test_the_openapi_document_describes_the_inject_operation(refusing: PigeonProcess) -> None:
    status, body = refusing.http_get("/api/openapi.json")
    assert status == 200
    document = json.loads(body)
    assert document["openapi"].startswith("3.")
    operation = document["paths"]["/api/v1/inject"]["post"]
    schema_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request_schema = document["components"]["schemas"][schema_ref.rsplit("/", 1)[1]]
    assert set(request_schema["required"]) == {"envelope_sender", "recipients", "content"}
    assert request_schema["additionalProperties"] is False
    assert {"200", "400", "401", "403"} <= set(operation["responses"])


def test_with_two_workers_injections_reach_the_workers_through_the_supervisor(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, http={"token": TOKENS}, **config) as pigeon:
        ids = []
        for n in range(6):  # round robin: both workers get some
            request = {"envelope_sender": "a@example.org", "recipients": [{"email": f"r{n}@example.net"}],
                       "content": "From: a@example.org\nSubject: {{ n }}\n\nhi\n",
                       "substitutions": {"n": n}}  # fmt: skip
            status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
            assert status == 200, answer
            ids.append(answer["recipients"][0]["id"])
        assert {int(i, 16) & 0x3F for i in ids} == {0, 1}  # the shard bits of the ids: both workers
        assert sorted(int(m.email["Subject"]) for m in sink.wait_for(6)) == list(range(6))
        receptions = pigeon.wait_records("Reception", 6)
        assert {r["peer"].rsplit(":", 1)[0] for r in receptions} == {"127.0.0.1"}  # the client, not a socket
        assert pigeon.http_post("/api/v1/inject", {}, "wrong-token-0123456789")[0] == 401


@pytest.mark.parametrize(
    ("field", "value"),
    [("tenant", "ac\x1bme"), ("campaign", "c\x7fd"), ("tenant", "a\x9bb"), ("campaign", "spring\u202e")],
)
def test_a_tenant_or_campaign_with_a_control_or_format_character_gets_400_naming_the_field(
    refusing: PigeonProcess, field: str, value: str
) -> None:
    status, answer = refusing.http_post("/api/v1/inject", _parts_request(**{field: value}), TOKEN)
    assert status == 400, answer
    assert answer["field"] == f"$.{field}"
    assert "control or format" in answer["error"]
    assert refusing.spool_messages() == []


def test_structured_headers_and_a_subject_s_own_white_space_reach_the_sink_as_given(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    """An outside tester's report: List-Unsubscribe, Cc and a long In-Reply-To arrived as one
    RFC 2047 word each (unreadable where no reader decodes one), and a Subject lost its
    U+3000, U+00A0 and double spaces."""
    unsubscribe = "<https://example.com/unsubscribe?t=0123456789abcdef0123456789ab>, <mailto:u@example.com>"
    long_id = "<" + "r" * 90 + "@example.org>"
    message_id = "<" + "m" * 100 + "@example.org>"
    subject = "件名\u3000テスト\u00a0ok  two  spaces"
    content = {
        "from": {"email": "news@example.org"},
        "subject": subject,
        "text": "x",
        "headers": {
            "List-Unsubscribe": unsubscribe,
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
            "Cc": 'Zoë Ünïcode <zoe@example.net>, "Doe, J" <j@example.net>',
            "In-Reply-To": long_id,
            "References": f"<a@example.org> {long_id}",
            "Message-ID": message_id,
        },
    }
    request = {"envelope_sender": "news@example.org", "recipients": [{"email": "r@example.net"}], "content": content}
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["accepted"]) == (200, 1), answer
    (received,) = sink.wait_for(1)
    message = email.message_from_bytes(received.data, policy=email.policy.strict)
    assert message["List-Unsubscribe"] == unsubscribe
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    cc = [(a.display_name, a.addr_spec) for a in message["Cc"].addresses]
    assert cc == [("Zoë Ünïcode", "zoe@example.net"), ("Doe, J", "j@example.net")]
    assert message["In-Reply-To"] == long_id and message["References"] == f"<a@example.org> {long_id}"
    assert message["Message-ID"] == message_id
    assert message["Subject"] == subject


def test_a_group_in_to_and_cc_reaches_the_sink_a_group_and_the_envelope_is_the_recipients(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    """Found from outside: `To: undisclosed-recipients:;` (RFC 5322 3.4, common in bulk mail)
    was refused in `headers`, and a Cc's `Team: a@example.com, b@example.com;` lost its group."""
    content = {
        "from": {"email": "news@example.org"},
        "subject": "s",
        "text": "x",
        "headers": {"To": "undisclosed-recipients:;", "Cc": "Team: a@example.com, b@example.com;"},
    }
    recipients = [{"email": "ann@example.net", "name": "Ann"}, {"email": "bob@example.com"}]
    request = {"envelope_sender": "news@example.org", "recipients": recipients, "content": content}
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["accepted"]) == (200, 2), answer
    received = sink.wait_for(2)
    assert sorted(r for m in received for r in m.recipients) == ["ann@example.net", "bob@example.com"]
    for message in received:
        assert b"\r\nTo: undisclosed-recipients:;\r\n" in message.data, message.data
        assert b"\r\nCc: Team: a@example.com, b@example.com;\r\n" in message.data, message.data
        parsed = email.message_from_bytes(message.data, policy=email.policy.strict)
        assert parsed.get_all("To") == ["undisclosed-recipients:;"]
        (team,) = parsed["Cc"].groups
        assert (team.display_name, [a.addr_spec for a in team.addresses]) == (
            "Team",
            ["a@example.com", "b@example.com"],
        )
