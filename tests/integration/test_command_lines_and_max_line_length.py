"""`[smtp] max_line_length` bounds message lines; command lines keep at least 998 octets
(RFC 5321 4.5.3.1.4 gives commands 512, raised by the extensions offered), so a lowered
setting does not refuse over SMTP a valid address that HTTP and `pigeon inject` take. A
command line refused for its length is logged like any refused one: its command named, and
a RCPT's address as given, cut at 256 characters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

TOKEN = "lines-token-0123456789"
# 64 + 1 + 189 = 254 octets: the longest address RFC 5321 4.5.3.1.3 allows in a path.
LONGEST = "l" * 64 + "@" + ".".join(["d" * 61, "d" * 61, "d" * 60, "test"])
assert len(LONGEST) == 254


@pytest.fixture(scope="module")
def pigeon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    root = tmp_path_factory.mktemp("lines")
    http = {"token": [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]}
    with PigeonProcess(root / "node", smtp={"max_line_length": 100}, http=http) as running:
        yield running


def test_a_254_octet_recipient_is_taken_over_smtp_with_a_lowered_max_line_length_as_over_http(
    pigeon: PigeonProcess,
) -> None:
    with RawSmtp(pigeon.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<a@example.org>")
        smtp.expect(250, f"RCPT TO:<{LONGEST}> NOTIFY=SUCCESS,FAILURE,DELAY ORCPT=rfc822;{LONGEST}")
        smtp.expect(221, "QUIT")
    content = "From: a@example.org\r\nSubject: x\r\n\r\nx\r\n"
    request = {"envelope_sender": "a@example.org", "recipients": [{"email": LONGEST}], "content": content}
    status, answer = pigeon.http_post("/api/v1/inject", request, TOKEN)
    assert (status, answer.get("accepted")) == (200, 1), answer


def test_a_message_line_over_a_lowered_max_line_length_is_still_refused(pigeon: PigeonProcess) -> None:
    with RawSmtp(pigeon.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, "MAIL FROM:<a@example.org>")
        smtp.expect(250, "RCPT TO:<b@example.net>")
        smtp.expect(354, "DATA")
        smtp.send(b"From: a@example.org\r\n\r\n" + b"x" * 101 + b"\r\n.\r\n")
        assert smtp.expect(554)[0].startswith("5.6.0 ")


@pytest.mark.parametrize("pieces", [1, 3], ids=["one-write", "in-pieces"])
def test_a_rcpt_line_refused_for_its_length_is_logged_with_its_command_and_address(
    pigeon: PigeonProcess, pieces: int
) -> None:
    address = "r" * 1200 + f"{pieces}@example.net"
    line = f"RCPT TO:<{address}>\r\n".encode()
    with RawSmtp(pigeon.smtp_port) as smtp:
        smtp.expect(220)
        smtp.expect(250, "EHLO client.test")
        smtp.expect(250, f"MAIL FROM:<a{pieces}@example.org>")
        size = -(-len(line) // pieces)
        for at in range(0, len(line), size):
            smtp.send(line[at : at + size])
        assert smtp.expect(500) == ["5.5.2 Line too long (RFC 5321 4.5.3.1.4)"]
        smtp.expect(221, "QUIT")
    record = pigeon.wait_record("Rejection", lambda r: r["sender"] == f"a{pieces}@example.org")
    assert (record["response"]["code"], record["command"]) == (500, "RCPT")
    assert record["recipients"] is not None
    (given,) = record["recipients"]
    assert given.startswith("r" * 200) and given.endswith("...")
    assert record["sender"] == f"a{pieces}@example.org"
    assert len(given) == 256 + len("...")
