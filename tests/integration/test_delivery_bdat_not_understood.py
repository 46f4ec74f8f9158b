"""A next hop that offers CHUNKING and answers BDAT as a command it does not know gets the
message once, with DATA, on a new connection; and DATA from then on.

Found from outside: `500 5.5.1 BDAT broken` to BDAT bounced the mail (`Bounce ... 500 BDAT
broken ProtocolErrors`, and a DSN), so one broken BDAT (a middlebox that mangles it) made mail
undeliverable for good. A 500, 502 or 504 to BDAT says nothing of the message (RFC 5321 4.2.4).
"""

from __future__ import annotations

import smtplib
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: chunks\r\n\r\nHello.\r\n"


@pytest.mark.parametrize("extensions", [("PIPELINING", "CHUNKING"), ("CHUNKING",)], ids=["pipelined", "lockstep"])
def test_a_message_whose_bdat_is_not_understood_arrives_once_with_data(
    tmp_path: Path, extensions: tuple[str, ...]
) -> None:
    sink = AnswerSink({"BDAT": "500 5.5.1 BDAT broken"}, extensions=extensions)
    with sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, idle_timeout="1s")) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("sender@example.org", ["a@bdat500.test", "b@bdat500.test"], MESSAGE)
        delivered = pigeon.wait_records("Delivery", 2, timeout=20)
        for record in delivered:
            assert record["response"]["code"] == 250, record
            assert "(sent with DATA: BDAT not understood)" in record["response"]["text"], record
        first, second = sink.sessions[:2]
        assert any(command.startswith("BDAT ") for command in first)
        assert first[-1] == "QUIT"  # said goodbye at once: the chunk may have been read as commands
        assert "DATA" in second and not any(command.startswith("BDAT") for command in second)
        assert sink.commands.count("DATA") == 1  # once
        assert sum(b"Hello." in content for content in sink.contents) == 2  # the BDAT chunk, the DATA
        assert pigeon.records("Bounce") == [] and pigeon.records("TransientFailure") == []

        # A later connection (the idle one closed) goes with DATA at once.
        wait_until(lambda: sink.quits >= 2)
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("sender@example.org", ["c@bdat500.test"], MESSAGE)
        (later,) = [r for r in pigeon.wait_records("Delivery", 3, timeout=20) if r["recipient"] == "c@bdat500.test"]
        assert later["response"]["text"] == "stored"
        assert len(sink.sessions) == 3 and "DATA" in sink.sessions[2]
        assert not any(command.startswith("BDAT") for command in sink.sessions[2])
        pigeon.stop()
        said = pigeon.stderr()
    assert "answered BDAT with 500 5.5.1 BDAT broken, though it offers CHUNKING" in said, said
    assert "Traceback" not in said, said


def test_a_content_refusal_after_bdat_last_still_bounces(tmp_path: Path) -> None:
    sink = AnswerSink({"BDAT": "554 5.6.0 content refused"}, extensions=("PIPELINING", "CHUNKING"))
    with sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("sender@example.org", ["a@bdat554.test"], MESSAGE)
        (bounce,) = pigeon.wait_records("Bounce", timeout=20)
        assert bounce["response"]["code"] == 554
        assert "DATA" not in sink.commands
