"""The same rules at every door: SMTP, POST /api/v1/inject and `pigeon inject` against one node."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import wait_until

TOKEN = "doors-token-0123456789"
TOKENS = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
LIMIT = 5


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """Delivery off: what a door takes stays in the spool, to be counted."""
    http = {"token": TOKENS, "max_recipients": LIMIT, "max_request_size": "64KiB"}
    with PigeonProcess(tmp_path_factory.mktemp("doors") / "node", http=http, smtp={"max_recipients": LIMIT}) as node:
        yield node


def _request(*emails: str, **overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": email} for email in emails],
        "content": "From: <app@example.org>\nSubject: hi\n\nhello\n",
        "template": False,
    }
    request.update(overrides)
    return request


def _cli(
    node: PigeonProcess, *args: str, stdin: str = "From: a@example.org\nSubject: hi\n\nhello\n"
) -> subprocess.CompletedProcess[str]:
    command = ["inject", "-c", str(node.config_path), "--from", "app@example.org"]
    return zygote.run([*command, *args, "-"], input=stdin, text=True, timeout=60)


def _smtp_rcpt(node: PigeonProcess, address: str) -> tuple[int, list[str]]:
    with RawSmtp(node.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org>")
        return smtp.command(f"RCPT TO:<{address}>")


def _rejection(node: PigeonProcess, text: str) -> dict[str, Any]:
    """The one Rejection whose response text is `text`, once it is written (a moment after the answer)."""
    found = wait_until(lambda: [r for r in node.records("Rejection") if r["response"]["text"] == text])
    assert len(found) == 1, found
    return found[0]


def test_a_request_over_http_max_recipients_is_refused_whole_naming_the_setting(node: PigeonProcess) -> None:
    before = len(node.spool_messages())
    too_many = [f"r{n}@example.net" for n in range(LIMIT + 1)]
    status, answer = node.http_post("/api/v1/inject", _request(*too_many), TOKEN)
    assert status == 400, answer
    assert answer == {
        "error": f"{LIMIT + 1} recipients, over [http] max_recipients ({LIMIT}): send them in more requests",
        "field": "$.recipients",
    }
    cli = _cli(node, *[arg for email in too_many for arg in ("--to", email)])
    assert cli.returncode == 2 and "[http] max_recipients (5)" in cli.stderr, cli.stderr
    assert len(node.spool_messages()) == before  # nothing stored
    # As many as the limit are taken: content sent as it is, to one domain, is one message for them all.
    status, answer = node.http_post("/api/v1/inject", _request(*too_many[:LIMIT]), TOKEN)
    assert (status, answer["accepted"]) == (200, LIMIT), answer
    stored = node.spool_messages()[before:]
    assert [len(m["recipients"]) for m in stored] == [LIMIT]


@pytest.mark.parametrize("mailbox", ['"quoted local"@dest.test', "u@[127.0.0.1]", "u@[IPv6:::1]"])
def test_a_quoted_local_part_or_an_address_literal_passes_every_door(node: PigeonProcess, mailbox: str) -> None:
    assert _smtp_rcpt(node, mailbox)[0] == 250
    status, answer = node.http_post("/api/v1/inject", _request(mailbox), TOKEN)
    assert (status, answer.get("accepted")) == (200, 1), answer
    assert answer["recipients"][0]["email"] == mailbox
    status, answer = node.http_post("/api/v1/inject", _request("ann@example.net", envelope_sender=mailbox), TOKEN)
    assert (status, answer.get("accepted")) == (200, 1), answer
    cli = _cli(node, "--to", mailbox)
    assert cli.returncode == 0, cli.stderr


def test_an_address_literal_that_is_no_address_gets_the_same_text_at_every_door(node: PigeonProcess) -> None:
    text = "Not a valid address literal: [IPv4] or [IPv6:...] (RFC 5321 4.1.3)"
    assert _smtp_rcpt(node, "u@[300.1.1.1]") == (501, [f"5.1.3 {text}"])
    status, answer = node.http_post("/api/v1/inject", _request("u@[300.1.1.1]"), TOKEN)
    assert (status, answer) == (400, {"error": text, "field": "$.recipients[0].email"})


def test_a_refused_injection_is_logged_as_a_rejection_naming_the_token(node: PigeonProcess) -> None:
    status, _ = node.http_post("/api/v1/inject", _request("ann@example.net", "bad address"), TOKEN)
    assert status == 400
    record = _rejection(node, "Not a valid mailbox address (local@domain) ($.recipients[1].email)")
    assert (record["command"], record["auth_user"], record["response"]["code"]) == ("inject", "app", 400)
    assert record["session"].startswith("http-") and record["peer"].startswith("127.0.0.1:")
    nul = _request("ann@example.net", content={"from": {"email": "app@example.org"}, "subject": "a\x00b", "text": "t"})
    assert node.http_post("/api/v1/inject", nul, TOKEN)[0] == 400
    _rejection(node, "554 5.6.0 Message contains a NUL octet (RFC 5322 2.3, RFC 6152 2) ($.content.subject)")
    # Over [http] max_request_size by its Content-Length: refused before the body is read.
    big = _request("ann@example.net", content="From: a@example.org\nSubject: big\n\n" + "x" * 70_000)
    status, answer = node.http_post("/api/v1/inject", big, TOKEN)
    assert status == 413, answer
    record = _rejection(node, "request body is over [http] max_request_size (65536 bytes) ($)")
    assert (record["response"]["code"], record["auth_user"]) == (413, "app")
    # No token: 401, and nothing logged (anyone may send those, at no cost).
    injections = len([r for r in node.records("Rejection") if r["command"] == "inject"])
    assert node.http_post("/api/v1/inject", _request("ann@example.net", "no token"), None)[0] == 401
    assert node.http_post("/api/v1/inject", big, None)[0] == 401
    assert node.http_post("/api/v1/inject", _request("ann@example.net", "then a token"), TOKEN)[0] == 400
    # (the request after them is logged: had they been, they would be before it)
    wait_until(lambda: len([r for r in node.records("Rejection") if r["command"] == "inject"]) == injections + 1)
    assert all(r.get("auth_user") for r in node.records("Rejection") if r["command"] == "inject")


def test_a_request_refused_whole_is_logged_with_the_sender_and_recipients_it_named(node: PigeonProcess) -> None:
    # Found from outside: a 400 was logged without them, so `pigeon logs --sender` and
    # `--recipient` did not find it, and `--sender ''` (the null sender) did.
    request = _request("x@example.net", "Y@Example.net", envelope_sender="real.sender@b.test", tenant="a b")
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert status == 400, answer
    record = _rejection(node, f"{answer['error']} ({answer['field']})")
    assert (record["sender"], record["recipients"]) == ("real.sender@b.test", ["x@example.net", "Y@Example.net"])
    # The null sender is named as such; past [smtp] max_recipients (5 here), the first ones only.
    too_many = [f"many{n}@example.net" for n in range(LIMIT + 2)]  # (7: another text than the test above)
    status, answer = node.http_post("/api/v1/inject", _request(*too_many, envelope_sender=""), TOKEN)
    assert status == 400, answer
    record = _rejection(node, f"{answer['error']} ({answer['field']})")
    assert (record["sender"], record["recipients"]) == ("", too_many[:LIMIT])
    # A body that is no JSON names nobody: neither field is written.
    cut = b'{"envelope_sender": "a@b.test", "recipients": ['
    status, answer = node.http_post("/api/v1/inject", None, TOKEN, raw=cut)
    assert status == 400, answer
    record = _rejection(node, f"{answer['error']} ({answer['field']})")
    assert "sender" not in record and "recipients" not in record


def test_a_tenant_over_255_characters_is_refused_at_every_door(node: PigeonProcess) -> None:
    before = len(node.spool_messages())
    tenant = "t" * 300
    text = "5.6.0 X-Tenant header is 300 characters long: at most 255 (it names a queue)"
    with RawSmtp(node.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org>")
        smtp.expect(250, "RCPT TO:<ann@example.net>")
        smtp.expect(354, "DATA")
        assert smtp.command(f"From: a@example.org\r\nX-Tenant: {tenant}\r\nSubject: hi\r\n\r\nhello\r\n.") == (
            554,
            [text],
        )
    raw = _request("ann@example.net", content=f"From: a@example.org\nX-Tenant: {tenant}\nSubject: hi\n\nhello\n")
    status, answer = node.http_post("/api/v1/inject", raw, TOKEN)
    assert (status, answer) == (400, {"error": f"554 {text}", "field": "$.content"})
    status, answer = node.http_post("/api/v1/inject", _request("ann@example.net", tenant="t" * 256), TOKEN)
    assert (status, answer["field"]) == (400, "$.tenant"), answer
    assert node.http_post("/api/v1/inject", _request("ann@example.net", tenant="t" * 255), TOKEN)[0] == 200
    assert len(node.spool_messages()) == before + 1


@pytest.mark.parametrize("header", ["X-Tenant", "X-Campaign"])
def test_a_routing_header_with_bytes_that_are_not_utf8_is_refused_at_every_door(
    node: PigeonProcess, header: str
) -> None:
    """Found from outside: `X-Tenant: glob\\xe9x` named the tenant `glob\\ufffdx`, read with the
    replacement character, so distinct byte strings (\\xe9, \\xe8) were one tenant."""
    before = len(node.spool_messages())
    text = f"5.6.0 {header} header holds byte 0xE9, which is not UTF-8: a name is text, in UTF-8 (it names a queue)"
    message = b"From: a@example.org\r\n" + header.encode() + b": glob\xe9x\r\nSubject: hi\r\n\r\nhello\r\n"
    with RawSmtp(node.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        for verb in ("DATA", "BDAT"):
            smtp.expect(250, "MAIL FROM:<app@example.org> BODY=8BITMIME")
            smtp.expect(250, "RCPT TO:<ann@example.net>")
            if verb == "DATA":
                smtp.expect(354, "DATA")
                assert smtp.command(message + b".") == (554, [text]), verb
            else:
                assert smtp.command(b"BDAT %d LAST\r\n" % len(message) + message[:-2]) == (554, [text]), verb
    raw = _request("ann@example.net", content=base64.b64encode(message).decode(), content_encoding="base64")
    status, answer = node.http_post("/api/v1/inject", raw, TOKEN)
    assert (status, answer) == (400, {"error": f"554 {text}", "field": "$.content"})
    assert len(node.spool_messages()) == before
    # Text that is UTF-8 names its tenant as it is.
    utf8 = message.replace(b"\xe9", "\u00e9".encode())
    raw = _request("bob@example.net", content=base64.b64encode(utf8).decode(), content_encoding="base64")
    assert node.http_post("/api/v1/inject", raw, TOKEN)[0] == 200


def test_a_tenant_with_white_space_colon_or_at_is_one_rule_at_every_door(node: PigeonProcess) -> None:
    """A header's value cannot be refused without refusing the mail: its white space, ':' and
    '@' become '_', over SMTP and in injected content alike. A tenant given as itself is refused
    naming the field (an admin selector's too: test_admin_refusals)."""
    queues = {m["queue"] for m in node.spool_messages()}
    with RawSmtp(node.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org>")
        smtp.expect(250, "RCPT TO:<ann@example.net>")
        smtp.expect(354, "DATA")
        smtp.expect(
            250,
            "From: a@example.org\r\nX-Tenant: a b@c:d\r\nX-Campaign:  spring \t sale\r\nSubject: hi\r\n\r\nhello\r\n.",
        )
    raw = _request("bob@example.net", content="From: a@example.org\nX-Tenant: a b@c:d\nSubject: hi\n\nhello\n")
    assert node.http_post("/api/v1/inject", raw, TOKEN)[0] == 200
    added = {m["queue"] for m in node.spool_messages()} - queues
    assert added == {"spring_sale:a_b_c_d@example.net", "a_b_c_d@example.net"}
    for field, value in (("tenant", "a b"), ("campaign", "x@y")):
        status, answer = node.http_post("/api/v1/inject", _request("ann@example.net", **{field: value}), TOKEN)
        shown = repr(value[1])
        error = f"{field} contains {shown}: no white space, ':' or '@' allowed (it names a queue)"
        assert (status, answer) == (400, {"error": error, "field": f"$.{field}"})


def test_a_tenant_or_campaign_both_in_the_request_and_its_content_gets_400_naming_the_header(
    node: PigeonProcess,
) -> None:
    """The request's own `tenant` and a routing header inside its content that says otherwise:
    most likely a mistake, refused rather than one of them chosen quietly (the header named the
    queue of parts). Either one alone names the queue."""
    before = node.spool_messages()
    parts = {"from": {"email": "app@example.org"}, "subject": "hi", "text": "hello"}
    for field, header in (("tenant", "X-Tenant"), ("campaign", "x-campaign")):
        request = _request("ann@example.net", content={**parts, "headers": {header: "zz top"}}, **{field: "a_b_c_d"})
        status, answer = node.http_post("/api/v1/inject", request, TOKEN)
        error = f"{header} is set here and by $.{field}: give it in one place"
        assert (status, answer) == (400, {"error": error, "field": f"$.content.headers.{header}"})
        raw = _request(
            "ann@example.net",
            content=f"From: a@example.org\nSubject: hi\n{header} : zz top\n\nhello\n",
            **{field: "a_b_c_d"},
        )
        status, answer = node.http_post("/api/v1/inject", raw, TOKEN)
        error = f"{header.title()} is set here and by $.{field}: give it in one place"
        assert (status, answer) == (400, {"error": error, "field": "$.content"})
    done = _cli(
        node,
        "--to",
        "ann@example.net",
        "--tenant",
        "acme",
        stdin="From: a@example.org\nX-Tenant: zz top\nSubject: hi\n\nhi\n",
    )
    assert done.returncode == 2, done
    assert "X-Tenant is set here and by $.tenant: give it in one place" in done.stderr
    assert node.spool_messages() == before
    # One place, either one: it names the queue.
    alone = _request("bob@example.net", content={**parts, "headers": {"X-Tenant": "zz top"}})
    assert node.http_post("/api/v1/inject", alone, TOKEN)[0] == 200
    in_body = _request(
        "cy@example.net", tenant="solo", content="From: a@example.org\nSubject: hi\n\nX-Tenant: zz top\n"
    )  # no header
    assert node.http_post("/api/v1/inject", in_body, TOKEN)[0] == 200
    added = {m["queue"] for m in node.spool_messages()} - {m["queue"] for m in before}
    assert added == {"zz_top@example.net", "solo@example.net"}


def _smtp_data(node: PigeonProcess, recipient: str, message: bytes) -> tuple[int, list[str]]:
    with RawSmtp(node.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org>")
        smtp.expect(250, f"RCPT TO:<{recipient}>")
        smtp.expect(354, "DATA")
        smtp.send(message + b".\r\n")
        return smtp.reply()


# A line in the header section that is no field: at every door the header section ends there,
# and an empty line is put in before it (as Postfix's cleanup does), so what follows is body.
NO_FIELD_LINE = b"From: a@example.org\r\nSubject: x\r\ngarbage line\r\n"


@pytest.mark.parametrize("template", [False, True])
def test_a_from_after_a_line_that_is_no_field_is_body_at_every_door(node: PigeonProcess, template: bool) -> None:
    message = NO_FIELD_LINE + b"From: evil@example.com\r\n\r\nbody\r\n"
    before = {m["id"] for m in node.spool_messages()}
    assert _smtp_data(node, "smtp@example.net", message)[0] == 250
    request = _request("http@example.net", content=message.decode(), template=template)
    assert node.http_post("/api/v1/inject", request, TOKEN)[0] == 200
    added = {m["recipients"][0]: m["data"] for m in node.spool_messages() if m["id"] not in before}
    split = b"From: a@example.org\r\nSubject: x\r\n\r\ngarbage line\r\nFrom: evil@example.com\r\n"
    assert split in added["smtp@example.net"] and split in added["http@example.net"], added


@pytest.mark.parametrize("template", [False, True])
def test_an_x_tenant_after_a_line_that_is_no_field_names_no_queue_at_any_door(
    node: PigeonProcess, template: bool
) -> None:
    message = NO_FIELD_LINE + f"X-Tenant: after-garbage-{template}\r\n\r\nbody\r\n".encode()
    before = {m["id"] for m in node.spool_messages()}
    assert _smtp_data(node, "smtp@example.net", message)[0] == 250
    request = _request("http@example.net", content=message.decode(), template=template)
    assert node.http_post("/api/v1/inject", request, TOKEN)[0] == 200
    added = {m["recipients"][0]: m["queue"] for m in node.spool_messages() if m["id"] not in before}
    assert added == {"smtp@example.net": "example.net", "http@example.net": "example.net"}


def test_a_long_or_non_ascii_tenant_of_parts_names_its_queue_as_it_is_and_asks_for_no_smtputf8(
    node: PigeonProcess,
) -> None:
    """The routing field of a message made of parts was written as RFC 2047 words when the
    tenant was not short ASCII: the intake, which reads it undecoded, named the queue
    "=?utf-8?q?...?=" (and refused a 255-character tenant as 319 characters long)."""
    tenant = "bücher-" + "t" * 248  # 255 characters
    parts = {"from": {"email": "app@example.org"}, "subject": "hi", "text": "hello"}
    before = {m["id"] for m in node.spool_messages()}
    requests = [
        _request("given@example.net", content=parts, tenant=tenant),
        _request("header@example.net", content={**parts, "headers": {"x-tenant": f"{tenant}"}}),
        _request("raw@example.net", content="From: a@example.org\nSubject: hi\n\nhello\n", tenant=tenant),
    ]
    for request in requests:
        status, answer = node.http_post("/api/v1/inject", request, TOKEN)
        assert (status, answer.get("accepted")) == (200, 1), answer
    added = {m["recipients"][0]: m for m in node.spool_messages() if m["id"] not in before}
    assert {r: m["queue"] for r, m in added.items()} == {
        "given@example.net": f"{tenant}@example.net",
        "header@example.net": f"{tenant}@example.net",
        "raw@example.net": f"{tenant}@example.net",
    }
    assert not added["given@example.net"]["envelope"].smtputf8  # the field comes off before delivery


NO_NAME = (
    "554 5.6.0 template subject: 'name' is undefined: the recipient has no name (give it one, or write"
    ' {{ name | default("...") }})'
)


def _subject(node: PigeonProcess, spool_id: str) -> bytes:
    (data,) = [m["data"] for m in node.spool_messages() if m["id"] == spool_id]
    return next(line for line in data.split(b"\r\n") if line.startswith(b"Subject: "))


def test_hello_name_refuses_a_recipient_without_a_name_rather_than_sending_hello_comma(node: PigeonProcess) -> None:
    """README: an undefined variable refuses the recipient rather than sending "Dear ,"; `name`
    defaulted to "" for a recipient without one, and "Hello " went out."""
    parts = {"from": {"email": "app@example.org"}, "subject": "Hello {{ name }}", "text": "x"}
    recipients = [{"email": "ann@example.net", "name": "Ann"}, {"email": "anon@example.net"}]
    request = {**_request(), "recipients": recipients, "content": parts, "template": True}
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer
    ann, anon = answer["recipients"]
    assert anon == {"email": "anon@example.net", "error": NO_NAME}
    assert _subject(node, ann["id"]) == b"Subject: Hello Ann"
    fallback = {**parts, "subject": 'Hello {{ name | default("there") }}'}
    request = {**_request("anon@example.net"), "content": fallback, "template": True}
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["accepted"]) == (200, 1), answer
    assert _subject(node, answer["recipients"][0]["id"]) == b"Subject: Hello there"
    # The OpenAPI document says so where a client looks: at the recipient's name.
    document = json.loads(node.http_get("/api/openapi.json")[1])
    name = document["components"]["schemas"]["InjectRecipient"]["properties"]["name"]
    assert "`name` is undefined: a template that writes it out refuses this recipient" in name["description"]
    assert '{{ name | default("there") }}' in name["description"]


def test_pigeon_inject_of_hello_name_refuses_and_its_help_example_sends_a_fallback(node: PigeonProcess) -> None:
    command = ["inject", "-c", str(node.config_path), "--from", "me@example.org"]
    command += ["--to", "you@example.net", "--text", "x"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return zygote.run([*command, *args], text=True, timeout=60, check=False)

    refused = run("--subject", "Hello {{ name }}")  # the outside tester's
    assert refused.returncode == 1, refused
    assert refused.stdout.split(None, 2)[1:] == ["refused:", NO_NAME + "\n"]
    # The --help example (its subject), and a name given to every recipient by --var.
    helped = [line.strip() for line in run("--help").stdout.splitlines() if "--subject 'Hello" in line]
    assert helped == [
        """--subject 'Hello {{ name | default("there") }}' --text 'Your code is {{ code }}.' --var code=1234 \\"""
    ]
    sent = run("--subject", 'Hello {{ name | default("there") }}')
    assert sent.returncode == 0, sent
    assert _subject(node, sent.stdout.split()[-1]) == b"Subject: Hello there"
    named = run("--subject", 'Hello {{ name | default("there") }}', "--var", "name=Ann")
    assert named.returncode == 0, named
    assert _subject(node, named.stdout.split()[-1]) == b"Subject: Hello Ann"
