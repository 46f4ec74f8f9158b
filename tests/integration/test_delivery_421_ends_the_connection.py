"""A 421 at any step of a transaction ends the connection (RFC 5321 3.8), even when the server
goes on talking: its recipients without an answer of their own get the 421, saying which
command it answered, and the next message goes on a new connection.

Found from outside: a peer that answered RCPT with 421 and did not hang up had the connection
reused, RSET, MAIL ..., for the next message.
"""

from __future__ import annotations

import smtplib
from contextlib import ExitStack
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: 421\r\n\r\nHello.\r\n"
BUSY = "421 4.7.0 busy, closing connection"

# Where the 421 comes, whether the server pipelines, and the command the record says it answered.
CASES = {
    "mail-pipelined": ({"MAIL": BUSY}, ("PIPELINING",), "MAIL FROM"),
    "rcpt-pipelined": ({"RCPT": BUSY}, ("PIPELINING",), "RCPT TO"),
    "rcpt-lockstep": ({"RCPT": BUSY}, (), "RCPT TO"),
    "data-lockstep": ({"DATA": BUSY}, (), "DATA"),
    "dot-pipelined": ({".": BUSY}, ("PIPELINING",), "the end of data"),
    "bdat-pipelined": ({"BDAT": BUSY}, ("PIPELINING", "CHUNKING"), "the end of data"),
    # BDAT LAST went out ahead of the RCPT's 421, but replies come in order (RFC 2920 3.1):
    # the server went away before it answered the end of data, and took no message.
    "rcpt-chunked": ({"RCPT": BUSY}, ("PIPELINING", "CHUNKING"), "RCPT TO"),
    "mail-chunked": ({"MAIL": BUSY}, ("PIPELINING", "CHUNKING"), "MAIL FROM"),
}


def test_a_421_anywhere_in_a_transaction_ends_the_connection_and_defers_with_the_servers_words(
    tmp_path: Path,
) -> None:
    with ExitStack() as stack:
        sinks = {
            name: stack.enter_context(AnswerSink(answers, extensions=extensions))
            for name, (answers, extensions, _) in CASES.items()
        }
        config = delivery_config("unused", retry_interval="1h")
        config["route"] = [
            {"domain": f"{name}.example", "next_hop": sink.endpoint, "tls": "disabled"} for name, sink in sinks.items()
        ]
        pigeon = stack.enter_context(PigeonProcess(tmp_path / "node", **config))
        for n in range(2):  # two messages a site: the second must not ride the first's connection
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("sender@example.org", [f"m{n}@{name}.example" for name in sinks], MESSAGE)
        failures = wait_until(lambda: len(found := pigeon.records("TransientFailure")) == 2 * len(sinks) and found)
        for record in failures:
            name = record["recipient"].partition("@")[2].removesuffix(".example")
            response = record["response"]
            assert (response["code"], response["enhanced"]) == (421, "4.7.0"), record  # the server's words
            # A 421 is a definite no, wherever it comes: never "may be delivered twice". Where
            # it came is said after the server's words, as for a 421 to EHLO.
            answered = f"(answer of [127.0.0.1]:{sinks[name].port} to {CASES[name][2]})"
            assert response["text"] == f"busy, closing connection {answered}", record
        for name, sink in sinks.items():
            wait_until(lambda sink=sink: sink.drops == 2)
            assert sink.quits == 0, name  # closed at once: no QUIT into what the server left behind
            assert len(sink.sessions) == 2, (name, sink.sessions)
            for session in sink.sessions:
                verbs = [line.split(" ", 1)[0].upper() for line in session]
                assert verbs.count("MAIL") == 1 and "RSET" not in verbs, (name, session)
        assert pigeon.records("Delivery") == []
