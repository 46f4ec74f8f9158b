"""Every header line Pigeon adds keeps within `[smtp] max_line_length`, as the README says,
whatever its length: with 78 and a 50-character `hostname`, a submission's Message-ID
(`email.utils.make_msgid`: 103 octets, the worker's pid in it) and the `by` line of the
Received field (97 octets) were longer, and a next hop with the same setting refused the
message (554 5.6.0). Pigeon's Message-ID is `<22 hex characters@hostname>`, as injected
mail's is."""

from __future__ import annotations

import re
import smtplib
from collections.abc import Iterator
from pathlib import Path

import pytest

from pigeon.listener.passwords import set_password
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

HOSTNAME = "h" * 42 + ".example"  # 50 characters
MAX_LINE = 78
TOKEN = "lines-token-0123456789abcdef"
MESSAGE = b"From: a@example.org\r\nSubject: hi\r\n\r\nbody\r\n"  # no Date, no Message-ID


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture
def node(tmp_path: Path, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    users = tmp_path / "users"
    set_password(users, "app", "secret-password")
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True, "hostname": HOSTNAME, "max_line_length": MAX_LINE}
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    with PigeonProcess(tmp_path / "node", smtp=smtp, http=http, **delivery_config(sink.endpoint)) as process:
        yield process


def _long_lines(data: bytes) -> list[bytes]:
    head = data.partition(b"\r\n\r\n")[0]
    return [line for line in head.split(b"\r\n") if len(line) > MAX_LINE]


def _message_id(data: bytes) -> str:
    head = data.partition(b"\r\n\r\n")[0].replace(b"\r\n ", b" ").replace(b"\r\n\t", b" ")
    (found,) = re.findall(rb"^Message-ID: *([^\r\n]*)", head, flags=re.MULTILINE | re.IGNORECASE)
    return found.decode()


def test_a_submission_leaves_with_header_lines_within_max_line_length(node: PigeonProcess, sink: ScriptedSink) -> None:
    with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        client.ehlo("client.example.org")
        client.login("app", "secret-password")
        assert client.sendmail("a@example.org", ["b@example.net"], MESSAGE) == {}
    (received,) = sink.wait_for(1)
    assert _long_lines(received.data) == []
    assert re.fullmatch(rf"<[0-9a-f]{{22}}@{HOSTNAME}>", _message_id(received.data)), received.data


def test_an_injection_leaves_with_header_lines_within_max_line_length(node: PigeonProcess, sink: ScriptedSink) -> None:
    request = {
        "envelope_sender": "a@example.org",
        "recipients": [{"email": "b@example.net"}],
        "content": MESSAGE.decode(),
        "template": False,
    }
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert status == 200, answer
    (received,) = sink.wait_for(1)
    assert _long_lines(received.data) == []
    assert re.fullmatch(rf"<[0-9a-f]{{22}}@{HOSTNAME}>", _message_id(received.data)), received.data


def test_a_bounce_leaves_with_header_lines_within_max_line_length(node: PigeonProcess, sink: ScriptedSink) -> None:
    with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        assert client.sendmail("a@example.org", ["permfail@example.net"], MESSAGE) == {}
    (bounce,) = sink.wait_for(1)
    assert bounce.recipients == ["a@example.org"]
    # Every line of it is Pigeon's (the returned header section too, with its Received field).
    too_long = [line for line in bounce.data.split(b"\r\n") if len(line) > MAX_LINE]
    assert too_long == [], too_long
