"""A message submitted over authenticated SMTP without a Date or Message-ID leaves with
Pigeon's (RFC 6409 8.2, 8.3), as an HTTP injection does; one that has them keeps its own, and
a relayed (unauthenticated) message is left as it came. A policy that removes them from a
submission (through either door) does not send it out without them."""

from __future__ import annotations

import email
import email.policy
import smtplib
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pigeon.listener.passwords import set_password
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

OWN = b"Date: Mon, 1 Jan 2024 00:00:00 +0000\r\nMessage-ID: <own@example.org>\r\n"


@pytest.fixture
def sink() -> Iterator[ScriptedSink]:
    with ScriptedSink() as running:
        yield running


@pytest.fixture
def pigeon(tmp_path: Path, sink: ScriptedSink) -> Iterator[PigeonProcess]:
    users = tmp_path / "users"
    set_password(users, "app", "secret-password")
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    with PigeonProcess(tmp_path / "node", smtp=smtp, **delivery_config(sink.endpoint)) as process:
        yield process


def _send(pigeon: PigeonProcess, message: bytes, *, login: bool) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        if login:
            client.login("app", "secret-password")
        assert client.sendmail("a@example.org", ["b@example.net"], message) == {}


@pytest.mark.parametrize(
    ("login", "own"), [(True, b""), (True, OWN), (False, b"")], ids=["submitted", "own", "relayed"]
)
def test_a_submission_gets_the_date_and_message_id_it_lacks(
    pigeon: PigeonProcess, sink: ScriptedSink, login: bool, own: bytes
) -> None:
    _send(pigeon, own + b"From: a@example.org\r\nSubject: hi\r\n\r\nbody\r\n", login=login)
    (received,) = sink.wait_for(1)
    message = email.message_from_bytes(received.data, policy=email.policy.default)
    dates, ids = message.get_all("Date") or [], message.get_all("Message-ID") or []
    if own:
        assert (dates, ids) == (["Mon, 01 Jan 2024 00:00:00 +0000"], ["<own@example.org>"])
    elif login:
        assert len(dates) == 1 and len(ids) == 1, received.data
        assert received.data.startswith(b"Received: ")  # the trace field stays on top (RFC 5322 3.6.7)
        assert ids[0].endswith(">") and "@" in ids[0]
    else:
        assert (dates, ids) == ([], [])


DROPS_THEM = """
    from pigeon.policy import Changes
    def on_message(message):
        return Changes(remove_headers=["Date", "Message-ID"])
"""
TOKEN = "inject-token-0123456789"


@pytest.mark.parametrize("door", ["smtp", "http"])
def test_a_submission_whose_date_and_message_id_a_policy_removed_leaves_with_new_ones(
    tmp_path: Path, sink: ScriptedSink, door: str
) -> None:
    users = tmp_path / "users"
    set_password(users, "app", "secret-password")
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(DROPS_THEM))
    smtp = {"auth_users": str(users), "allow_plaintext_auth": True}
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    config = delivery_config(sink.endpoint)
    with PigeonProcess(tmp_path / "node", smtp=smtp, http=http, policy={"module": str(module)}, **config) as pigeon:
        if door == "smtp":
            _send(pigeon, OWN + b"From: a@example.org\r\nSubject: hi\r\n\r\nbody\r\n", login=True)
        else:
            content = (OWN + b"From: a@example.org\r\nSubject: hi\r\n\r\nbody\r\n").decode()
            recipients = [{"email": "b@example.net"}]
            request = {"envelope_sender": "a@example.org", "recipients": recipients, "content": content}
            status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
            assert (status, answer["accepted"]) == (200, 1), answer
        (received,) = sink.wait_for(1)
    message = email.message_from_bytes(received.data, policy=email.policy.default)
    dates, ids = message.get_all("Date") or [], message.get_all("Message-ID") or []
    assert len(dates) == 1 and len(ids) == 1, received.data
    assert dates != ["Mon, 01 Jan 2024 00:00:00 +0000"] and ids != ["<own@example.org>"]  # the policy's removal holds
