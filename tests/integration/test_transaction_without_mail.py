"""A client that keeps a connection (and a transaction) open without ever sending a message,
by RCPTs past `max_recipients` or by looping EHLO/MAIL/RSET, is told 421 and disconnected
once `max_junk_commands` is spent, with a Rejection saying so; a client that sends mail, 200
messages on one connection with RSET and NOOP between them, never is."""

from __future__ import annotations

import smtplib
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

TOO_MANY = (421, ["4.7.0 mx.pigeon.test Error: too many commands that move no mail, closing connection"])


def test_rcpts_past_the_recipient_limit_end_with_421_once_the_junk_limit_is_spent(tmp_path: Path) -> None:
    limits = {"max_recipients": 2, "max_junk_commands": 3}
    with PigeonProcess(tmp_path / "node", smtp=limits) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO greedy.test")
        client.expect(250, "MAIL FROM:<a@example.org>")
        # Pipelined, as a client that has not heard the first 452 yet sends them.
        client.send(b"".join(b"RCPT TO:<r%d@example.net>\r\n" % i for i in range(20)))
        codes = [client.reply()[0] for _ in range(2 + 2 + 3)]
        assert codes == [250, 250] + [452] * 5  # 2 taken, 2 as many again free, 3 junk
        assert client.reply() == TOO_MANY
        assert client.closed_by_peer()
        rejections = pigeon.wait_records("Rejection", 6)
    assert [(r["command"], r["response"]["code"], r["recipients"]) for r in rejections] == [
        *(("RCPT", 452, [f"r{i}@example.net"]) for i in range(2, 7)),
        ("RCPT", 421, ["r7@example.net"]),
    ]
    assert rejections[-1]["response"]["enhanced"] == "4.7.0"


def test_an_ehlo_mail_rset_loop_without_data_ends_with_421(tmp_path: Path) -> None:
    with (
        PigeonProcess(tmp_path / "node", smtp={"max_junk_commands": 4}) as pigeon,
        RawSmtp(pigeon.smtp_port) as client,
    ):
        client.expect(220)
        client.expect(250, "EHLO looper.test")
        for _ in range(2):
            client.expect(250, "MAIL FROM:<a@example.org>")
            client.expect(250, "RCPT TO:<b@example.net>")
            client.expect(250, "EHLO looper.test")  # junk: resets the transaction, as RSET does
            client.expect(250, "MAIL FROM:<a@example.org>")
            client.expect(250, "RSET")  # junk
        client.expect(250, "MAIL FROM:<a@example.org>")
        assert client.command("EHLO looper.test") == TOO_MANY
        assert client.closed_by_peer()
        (rejection,) = pigeon.wait_records("Rejection")
    assert (rejection["command"], rejection["response"]["code"], rejection["sender"]) == ("EHLO", 421, "a@example.org")
    assert pigeon.records("Reception") == []


def test_two_hundred_messages_on_one_connection_with_rset_between_all_arrive(tmp_path: Path) -> None:
    """Tight limits, so that a count that did not start over with each message would show:
    three junk commands and two recipients past the limit with each message, 200 times."""
    limits = {"max_junk_commands": 3, "max_errors": 1, "max_recipients": 2}
    with PigeonProcess(tmp_path / "node", smtp=limits) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("bulk.test")
        for n in range(200):
            client.rset()
            assert client.noop()[0] == 250
            recipients = [f"r{i}-{n}@example.net" for i in range(4)]
            refused = client.sendmail("a@example.org", recipients, f"Subject: {n}\r\n\r\nmessage {n}\r\n")
            assert sorted(refused) == recipients[2:]  # 452: sent in a new transaction, not lost
            client.ehlo("bulk.test")  # some clients greet before each message
        assert client.noop()[0] == 250
        receptions = pigeon.wait_records("Reception", 200)
        rejections = pigeon.records("Rejection")
    assert len(receptions) == 200 and len({r["session"] for r in receptions}) == 1
    assert {(r["command"], r["response"]["code"]) for r in rejections} == {("RCPT", 452)} and len(rejections) == 400
