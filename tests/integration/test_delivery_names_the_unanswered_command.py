"""A timeout or a dropped connection says which command the next hop left unanswered, as
Postfix does ("lost connection with X while sending RCPT TO"): `451 4.4.2 timeout waiting for
X to answer MAIL FROM`, `451 4.4.2 X closed the connection after DATA`. With PIPELINING several
commands wait for their replies at once, and replies come in their order (RFC 2920 3.1): the
first one not answered is named. The greeting's and the end of data's texts are as they were.

Found from outside: a server that never answered EHLO read the same as one that never answered
MAIL ("timeout waiting for X"), and one that hung up at MAIL, RCPT or DATA read "X closed the
connection" each time, so a log reader could not tell a refused sender from refused content.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from tests.support.sinks import AnswerSink, node_failing_at_each

MESSAGE = b"From: <sender@example.org>\r\nSubject: unanswered\r\n\r\nHello.\r\n"
SILENT = 8.0  # seconds a sink keeps quiet: past the test's reply_timeout (2 s)
PIPELINING = ("PIPELINING",)
TWICE = "; no reply to the end of data: the message may be delivered twice"

# How each sink fails (its answers, delays and extensions), and the text of the attempt's
# TransientFailure, "{peer}" for the sink ("[127.0.0.1]:port").
CASES: dict[str, tuple[dict[str, str], dict[str, float], tuple[str, ...], str]] = {
    "silent-at-ehlo": ({}, {"EHLO": SILENT}, (), "timeout waiting for {peer} to answer EHLO"),
    "silent-at-mail": ({}, {"MAIL": SILENT}, (), "timeout waiting for {peer} to answer MAIL FROM"),
    "silent-at-mail-pipelined": ({}, {"MAIL": SILENT}, PIPELINING, "timeout waiting for {peer} to answer MAIL FROM"),
    "silent-at-rcpt": ({}, {"RCPT": SILENT}, (), "timeout waiting for {peer} to answer RCPT TO"),
    "silent-at-rcpt-pipelined": ({}, {"RCPT": SILENT}, PIPELINING, "timeout waiting for {peer} to answer RCPT TO"),
    "silent-at-data": ({}, {"DATA": SILENT}, (), "timeout waiting for {peer} to answer DATA"),
    "closes-at-ehlo": ({"EHLO": ""}, {}, (), "{peer} closed the connection after EHLO"),
    "closes-at-mail": ({"MAIL": ""}, {}, (), "{peer} closed the connection after MAIL FROM"),
    "closes-at-mail-pipelined": ({"MAIL": ""}, {}, PIPELINING, "{peer} closed the connection after MAIL FROM"),
    "closes-at-rcpt": ({"RCPT": ""}, {}, (), "{peer} closed the connection after RCPT TO"),
    "closes-at-rcpt-pipelined": ({"RCPT": ""}, {}, PIPELINING, "{peer} closed the connection after RCPT TO"),
    "closes-at-data": ({"DATA": ""}, {}, (), "{peer} closed the connection after DATA"),
    "closes-at-data-pipelined": ({"DATA": ""}, {}, PIPELINING, "{peer} closed the connection after DATA"),
    # BDAT LAST went with MAIL: the server may have taken the message, whatever it left unanswered.
    "closes-at-mail-chunked": (
        {"MAIL": ""},
        {},
        ("PIPELINING", "CHUNKING"),
        "{peer} closed the connection after MAIL FROM" + TWICE,
    ),
    # The end of data: as it was said before, the note naming it.
    "closes-at-the-end": ({".": ""}, {}, (), "{peer} closed the connection" + TWICE),
    "silent-at-the-end": ({}, {".": SILENT}, (), "timeout waiting for {peer}" + TWICE),
}


def test_a_timeout_or_a_close_names_the_first_command_left_unanswered(tmp_path: Path) -> None:
    with ExitStack() as stack:
        sinks = {
            name: stack.enter_context(AnswerSink(answers, delays=delays, extensions=extensions))
            for name, (answers, delays, extensions, _) in CASES.items()
        }
        pigeon, failures = stack.enter_context(
            node_failing_at_each(tmp_path / "node", sinks, MESSAGE, reply_timeout="2s", data_done_timeout="2s")
        )
        texts = {name: failures[name]["response"]["text"] for name in CASES}
        expected = {name: text.format(peer=f"[127.0.0.1]:{sinks[name].port}") for name, (*_, text) in CASES.items()}
        assert texts == expected
        assert {(r["response"]["code"], r["response"]["enhanced"]) for r in failures.values()} == {(451, "4.4.2")}
        assert pigeon.records("Delivery") == []
