"""What a DSN returns of a message (its header section, or all of it under RET=FULL) is the
message as it would leave Pigeon, never the spooled original: the routing headers
(`[delivery] tenant_header`, `campaign_header`: for Pigeon only) are not in it, and the
policy's header edits and a submission's Date and Message-ID are. Each door (SMTP, HTTP raw
content, HTTP parts with a JSON `tenant` and `campaign`), each RET, each kind of report
(a bounce, an expiry, a success relayed), through a real node to a real sink: the report's
bytes are compared with the copy the same sink got for the recipient that was delivered."""

from __future__ import annotations

import email
import email.policy
import smtplib
import textwrap
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import Received, ScriptedSink, delivery_config, wait_until

TOKEN = "dsn-returns-token-0123456789"
SECRETS = (b"secrettenant", b"secretcampaign")
POLICY = """
    from pigeon.policy import Changes

    def on_message(message):
        return Changes(add_headers=[("X-Policy-Added", "yes")], remove_headers=["X-Drop-Me"])
"""


def _message(sender: str, recipients: list[str]) -> bytes:
    # The configured tenant header, and the campaign header in another case than configured.
    return (
        f"From: <{sender}>\r\nTo: {', '.join(recipients)}\r\nSubject: returned\r\n"
        "X-Customer: secrettenant\r\nx-campaign: secretcampaign\r\nX-Drop-Me: gone\r\n"
        "\r\nHello.\r\n"
    ).encode()


