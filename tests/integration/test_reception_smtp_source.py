"""Postfix's smtp-source, the load generator of the benchmark, as a third independent client."""

from __future__ import annotations

from tests.support.process import PigeonProcess
from tests.support.tools import smtp_source


def test_every_message_smtp_source_sends_is_stored_and_logged(pigeon: PigeonProcess) -> None:
    result = smtp_source(
        pigeon.smtp_port, "-s", "10", "-l", "5120", "-m", "500", "-f", "a@src.test", "-t", "r@sink.test"
    )
    assert result.returncode == 0, result.stderr
    stored = pigeon.spool_messages()
    assert len(stored) == 500
    message_ids = {m["data"].split(b"Message-Id: ", 1)[1].split(b"\r\n", 1)[0] for m in stored}
    assert len(message_ids) == 500
    assert len(pigeon.wait_records("Reception", 500)) == 500
    assert pigeon.metric("pigeon_messages_received_total") == 500
    assert pigeon.metric("pigeon_spool_messages") == 500


def test_connection_reuse_and_several_recipients(pigeon: PigeonProcess) -> None:
    result = smtp_source(
        pigeon.smtp_port, "-d", "-s", "4", "-r", "3", "-l", "1000", "-m", "40", "-f", "a@src.test", "-t", "r@sink.test"
    )
    assert result.returncode == 0, result.stderr
    stored = pigeon.spool_messages()
    assert len(stored) == 40
    assert all(len(m["recipients"]) == 3 for m in stored)
