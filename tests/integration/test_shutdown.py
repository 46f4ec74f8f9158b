"""SIGTERM: stop accepting, let the open transaction finish, lose nothing."""

from __future__ import annotations

import signal
import socket
import time

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp


def test_sigterm_lets_an_open_transaction_finish_then_says_421(pigeon: PigeonProcess) -> None:
    with RawSmtp(pigeon.smtp_port) as busy, RawSmtp(pigeon.smtp_port) as idle:
        busy.expect(220)
        idle.expect(220)
        idle.expect(250, "EHLO idle.test")
        busy.expect(250, "EHLO busy.test")
        busy.expect(250, "MAIL FROM:<a@example.org>")
        busy.expect(250, "RCPT TO:<b@example.net>")
        busy.expect(354, "DATA")
        busy.send(b"Subject: in flight\r\n\r\nfirst half\r\n")
        assert pigeon.process is not None
        pigeon.process.send_signal(signal.SIGTERM)
        code, _ = idle.reply()  # the idle connection is closed at once
        assert code == 421
        time.sleep(0.3)
        try:  # the listener is closed: no new clients
            socket.create_connection(("127.0.0.1", pigeon.smtp_port), timeout=1).close()
            refused = False
        except OSError:
            refused = True
        assert refused
        busy.send(b"second half\r\n.\r\n")
        assert busy.expect(250)[0].startswith("2.0.0 Ok: queued as")
        code, _text = busy.command("MAIL FROM:<a@example.org>")
        assert code == 421
    assert pigeon.process.wait(15) == 0
    (stored,) = pigeon.spool_messages()
    assert stored["data"].endswith(b"first half\r\nsecond half\r\n")
