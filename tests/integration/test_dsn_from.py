"""`[delivery] dsn_from` is the From of the DSNs Pigeon writes, as Postfix's come from
MAILER-DAEMON@$myorigin: a smart host that takes only verified From domains (Amazon SES) refuses
one from MAILER-DAEMON@<[smtp] hostname>, and that notice, with its null sender, is lost.

Found from outside, migrating from Postfix: there was no such setting, and every DSN was
`From: MAILER-DAEMON@<[smtp] hostname>`."""

from __future__ import annotations

import email.utils
import smtplib
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until


def test_the_dsn_for_a_refused_recipient_comes_from_the_configured_dsn_from(tmp_path: Path) -> None:
    with ScriptedSink() as remote, ScriptedSink() as senders_host:
        remote.rcpt_reply = lambda address: "550 5.1.1 no such user" if address == "gone@example.net" else None
        sections = delivery_config(remote.endpoint, dsn_from="MAILER-DAEMON@example.org")
        # The sender's mail (the DSN) goes to its own host; the refusing one is every other's.
        sections["route"].insert(0, {"domain": "example.org", "next_hop": senders_host.endpoint, "tls": "disabled"})
        with PigeonProcess(tmp_path / "node", **sections) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail(
                    "sender@example.org",
                    ["gone@example.net"],
                    b"From: <sender@example.org>\r\nSubject: hi\r\n\r\nHello.\r\n",
                )
            report = wait_until(lambda: next(iter(senders_host.received), None))
    assert report.recipients == ["sender@example.org"]
    assert report.sender in ("", "<>")  # the envelope sender stays null: a DSN never bounces back
    parsed = report.email
    assert email.utils.parseaddr(str(parsed["From"])) == ("Mail Delivery System", "MAILER-DAEMON@example.org")
    # The host that wrote it is still named where the host is meant.
    assert str(parsed["Message-ID"]).endswith("@mx.pigeon.test>")
    status = parsed.get_payload()[1].get_payload()[0]  # type: ignore[union-attr, index]
    assert status["Reporting-MTA"] == "dns; mx.pigeon.test"
    assert not remote.received  # (nothing was delivered to the refusing host)
