"""A stop whose `shutdown_timeout` runs out while a next hop holds its reply to the end of data
cuts the transaction where the server may have taken the message. That is a break after the
content went, like any other: each such message gets its `TransientFailure` saying it may be
delivered twice (the attempt counted, its recipients due for a retry), and a WARNING names it
and its recipients. A transaction cut before its content went says nothing of the kind.

Found from outside: the cut attempts left no record and no log line, and were sent again at
the next start as "attempt": 1, with nothing to tell the operator which mail came twice.
"""

from __future__ import annotations

import re
import smtplib
import time
from contextlib import ExitStack
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, ScriptedSink, delivery_config, wait_until

TWICE = "no reply to the end of data: the message may be delivered twice"

# Which reply each sink holds past the stop, and its extensions. Two sinks of each, one message
# each (one sink would take the second message only once it answered the first).
CASES = {
    "dot1": (".", ()),
    "dot2": (".", ()),
    "bdat1": ("BDAT", ("PIPELINING", "CHUNKING")),
    "bdat2": ("BDAT", ("PIPELINING", "CHUNKING")),
    "data1": ("DATA", ()),  # cut while waiting for the 354: nothing sent
    "data2": ("DATA", ()),
}
CUT = ("dot1", "dot2", "bdat1", "bdat2")  # the content went


def test_a_stop_that_cuts_the_end_of_data_records_that_the_message_may_come_twice(tmp_path: Path) -> None:
    with ExitStack() as stack:
        sinks = {
            name: stack.enter_context(AnswerSink(delays={held: 6.0}, extensions=extensions))
            for name, (held, extensions) in CASES.items()
        }
        config = delivery_config("unused", retry_interval="1s")
        config["node"] = {"shutdown_timeout": "1s"}
        config["route"] = [
            {"domain": f"{name}.example", "next_hop": sink.endpoint, "tls": "disabled"} for name, sink in sinks.items()
        ]
        pigeon = stack.enter_context(PigeonProcess(tmp_path / "node", **config))
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            for name in CASES:
                recipients = [f"a@{name}.example", f"b@{name}.example"]
                client.sendmail("sender@example.org", recipients, f"Subject: {name}\r\n\r\nHi.\r\n")
        # Every message on the wire, its reply held: the content in full where it went.
        wait_until(lambda: all(len(sinks[name].contents) == 1 for name in CUT))
        wait_until(lambda: all("DATA" in sinks[name].commands for name in ("data1", "data2")))
        ids = {m["recipients"][0]: m["id"] for m in pigeon.spool_messages()}
        started = time.monotonic()
        assert pigeon.stop() == 0
        assert time.monotonic() - started < 5
        stderr = pigeon.stderr()

        failures = {r["recipient"]: r for r in pigeon.records("TransientFailure")}
        cut = {f"{who}@{name}.example" for name in CUT for who in "ab"}
        assert set(failures) == cut
        for record in failures.values():
            assert (record["response"]["code"], record["response"]["enhanced"]) == (451, "4.4.2")
            assert record["response"]["text"].endswith(TWICE), record
            assert "before the node stopped" in record["response"]["text"]
            assert record["attempt"] == 1
        for name in CUT:
            line = f"message {ids[f'a@{name}.example']}: the node stopped before [127.0.0.1]:{sinks[name].port}"
            assert re.search(
                rf"WARNING.*{re.escape(line)} answered the end of data: a@{name}\.example, b@{name}\.example may be "
                "delivered twice",
                stderr,
            ), stderr
        assert "data1" not in stderr and "data2" not in stderr

        # Started again, with the sinks answering at once: every message goes, the cut ones
        # as their second attempt, the one cut before its content as its first.
        for sink in sinks.values():
            sink.delays = {}
        pigeon.start()
        deliveries = pigeon.wait_records("Delivery", 12)
        attempts = {r["recipient"]: r["attempt"] for r in deliveries}
        assert attempts == {r: (2 if r in cut else 1) for r in attempts}
        assert len(attempts) == 12


def test_a_stop_that_cuts_a_later_transaction_keeps_what_the_earlier_one_delivered(tmp_path: Path) -> None:
    # The sink takes one recipient a transaction: ok@ goes in the first (delivered), and
    # slowend-1@ in a second whose end of data the sink holds past the stop. ok@ is delivered
    # (not sent again at the next start), slowend-1@ may come twice.
    with ScriptedSink(max_recipients=1, slow=6.0) as sink:
        config = delivery_config(sink.endpoint, retry_interval="1s")
        config["node"] = {"shutdown_timeout": "1s"}
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                recipients = ["ok@example.net", "slowend-1@example.net"]
                client.sendmail("sender@example.org", recipients, b"Subject: x\r\n\r\nHi.\r\n")
            wait_until(lambda: sink.received and "slowend-1@example.net" in sink.rcpt_log[1:])
            time.sleep(0.5)  # its content on the way, the reply held
            assert pigeon.stop() == 0
            (delivery,) = pigeon.records("Delivery")
            assert (delivery["recipient"], delivery["attempt"]) == ("ok@example.net", 1)
            (failure,) = pigeon.records("TransientFailure")
            assert (failure["recipient"], failure["attempt"]) == ("slowend-1@example.net", 1)
            assert failure["response"]["text"].endswith(TWICE)
            assert "answered the end of data: slowend-1@example.net may be delivered twice" in pigeon.stderr()
            sink.slow = 0.0
            pigeon.start()
            (again,) = [r for r in pigeon.wait_records("Delivery", 2) if r != delivery]
            assert (again["recipient"], again["attempt"]) == ("slowend-1@example.net", 2)
            assert [m.recipients for m in sink.received].count(["ok@example.net"]) == 1
