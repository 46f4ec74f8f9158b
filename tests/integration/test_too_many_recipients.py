"""A destination that takes only so many recipients per transaction (452 4.5.3 for the rest)
gets the rest in the next transactions on the same connection, at once: nothing waits for the
retry schedule, and the attempt is no failure."""

from __future__ import annotations

import smtplib
import time
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

MESSAGE = b"From: <sender@example.org>\r\nSubject: many\r\n\r\nHello all.\r\n"


# RFC 821 gave 552 for too many recipients, and some servers still say it (RFC 5321 4.5.3.1.10).
@pytest.mark.parametrize("too_many", ["452 4.5.3 too many recipients", "552 5.5.3 too many recipients"])
def test_recipients_refused_as_too_many_go_in_the_next_transaction_at_once_each_delivered_once(
    tmp_path: Path, too_many: str
) -> None:
    recipients = [f"ok{n}@example.net" for n in range(7)]
    # A retry an hour away: a recipient deferred instead of sent again would not arrive.
    config = delivery_config("", retry_interval="1h")
    with ScriptedSink(max_recipients=3, too_many=too_many) as sink:
        config["route"][0]["next_hop"] = sink.endpoint
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            started = time.monotonic()
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                assert client.sendmail("sender@example.org", recipients, MESSAGE) == {}
            received = sink.wait_for(3, timeout=10)
            assert time.monotonic() - started < 10
            delivered = [r for message in received for r in message.recipients]
            assert sorted(delivered) == sorted(recipients)  # every one, once
            assert [len(message.recipients) for message in received] == [3, 3, 1]
            # The same connection, one transaction after another (the other is the sink's own
            # check that it listens, which says no EHLO).
            assert len([c for c in sink.connections if c.helo]) == 1
            records = pigeon.wait_records("Delivery", 7)
            assert sorted(r["recipient"] for r in records) == sorted(recipients)
            assert {r["attempt"] for r in records} == {1}  # no failed attempt before
            assert pigeon.records("TransientFailure") == []
            assert pigeon.records("Bounce") == []
            assert sink.after(1.0) == received  # and nothing sent twice


def test_a_server_that_takes_no_recipient_at_all_is_not_asked_again_and_again(tmp_path: Path) -> None:
    # 452 to every RCPT, none taken: another transaction would get the same. The recipients
    # keep the 452 as a transient failure and wait for the retry schedule.
    config = delivery_config("", retry_interval="1h")
    with ScriptedSink(max_recipients=0) as sink:
        config["route"][0]["next_hop"] = sink.endpoint
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                assert client.sendmail("sender@example.org", ["a@example.net", "b@example.net"], MESSAGE) == {}
            failures = pigeon.wait_records("TransientFailure", 2)
            assert {(f["response"]["code"], f["response"]["enhanced"]) for f in failures} == {(452, "4.5.3")}
            assert sink.after(1.0) == [] and sorted(sink.rcpt_log) == ["a@example.net", "b@example.net"]
