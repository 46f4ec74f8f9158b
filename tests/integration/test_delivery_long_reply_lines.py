"""A next hop whose EHLO reply has a line of 5,000 characters gets its mail.

Found from outside: one such line (`250-X-LONG aaaa...`) made every attempt a `451 ... broke the
protocol: reply line too long`, for ever. The line is now cut (as Postfix cuts reply lines at
`line_length_limit`), and an EHLO keyword line that long is not used; the others are.
"""

from __future__ import annotations

import smtplib
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, delivery_config

MESSAGE = b"From: <sender@example.org>\r\nSubject: long\r\n\r\nHello.\r\n"
EHLO = "\r\n".join(["250-answer.test", "250-X-LONG " + "a" * 5000, "250-PIPELINING", "250-CHUNKING", "250 8BITMIME"])


def test_a_server_with_a_5000_character_ehlo_line_gets_its_mail(tmp_path: Path) -> None:
    sink = AnswerSink({"EHLO": EHLO})
    with sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("sender@example.org", ["a@long.test"], MESSAGE)
        (delivered,) = pigeon.wait_records("Delivery", timeout=20)
        assert delivered["response"]["code"] == 250
        assert any(command.startswith("BDAT ") for command in sink.commands)  # the other keywords were read
        assert pigeon.records("TransientFailure") == []
