"""A client that half-closes its connection (shutdown(SHUT_WR): `printf ... | nc -N`, monitoring
probes, some libraries) once it has sent its whole transaction is done sending, not gone: it
gets every reply, the 250 for its message and the 221 for its QUIT, and its message goes out
once. A half-close before the end of the message still leaves an incomplete message, which is
not stored."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

MESSAGE = b"From: <sender@example.org>\r\nSubject: half-closed\r\n\r\nHello.\r\n"
ENVELOPE = b"EHLO client.test\r\nMAIL FROM:<sender@example.org>\r\nRCPT TO:<ok@example.net>\r\n"


def _send_all_then_half_close(port: int, data: bytes) -> bytes:
    """Everything in one write, a half-close, then all Pigeon answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as client:
        client.sendall(data)
        client.shutdown(socket.SHUT_WR)
        answers = b""
        while chunk := client.recv(65536):
            answers += chunk
    return answers


def _codes(answers: bytes) -> list[int]:
    return [int(line[:3]) for line in answers.split(b"\r\n") if line[3:4] == b" "]


@pytest.mark.parametrize("verb", ["DATA", "BDAT"])
def test_a_client_that_half_closes_after_its_whole_transaction_gets_its_250_and_221_and_its_mail_goes_out_once(
    tmp_path: Path, verb: str
) -> None:
    content = MESSAGE + b".\r\n" if verb == "DATA" else MESSAGE
    send = b"DATA\r\n" + content if verb == "DATA" else b"BDAT %d LAST\r\n" % len(MESSAGE) + content
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        answers = _send_all_then_half_close(pigeon.smtp_port, ENVELOPE + send + b"QUIT\r\n")
        expected = [220, 250, 250, 250, 354, 250, 221] if verb == "DATA" else [220, 250, 250, 250, 250, 221]
        assert _codes(answers) == expected, answers
        assert b"250 2.0.0 Ok: queued as " in answers
        (reception,) = pigeon.wait_records("Reception")
        assert "answered" not in reception  # (`"answered": false` says the 250 could not be given)
        (delivered,) = sink.wait_for(1)
        assert delivered.recipients == ["ok@example.net"] and delivered.data.endswith(MESSAGE)
        assert len(sink.after(0.5)) == 1
        assert "client gone" not in pigeon.stderr()


def test_a_client_that_half_closes_in_the_middle_of_its_message_has_nothing_stored(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node") as pigeon:
        answers = _send_all_then_half_close(pigeon.smtp_port, ENVELOPE + b"DATA\r\n" + MESSAGE)  # no final dot
        assert _codes(answers) == [220, 250, 250, 250, 354]
        # The session is over: a second client is served, and nothing of the first was kept.
        answers = _send_all_then_half_close(pigeon.smtp_port, b"NOOP\r\nQUIT\r\n")
        assert _codes(answers) == [220, 250, 221]
        assert pigeon.spool_messages() == []
        assert pigeon.records("Reception") == []
