"""A message the spool has no room for at the end of its data gets `452 4.3.1 Insufficient
system storage` (RFC 3463 X.3.1, RFC 5321 4.3.2: 452 after the data), as `MAIL ... SIZE=` over
the room does, not `451 4.3.0 Local error in processing`, which told the client (and the
operator reading the Rejection record) nothing of why. The same reply over BDAT and as an HTTP
injection's recipient's error (503: a 4xx for every recipient)."""

from __future__ import annotations

import smtplib
from collections.abc import Iterator

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

TOKEN = "full-token-0123456789abcdef"
LARGE = b"From: a@example.org\r\nSubject: large\r\n\r\n" + (b"z" * 76 + b"\r\n") * 21_000  # 1.6 MB
FULL = "452 4.3.1 Insufficient system storage: the spool has no room for this message now, try again later"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    """The outside tester's: a 3 MiB spool with one message of 1.6 MB has no room for another."""
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    spool = {"max_size": "3MiB"}
    with PigeonProcess(tmp_path_factory.mktemp("full") / "node", spool=spool, http=http) as node:
        with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            assert client.sendmail("a@example.org", ["user@example.net"], LARGE) == {}
        yield node


def _rejection(node: PigeonProcess, command: str) -> str:
    (found,) = [r for r in node.records("Rejection") if r.get("command") == command]
    response = found["response"]
    return f"{response['code']} {response['enhanced']} {response['text']}"


def test_data_the_spool_has_no_room_for_gets_452_4_3_1(node: PigeonProcess) -> None:
    with smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        client.ehlo("client.test")
        client.mail("a@example.org")
        client.rcpt("user@example.net")
        code, text = client.data(LARGE)
    assert f"{code} {text.decode()}" == FULL
    node.wait_records("Rejection")
    assert _rejection(node, "DATA") == FULL


def test_bdat_the_spool_has_no_room_for_gets_452_4_3_1(node: PigeonProcess) -> None:
    with RawSmtp(node.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<a@example.org>")
        smtp.expect(250, "RCPT TO:<user@example.net>")
        smtp.send(b"BDAT %d LAST\r\n" % len(LARGE) + LARGE)
        code, lines = smtp.reply()
    assert f"{code} {' '.join(lines)}" == FULL


def test_an_injection_the_spool_has_no_room_for_gets_452_4_3_1(node: PigeonProcess) -> None:
    request = {
        "envelope_sender": "a@example.org",
        "recipients": [{"email": "ann@example.net"}],
        "content": LARGE.decode(),
        "template": False,
    }
    status, answer = node.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer["recipients"][0]["error"]) == (503, FULL), answer