@pytest.fixture(scope="module")
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture(scope="module")
def pigeon(tmp_path_factory: pytest.TempPathFactory, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("dsn-returns")
    policy = root / "policy.py"
    policy.write_text(textwrap.dedent(POLICY))
    sections = delivery_config(sink.endpoint, max_age="2s")
    sections["delivery"] |= {"tenant_header": "X-Customer", "campaign_header": "X-Campaign"}
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    with PigeonProcess(root / "node", http=http, policy={"module": str(policy)}, **sections) as node:
        yield node


def _smtp(pigeon: PigeonProcess, sender: str, recipients: list[str], ret: str, notify: str | None = None) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        assert client.mail(sender, [f"RET={ret}"])[0] == 250
        for recipient in recipients:
            options = [f"NOTIFY={notify}"] if notify and recipient.endswith("-ok@example.net") else []
            assert client.rcpt(recipient, options)[0] == 250
        assert client.data(_message(sender, recipients))[0] == 250


def _inject(pigeon: PigeonProcess, sender: str, recipients: list[str], content: Any, **extra: Any) -> None:
    request = {"envelope_sender": sender, "recipients": [{"email": r} for r in recipients], "content": content}
    status, answer = pigeon.http_post("/api/v1/inject", {**request, **extra}, TOKEN)
    assert status == 200 and answer["accepted"] == len(recipients), answer


def _arrived(sink: ScriptedSink, sender: str, delivered: str) -> tuple[Received, Received]:
    """The report to `sender` and the copy delivered to `delivered`, once both are in."""

    def both() -> tuple[Received, Received] | None:
        reports = [m for m in sink.received if m.recipients == [sender]]
        copies = [m for m in sink.received if m.recipients == [delivered]]
        return (reports[0], copies[0]) if reports and copies else None

    found: tuple[Received, Received] = wait_until(both)
    return found


def _returned(report: Received) -> tuple[str, bytes]:
    """The returned part's content type and its bytes, exactly as the report carries them."""
    parsed = email.message_from_bytes(report.data, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage) and parsed.defects == []
    kind = list(parsed.iter_parts())[2].get_content_type()
    boundary = parsed.get_boundary()
    assert boundary is not None
    start = report.data.index(f"Content-Type: {kind}\r\n\r\n".encode()) + len(f"Content-Type: {kind}\r\n\r\n")
    end = report.data.rindex(f"\r\n--{boundary}--".encode())
    return kind, report.data[start:end]


def _header_section(message: bytes) -> bytes:
    return message[: message.index(b"\r\n\r\n") + 2]


def _fields(header_section: bytes, unique: tuple[str, ...]) -> list[tuple[str, str]]:
    """Each field's name and value, the values of the `unique` fields left out."""
    parsed = email.message_from_bytes(header_section + b"\r\n", policy=email.policy.compat32)
    return [(name, "" if name.lower() in unique else value) for name, value in parsed.items()]


def _check(report: Received, copy: Received, *, full: bool, own_message: bool = False) -> bytes:
    """The report returns what the delivered copy is (headers, or all), no routing header.
    `own_message`: each recipient had a message of its own (HTTP injection), with its own
    Received, Date, Message-ID (and To, from parts): those fields' values are not compared."""
    assert report.sender in ("", "<>")
    for secret in SECRETS:
        assert secret not in report.data.lower(), report.data.decode()
        assert secret not in copy.data.lower()
    kind, returned = _returned(report)
    assert kind == ("message/rfc822" if full else "text/rfc822-headers")
    if own_message:
        unique = ("received", "date", "message-id", "to")
        assert _fields(returned, unique) == _fields(_header_section(copy.data), unique)
    else:
        assert returned == (copy.data if full else _header_section(copy.data))
    assert b"\r\nX-Policy-Added: yes\r\n" in returned and b"X-Drop-Me" not in returned
    return returned


@pytest.mark.parametrize("ret", ["HDRS", "FULL"])
def test_a_bounce_returns_the_message_as_it_left_over_smtp(pigeon: PigeonProcess, sink: ScriptedSink, ret: str) -> None:
    sender, delivered = f"bounce-{ret}@example.org", f"bounce-{ret}-ok@example.net"
    _smtp(pigeon, sender, [delivered, "permfail@example.net"], ret)
    report, copy = _arrived(sink, sender, delivered)
    _check(report, copy, full=ret == "FULL")
    assert b"Action: failed\r\n" in report.data
    # The peer as RFC 3464 names one: a host, here the address literal, without the port.
    assert b"\r\nRemote-MTA: dns; [127.0.0.1]\r\n" in report.data
    # Every line Pigeon wrote (all but the returned message's) within RFC 5322's 78 octets.
    _, returned = _returned(report)
    own = report.data.replace(returned, b"")
    assert max(len(line) for line in own.split(b"\r\n")) <= 78, own.decode()


@pytest.mark.parametrize("ret", ["HDRS", "FULL"])
def test_an_expiry_returns_the_message_as_it_left(pigeon: PigeonProcess, sink: ScriptedSink, ret: str) -> None:
    sender, delivered = f"expiry-{ret}@example.org", f"expiry-{ret}-ok@example.net"
    _smtp(pigeon, sender, [delivered, "tempfail@example.net"], ret)
    report, copy = _arrived(sink, sender, delivered)
    _check(report, copy, full=ret == "FULL")
    assert b"Status: 5.4.7\r\n" in report.data  # expired, with the server's last reply as its
    assert b"Diagnostic-Code: smtp; 451 4.3.0 try again later\r\n" in report.data


def test_a_success_report_returns_the_headers_as_they_left(pigeon: PigeonProcess, sink: ScriptedSink) -> None:
    sender, delivered = "success@example.org", "success-ok@example.net"
    _smtp(pigeon, sender, [delivered], "FULL", notify="SUCCESS")
    report, copy = _arrived(sink, sender, delivered)
    _check(report, copy, full=False)  # a success returns the headers only (RFC 3461 4.3)
    assert b"Action: relayed\r\n" in report.data


def test_a_bounce_of_raw_injected_content_returns_it_as_it_left(pigeon: PigeonProcess, sink: ScriptedSink) -> None:
    sender, delivered = "raw@example.org", "raw-ok@example.net"
    content = _message(sender, [delivered]).decode().replace("\r\n", "\n")
    _inject(pigeon, sender, [delivered, "permfail@example.net"], content, template=False)
    report, copy = _arrived(sink, sender, delivered)
    returned = _check(report, copy, full=False, own_message=True)
    # The content had neither: Pigeon's own Date and Message-ID are in what left, and so here.
    assert b"\r\nDate: " in returned and b"\r\nMessage-ID: <" in returned


def test_a_bounce_of_injected_parts_returns_them_as_they_left(pigeon: PigeonProcess, sink: ScriptedSink) -> None:
    sender, delivered = "parts@example.org", "parts-ok@example.net"
    # Pigeon writes the tenant and campaign headers itself, from the JSON fields.
    content = {"from": {"email": sender}, "subject": "returned", "text": "Hello.", "headers": {"X-Drop-Me": "gone"}}
    recipients = [delivered, "permfail@example.net"]
    _inject(pigeon, sender, recipients, content, tenant="secrettenant", campaign="secretcampaign")
    report, copy = _arrived(sink, sender, delivered)
    _check(report, copy, full=False, own_message=True)
