"""POST /api/inject/v1, KumoMTA's injection API, against a real node: a KumoMTA client's request
is taken as it is, carried out by the pipeline of POST /api/v1/inject (its tokens, tenants,
checks and records), and answered in KumoMTA's shape."""

from __future__ import annotations

import base64
import email
import email.policy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import Received, ScriptedSink, delivery_config, wait_until

TOKEN = "kumo-token-0123456789"
BOUND = "kumo-bound-0123456789"
READER = "kumo-reader-0123456789"
TOKENS = [
    {"name": "app", "token": TOKEN, "scopes": ["inject"]},
    {"name": "shop-a", "token": BOUND, "scopes": ["inject"], "tenants": ["A"]},
    {"name": "ops", "token": READER, "scopes": ["read"]},
]
PATH = "/api/inject/v1"
PIXEL = "R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7"  # KumoMTA's documented example


@pytest.fixture(scope="module")
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    config = delivery_config(sink.endpoint)
    root = tmp_path_factory.mktemp("kumo") / "node"
    with PigeonProcess(root, http={"token": TOKENS}, **config) as running:
        yield running


def _delivered(sink: ScriptedSink, *recipients: str) -> dict[str, Received]:
    """The messages the sink got for `recipients`, by recipient (the sink is the module's)."""

    def found() -> dict[str, Received] | None:
        got = {m.recipients[0]: m for m in list(sink.received) if m.recipients[0] in recipients}
        return got if len(got) == len(recipients) else None

    result: dict[str, Received] = wait_until(found)
    return result


def _builder_request(**overrides: Any) -> dict[str, Any]:
    """A request as KumoMTA documents one: builder content, every option it takes."""
    request: dict[str, Any] = {
        "envelope_sender": "bounces@example.org",
        "content": {
            "text_body": "Hello {{ name }}, your code is {{ code }}.\n",
            "html_body": '<p>Hello {{ name }}, your code is <b>{{ code }}</b>.</p><img src="cid:my-image">\n',
            "attachments": [
                {
                    "data": PIXEL,
                    "base64": True,
                    "content_type": "image/gif",
                    "content_id": "my-image",
                    "file_name": "pixel.gif",
                },
                {"data": "a,b\n1,2\n", "content_type": "text/csv", "file_name": "codes.csv"},
            ],
            "from": {"email": "news@example.org", "name": "News"},
            "subject": "For {{ name }}: {{ campaign_title }}",
            "reply_to": {"email": "help@example.org", "name": "Help"},
            "headers": {"X-Tenant": "acme", "X-Campaign": "fall", "X-Code": "{{ code }}"},
        },
        "recipients": [
            {"email": "ann@k1.test", "name": "Ann", "substitutions": {"code": "A-1"}},
            {"email": "bob@k2.test", "name": "Bob", "substitutions": {"code": "<B-2>"}},
        ],
        "substitutions": {"campaign_title": "Fall Campaign", "code": "none"},
        "template_dialect": "Jinja",
        "deferred_generation": True,
        "deferred_spool": False,
        "trace_headers": {
            "received_header": False,
            "supplemental_header": True,
            "header_name": "X-KumoRef",
            "include_meta_names": [],
        },
    }
    request.update(overrides)
    return request


