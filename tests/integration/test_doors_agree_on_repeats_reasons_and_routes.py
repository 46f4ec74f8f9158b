"""The same input through every door gets the same outcome, with the same text: SMTP (a real
socket), POST /api/v1/inject, KumoMTA's POST /api/inject/v1 and `pigeon inject`, against one
node that delivers to a sink. A mailbox named again is one mailbox, counted once against
`[smtp] max_recipients` and delivered once; an address refused says why, at KumoMTA's door
too; a source route (`@host:`) is SMTP path syntax, taken over SMTP and refused, saying so,
as an API's address."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import ScriptedSink, delivery_config

TOKEN = "doors-agree-token-0123456789"
LIMIT = 5  # [smtp] max_recipients
CONTENT = "From: <app@example.org>\nSubject: {subject}\n\nhello\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PigeonProcess, ScriptedSink]]:
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint)
        http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
        root = tmp_path_factory.mktemp("doors-agree") / "node"
        with PigeonProcess(root, http=http, smtp={"max_recipients": LIMIT}, **config) as node:
            yield node, sink


def _smtp(node: PigeonProcess, recipients: list[str], subject: str) -> list[tuple[int, list[str]]]:
    """Each RCPT's reply, then DATA's end's (when a recipient was taken)."""
    with RawSmtp(node.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<app@example.org>")
        answers = [smtp.command(f"RCPT TO:<{recipient}>") for recipient in recipients]
        if any(code == 250 for code, _ in answers):
            smtp.expect(354, "DATA")
            body = CONTENT.format(subject=subject).replace("\n", "\r\n")
            answers.append(smtp.command(body.encode() + b"."))
        smtp.command("QUIT")
    return answers


def _http(node: PigeonProcess, recipients: list[str], subject: str) -> tuple[int, Any]:
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": r} for r in recipients],
        "content": CONTENT.format(subject=subject),
        "template": False,
    }
    return node.http_post("/api/v1/inject", request, TOKEN)


def _kumo(node: PigeonProcess, recipients: list[str], subject: str) -> tuple[int, Any]:
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": r} for r in recipients],
        "content": CONTENT.format(subject=subject),
        "template_dialect": "Static",
    }
    return node.http_post("/api/inject/v1", request, TOKEN)


def _cli(node: PigeonProcess, recipients: list[str], subject: str) -> subprocess.CompletedProcess[str]:
    command = ["inject", "-c", str(node.config_path), "--token", TOKEN]
    command += ["--from", "app@example.org", *[arg for r in recipients for arg in ("--to", r)], "-"]
    content = CONTENT.format(subject=subject)
    return zygote.run(command, input=content, text=True, timeout=60, check=False)


def _delivered(sink: ScriptedSink, subject: str, count: int) -> list[str]:
    """Every recipient the sink got mail with `subject` for, once the node delivered `count`
    of them, and after a moment more (a second copy would come then)."""

    def by_subject() -> list[str]:
        return sorted(r for m in sink.received if m.email["Subject"] == subject for r in m.recipients)

    for _ in range(400):
        if len(by_subject()) >= count:
            break
        sink.after(0.05)
    sink.after(1.0)
    return by_subject()


def test_a_mailbox_named_again_is_one_mailbox_at_every_door_counted_once_and_delivered_once(
    world: tuple[PigeonProcess, ScriptedSink],
) -> None:
    node, sink = world
    named = ["ddx@rich.test"] * LIMIT + ["ddy@rich.test"]  # six RCPTs, two mailboxes

    answers = _smtp(node, named, "smtp")
    assert [code for code, _ in answers] == [250] * (LIMIT + 2), answers  # each RCPT, and the data
    assert _delivered(sink, "smtp", 2) == ["ddx@rich.test", "ddy@rich.test"]

    status, answer = _http(node, named, "http")
    assert (status, answer["accepted"], answer["failed"]) == (200, 2, LIMIT - 1), answer
    assert _delivered(sink, "http", 2) == ["ddx@rich.test", "ddy@rich.test"]

    status, answer = _kumo(node, named, "kumo")
    assert (status, answer["success_count"], answer["fail_count"]) == (200, 2, LIMIT - 1), answer
    assert _delivered(sink, "kumo", 2) == ["ddx@rich.test", "ddy@rich.test"]

    cli = _cli(node, named, "cli")
    assert cli.returncode == 1, cli.stderr  # the repeats refused, as the API says
    assert "refused: 550 5.1.0 duplicate of recipient 0 of the request" in cli.stdout
    assert _delivered(sink, "cli", 2) == ["ddx@rich.test", "ddy@rich.test"]


