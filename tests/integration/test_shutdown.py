"""SIGTERM: stop accepting, let the open transaction finish, lose nothing."""

from __future__ import annotations

import math
import signal
import smtplib
import socket
import time
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import ScriptedSink, delivery_config, wait_until


def _half_a_message(busy: RawSmtp) -> None:
    """A transaction open in the middle of its message's content, as a SIGTERM may find one."""
    busy.expect(220)
    busy.expect(250, "EHLO busy.test")
    busy.expect(250, "MAIL FROM:<a@example.org>")
    busy.expect(250, "RCPT TO:<b@example.net>")
    busy.expect(354, "DATA")
    busy.send(b"Subject: in flight\r\n\r\nfirst half\r\n")


def test_sigterm_lets_an_open_transaction_finish_then_says_421(pigeon: PigeonProcess) -> None:
    with RawSmtp(pigeon.smtp_port) as busy, RawSmtp(pigeon.smtp_port) as idle:
        idle.expect(220)
        idle.expect(250, "EHLO idle.test")
        _half_a_message(busy)
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


def test_with_two_workers_new_clients_are_refused_at_once_while_a_transaction_finishes(tmp_path: Path) -> None:
    # Every worker closes its copy of the listening socket at SIGTERM; the supervisor's copy
    # (kept to restart workers on it) must go too, or the kernel goes on completing handshakes
    # that nobody will ever greet: the client hangs until the node exits, then is reset.
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        with RawSmtp(pigeon.smtp_port) as busy:
            _half_a_message(busy)
            assert pigeon.process is not None
            pigeon.process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            started = time.monotonic()
            try:
                with socket.create_connection(("127.0.0.1", pigeon.smtp_port), timeout=5) as late:
                    late.settimeout(5)
                    greeting = late.recv(512)  # b"": closed; a 421 would do too; a hang would not
            except OSError:
                greeting = b""
            assert greeting == b"" or greeting.startswith(b"421"), greeting
            assert time.monotonic() - started < 1
            busy.send(b"second half\r\n.\r\n")
            assert busy.expect(250)[0].startswith("2.0.0 Ok: queued as")
        assert pigeon.process.wait(15) == 0
        (stored,) = pigeon.spool_messages()
        assert stored["data"].endswith(b"first half\r\nsecond half\r\n")


def test_sigterm_closes_idle_outbound_connections_at_once(tmp_path: Path) -> None:
    # An outbound connection waits `idle_timeout` (10 s by default) for more mail; a graceful
    # stop must not wait for it, but say QUIT and go.
    config = delivery_config("", idle_timeout="30s")
    with ScriptedSink() as sink:
        config["route"][0]["next_hop"] = sink.endpoint
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("sender@example.org", ["ok@example.net"], b"Subject: x\r\n\r\nHello.\r\n")
            sink.wait_for(1)
            wait_until(lambda: pigeon.spool_messages() == [])
            idle = wait_until(lambda: [c for c in sink.connections if c.ended == math.inf])  # open, idle
            assert pigeon.process is not None
            started = time.monotonic()
            pigeon.process.send_signal(signal.SIGTERM)
            assert pigeon.process.wait(15) == 0
            assert time.monotonic() - started < 3
        wait_until(lambda: all(c.ended < math.inf for c in idle), timeout=2)


def test_sessions_still_open_when_shutdown_timeout_runs_out_are_told_421_before_the_close(tmp_path: Path) -> None:
    # RFC 5321 3.8: a server that shuts down says 421 to every session it closes, a client
    # stalled in the middle of its message's content too (whose partial message is not taken).
    with PigeonProcess(tmp_path / "node", node={"shutdown_timeout": "1s"}) as pigeon:
        with (
            RawSmtp(pigeon.smtp_port) as in_data,
            RawSmtp(pigeon.smtp_port) as in_envelope,
            RawSmtp(pigeon.smtp_port) as idle,
        ):
            for client in (in_data, in_envelope, idle):
                client.expect(220)
                client.expect(250, "EHLO stalled.test")
            for client in (in_data, in_envelope):
                client.expect(250, "MAIL FROM:<a@example.org>")
                client.expect(250, "RCPT TO:<b@example.net>")
            in_data.expect(354, "DATA")
            in_data.send(b"Subject: half\r\n\r\nthe first half, and then nothing\r\n")
            time.sleep(0.2)
            assert pigeon.process is not None
            started = time.monotonic()
            pigeon.process.send_signal(signal.SIGTERM)
            assert idle.reply()[0] == 421  # idle: at once
            for client in (in_envelope, in_data):  # in a transaction: once shutdown_timeout is over
                code, text = client.reply()
                assert (code, text[0].split(" ")[0]) == (421, "4.3.2"), (code, text)
                assert client.closed_by_peer()
            assert 0.9 < time.monotonic() - started < 5
        assert pigeon.process.wait(15) == 0
        assert pigeon.spool_messages() == []