def test_a_kumomta_builder_request_is_delivered_per_recipient_with_its_attachments(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    status, answer = node.http_post(PATH, _builder_request(), TOKEN)
    assert (status, answer) == (200, {"success_count": 2, "fail_count": 0, "failed_recipients": [],
                                      "errors": []})  # fmt: skip
    by_rcpt = _delivered(sink, "ann@k1.test", "bob@k2.test")
    ann, bob = by_rcpt["ann@k1.test"], by_rcpt["bob@k2.test"]
    assert ann.sender == "bounces@example.org"
    assert ann.email["Subject"] == "For Ann: Fall Campaign" and bob.email["Subject"] == "For Bob: Fall Campaign"
    assert ann.email["From"] == "News <news@example.org>" and ann.email["Reply-To"] == "Help <help@example.org>"
    assert ann.email["To"] == "Ann <ann@k1.test>"
    assert (ann.email["X-Code"], bob.email["X-Code"]) == ("A-1", "<B-2>")
    assert ann.email.get_body(("plain",)).get_content().splitlines() == ["Hello Ann, your code is A-1."]
    # The HTML part escapes what it writes out, as Pigeon's own API does.
    html = bob.email.get_body(("html",)).get_content()
    assert "your code is <b>&lt;B-2&gt;</b>." in html, html
    for message in (ann.email, bob.email):
        assert "X-Tenant" not in message and "X-Campaign" not in message
        parts = {part.get_content_type(): part for part in message.walk()}
        assert parts["image/gif"]["Content-ID"] == "<my-image>"
        assert parts["image/gif"].get_content() == base64.b64decode(PIXEL)
        assert parts["text/csv"].get_filename() == "codes.csv"
        assert parts["text/csv"].get_content() == "a,b\n1,2\n"
    # The tenant and campaign of its X-Tenant and X-Campaign, as KumoMTA's queues helper takes them.
    receptions = [r for r in node.records("Reception") if r["recipients"][0] in ("ann@k1.test", "bob@k2.test")]
    assert sorted(r["queue"] for r in receptions) == ["fall:acme@k1.test", "fall:acme@k2.test"]
    assert all(r["protocol"] == "HTTP" and r["auth_user"] == "app" for r in receptions)


def test_raw_content_is_one_template_with_to_header_and_static_sends_it_as_it_is(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    raw = "From: news@example.org\nTo: {{ to_header }}\nSubject: Hi {{ name }}\n\n{{ email }} / {{ to_header }}\n"
    request = {
        "envelope_sender": "bounces@example.org",
        "content": raw,
        "recipients": [{"email": "carl@k3.test", "name": "Carl Smith, Jr."}, {"email": "dora@k3.test",
                       "name": "Dora"}],
    }  # fmt: skip
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["success_count"]) == (200, 2), answer
    by_rcpt = _delivered(sink, "carl@k3.test", "dora@k3.test")
    carl, dora = by_rcpt["carl@k3.test"].email, by_rcpt["dora@k3.test"].email
    assert carl["To"] == '"Carl Smith, Jr." <carl@k3.test>' and dora["To"] == "Dora <dora@k3.test>"
    assert carl["Subject"] == "Hi Carl Smith, Jr."
    assert carl.get_content().splitlines() == ['carl@k3.test / "Carl Smith, Jr." <carl@k3.test>']
    # "Static": no template, the content goes as it is.
    static = {"envelope_sender": "bounces@example.org", "template_dialect": "Static",
              "content": "From: news@example.org\nSubject: {{ as is }}\n\nbody\n",
              "recipients": [{"email": "eve@k4.test"}]}  # fmt: skip
    status, answer = node.http_post(PATH, static, TOKEN)
    assert (status, answer["success_count"]) == (200, 1), answer
    assert _delivered(sink, "eve@k4.test")["eve@k4.test"].email["Subject"] == "{{ as is }}"


def test_to_header_is_a_template_variable_of_pigeon_s_own_api_too(node: PigeonProcess, sink: ScriptedSink) -> None:
    request = {"envelope_sender": "bounces@example.org",
               "content": {"from": {"email": "news@example.org"}, "text": "to: {{ to_header }}\n"},
               "recipients": [{"email": "fay@k5.test", "name": "Fay"}, {"email": "gus@k5.test"}]}  # fmt: skip
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["accepted"]) == (200, 2), answer
    by_rcpt = _delivered(sink, "fay@k5.test", "gus@k5.test")
    assert by_rcpt["fay@k5.test"].email.get_content().splitlines() == ["to: Fay <fay@k5.test>"]
    assert by_rcpt["gus@k5.test"].email.get_content().splitlines() == ["to: gus@k5.test"]


