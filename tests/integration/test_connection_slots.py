"""Connection slots cannot be held for ever by outsiders: a transaction's envelope has a time
bound of its own (`envelope_timeout`), a full listener makes room for a newcomer by closing an
outsider whose envelope has been open long, and a client that talks before its greeting is
turned away. Relay clients are served through all of it.

127.0.0.2 may relay; 127.0.0.60 and up are outsiders (they may still write to <postmaster>).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import textwrap
import threading
import time
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

RELAY = "127.0.0.2"
ONLY_RELAY = {"relay_networks": [f"{RELAY}/32"]}
MESSAGE = b"From: <a@example.org>\r\nTo: <b@example.net>\r\nSubject: hi\r\n\r\nHello.\r\n.\r\n"


def _into_envelope(client: RawSmtp) -> None:
    client.expect(220)
    client.expect(250, "EHLO x")
    client.expect(250, "MAIL FROM:<a@x.test>")
    client.expect(250, "RCPT TO:<postmaster>")


def _drip_recipients(client: RawSmtp, every: float, stop: threading.Event) -> list[tuple[int, list[str]]]:
    """One more RCPT every `every` seconds (each answered in time) until told to stop or cut
    off, or 20 of them."""
    got: list[tuple[int, list[str]]] = []
    while len(got) < 20 and not stop.wait(every):
        try:
            if select.select([client.sock], [], [], 0)[0]:  # said something unasked: it closes
                got.append(client.reply())
                return got
            reply = client.command("RCPT TO:<postmaster>")
        except OSError:
            break
        got.append(reply)
        if reply[0] != 250:
            return got
    with contextlib.suppress(OSError):
        if select.select([client.sock], [], [], 0.5)[0]:  # told something as it stopped
            got.append(client.reply())
    return got


def test_an_outsider_dripping_recipients_is_cut_at_envelope_timeout_while_a_relay_client_sends_its_envelope(
    tmp_path: Path,
) -> None:
    smtp = {**ONLY_RELAY, "idle_timeout": "4s", "command_timeout": "4s", "envelope_timeout": "2s"}
    with PigeonProcess(tmp_path / "node", smtp=smtp) as pigeon, RawSmtp(pigeon.smtp_port, source="127.0.0.60") as slow:
        _into_envelope(slow)
        started = time.monotonic()
        got = _drip_recipients(slow, 0.5, threading.Event())
        assert got[-1] == (
            421,
            ["4.4.2 mx.pigeon.test Error: transaction envelope not done within 2s (MAIL to DATA), closing connection"],
        )
        assert [code for code, _ in got[:-1]] == [250] * (len(got) - 1)
        assert 1.3 < time.monotonic() - started < 3.5
        assert slow.closed_by_peer()
        (rejection,) = pigeon.wait_records("Rejection")
        assert rejection["peer"].startswith("127.0.0.60:")
        assert (rejection["response"]["code"], rejection["response"]["enhanced"]) == (421, "4.4.2")
        assert rejection["sender"] == "a@x.test"

        # A relay client's envelope of 1,000 recipients, pipelined, is well within it.
        with RawSmtp(pigeon.smtp_port, source=RELAY) as relay:
            relay.expect(220)
            relay.expect(250, "EHLO relay.test")
            rcpts = b"".join(b"RCPT TO:<r%d@example.net>\r\n" % n for n in range(1000))
            relay.send(b"MAIL FROM:<a@example.org>\r\n" + rcpts + b"DATA\r\n")
            assert [relay.reply()[0] for _ in range(1002)] == [250] * 1001 + [354]
            relay.send(MESSAGE)
            assert relay.reply()[0] == 250

            # One that does not pipeline, over a slow way (a round trip a recipient: Python's
            # smtplib), is not bounded so: its envelope outlasts envelope_timeout and is taken.
            relay.send(b"MAIL FROM:<a@example.org>\r\n")
            assert relay.reply()[0] == 250
            for n in range(6):
                time.sleep(0.5)
                relay.send(b"RCPT TO:<slow%d@example.net>\r\n" % n)
                assert relay.reply()[0] == 250
            relay.send(b"DATA\r\n")
            assert relay.reply()[0] == 354
            relay.send(MESSAGE)
            assert relay.reply()[0] == 250
        assert len(pigeon.records("Rejection")) == 1


def test_a_full_listener_closes_an_outsider_whose_envelope_is_open_long_to_serve_a_relay_client(
    tmp_path: Path,
) -> None:
    """max_connections = 3, all held by outsiders each sending a RCPT every second (no timeout
    meets them yet): the relay client is greeted, the outsider whose envelope is oldest is told
    421 to make room. (The RCPTs are sent in turn from here, none in flight when the relay
    client comes: a connection closed with a command unread may be reset, its 421 lost.)"""
    smtp = {
        **ONLY_RELAY,
        "max_connections": 3,
        "idle_timeout": "4s",
        "command_timeout": "4s",
        # An envelope open 6 s (half of it) is open long. The relay client comes at about 7 s
        # of the oldest envelope, 5 s before the timeout that would close it anyway.
        "envelope_timeout": "12s",
    }
    with PigeonProcess(tmp_path / "node", smtp=smtp) as pigeon:
        outsiders = [RawSmtp(pigeon.smtp_port, source=f"127.0.0.{60 + n}") for n in range(3)]
        try:
            # The oldest by a second: envelopes begun within a millisecond of each other are
            # ordered by chance, as the time spent deciding each RCPT is left out of their clocks.
            _into_envelope(outsiders[0])
            time.sleep(1.0)
            for client in outsiders[1:]:
                _into_envelope(client)
            with RawSmtp(pigeon.smtp_port, source=RELAY) as early:  # none has been open long yet
                assert early.reply() == (421, ["mx.pigeon.test too many connections, try again later"])
            for _ in range(6):
                time.sleep(1.0)
                for client in outsiders:
                    client.expect(250, "RCPT TO:<postmaster>")
            with RawSmtp(pigeon.smtp_port, source=RELAY) as relay:
                relay.expect(220)
                relay.expect(250, "EHLO relay.test")
                relay.expect(250, "MAIL FROM:<a@example.org>")
                relay.expect(250, "RCPT TO:<b@example.net>")
                relay.expect(354, "DATA")
                relay.send(MESSAGE)
                assert relay.reply()[0] == 250
            oldest, *others = outsiders
            assert oldest.reply() == (
                421,
                [
                    "4.7.0 mx.pigeon.test too many connections: closing this one, whose transaction has been open "
                    "too long; reconnect when you have mail"
                ],
            )
            assert oldest.closed_by_peer()
            for client in others:
                client.expect(250, "RCPT TO:<postmaster>")
        finally:
            for client in outsiders:
                client.close()
        rejections = pigeon.wait_records("Rejection", 2)
        evicted = [r for r in rejections if r["peer"].startswith("127.0.0.60:")]
        assert [(r["response"]["code"], r["response"]["enhanced"], r["sender"]) for r in evicted] == [
            (421, "4.7.0", "a@x.test")
        ]
        assert pigeon.metric("pigeon_smtp_connections_evicted_total") == 1


def _early_talk(port: int, source: str) -> tuple[bytes, bool]:
    """Connect and send EHLO and MAIL at once, without waiting for the greeting; what came back
    before the server closed (or in a second), and whether it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as sock:
        sock.sendall(b"EHLO early\r\nMAIL FROM:<a@x.test>\r\n")
        return _read_all(sock)


