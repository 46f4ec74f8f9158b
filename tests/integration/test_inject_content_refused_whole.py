"""Content injected as it is (`"template": false`) is every recipient's alike: when it fails
SMTP reception's content check, the request is refused whole, 400 naming `$.content` with the
reply SMTP gives the same content, as a second Subject is; not a 200 listing each recipient
refused. `pigeon inject --no-template` exits 2 for it (README: a request refused with 400).
SMTP gives the same content the same reply, word for word."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import wait_until

TOKEN = "content-token-0123456789"
MAX_SIZE = 8192

CASES = {
    "long line": (
        "Subject: " + "s" * 1000 + "\r\n\r\nhello\r\n",
        "554 5.6.0 Message has a line longer than 998 octets (RFC 5322 2.1.1)",
    ),
    "long tenant": (
        "X-Tenant: " + "t" * 300 + "\r\nSubject: hi\r\n\r\nhello\r\n",
        "554 5.6.0 X-Tenant header is 300 characters long: at most 255 (it names a queue)",
    ),
    "loop": (
        "".join(f"Received: from hop{n}.example by relay.example; 1 Jan 2024 00:00 +0000\r\n" for n in range(101))
        + "Subject: hi\r\n\r\nhello\r\n",
        "554 5.4.6 Too many hops: mail loop detected (RFC 5321 6.3)",
    ),
    "too big": (
        "Subject: hi\r\n\r\n" + ("b" * 70 + "\r\n") * (MAX_SIZE // 72 + 10),
        f"552 5.3.4 Message size exceeds fixed maximum message size of {MAX_SIZE} octets",
    ),
    "two from": (
        "From: a@example.org\r\nFrom: b@example.org\r\nSubject: hi\r\n\r\nhello\r\n",
        "554 5.6.0 Message has more than one From header field (RFC 5322 3.6 allows one)",
    ),
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """Delivery off: what is taken stays in the spool, to be counted."""
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    root = tmp_path_factory.mktemp("content") / "node"
    with PigeonProcess(root, http=http, smtp={"max_message_size": MAX_SIZE}) as node:
        yield node


@pytest.mark.parametrize("case", list(CASES))
def test_raw_content_that_fails_the_content_check_refuses_the_whole_request(node: PigeonProcess, case: str) -> None:
    content, reply = CASES[case]
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": f"ann-{case.replace(' ', '-')}@example.net"}, {"email": "bob@example.net"}],
        "content": content,
        "template": False,
    }
    before = len(node.spool_messages())
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert status == 400, answer
    assert answer == {"error": reply, "field": "$.content"}
    assert len(node.spool_messages()) == before
    # One Rejection for the request, as for any other it refuses whole.
    logged = wait_until(lambda: [r for r in node.records("Rejection") if r["response"]["text"].startswith(reply)])
    assert [(r["command"], r["response"]["code"]) for r in logged] == [("inject", 400)]


@pytest.mark.parametrize("case", list(CASES))
def test_smtp_refuses_such_content_with_the_very_text_http_gives(node: PigeonProcess, case: str) -> None:
    """One rule, one text: README says an injection's error is the reply SMTP gives."""
    content, reply = CASES[case]
    with RawSmtp(node.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org>")
        smtp.expect(250, "RCPT TO:<smtp@example.net>")
        smtp.expect(354, "DATA")
        code, lines = smtp.command(content + ".")
    assert f"{code} {lines[-1]}" == reply


@pytest.mark.parametrize("case", ["long line", "loop"])
def test_pigeon_inject_no_template_of_such_content_exits_2_with_the_reply(node: PigeonProcess, case: str) -> None:
    content, reply = CASES[case]
    command = ["inject", "-c", str(node.config_path), "--token", TOKEN]
    command += ["--no-template", "--from", "app@example.org", "--to", "cli@example.net", "-"]
    done = zygote.run(command, input=content, text=True, timeout=60, check=False)
    assert done.returncode == 2, done
    assert f"pigeon: 400: {reply} ($.content)" in done.stderr


TOO_BIG = f"552 5.3.4 Message size exceeds fixed maximum message size of {MAX_SIZE} octets"
# Under max_message_size in characters, over it in octets (each "é" two in UTF-8, each line
# end a CRLF): no render budget is spent, and the message is too big all the same.
WIDE = "From: a@example.org\nSubject: hi\n\n" + ("é" * 70 + "\n") * 80


@pytest.mark.parametrize(
    ("path", "how"),
    [
        ("/api/v1/inject", {"template": False}),
        ("/api/v1/inject", {}),
        ("/api/v1/inject", {"content": WIDE + "{{ email }}\n"}),
        ("/api/v1/inject", {"content": {"from": {"email": "a@example.org"}, "text": WIDE}}),
        ("/api/inject/v1", {"template_dialect": "Static"}),
        ("/api/inject/v1", {}),
        ("/api/inject/v1", {"content": WIDE + "{{ email }}\n"}),
    ],
    ids=["as-is", "template", "rendered", "parts", "kumo-static", "kumo-template", "kumo-rendered"],
)
def test_content_over_max_message_size_refuses_the_request_whatever_template_says(
    node: PigeonProcess, path: str, how: dict[str, object]
) -> None:
    """Found from outside: the same content over max_message_size got 400 naming `$.content` as
    it is (`"template": false`), but 422 with `552 5.3.4` for each recipient as a template,
    with or without `{{ }}`. README: a render over max_message_size is refused with 400 for the
    first recipient, and content that is no template with SMTP's reply."""
    request = {"envelope_sender": "app@example.org", "content": WIDE, **how,
               "recipients": [{"email": "big-1@example.net"}, {"email": "big-2@example.net"}]}  # fmt: skip
    before = len(node.spool_messages())
    status, answer = node.http_post(path, request, TOKEN)
    assert (status, answer) == (400, {"error": TOO_BIG, "field": "$.content"})
    assert len(node.spool_messages()) == before


def test_a_later_recipient_whose_render_is_over_max_message_size_is_refused_alone(node: PigeonProcess) -> None:
    """Once a recipient's message was taken, the content is no longer at fault: a later one
    its substitutions make too big gets SMTP's reply, alone; and a render that passes the size
    in characters is stopped, 400 naming the limit, as the first recipient's."""
    request = {"envelope_sender": "app@example.org", "content": "From: a@example.org\n\n{{ x }}\n",
               "recipients": [{"email": "fits@example.net", "substitutions": {"x": "é"}},
                              {"email": "wide@example.net", "substitutions": {"x": "é" * 5000}}]}  # fmt: skip
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["accepted"]) == (200, 1), answer
    assert answer["recipients"][1] == {"email": "wide@example.net", "error": TOO_BIG}
    request["recipients"] = [{"email": "long@example.net", "substitutions": {"x": "x" * (MAX_SIZE + 1)}}]
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    limit = f"template raw: output over {MAX_SIZE} characters (the message size limit)"
    assert (status, answer) == (400, {"error": limit, "field": "$.content"})