def test_max_recipients_counts_mailboxes_and_a_repeat_past_it_is_still_taken(
    world: tuple[PigeonProcess, ScriptedSink],
) -> None:
    node, sink = world
    distinct = [f"dd{n}@rich.test" for n in range(LIMIT)]
    # A repeat (the domain in another case is the same mailbox) between them, one more mailbox
    # past the limit, and a repeat after that refusal.
    named = [distinct[0], "dd0@RICH.test", *distinct[1:], "dd9@rich.test", distinct[2]]
    answers = _smtp(node, named, "limit")
    codes = [code for code, _ in answers]
    assert codes == [250] * (LIMIT + 1) + [452, 250, 250], answers
    assert answers[LIMIT + 1] == (
        452,
        ["4.5.3 Too many recipients for this message; send the rest in a new transaction"],
    ), answers
    assert _delivered(sink, "limit", LIMIT) == sorted(distinct)


LOCAL_TOO_LONG = "Local part is longer than 64 octets (RFC 5321 4.5.3.1.1)"
LITERAL = "Not a valid address literal: [IPv4] or [IPv6:...] (RFC 5321 4.1.3)"
IDNA = "Domain is not a valid internationalized domain name (IDNA2008, RFC 5891 5.4)"
RLO = "Address contains U+202E RIGHT-TO-LEFT OVERRIDE: no control or format characters allowed"
REFUSED = [
    # (address, SMTP reply code, text)
    ("x" * 65 + "@rich.test", 501, LOCAL_TOO_LONG),
    ("adi@[300.1.1.1]", 501, LITERAL),
    ("adi@\u2163.example", 553, IDNA),  # passes the schema's pattern, refused by the check after it
    ("adi\u202e@rich.test", 553, RLO),
]


@pytest.mark.parametrize(("bad", "code", "text"), REFUSED, ids=["local", "literal", "idna", "control"])
def test_an_address_refused_says_why_at_every_door_kumomtas_too(
    world: tuple[PigeonProcess, ScriptedSink], bad: str, code: int, text: str
) -> None:
    node, sink = world
    answers = _smtp(node, [bad], "never")
    assert answers == [(code, [f"5.1.3 {text}"])]

    status, answer = _http(node, [bad], "never")
    assert (status, answer) == (400, {"error": text, "field": "$.recipients[0].email"})

    cli = _cli(node, ["cli-ok@rich.test", bad], "never")
    assert cli.returncode == 2 and f"400: {text} ($.recipients[1].email)" in cli.stderr, cli.stderr

    # KumoMTA's door refuses such a recipient alone, as KumoMTA does, with the same reply.
    status, answer = _kumo(node, ["kumo-ok@rich.test", bad], f"kumo {code} {text[:10]}")
    assert status == 200, answer
    assert answer == {
        "success_count": 1,
        "fail_count": 1,
        "failed_recipients": [bad],
        "errors": [f"{bad}: {code} 5.1.3 {text}"],
    }
    assert _delivered(sink, f"kumo {code} {text[:10]}", 1) == ["kumo-ok@rich.test"]


def test_what_is_no_address_at_all_gets_the_syntax_text_at_kumomtas_door(
    world: tuple[PigeonProcess, ScriptedSink],
) -> None:
    node, _ = world
    status, answer = _kumo(node, ["no address", "kumo-ok2@rich.test"], "syntax")
    assert status == 200
    assert answer["errors"] == ["no address: 501 5.1.3 Not a valid mailbox address (local@domain)"]
    status, answer = _http(node, ["no address"], "never")
    assert (status, answer["error"]) == (400, "Not a valid mailbox address (local@domain)")


ROUTE = "A source route (@host:) is SMTP path syntax, no part of an address: give local@domain alone (RFC 5321 4.1.1.3)"


def test_a_source_route_is_taken_and_ignored_over_smtp_and_refused_saying_so_as_an_api_address(
    world: tuple[PigeonProcess, ScriptedSink],
) -> None:
    node, sink = world
    routed = "@r1.test,@r2.test:adsr@rich.test"
    # RFC 5321 4.1.1.3 and C: a server must take a source route in a path, and may ignore it.
    answers = _smtp(node, [routed], "route")
    assert [code for code, _ in answers] == [250, 250], answers
    assert _delivered(sink, "route", 1) == ["adsr@rich.test"]

    # An API's address field is an address, not an SMTP path: refused, saying what to send.
    status, answer = _http(node, [routed], "never")
    assert (status, answer) == (400, {"error": ROUTE, "field": "$.recipients[0].email"})
    cli = _cli(node, [routed], "never")
    assert cli.returncode == 2 and f"400: {ROUTE} ($.recipients[0].email)" in cli.stderr, cli.stderr
    status, answer = _kumo(node, [routed], "never")
    assert (status, answer["errors"]) == (200, [f"{routed}: 501 5.1.3 {ROUTE}"]), answer
    request = {"envelope_sender": routed, "recipients": [{"email": "a@rich.test"}], "content": "x"}
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer) == (400, {"error": ROUTE, "field": "$.envelope_sender"})