def test_failed_recipients_are_listed_in_a_200_answer_even_when_all_fail(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    request = {
        "envelope_sender": "bounces@example.org",
        "content": {"from": {"email": "news@example.org"}, "text_body": "code {{ code }}\n"},
        "recipients": [
            {"email": "hal@k6.test", "substitutions": {"code": "1"}},
            {"email": "ida@k6.test"},  # no code: undefined, refused
            {"email": "hal@K6.TEST", "substitutions": {"code": "2"}},  # a repeat
        ],
    }
    status, answer = node.http_post(PATH, request, TOKEN)
    assert status == 200, answer
    assert (answer["success_count"], answer["fail_count"]) == (1, 2), answer
    assert answer["failed_recipients"] == ["ida@k6.test", "hal@K6.TEST"]
    assert answer["errors"][0].startswith("ida@k6.test: 554 5.6.0 template text: 'code' is undefined"), answer
    assert answer["errors"][1] == "hal@K6.TEST: 550 5.1.0 duplicate of recipient 0 of the request"
    assert _delivered(sink, "hal@k6.test")["hal@k6.test"].email.get_content().splitlines() == ["code 1"]
    # Every one refused: KumoMTA's 200 still, where Pigeon's own API says 422.
    request["recipients"] = [{"email": "jo@k6.test"}]
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["success_count"], answer["fail_count"]) == (200, 0, 1), answer
    assert answer["failed_recipients"] == ["jo@k6.test"]
    # Refused as Pigeon's own API refuses them, and logged so.
    wait_until(lambda: [r for r in node.records("Rejection") if r.get("recipients") == ["jo@k6.test"]])


def test_a_recipient_that_is_no_address_is_refused_alone_and_the_others_are_injected(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    """Found from outside: one malformed address refused the whole request (400), where KumoMTA
    counts it in `fail_count` and injects the rest: a migrated application lost whole batches."""
    request = {
        "envelope_sender": "bounces@example.org",
        "content": {"from": {"email": "news@example.org"}, "text_body": "hello {{ name }}\n"},
        "recipients": [{"email": "not an address"}, {"email": "max@k9.test", "name": "Max"}, {"email": "a@@b"}],
    }
    status, answer = node.http_post(PATH, request, TOKEN)
    assert status == 200, answer
    assert (answer["success_count"], answer["fail_count"]) == (1, 2), answer
    assert answer["failed_recipients"] == ["not an address", "a@@b"]
    assert answer["errors"] == [
        "not an address: 501 5.1.3 Not a valid mailbox address (local@domain)",
        "a@@b: 501 5.1.3 Not a valid mailbox address (local@domain)",
    ]
    assert _delivered(sink, "max@k9.test")["max@k9.test"].email.get_content().splitlines() == ["hello Max"]
    wait_until(lambda: [r for r in node.records("Rejection") if r.get("recipients") == ["a@@b"]])
    # Only such recipients: a 200 that took none, as KumoMTA's.
    request["recipients"] = [{"email": "nobody"}]
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["success_count"], answer["fail_count"]) == (200, 0, 1), answer


