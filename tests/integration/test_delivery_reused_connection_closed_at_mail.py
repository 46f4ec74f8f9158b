"""A connection used before that the server closes as the next MAIL comes (its idle timeout, its
limit of messages a connection) took nothing of that transaction: the message goes again at once
on a new connection, with no attempt counted and no `TransientFailure`. Once: a new connection
closed at MAIL too, a fresh connection closed at MAIL, or a server that answered anything of
the transaction before it closed, is the counted transient failure it always was.

Found from outside: with a sink that closed every connection at its second MAIL, every other
message was a `451 4.4.2 ... closed the connection` and waited `retry_interval` (5 minutes).
"""

from __future__ import annotations

import smtplib
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, delivery_config, wait_until

# Whether the server pipelines, and whether it takes BDAT: with both, MAIL, RCPT and BDAT LAST
# with the content go in one write, so the server closes with the whole message unread.
SERVERS = {
    "chunked": ("PIPELINING", "CHUNKING"),
    "pipelined": ("PIPELINING",),
    "lockstep": (),
}


def message(n: int) -> bytes:
    return f"From: <sender@example.org>\r\nSubject: m{n}\r\n\r\nHello {n}.\r\n".encode()


def submit(pigeon: PigeonProcess, *numbers: int) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        for n in numbers:
            client.sendmail("sender@example.org", [f"m{n}@example.net"], message(n))


def config(sink: AnswerSink, **delivery: Any) -> dict[str, dict[str, Any]]:
    # One connection at a time, so that the messages ride it; a counted failure would wait an
    # hour (the test would time out rather than pass slowly).
    return delivery_config(sink.endpoint, retry_interval="1h", connection_limit=1, idle_timeout="10s", **delivery)


def mails(session: list[str]) -> int:
    return sum(line.upper().startswith("MAIL ") for line in session)


@pytest.mark.parametrize("extensions", SERVERS.values(), ids=SERVERS.keys())
def test_a_reused_connection_closed_at_mail_sends_the_message_at_once_on_a_new_one(
    tmp_path: Path, extensions: tuple[str, ...]
) -> None:
    with (
        AnswerSink(extensions=extensions, close_at_mail=2) as sink,
        PigeonProcess(tmp_path / "node", **config(sink)) as pigeon,
    ):
        submit(pigeon, 1, 2, 3, 4)
        deliveries = pigeon.wait_records("Delivery", 4, timeout=20)
        assert sorted(r["recipient"] for r in deliveries) == [f"m{n}@example.net" for n in (1, 2, 3, 4)]
        assert {r["attempt"] for r in deliveries} == {1}  # none waited for a retry
        assert pigeon.records("TransientFailure") == []
        # Each message went once, and connections were reused (closed at their second MAIL).
        taken = [n for content in sink.contents for n in (1, 2, 3, 4) if b"Hello %d." % n in content]
        assert sorted(taken) == [1, 2, 3, 4]
        assert any(mails(session) == 2 for session in sink.sessions), sink.sessions
        assert "the transaction goes again at once on a new connection" in pigeon.stderr()


@pytest.mark.parametrize("extensions", SERVERS.values(), ids=SERVERS.keys())
def test_a_server_that_answered_mail_before_closing_a_reused_connection_defers_the_message(
    tmp_path: Path, extensions: tuple[str, ...]
) -> None:
    with (
        AnswerSink(extensions=extensions, close_at_mail=2, answer_before_close=True) as sink,
        PigeonProcess(tmp_path / "node", **config(sink)) as pigeon,
    ):
        submit(pigeon, 1, 2)
        (failure,) = pigeon.wait_records("TransientFailure", timeout=20)
        assert failure["recipient"] == "m2@example.net" and failure["attempt"] == 1
        assert (failure["response"]["code"], failure["response"]["enhanced"]) == (451, "4.4.2"), failure
        if "CHUNKING" in extensions:  # its content had gone out with MAIL: it may have it
            assert failure["response"]["text"].endswith("the message may be delivered twice"), failure
        assert [r["recipient"] for r in pigeon.records("Delivery")] == ["m1@example.net"]
        assert len(sink.sessions) == 1  # not sent again at once


def test_a_fresh_connection_closed_at_mail_defers_the_message(tmp_path: Path) -> None:
    with (
        AnswerSink(extensions=SERVERS["chunked"], close_at_mail=1) as sink,
        PigeonProcess(tmp_path / "node", **config(sink)) as pigeon,
    ):
        submit(pigeon, 1)
        (failure,) = pigeon.wait_records("TransientFailure", timeout=20)
        assert failure["recipient"] == "m1@example.net" and failure["attempt"] == 1
        assert (failure["response"]["code"], failure["response"]["enhanced"]) == (451, "4.4.2"), failure
        assert len(sink.sessions) == 1 and pigeon.records("Delivery") == []


def test_a_new_connection_closed_at_mail_too_defers_the_message_once(tmp_path: Path) -> None:
    with (
        AnswerSink(extensions=SERVERS["chunked"], close_at_mail=2) as sink,
        PigeonProcess(tmp_path / "node", **config(sink)) as pigeon,
    ):
        submit(pigeon, 1)
        pigeon.wait_records("Delivery", timeout=20)
        sink.close_at_mail = 1  # from now, every MAIL: the open connection's 2nd, a new one's 1st
        submit(pigeon, 2)
        (failure,) = pigeon.wait_records("TransientFailure", timeout=20)
        assert failure["recipient"] == "m2@example.net" and failure["attempt"] == 1
        assert (failure["response"]["code"], failure["response"]["enhanced"]) == (451, "4.4.2"), failure
        assert [mails(session) for session in sink.sessions] == [2, 1]  # the reused one, one new one
        wait_until(lambda: sink.drops == 2)