def _read_all(sock: socket.socket) -> tuple[bytes, bool]:
    sock.settimeout(1.0)
    got = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return got, False
        except ConnectionResetError:
            return got, True
        if not chunk:
            return got, True
        got += chunk


def test_an_outsider_that_talks_while_an_async_on_connect_holds_the_greeting_gets_554_and_is_closed(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.py"
    policy.write_text(
        textwrap.dedent("""
            import asyncio
            async def on_connect(connection):
                await asyncio.sleep(0.5)
        """)
    )
    with PigeonProcess(tmp_path / "node", smtp=ONLY_RELAY, policy={"module": str(policy)}) as pigeon:
        got, closed = _early_talk(pigeon.smtp_port, "127.0.0.60")
        assert (got, closed) == (b"554 mx.pigeon.test Error: you sent before the greeting (RFC 5321 4.3.1), "
                                 b"closing connection\r\n", True)  # fmt: skip
        (rejection,) = pigeon.wait_records("Rejection")
        assert rejection["command"] == "CONNECT"
        assert rejection["peer"].startswith("127.0.0.60:")
        assert rejection["response"]["code"] == 554
        assert "enhanced" not in rejection["response"]  # (logged as sent: a greeting carries none)

        # A relay client that does the same is served; so is an outsider that waits.
        got, closed = _early_talk(pigeon.smtp_port, RELAY)
        assert [line[:3] for line in got.split(b"\r\n") if line[3:4] == b" "] == [b"220", b"250", b"250"]
        with RawSmtp(pigeon.smtp_port, source="127.0.0.61") as patient:
            _into_envelope(patient)
        assert len(pigeon.records("Rejection")) == 1


def test_an_outsider_whose_commands_are_there_before_the_greeting_gets_554_and_is_closed(tmp_path: Path) -> None:
    """Without a policy the greeting goes out as soon as the connection is taken: the node is
    stopped (SIGSTOP) while the client connects and sends, so its bytes are there first."""
    with PigeonProcess(tmp_path / "node", smtp=ONLY_RELAY) as pigeon:
        assert pigeon.process is not None
        for source in ("127.0.0.60", RELAY):
            os.kill(pigeon.process.pid, signal.SIGSTOP)
            try:  # the kernel takes the connection (the listening backlog) and the bytes meanwhile
                sock = socket.create_connection(("127.0.0.1", pigeon.smtp_port), timeout=5, source_address=(source, 0))
                sock.sendall(b"EHLO early\r\nMAIL FROM:<a@x.test>\r\n")
            finally:
                os.kill(pigeon.process.pid, signal.SIGCONT)
            with sock:
                got, closed = _read_all(sock)
            if source == RELAY:  # trusted: served as ever
                assert [line[:3] for line in got.split(b"\r\n") if line[3:4] == b" "] == [b"220", b"250", b"250"]
                assert not closed
            else:
                assert got.startswith(b"554 mx.pigeon.test Error: you sent before the greeting")
                assert closed
        (rejection,) = pigeon.wait_records("Rejection")
        assert rejection["command"] == "CONNECT" and "enhanced" not in rejection["response"]
        with RawSmtp(pigeon.smtp_port, source="127.0.0.61") as patient:
            _into_envelope(patient)