def test_a_recipient_that_is_no_address_is_logged_escaped_as_smtp_logs_it(node: PigeonProcess) -> None:
    """Found from outside: its Rejection record held the address as sent, a U+202E included
    (JSON escapes only C0 controls), where SMTP's and /api/v1/inject's write `\\u202e` (README:
    text others chose is escaped in records, so a log viewer shows what was sent)."""
    request = {
        "envelope_sender": "bounces@example.org",
        "content": {"from": {"email": "news@example.org"}, "text_body": "hi\n"},
        "recipients": [
            {"email": "ceo\u202egro@k10.test"},
            {"email": "t\tab@k10.test"},
            {"email": "n\u0000ul@k10.test"},
        ],
    }
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["fail_count"]) == (200, 3), answer
    with RawSmtp(node.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<bounces@example.org> SMTPUTF8")
        smtp.expect(553, "RCPT TO:<ceo\u202egro@k11.test>")

    def logged() -> list[str] | None:
        named = [r["recipients"][0] for r in node.records("Rejection") if r.get("recipients")]
        found = [name for name in named if name.endswith(("@k10.test", "@k11.test"))]
        return found if len(found) == 4 else None

    assert sorted(wait_until(logged)) == sorted(
        ["ceo\\u202egro@k10.test", "t\\x09ab@k10.test", "n\\x00ul@k10.test", "ceo\\u202egro@k11.test"]
    )


def test_failed_recipients_are_in_request_order_and_indexes_are_the_request_s(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    """Found from outside: the recipients that are no address came first in `failed_recipients`
    (its schema says request order), and "duplicate of recipient N" counted the addresses only:
    N named another recipient of the request."""
    request: dict[str, Any] = {
        "envelope_sender": "bounces@example.org",
        "content": {"from": {"email": "news@example.org"}, "text_body": "code {{ code }}\n"},
        "recipients": [
            {"email": "bad"},
            {"email": "ko2@k12.test", "substitutions": {"code": "1"}},
            {"email": "kim@k12.test"},  # no code: undefined, refused
            {"email": "ko2@k12.test", "substitutions": {"code": "2"}},  # a repeat of recipient 1
            {"email": "a@@b"},
        ],
    }
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["success_count"], answer["fail_count"]) == (200, 1, 4), answer
    assert answer["failed_recipients"] == ["bad", "kim@k12.test", "ko2@k12.test", "a@@b"]
    assert [error.partition(": ")[2][:9] for error in answer["errors"]] == ["501 5.1.3", "554 5.6.0", "550 5.1.0",
                                                                           "501 5.1.3"]  # fmt: skip
    assert answer["errors"][2] == "ko2@k12.test: 550 5.1.0 duplicate of recipient 1 of the request"
    assert _delivered(sink, "ko2@k12.test")["ko2@k12.test"].email.get_content().splitlines() == ["code 1"]
    # A refusal of the whole request names a recipient by its index in the request too.
    request["content"] = "From: news@example.org\nTo: {{ name }}\n\nhi\n"
    request["recipients"] = [{"email": "bad"}, {"email": "lou@k12.test", "name": "Lou\nBcc: eve@k12.test"}]
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["field"]) == (400, "$.recipients[1].name"), answer
    request["recipients"] = [{"email": "bad"}, {"email": "lou@k12.test", "name": "L\u0000u"}]
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["field"]) == (400, "$.recipients[1].name"), answer


def test_content_is_checked_when_every_recipient_is_refused_as_when_one_is_taken(node: PigeonProcess) -> None:
    """Found from outside: content with no From and only recipients that are no address was a
    200 (fail_count 1), where the same content with a good recipient was refused (400 $.content):
    the content is the request's, whoever it goes to."""
    before = len(node.spool_messages())
    request: dict[str, Any] = {"content": "AAA", "envelope_sender": "", "recipients": [{"email": "lou@k8.test"}]}
    status, with_one = node.http_post(PATH, request, TOKEN)
    assert (status, with_one["field"]) == (400, "$.content"), with_one
    for recipients in ([{"email": ""}], [{"email": "nobody"}, {"email": "a@@b"}]):
        request["recipients"] = recipients
        assert node.http_post(PATH, request, TOKEN) == (400, with_one), recipients
    # Content that passes is a 200 that took none, as before.
    request["content"] = "From: a@example.org\n\nx\n"
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["success_count"], answer["fail_count"]) == (200, 0, 2), answer
    assert len(node.spool_messages()) == before


