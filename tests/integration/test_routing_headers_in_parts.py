"""A tenant or campaign given in an injection's parts `headers` gets the answer the same value
gets at every other door: one that cannot name a queue (the campaign `inbound`, 300
characters, a bidi override) refuses the request whole, 400 naming the member
(`$.content.headers.X-Campaign`) with the reply SMTP gives, and `pigeon inject --header` exits
2 ("fix the command"), as `"campaign"`/`--campaign` and raw content do. It was 422 with a
`554 5.6.0` per recipient, and exit 1 ("look at the refused ones"), as if some recipients
could be sent again. A Date given there is named the same way. A header's value is read as
SMTP reads it wherever it is given: `X-Tenant: a b` is the tenant `a_b` (the JSON `tenant`
is the name itself, and refuses what no name holds). README: "HTTP injection"."""

from __future__ import annotations

import smtplib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until

TOKEN = "parts-token-0123456789"
INBOUND = "is 'inbound': its queues (inbound:...) would be taken for the [[inbound]] routes' own, which are named so"
UNFIT = {
    "campaign-inbound": ("X-Campaign", "inbound", f"X-Campaign header {INBOUND} (it names a queue)"),
    "tenant-300": ("X-Tenant", "t" * 300, "X-Tenant header is 300 characters long: at most 255 (it names a queue)"),
    "tenant-bidi": (
        "X-Tenant",
        "a\u202eb",
        "X-Tenant header contains U+202E RIGHT-TO-LEFT OVERRIDE: no control or format characters allowed"
        " (it names a queue)",
    ),
    # White space to `str.split()`, control characters to SMTP: refused, not made "_"
    "tenant-vt": ("X-Tenant", "ac\x0bme", "X-Tenant header contains U+000B: no control or format characters allowed"
                  " (it names a queue)"),
    "campaign-ff": ("X-Campaign", "sp\x0cring", "X-Campaign header contains U+000C: no control or format characters"
                    " allowed (it names a queue)"),
    "tenant-nel": ("X-Tenant", "ac\x85me", "X-Tenant header contains U+0085: no control or format characters allowed"
                   " (it names a queue)"),
}  # fmt: skip


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    with PigeonProcess(tmp_path_factory.mktemp("parts-routing") / "node", http=http) as running:
        yield running


def _parts(headers: dict[str, str], **more: Any) -> dict[str, Any]:
    content = {"from": {"email": "a@example.org"}, "subject": "s", "text": "t", "headers": headers}
    recipients = [{"email": "ann@example.net"}, {"email": "bob@example.net"}]
    return {"envelope_sender": "a@example.org", "recipients": recipients, "content": content, **more}


def _smtp(node: PigeonProcess, header: str, value: str) -> str:
    """The reply to a message with that header, over SMTP (the node's relay client)."""
    with smtplib.SMTP("127.0.0.1", node.smtp_port, timeout=30) as client:
        client.ehlo("client.test")
        assert client.mail("a@example.org", ["SMTPUTF8"] if not value.isascii() else [])[0] == 250
        assert client.rcpt("ann@example.net")[0] == 250
        message = f"From: a@example.org\r\n{header}: {value}\r\nSubject: smtp\r\n\r\nhi\r\n".encode()
        code, text = client.data(message)
    return f"{code} {text.decode()}"


def _rejections(node: PigeonProcess, status: int) -> int:
    return sum(1 for r in node.records("Rejection") if r["command"] == "inject" and r["response"]["code"] == status)


@pytest.mark.parametrize("template", [True, False], ids=["template", "as-it-is"])
@pytest.mark.parametrize("case", list(UNFIT))
def test_a_parts_header_that_names_no_queue_refuses_the_request_naming_the_member_with_smtp_s_reply(
    node: PigeonProcess, case: str, template: bool
) -> None:
    header, value, text = UNFIT[case]
    reply = f"554 5.6.0 {text}"
    assert _smtp(node, header, value) == reply
    stored, logged = len(node.spool_messages()), _rejections(node, 400)
    status, answer = node.http_post("/api/v1/inject", _parts({header: value}, template=template), TOKEN)
    assert (status, answer) == (400, {"error": reply, "field": f"$.content.headers.{header}"})
    wait_until(lambda: _rejections(node, 400) == logged + 1)  # one Rejection: the request's
    assert len(node.spool_messages()) == stored


def test_a_parts_header_is_named_as_given(node: PigeonProcess) -> None:
    status, answer = node.http_post("/api/v1/inject", _parts({"x-campaign": "Inbound"}), TOKEN)
    assert (status, answer["field"]) == (400, "$.content.headers.x-campaign"), answer


def test_a_later_recipient_whose_rendered_header_names_no_queue_is_refused_alone(node: PigeonProcess) -> None:
    request = _parts({"X-Campaign": "{{ campaign }}"})
    request["recipients"][0]["substitutions"] = {"campaign": "spring"}
    request["recipients"][1]["substitutions"] = {"campaign": "inbound"}
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["accepted"]) == (200, 1), answer
    assert answer["recipients"][1]["error"] == f"554 5.6.0 X-Campaign header {INBOUND} (it names a queue)"


def test_pigeon_inject_with_a_header_that_names_no_queue_exits_2_as_with_the_option(node: PigeonProcess) -> None:
    command = ["inject", "-c", str(node.config_path), "--token", TOKEN]
    command += ["--from", "a@example.org", "--to", "c13@example.net", "--subject", "s", "--text", "body"]
    by_header = zygote.run([*command, "--header", "X-Campaign=inbound"], timeout=60)
    by_option = zygote.run([*command, "--campaign", "inbound"], timeout=60)
    assert (by_header.returncode, by_option.returncode) == (2, 2), (by_header, by_option)
    assert "($.content.headers.X-Campaign)" in by_header.stderr.decode(), by_header
    assert "($.campaign)" in by_option.stderr.decode(), by_option


def test_a_parts_header_s_white_space_becomes_an_underscore_as_over_smtp(node: PigeonProcess) -> None:
    assert _smtp(node, "X-Tenant", "acme corp").startswith("250 ")
    status, answer = node.http_post("/api/v1/inject", _parts({"X-Tenant": "acme corp"}), TOKEN)
    assert (status, answer["accepted"]) == (200, 2), answer
    wait_until(lambda: sum(r["queue"] == "acme_corp@example.net" for r in node.records("Reception")) == 3)
    status, answer = node.http_post("/api/v1/inject", _parts({}, tenant="acme corp"), TOKEN)
    assert (status, answer["field"]) == (400, "$.tenant"), answer
