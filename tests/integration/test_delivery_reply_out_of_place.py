"""A next hop that answers a command with a positive reply that command cannot have: the
recipients are deferred, the connection dropped, and nothing is ever logged as delivered.

Found from outside: a peer answering DATA with `250 2.0.0 Ok: queued` had its recipient
logged as a Delivery with the content never sent (the message lost, the log saying it went);
a `354 more?` to the final dot was logged as a Delivery with code 354. RFC 5321 4.3.2: only a
2xx is success, and only DATA may answer 354. Any other positive reply is a broken protocol
(`451 4.5.0`), as Postfix takes it: the transaction's recipients wait for their retry.
"""

from __future__ import annotations

import smtplib
from contextlib import ExitStack
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: out of place\r\n\r\nHello.\r\n"

# What goes wrong, and where: (the sink's answers, whether the content was sent before it).
CASES = {
    "data-250": ({"DATA": "250 2.0.0 Ok: queued"}, False),
    "data-220": ({"DATA": "220 hmm"}, False),
    "dot-354": ({".": "354 more?"}, True),
    "bdat-354": ({"BDAT": "354 more?"}, True),
    "mail-354": ({"MAIL": "354 go ahead"}, False),
    "rcpt-354": ({"RCPT": "354 go ahead"}, False),
}
# Pipelined (one write for the envelope) or lock-step (a write per command).
MODES = {"pipelined": ("PIPELINING",), "lockstep": ()}


def test_a_positive_reply_its_command_cannot_have_defers_every_recipient_and_is_never_a_delivery(
    tmp_path: Path,
) -> None:
    with ExitStack() as stack:
        sinks: dict[str, AnswerSink] = {}
        for case, (answers, _) in CASES.items():
            for mode, extensions in MODES.items():
                chunking = ("CHUNKING",) if case.startswith("bdat") else ()
                sinks[f"{case}-{mode}"] = stack.enter_context(AnswerSink(answers, extensions=extensions + chunking))
        config = delivery_config("unused", retry_interval="1h")
        config["route"] = [
            {"domain": f"{name}.example", "next_hop": sink.endpoint, "tls": "disabled"} for name, sink in sinks.items()
        ]
        pigeon = stack.enter_context(PigeonProcess(tmp_path / "node", **config))
        recipients = [f"a@{name}.example" for name in sinks]
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            assert client.sendmail("sender@example.org", recipients, MESSAGE) == {}
        records = wait_until(lambda: len(done := _outcomes(pigeon)) == len(recipients) and done, timeout=20)
        by_recipient = {record["recipient"]: record for record in records}
        for name, sink in sinks.items():
            case = name.rsplit("-", 1)[0]
            record = by_recipient[f"a@{name}.example"]
            answers, content_sent = CASES[case]
            (bad,) = answers.values()
            assert record["type"] == "TransientFailure", (name, record)
            response = record["response"]
            assert (response["code"], response["enhanced"]) == (451, "4.5.0"), (name, response)
            assert "broke the protocol" in response["text"] and bad in response["text"], (name, response)
            assert record["peer"] == f"[127.0.0.1]:{sink.port}"
            assert sink.quits == 0 and sink.drops == 1, name  # dropped: a QUIT could be read as content
            assert bool(sink.contents) == content_sent, name  # no content after a 250 to DATA
        assert pigeon.records("Delivery") == []


def _outcomes(pigeon: PigeonProcess) -> list[dict[str, object]]:
    return [r for r in pigeon.records() if r["type"] in ("Delivery", "TransientFailure", "Bounce")]
