"""A `Rejection` names the command it answered as the client sent it, escaped as its addresses
are (AUTH for a SASL response, none of which is logged); one that answered no command (a
timeout) has no `command` at all; and a command line refused for a bare CR or a NUL is told
which of the two it held."""

from __future__ import annotations

import base64
from pathlib import Path

from pigeon.listener.passwords import set_password
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp


def test_a_refused_command_that_is_not_ascii_is_logged_escaped_as_its_addresses_are(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node") as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(500, b"\xc3\xa9HLO x")  # UTF-8: printable, kept
        client.expect(500, b"\xe9HLO x")  # Latin-1: no UTF-8, a byte escaped
        client.expect(500, "\u202eHLO x".encode())  # a bidirectional override, escaped
        client.expect(500, b"\x1b[2JHLO x")  # a terminal's escape sequence
        # The same bytes in a RCPT's address (refused: no transaction is open) come out alike.
        client.expect(503, b"RCPT TO:<\xe9\xe2\x80\xaeab@example.org>")
        records = pigeon.wait_records("Rejection", 5)
        status, body = pigeon.http_get("/metrics")
    assert [record["command"] for record in records[:4]] == ["\xe9HLO", "\\xe9HLO", "\\u202eHLO", "\\x1b[2JHLO"]
    assert records[4]["recipients"] == ["\\xe9\\u202eab@example.org"]
    # The metrics count them all as "other": no series of a client's making (see
    # test_rejections_metric_names_known_verbs_only).
    assert status == 200
    assert 'pigeon_rejections_total{code="500",command="other"} 4.0' in body.decode()


def test_the_421_for_too_many_errors_names_the_command_that_went_over_the_limit(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={"max_errors": 3}) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(500, "BOGUS")
        client.expect(501, "EHLO")
        client.send(b"FOO\r\n")
        assert client.reply()[0] == 500
        assert client.reply()[0] == 421
        assert client.closed_by_peer()
        records = pigeon.wait_records("Rejection", 4)
    assert [(record["command"], record["response"]["code"]) for record in records] == [
        ("BOGUS", 500),
        ("EHLO", 501),
        ("FOO", 500),
        ("FOO", 421),
    ]
    assert "too many errors" in records[3]["response"]["text"]


def test_the_421_for_too_many_errors_names_a_refused_rcpt(tmp_path: Path) -> None:
    """The error that goes over the limit is the answer to a decision (a RCPT refused by the
    relay check), not one the session gave by itself."""
    settings = {"max_errors": 1, "relay_networks": []}
    with PigeonProcess(tmp_path / "node", smtp=settings) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO client.test")
        client.expect(250, "MAIL FROM:<a@example.org>")
        client.send(b"RCPT TO:<someone@elsewhere.test>\r\n")
        assert client.reply()[0] == 550
        assert client.reply()[0] == 421
        records = pigeon.wait_records("Rejection", 2)
    assert [(record["command"], record["response"]["code"]) for record in records] == [("RCPT", 550), ("RCPT", 421)]


def test_a_timeout_answers_no_command_and_its_rejection_names_none(tmp_path: Path) -> None:
    with (
        PigeonProcess(tmp_path / "node", smtp={"idle_timeout": "1s"}) as pigeon,
        RawSmtp(pigeon.smtp_port) as client,
    ):
        client.expect(220)
        client.expect(250, "EHLO client.test")
        code, text = client.reply()
        assert (code, text) == (421, ["4.4.2 mx.pigeon.test Error: timeout exceeded, closing connection"])
        (record,) = pigeon.wait_records("Rejection")
    assert "command" not in record
    assert record["response"]["code"] == 421


def test_a_command_with_a_nul_or_a_bare_cr_is_told_which(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node") as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        assert client.command(b"NOOP\0") == (501, ["5.5.2 Command contains a NUL"])
        assert client.command(b"NOOP\rRSET") == (501, ["5.5.2 Command contains a bare <CR>"])
        assert client.command(b"NOOP\r\0") == (501, ["5.5.2 Command contains a bare <CR> and a NUL"])
        client.expect(250, "NOOP")
        records = pigeon.wait_records("Rejection", 3)
    assert [record["command"] for record in records] == ["NOOP\\x00", "NOOP\\x0dRSET", "NOOP\\x0d\\x00"]


def test_a_sasl_response_refused_as_a_line_is_logged_as_auth_and_none_of_the_password(tmp_path: Path) -> None:
    users = tmp_path / "users"
    set_password(users, "alice", "Secret-Passw0rd!")
    settings = {"auth_users": str(users), "allow_plaintext_auth": True}
    response = base64.b64encode(b"Secret-Passw0rd!")
    with PigeonProcess(tmp_path / "node", smtp=settings) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO client.test")
        client.expect(334, "AUTH LOGIN")
        client.expect(334, base64.b64encode(b"alice"))
        assert client.command(response + b"\0")[0] == 501
        client.expect(334, "AUTH LOGIN")
        client.expect(334, base64.b64encode(b"alice"))
        client.send(response + b"\n")  # a bare LF: the session ends
        assert client.reply()[0] == 421
        records = pigeon.wait_records("Rejection", 2)
        _, metrics = pigeon.http_get("/metrics")
    assert [(record["command"], record["response"]["code"]) for record in records] == [("AUTH", 501), ("AUTH", 421)]
    logged = b"".join(path.read_bytes() for path in (tmp_path / "node" / "log").iterdir() if path.is_file())
    for text in (logged, metrics):
        assert response[:12].upper() not in text.upper()
