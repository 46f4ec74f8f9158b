"""A server that took the content, then never answered its end (it hung up, or took longer than
`[delivery] data_done_timeout`), may have taken the message: the TransientFailure says the reply
to the end of data never came and the message may be delivered twice. A failure before the
content went says nothing of the kind.

Found from outside: both were logged alike, where Postfix says "while sending end of data --
message may be sent more than once".
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from tests.support.sinks import AnswerSink, node_failing_at_each

MESSAGE = b"From: <sender@example.org>\r\nSubject: unanswered\r\n\r\nHello.\r\n"
TWICE = "no reply to the end of data: the message may be delivered twice"

# How each sink fails: its answers, delays and extensions; whether the content's end went out.
CASES = {
    "drop-after-dot": ({".": ""}, {}, (), True),
    "drop-after-dot-pipelined": ({".": ""}, {}, ("PIPELINING",), True),
    "drop-after-bdat": ({"BDAT": ""}, {}, ("PIPELINING", "CHUNKING"), True),
    "slow-after-dot": ({}, {".": 4.0}, (), True),  # past data_done_timeout
    "drop-at-rcpt": ({"RCPT": ""}, {}, (), False),
    "drop-at-data": ({"DATA": ""}, {}, ("PIPELINING",), False),
}


def test_only_a_failure_after_the_content_went_says_the_message_may_be_delivered_twice(tmp_path: Path) -> None:
    with ExitStack() as stack:
        sinks = {
            name: stack.enter_context(AnswerSink(answers, delays=delays, extensions=extensions))
            for name, (answers, delays, extensions, _) in CASES.items()
        }
        pigeon, failures = stack.enter_context(
            node_failing_at_each(tmp_path / "node", sinks, MESSAGE, reply_timeout="2s", data_done_timeout="2s")
        )
        for name, (_, _, _, content_sent) in CASES.items():
            response = failures[name]["response"]
            assert (response["code"], response["enhanced"]) == (451, "4.4.2"), (name, response)
            assert (TWICE in response["text"]) == content_sent, (name, response)
            assert bool(sinks[name].contents) == content_sent, name
        assert pigeon.records("Delivery") == []
