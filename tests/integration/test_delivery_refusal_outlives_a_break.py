"""A recipient the next hop refused for good (5xx at RCPT) is bounced with that refusal even when
the connection then breaks later in the same transaction (a close, a timeout), PIPELINING or
not, DATA or BDAT: only the recipients without an answer of their own are deferred, and only
those the server accepted are said to be perhaps delivered twice. The sender's DSN reports the
server's 550 at once.

Found from outside: the refused recipient was deferred with the others ("451 4.4.2 ... closed
the connection", even "... may be delivered twice", though it was never accepted) at every
attempt until it expired, and the 550 never showed in the log. Postfix bounces it at once, and
Pigeon did after a 421.
"""

from __future__ import annotations

import smtplib
from contextlib import ExitStack
from email.message import Message
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, ScriptedSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: refused, then a break\r\n\r\nHello.\r\n"
UNKNOWN = "550-5.1.1 <unknown@{domain}>: Recipient address rejected:\r\n550 5.1.1 User unknown in virtual mailbox table"
TWICE = "no reply to the end of data: the message may be delivered twice"

# name: (extensions, where the connection breaks, the other recipient's local part, whether the
# content's end went out before the break: that recipient may then have the message)
CASES = {
    "rcpt-pipelined": (("PIPELINING",), "RCPT TO:<drop@{domain}>", "drop", False),
    "rcpt-lockstep": ((), "RCPT TO:<drop@{domain}>", "drop", False),
    "dot-pipelined": (("PIPELINING",), ".", "taken", True),
    "dot-lockstep": ((), ".", "taken", True),
    "bdat": (("PIPELINING", "CHUNKING"), "BDAT", "taken", True),
    "data-lockstep": ((), "DATA", "taken", False),
}
TIMEOUT = "rcpt-timeout"  # no close: the server stops answering after the 550


def _status_blocks(dsn: Message) -> dict[str, Message]:
    blocks = dsn.get_payload()[1].get_payload()[1:]  # (the first is the per-message one)
    return {block["Final-Recipient"].split("; ")[1]: block for block in blocks}


def test_a_recipient_refused_for_good_is_bounced_with_its_refusal_when_the_connection_breaks_later(
    tmp_path: Path,
) -> None:
    with ExitStack() as stack:
        sinks: dict[str, AnswerSink] = {}
        for name, (extensions, breaks_at, _, _) in CASES.items():
            domain = f"{name}.example"
            answers = {
                f"RCPT TO:<unknown@{domain}>": UNKNOWN.format(domain=domain),
                breaks_at.format(domain=domain): "",
            }
            sinks[name] = stack.enter_context(AnswerSink(answers, extensions=extensions))
        domain = f"{TIMEOUT}.example"
        answers = {f"RCPT TO:<unknown@{domain}>": UNKNOWN.format(domain=domain)}
        delays = {f"RCPT TO:<drop@{domain}>": 6.0}
        sinks[TIMEOUT] = stack.enter_context(AnswerSink(answers, delays=delays, extensions=("PIPELINING",)))
        dsn_sink = stack.enter_context(ScriptedSink())
        config = delivery_config("unused", retry_interval="1h", reply_timeout="2s", data_done_timeout="2s")
        config["route"] = [
            {"domain": "example.org", "next_hop": dsn_sink.endpoint, "tls": "disabled"},
            *(
                {"domain": f"{name}.example", "next_hop": sink.endpoint, "tls": "disabled"}
                for name, sink in sinks.items()
            ),
        ]
        pigeon = stack.enter_context(PigeonProcess(tmp_path / "node", **config))
        others = {name: case[2] for name, case in CASES.items()} | {TIMEOUT: "drop"}
        for name, other in others.items():  # one message a site: each transaction breaks on its own
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                recipients = [f"unknown@{name}.example", f"{other}@{name}.example"]
                assert client.sendmail("sender@example.org", recipients, MESSAGE) == {}

        outcomes = ("Bounce", "TransientFailure")
        wait_until(lambda: len([r for r in pigeon.records() if r["type"] in outcomes]) >= 2 * len(sinks), timeout=30)
        bounces, failures = pigeon.records("Bounce"), pigeon.records("TransientFailure")
        assert sorted(record["recipient"] for record in bounces) == sorted(f"unknown@{name}.example" for name in sinks)
        assert sorted(record["recipient"] for record in failures) == sorted(
            f"{other}@{name}.example" for name, other in others.items()
        )
        for record in bounces:  # the server's own refusal, both its lines
            response = record["response"]
            assert (response["code"], response["enhanced"]) == (550, "5.1.1"), record
            assert "User unknown in virtual mailbox table" in response["text"], record
            assert "Recipient address rejected" in response["text"], record
            assert TWICE not in response["text"], record
        content_went = {f"{other}@{name}.example": case[3] for name, case in CASES.items() for other in [case[2]]}
        content_went[f"drop@{TIMEOUT}.example"] = False
        for record in failures:  # Pigeon's words for the break; "twice" only where the content's end went
            response = record["response"]
            assert (response["code"], response["enhanced"]) == (451, "4.4.2"), record
            assert (TWICE in response["text"]) == content_went[record["recipient"]], record
        assert all(record["recipient"] == "sender@example.org" for record in pigeon.records("Delivery"))  # (the DSNs)

        # One DSN a message, at once (no delay warning, no expiry), each with the server's 550.
        dsns = dsn_sink.wait_for(len(sinks), timeout=20)
        reported: dict[str, Message] = {}
        for dsn in dsns:
            reported |= _status_blocks(dsn.email)
        assert sorted(reported) == sorted(f"unknown@{name}.example" for name in sinks)
        for recipient, block in reported.items():
            assert (block["Action"], block["Status"]) == ("failed", "5.1.1"), (recipient, block)
            assert block["Diagnostic-Code"].startswith("smtp; 550 5.1.1 "), (recipient, block)
            assert "User unknown in virtual mailbox table" in block["Diagnostic-Code"], (recipient, block)
            assert block["Remote-MTA"] is not None, (recipient, block)
        assert len(dsn_sink.after(1.0)) == len(sinks)  # nothing more (no delay warning for the deferred)


def test_a_recipient_refused_for_good_is_bounced_with_its_refusal_when_a_stop_cuts_the_end_of_data(
    tmp_path: Path,
) -> None:
    # The same break, made by a stop whose shutdown_timeout runs out while the server holds its
    # reply to the end of data: only the accepted recipient may have the message.
    domain = "held.example"
    answers = {f"RCPT TO:<unknown@{domain}>": UNKNOWN.format(domain=domain)}
    with AnswerSink(answers, delays={".": 6.0}, extensions=("PIPELINING",)) as sink:
        config = delivery_config(sink.endpoint, retry_interval="1h")
        config["node"] = {"shutdown_timeout": "1s"}
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("sender@example.org", [f"unknown@{domain}", f"taken@{domain}"], MESSAGE)
            wait_until(lambda: len(sink.contents) == 1)
            assert pigeon.stop() == 0
            (bounce,) = pigeon.records("Bounce")
            assert bounce["recipient"] == f"unknown@{domain}"
            assert (bounce["response"]["code"], bounce["response"]["enhanced"]) == (550, "5.1.1"), bounce
            (failure,) = pigeon.records("TransientFailure")
            assert failure["recipient"] == f"taken@{domain}"
            assert failure["response"]["text"].endswith(TWICE), failure
            stderr = pigeon.stderr()
            assert f"answered the end of data: taken@{domain} may be delivered twice" in stderr, stderr
