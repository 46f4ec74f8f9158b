"""A DSN carries a next hop's reply, whatever its length, in lines the next hop of the DSN
takes: RFC 5322 2.1.1 allows 998 octets a line, and a server that keeps to it (Pigeon among
them: `554 5.6.0`) refuses a longer one. The DSN has the null sender, so that refusal would
reach no one and the bounce would be lost.

Found from outside: a refusal in three lines of 400 octets (RFC 5321 4.5.3.1.5 allows 512),
or in one line of 2000 (Pigeon's reader takes up to 4096), was joined into one line of the
DSN's text and one `Diagnostic-Code` line, of 1310 and more octets each.
"""

from __future__ import annotations

import smtplib
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

THREE_LINES_OF_400 = "\r\n".join(
    f"550{'-' if i < 2 else ' '}5.7.1 " + " ".join(f"policy{i * 100 + j:03d}" for j in range(43)) for i in range(3)
)
ONE_LINE_OF_2000 = "550 5.1.1 " + " ".join(f"reason{i:04d}" for i in range(182))
REPLIES = {"policy@example.net": THREE_LINES_OF_400, "long@example.net": ONE_LINE_OF_2000}


@pytest.mark.parametrize("refused", sorted(REPLIES))
def test_the_dsn_of_a_long_refusal_is_taken_by_a_next_hop_that_keeps_to_998_octets(
    tmp_path: Path, refused: str
) -> None:
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        sink.rcpt_reply = REPLIES.get
        sender = "sender@example.org"
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail(sender, [refused], b"From: <sender@example.org>\r\nSubject: refused\r\n\r\nHello.\r\n")
        report = wait_until(lambda: next((m for m in sink.received if m.recipients == [sender]), None))
        assert report.sender in ("", "<>")
        assert max(len(line) for line in report.data.split(b"\r\n")) <= 998
        # The reply, whole: its lines as the Diagnostic-Code's value, unfolded (RFC 5322 2.2.3).
        status = report.email.get_payload()[1].get_payload()[1]  # type: ignore[union-attr, index]
        lines = REPLIES[refused].split("\r\n")
        said = f"{lines[0][:3]} {lines[0][4:9]} " + " ".join(line[10:] for line in lines)  # ("550 5.7.1 " and text)
        assert status["Diagnostic-Code"] == f"smtp; {said}"
        # A next hop that refuses lines over 998 octets (Pigeon) takes the DSN, as it is.
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("relay.test")
            assert client.mail("<>")[0] == 250
            assert client.rcpt("relayed@example.net")[0] == 250
            code, answer = client.data(report.data)
        assert code == 250, answer