def test_tokens_and_tenant_bindings_are_those_of_pigeon_s_own_api(node: PigeonProcess) -> None:
    request = _builder_request(recipients=[{"email": "kim@k7.test", "substitutions": {"code": "1"},
                                            "name": "Kim"}])  # fmt: skip
    before = len(node.spool_messages())
    status, answer = node.http_post(PATH, request)
    assert status == 401 and "Bearer" in answer["error"], answer
    status, answer = node.http_post(PATH, request, READER)
    assert (status, answer) == (403, {"error": "token 'ops' lacks the 'inject' scope", "field": "Authorization"})
    # A token bound to tenant A may not send as acme: 403 naming where the request names it.
    status, answer = node.http_post(PATH, request, BOUND)
    assert (status, answer["field"]) == (403, "$.content.headers.X-Tenant"), answer
    assert "shop-a" in answer["error"]
    assert len(node.spool_messages()) == before
    rejection = wait_until(lambda: [r for r in node.records("Rejection") if r.get("auth_user") == "shop-a"])
    assert rejection[0]["command"] == "inject" and rejection[0]["recipients"] == ["kim@k7.test"]
    # Its own tenant it may; none named is its one tenant's.
    request["content"]["headers"] = {"X-Tenant": "A"}
    status, answer = node.http_post(PATH, request, BOUND)
    assert (status, answer["success_count"]) == (200, 1), answer
    wait_until(lambda: [r for r in node.records("Reception") if r["queue"] == "A@k7.test"])


@pytest.mark.parametrize(
    ("change", "field", "error"),
    [
        ({"colour": "blue"}, "$.colour", "unknown field `colour`"),
        ({"template_dialect": "Handlebars"}, "$.template_dialect", "template dialect 'Handlebars' is not taken"),
        (
            {"content": {"from": {"email": "a@example.org"}, "text_body": "x", "amp_html_body": "<html amp4email>"}},
            "$.content.amp_html_body",
            "Pigeon builds no AMP part",
        ),
        ({"content": {"from": {"email": "a@example.org"}, "text_body": "a\u0000b"}}, "$.content.text_body", "NUL"),
        ({"content": {"from": {"email": "a@example.org"}, "html_body": "{{ oops"}}, "$.content.html_body", "syntax"),
        ({"content": {"text_body": "x"}}, "$.content", "needs a From"),
        ({"content": {"from": {"email": "a@example.org"}, "subject": "x"}}, "$.content", "needs a text_body"),
        ({"recipients": []}, "$.recipients", "Expected `array` of length >= 1"),
    ],
)
def test_a_malformed_request_gets_400_naming_the_member_as_kumomta_names_it(
    node: PigeonProcess, change: dict[str, Any], field: str, error: str
) -> None:
    request = {"envelope_sender": "bounces@example.org", "recipients": [{"email": "lou@k8.test"}],
               "content": "From: a@example.org\n\nx\n"}  # fmt: skip
    request.update(change)
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["field"]) == (400, field), answer
    assert error in answer["error"], answer


def test_the_openapi_document_describes_kumomta_s_injection(node: PigeonProcess, tmp_path: Path) -> None:
    status, body = node.http_get("/api/openapi.json")
    assert status == 200
    document = json.loads(body)
    operation = document["paths"][PATH]["post"]
    reference = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    answer = document["components"]["schemas"][reference.rsplit("/", 1)[1]]
    assert set(answer["required"]) == {"success_count", "fail_count", "failed_recipients", "errors"}
    assert {"400", "401", "403", "413", "415"} <= set(operation["responses"])


def test_through_a_two_worker_node_s_supervisor_it_is_an_injection_whose_413_is_logged(
    tmp_path: Path, sink: ScriptedSink
) -> None:
    """The supervisor hands it to a worker as it does /api/v1/inject: a body over [http]
    max_request_size is the worker's to refuse, and it logs the Rejection (the supervisor keeps
    no log), as for Pigeon's own injections."""
    http = {"token": TOKENS, "max_request_size": "16KiB"}
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, http=http, **config) as pigeon:
        request = {"envelope_sender": "bounces@example.org", "recipients": [{"email": "max@k9.test", "name": "Max"}],
                   "content": "From: news@example.org\nTo: {{ to_header }}\nSubject: hi\n\nhello\n"}  # fmt: skip
        status, answer = pigeon.http_post(PATH, request, TOKEN)
        assert (status, answer["success_count"]) == (200, 1), answer
        assert _delivered(sink, "max@k9.test")["max@k9.test"].email["To"] == "Max <max@k9.test>"
        request["content"] += "x" * 20_000
        status, answer = pigeon.http_post(PATH, request, TOKEN)
        assert (status, answer["field"]) == (413, "$"), answer
        [record] = pigeon.wait_records("Rejection", 1)
        assert (record["command"], record["auth_user"], record["response"]["code"]) == ("inject", "app", 413), record


