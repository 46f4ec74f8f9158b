"""A hook whose answer breaks the checks made of it (its `__repr__` raises, so the error naming
it cannot be written) fails as any failing hook does: the documented answer (451 4.3.0, 421 at
connect, the message deferred or the attempt's own outcome kept), a PolicyFailure, and nothing
lost or sent twice. Found from outside: the error escaped the hook machinery, and then a
delivered message was reported as an internal error and sent again at every retry (a refused
one retried instead of bounced), an async on_mail_from left the client without a reply to
MAIL, an on_message over SMTP dropped the connection, and one over HTTP answered 500."""

from __future__ import annotations

import smtplib
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: hello\r\n\r\nHello.\r\n"
ERROR = b"4.3.0 policy error; try again later"

_MODULE = """
    class Unprintable:
        def __repr__(self):
            return 1 / 0

    {prefix}def on_connect(connection):
        if connection.peer_ip == "127.0.0.2":
            return Unprintable()
    {prefix}def on_mail_from(mail):
        if mail.sender.startswith("bad@"):
            return Unprintable()
    {prefix}def on_rcpt_to(rcpt):
        if rcpt.recipient.startswith("bad@"):
            return Unprintable()
    {prefix}def on_message(message):
        if message.headers["Subject"] == "bad":
            return Unprintable()
    {prefix}def before_delivery(delivery):
        if delivery.attempt == 1 and delivery.recipients[0].startswith("first@"):
            return Unprintable()
    {prefix}def on_delivery_outcome(outcome):
        if outcome.delivery.recipients[0].startswith(("outcome@", "permfail@")):
            return Unprintable()
"""


def _node(root: Path, mode: str, **sections: Any) -> PigeonProcess:
    root.mkdir(parents=True, exist_ok=True)
    module = root / "policy.py"
    module.write_text(textwrap.dedent(_MODULE).format(prefix="async " if mode == "async" else ""))
    return PigeonProcess(root / "node", policy={"module": str(module), "timeout": "5s"}, **sections)


@pytest.mark.parametrize("mode", ["inline", "async"])
def test_an_answer_whose_repr_raises_fails_the_hook_as_documented_and_nothing_is_sent_twice(
    tmp_path: Path, mode: str
) -> None:
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint, retry_interval="0.5s", dsn=False)
        with _node(tmp_path, mode, **config) as pigeon:
            with RawSmtp(pigeon.smtp_port, source="127.0.0.2") as client:
                assert client.reply() == (421, ["policy error; try again later"])
                assert client.closed_by_peer()
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                client.ehlo("client.test")
                assert client.mail("bad@example.org") == (451, ERROR)
                assert client.mail("a@example.org")[0] == 250
                assert client.rcpt("bad@example.net") == (451, ERROR)
                assert client.rcpt("ok@example.net")[0] == 250
                assert client.data(b"From: <a@example.org>\r\nSubject: bad\r\n\r\nhi\r\n") == (451, ERROR)
                client.sendmail("a@example.org", ["first@example.net"], MESSAGE)  # before_delivery's answer
                client.sendmail("a@example.org", ["outcome@example.net"], MESSAGE)  # delivered: kept so
                client.sendmail("a@example.org", ["permfail@example.net"], MESSAGE)  # refused 550: bounced
            body = {
                "envelope_sender": "a@example.org",
                "recipients": [{"email": "http@example.net"}],
                "content": "From: a@example.org\r\nSubject: bad\r\n\r\nhi\r\n",
            }
            status, answer = pigeon.http_post("/api/v1/inject", body, pigeon.local_token)
            assert (status, answer["recipients"][0]["error"]) == (503, "451 4.3.0 policy error; try again later")
            # The message whose before_delivery failed was deferred (451 4.3.0), then delivered.
            (transient,) = pigeon.wait_records("TransientFailure")
            assert (transient["recipient"], transient["response"]["code"]) == ("first@example.net", 451)
            assert transient["response"]["enhanced"] == "4.3.0"
            deliveries = pigeon.wait_records("Delivery", 2)
            assert sorted((d["recipient"], d["attempt"]) for d in deliveries) == [
                ("first@example.net", 2),
                ("outcome@example.net", 1),
            ]
            (bounce,) = pigeon.wait_records("Bounce")
            assert (bounce["recipient"], bounce["response"]["code"]) == ("permfail@example.net", 550)
            failures = pigeon.wait_records("PolicyFailure", 8)
            assert sorted((f["hook"], f["action"]) for f in failures) == [
                ("before_delivery", "deferred"),
                ("on_connect", "421"),
                ("on_delivery_outcome", "kept"),
                ("on_delivery_outcome", "kept"),
                ("on_mail_from", "451 4.3.0"),
                ("on_message", "451 4.3.0"),
                ("on_message", "451 4.3.0"),
                ("on_rcpt_to", "451 4.3.0"),
            ]
            for failure in failures:
                assert (
                    "Unprintable object (its repr() raised ZeroDivisionError)>; it may return None or"
                    in failure["error"]
                )
            # Each message sent once (none again as an "internal error"), none left in the spool.
            received = sorted(r.recipients[0] for r in sink.after(1.5))
            assert received == ["first@example.net", "outcome@example.net"]
            wait_until(lambda: pigeon.spool_messages() == [])
            assert len(pigeon.records("TransientFailure")) == 1
            stderr = pigeon.stderr()
            assert "internal error" not in stderr and "Fatal error" not in stderr and "SmtpUsageError" not in stderr
