"""Content whose first line starts with white space (or is no header field at all) is body,
after an empty line put in, over SMTP (DATA and BDAT, relayed or submitted) as over HTTP
injection (a submission that is all body has no From, and is refused): left as it came, it
would continue Pigeon's own Received field, a trace a client could write its own words into.
Every check at intake reads the same split as is delivered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pigeon.listener.passwords import set_password
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

CONTENT = b"\tby forged.example with ESMTP\r\nSubject: s\r\n\r\nbody\r\n"
TOKEN = "inject-token-0123456789"
NO_FROM = "Message has no From header field (RFC 5322 3.6 requires one): add From: with the author's address"
PLAIN = "AGFwcABzZWNyZXQtcGFzc3dvcmQ="  # base64 of "\0app\0secret-password"


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture
def pigeon(tmp_path: Path, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    users = tmp_path / "users"
    set_password(users, "app", "secret-password")
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    with PigeonProcess(tmp_path / "node", smtp=smtp, http=http, **delivery_config(sink.endpoint)) as process:
        yield process


def _send(pigeon: PigeonProcess, content: bytes, *, verb: str, login: bool) -> tuple[int, list[str]]:
    with RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO client.test")
        if login:
            client.expect(235, f"AUTH PLAIN {PLAIN}")
        client.expect(250, "MAIL FROM:<a@example.org>")
        client.expect(250, "RCPT TO:<b@example.net>")
        if verb == "DATA":
            client.expect(354, "DATA")
            client.send(content + b".\r\n")
        else:
            client.send(b"BDAT %d LAST\r\n" % len(content) + content)
        answer = client.reply()
        client.expect(221, "QUIT")
    return answer


def _split(message: bytes) -> tuple[bytes, bytes]:
    head, _, body = message.partition(b"\r\n\r\n")
    return head + b"\r\n", body


@pytest.mark.parametrize("login", [False, True], ids=["relayed", "submitted"])
@pytest.mark.parametrize("verb", ["DATA", "BDAT"])
def test_content_starting_with_white_space_is_body_not_part_of_our_received_field(
    pigeon: PigeonProcess, sink: ScriptedSink, verb: str, login: bool
) -> None:
    code, text = _send(pigeon, CONTENT, verb=verb, login=login)
    if login:
        # All body, so no From: a submission without one is refused (its Subject is no field).
        assert (code, text) == (554, [f"5.6.0 {NO_FROM}"])
        return
    assert code == 250
    (received,) = sink.wait_for(1)
    head, body = _split(received.data)
    assert head.startswith(b"Received: from client.test") and b"forged" not in head, received.data
    assert body == CONTENT
    fields = [line.split(b":", 1)[0] for line in head.split(b"\r\n") if line and line[:1] not in b" \t"]
    assert fields == [b"Received"]


def test_smtp_and_http_injection_read_such_content_alike(pigeon: PigeonProcess) -> None:
    """All body at both submission doors, so with no From, refused with one text."""
    assert _send(pigeon, CONTENT, verb="DATA", login=True) == (554, [f"5.6.0 {NO_FROM}"])
    request = {"envelope_sender": "a@example.org", "recipients": [{"email": "b@example.net"}]}
    request |= {"content": CONTENT.decode(), "template": False}
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer) == (400, {"error": f"554 5.6.0 {NO_FROM}", "field": "$.content"})


def test_fields_after_a_line_that_is_no_field_are_body_to_every_check(
    pigeon: PigeonProcess, sink: ScriptedSink
) -> None:
    # Read as header fields, these would be refused (From twice) and name a queue (X-Tenant).
    content = b"Subject: s\r\nnot a field\r\nFrom: a@example.org\r\nFrom: b@example.org\r\nX-Tenant: acme\r\n\r\nx\r\n"
    code, text = _send(pigeon, content, verb="DATA", login=False)
    assert code == 250, text
    (received,) = sink.wait_for(1)
    head, body = _split(received.data)
    assert head.endswith(b"Subject: s\r\n")
    assert body == content.removeprefix(b"Subject: s\r\n")
    (reception,) = wait_until(lambda: pigeon.records("Reception"))
    assert "acme" not in reception["queue"]
