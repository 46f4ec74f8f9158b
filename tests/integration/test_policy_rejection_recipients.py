"""A message the policy's `on_message` refuses leaves nothing in the spool: its `Rejection`
record must say whose mail it was, or an operator cannot answer "why did my mail not arrive?"."""

from __future__ import annotations

import smtplib
import textwrap
from pathlib import Path

from tests.support.process import PigeonProcess

POLICY = """
    from pigeon.policy import Refuse

    def on_message(message):
        if message.headers.get("Subject") == "spam":
            return Refuse(550, "looks like spam", "5.7.1")
"""


def test_a_message_the_policy_refuses_is_logged_with_its_recipients(tmp_path: Path) -> None:
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(POLICY))
    with (
        PigeonProcess(tmp_path / "node", policy={"module": str(module)}) as pigeon,
        smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client,
    ):
        client.ehlo("client.test")
        client.mail("sender@example.org")
        for recipient in ("ann@example.net", "bob@example.com"):
            assert client.rcpt(recipient)[0] == 250
        assert client.data(b"Subject: spam\r\n\r\nbuy now\r\n") == (550, b"5.7.1 looks like spam")
        # The next message of the same connection is not mixed into the refused one's record.
        assert client.sendmail("sender@example.org", ["carol@example.net"], b"Subject: fine\r\n\r\nhi\r\n") == {}
        (refused,) = pigeon.wait_records("Rejection")
        pigeon.wait_records("Reception")
    assert refused["command"] == "DATA"
    assert refused["response"] == {"code": 550, "enhanced": "5.7.1", "text": "looks like spam"}
    assert refused["sender"] == "sender@example.org"
    assert refused["recipients"] == ["ann@example.net", "bob@example.com"]
    assert refused["id"]
