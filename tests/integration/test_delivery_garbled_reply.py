"""A reply whose code is no SMTP code (`999 huh`) is a broken protocol: the recipients are
deferred and the connection dropped, never a bounce in words the server did not say.

Found from outside: `999 huh` to RCPT bounced the recipient, its DSN reading
`Diagnostic-Code: smtp; 554 invalid reply code 999: huh`, a 554 of Pigeon's own making.
"""

from __future__ import annotations

import smtplib
from contextlib import ExitStack
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, delivery_config, node_failing_at_each, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: garbled\r\n\r\nHello.\r\n"

CASES = {
    "rcpt-pipelined": ({"RCPT": "999 huh"}, ("PIPELINING",)),
    "rcpt-lockstep": ({"RCPT": "999 huh"}, ()),
    "mail-lockstep": ({"MAIL": "100 huh"}, ()),
    "ehlo": ({"EHLO": "999 huh"}, ()),
}


def test_a_reply_with_no_valid_code_defers_and_never_bounces(tmp_path: Path) -> None:
    with ExitStack() as stack:
        sinks = {
            name: stack.enter_context(AnswerSink(answers, extensions=extensions))
            for name, (answers, extensions) in CASES.items()
        }
        pigeon, failures = stack.enter_context(node_failing_at_each(tmp_path / "node", sinks, MESSAGE))
        for name, sink in sinks.items():
            response = failures[name]["response"]
            (garbled,) = CASES[name][0].values()
            assert (response["code"], response["enhanced"]) == (451, "4.5.0"), response
            said = f"[127.0.0.1]:{sink.port} broke the protocol: a reply with no valid code: {garbled!r}"
            assert response["text"] == said  # (no "554 invalid reply code" of Pigeon's making)
        for name, sink in sinks.items():
            wait_until(lambda sink=sink: sink.drops == 1)
            assert sink.quits == 0 and sink.contents == [], name  # dropped, nothing more said
        assert pigeon.records("Bounce") == [] and pigeon.records("Delivery") == []


def test_a_refusal_whose_lines_disagree_on_the_code_within_its_class_bounces_with_the_last_lines_code(
    tmp_path: Path,
) -> None:
    """Found from outside: `550-5.1.1 .../551 5.1.1 ...` to RCPT was "broke the protocol" at
    every attempt, and the recipient, refused for good, was retried until it expired."""
    with ExitStack() as stack:
        sink = stack.enter_context(AnswerSink({"RCPT": "550-5.1.1 no such user\r\n551 5.1.1 try elsewhere"}))
        config = delivery_config("unused", retry_interval="1h")
        config["route"] = [{"domain": "odd.example", "next_hop": sink.endpoint, "tls": "disabled"}]
        pigeon = stack.enter_context(PigeonProcess(tmp_path / "node", **config))
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("<>", ["a@odd.example"], MESSAGE)
        (bounce,) = wait_until(lambda: pigeon.records("Bounce"))
        response = bounce["response"]
        assert (response["code"], response["enhanced"]) == (551, "5.1.1"), response
        assert response["text"] == "no such user try elsewhere", response
        assert pigeon.records("TransientFailure") == [] and sink.contents == []