@pytest.mark.parametrize("name", ["html", "text"])
def test_pigeon_s_own_part_name_is_refused_naming_the_member_sent_with_kumomta_s(
    node: PigeonProcess, name: str
) -> None:
    """Found from outside: `content.html` here was refused naming `$.content.html_body`, a
    member the client never sent (the refusal's path was renamed as one of Pigeon's own)."""
    content = {"from": {"email": "news@example.org"}, "text_body": "x", "html": "<p>x</p>"}
    if name == "text":
        content = {"from": {"email": "news@example.org"}, "text": "x", "html_body": "<p>x</p>"}
    request = {"envelope_sender": "bounces@example.org", "recipients": [{"email": "lou@k8.test"}], "content": content}
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["field"]) == (400, f"$.content.{name}"), answer
    assert f"unknown field `{name}`" in answer["error"] and f"{name}_body" in answer["error"], answer


@pytest.mark.parametrize("path", [PATH, "/api/v1/inject"])
def test_a_cut_off_body_is_malformed_json_not_an_unknown_member(node: PigeonProcess, path: str) -> None:
    """Found from outside: `{"a":` was answered "Object contains unknown field `a`" (msgspec
    checks members as it parses), where other cut-off bodies said malformed JSON."""
    status, answer = node.http_post(path, None, TOKEN, raw=b'{"a":')
    assert (status, answer["field"]) == (400, "$"), answer
    assert answer["error"].startswith("malformed JSON"), answer


def test_an_ascii_header_value_goes_out_as_it_is_and_a_word_no_line_holds_in_encoded_words(
    node: PigeonProcess, sink: ScriptedSink
) -> None:
    """Found from outside: ASCII `headers` values went out as RFC 2047 words (a trailing space,
    a long token), unreadable to the machine that reads them; the README says unstructured
    text is written as it is. A word longer than a line can hold still goes, in RFC 2047 words
    (which fold anywhere), read back whole: a lowered max_line_length took it so before."""
    words = " ".join(f"w{n}=v{n};" for n in range(40))  # long: folded at its white space
    headers = {"X-B": "short trailing ", "X-Track": "id=42;k=v  two\tblanks", "X-Words": words}
    content = {"from": {"email": "news@example.org"}, "text_body": "x", "headers": headers}
    request = {"envelope_sender": "bounces@example.org", "recipients": [{"email": "hdr@k9.test"}], "content": content}
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["success_count"]) == (200, 1), answer
    data = _delivered(sink, "hdr@k9.test")["hdr@k9.test"].data
    head = data.split(b"\r\n\r\n", 1)[0]
    assert b"=?" not in head.replace(b"Subject: ", b""), head
    assert b"\r\nX-B: short trailing\r\n" in head and b"\r\nX-Track: id=42;k=v  two\tblanks\r\n" in head, head
    unfolded = head.split(b"\r\nX-Words: ", 1)[1].split(b"\r\nX-", 1)[0].split(b"\r\nMIME", 1)[0]
    assert unfolded.replace(b"\r\n", b"") == words.encode() and b"\r\n " in unfolded, head
    assert max(map(len, head.split(b"\r\n"))) <= 78, head
    content["headers"] = {"X-D": "k=v;" * 300}  # 1200 octets with no white space to fold at
    request["recipients"] = [{"email": "long@k9.test"}]
    status, answer = node.http_post(PATH, request, TOKEN)
    assert (status, answer["success_count"]) == (200, 1), answer
    data = _delivered(sink, "long@k9.test")["long@k9.test"].data
    message = email.message_from_bytes(data, policy=email.policy.default)
    assert str(message["X-D"]) == "k=v;" * 300
    assert max(map(len, data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"))) <= 998
