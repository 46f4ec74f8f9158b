"""Limits a hostile or broken client runs into: timeouts, connections, errors, line length."""

from __future__ import annotations

import socket
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import wait_until


def test_idle_client_is_told_421_and_disconnected(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={"idle_timeout": "1s"}) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        started = time.monotonic()
        code, text = client.reply()
        # No EHLO yet, and the enhanced status code all the same (RFC 2034 4: whether or not EHLO is used).
        assert (code, text) == (421, ["4.4.2 mx.pigeon.test Error: timeout exceeded, closing connection"])
        assert 0.8 < time.monotonic() - started < 5
        assert client.closed_by_peer()


def test_slow_dribbling_client_hits_the_command_timeout(tmp_path: Path) -> None:
    with (
        PigeonProcess(tmp_path / "node", smtp={"idle_timeout": "10s", "command_timeout": "1s"}) as pigeon,
        RawSmtp(pigeon.smtp_port) as client,
    ):
        client.expect(220)
        started = time.monotonic()
        for byte in b"EHLO slowloris.test":
            try:
                client.send(bytes([byte]))
            except OSError:
                break
            time.sleep(0.2)
        code, _ = client.reply()
        assert code == 421
        assert time.monotonic() - started < 4.5
        (rejection,) = pigeon.wait_records("Rejection")
        assert rejection["response"]["enhanced"] == "4.4.2"


def test_noop_keepalive_answered_at_once_is_not_a_timeout(tmp_path: Path) -> None:
    """command_timeout bounds one command; NOOPs every 0.25 s for 2.5 s (with a 1 s
    command_timeout) each take no time, so the session goes on."""
    with (
        PigeonProcess(tmp_path / "node", smtp={"idle_timeout": "10s", "command_timeout": "1s"}) as pigeon,
        RawSmtp(pigeon.smtp_port) as client,
    ):
        client.expect(220)
        client.expect(250, "EHLO pool.test")
        for _ in range(10):
            client.expect(250, "NOOP")
            time.sleep(0.25)
        client.expect(250, "MAIL FROM:<a@example.org>")
        assert pigeon.records("Rejection") == []


def test_junk_commands_past_the_limit_end_the_session_with_a_reply_that_says_so(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={"max_junk_commands": 3}) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO chatty.test")
        client.expect(250, "NOOP")
        client.expect(250, "RSET")
        client.expect(250, "NOOP")
        code, text = client.command("NOOP")
        assert (code, text) == (
            421,
            ["4.7.0 mx.pigeon.test Error: too many commands that move no mail, closing connection"],
        )
        assert client.closed_by_peer()
        (rejection,) = pigeon.wait_records("Rejection")
        assert (rejection["command"], rejection["response"]["enhanced"]) == ("NOOP", "4.7.0")


def test_connections_over_the_limit_are_refused_with_421(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={"max_connections": 2}) as pigeon:
        first, second = RawSmtp(pigeon.smtp_port), RawSmtp(pigeon.smtp_port)
        for client in (first, second):  # in a transaction: neither may be closed to make room
            client.expect(220)
            client.expect(250, "EHLO client.test")
            client.expect(250, "MAIL FROM:<a@example.org>")
        with RawSmtp(pigeon.smtp_port) as third:
            code, text = third.reply()
            assert code == 421
            assert "too many connections" in text[0]
        first.close()
        second.close()
        time.sleep(0.2)
        with RawSmtp(pigeon.smtp_port) as fourth:
            fourth.expect(220)


def test_the_max_errors_th_error_gets_its_reply_then_421_and_the_connection_closes(tmp_path: Path) -> None:
    """max_errors = 3: two errors leave the session open; the third is answered, then 421."""
    with PigeonProcess(tmp_path / "node", smtp={"max_errors": 3}) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        for _ in range(2):
            client.expect(500, "BOGUS")
        client.expect(250, "NOOP")  # still open after max_errors - 1
        client.send(b"BOGUS\r\n")
        assert client.reply()[0] == 500
        code, text = client.reply()
        assert code == 421
        assert "too many errors" in text[0]
        assert client.closed_by_peer()
        rejections = pigeon.wait_records("Rejection", 4)
    assert [r["response"]["code"] for r in rejections] == [500, 500, 500, 421]


def test_overlong_command_line_is_refused_and_the_session_goes_on(pigeon: PigeonProcess) -> None:
    with RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO client.test")
        code, text = client.command(b"NOOP " + b"a" * 5000)
        assert (code, text[0][:5]) == (500, "5.5.2")
        client.expect(250, "MAIL FROM:<a@example.org>")


def test_peer_closing_mid_data_leaves_nothing_in_the_spool(pigeon: PigeonProcess) -> None:
    sock = socket.create_connection(("127.0.0.1", pigeon.smtp_port))
    sock.sendall(b"EHLO c.test\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n")
    sock.recv(65536)
    sock.sendall(b"Subject: cut short\r\n\r\n" + b"x" * 100000)
    sock.close()
    wait_until(lambda: pigeon.metric("pigeon_smtp_connections") == 0)
    assert pigeon.spool_messages() == []
    shard = pigeon.spool_path / "shard-0"
    with closing(sqlite3.connect(f"file:{shard / 'spool.db'}?mode=ro", uri=True)) as conn:
        assert conn.execute("SELECT count(*) FROM body").fetchone()[0] == 0
    assert list((shard / "data").iterdir()) == []
    assert pigeon.http_get("/healthz")[0] == 200
