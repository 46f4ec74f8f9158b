"""After one STARTTLS handshake that failed (and a try again in the clear that delivered), later
deliveries, to that site and to others, run as before: no error logged, whatever the build.

Found from outside, in the mypyc-compiled build only: once a handshake had failed, every
later delivery connection, to any site, ended at its idle close with "Task exception was
never retrieved ... SSLError WRONG_VERSION_NUMBER", a traceback ending in `_start_tls`.
"""

from __future__ import annotations

import smtplib
import time
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: after TLS\r\n\r\nHello.\r\n"


def test_a_failed_handshake_leaves_no_error_behind_for_later_deliveries(tmp_path: Path) -> None:
    with (
        AnswerSink(extensions=("PIPELINING", "STARTTLS")) as broken_tls,
        AnswerSink(extensions=("PIPELINING",)) as plain,
    ):
        config = delivery_config("unused", idle_timeout="1s")
        config["route"] = [
            {"domain": "tls.example", "next_hop": broken_tls.endpoint, "tls": "opportunistic"},
            {"domain": "*", "next_hop": plain.endpoint, "tls": "disabled"},
        ]
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("sender@example.org", ["a@tls.example"], MESSAGE)
            wait_until(lambda: pigeon.records("Delivery"))
            assert broken_tls.commands[:2] == ["EHLO mx.pigeon.test", "STARTTLS"]  # the handshake failed ...
            assert "STARTTLS" not in broken_tls.commands[2:]  # ... and the clear delivered
            for n in range(3):  # later connections, each to its idle close
                with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                    client.sendmail("sender@example.org", [f"b{n}@plain.example", f"c{n}@tls.example"], MESSAGE)
                wait_until(lambda n=n: len(pigeon.records("Delivery")) == 3 + 2 * n, timeout=20)
                time.sleep(1.5)  # past the idle close of both connections
            wait_until(lambda: plain.quits >= 3)
            pigeon.stop()
            said = pigeon.stderr()
    assert "never retrieved" not in said, said
    assert "Traceback" not in said, said
