"""A message's content (DATA's up to the final dot, a BDAT sequence up to its LAST chunk) must
arrive within `command_timeout` plus its size at `min_data_rate`: a trickle of a line or a byte
at a time is cut with 421 4.4.2 and frees its connection slot, while a sender at least as fast
as the minimum rate is never cut, however long its message takes."""

from __future__ import annotations

import select
import socket
import time
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import wait_until

TIMEOUT = "421 4.4.2 mx.pigeon.test Error: timeout exceeded, closing connection"
QUICK = {"idle_timeout": "10s", "command_timeout": "1s"}


def _trickle(sock: socket.socket, piece: bytes, every: float, within: float) -> tuple[float, list[str]]:
    """Send `piece` every `every` seconds until the server closes or `within` has passed;
    the time taken and the reply lines received meanwhile."""
    started = time.monotonic()
    received = b""
    next_send = started
    while time.monotonic() - started < within:
        if time.monotonic() >= next_send:
            try:
                sock.sendall(piece)
            except OSError:
                break
            next_send += every
        readable, _, _ = select.select([sock], [], [], max(0.0, next_send - time.monotonic()))
        if readable:
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            received += chunk
    return time.monotonic() - started, received.decode().split("\r\n")[:-1]


def _open_transaction(client: RawSmtp) -> None:
    client.expect(220)
    client.expect(250, "EHLO slow.test")
    client.expect(250, "MAIL FROM:<a@example.org>")
    client.expect(250, "RCPT TO:<b@example.net>")


def _timeout_rejections(pigeon: PigeonProcess, command: str) -> list[str]:
    wait_until(lambda: any(r["command"] == command for r in pigeon.records("Rejection")))
    return [r["response"]["enhanced"] for r in pigeon.records("Rejection") if r["command"] == command]


def test_data_trickled_a_line_at_a_time_is_cut_with_421_and_frees_its_slot(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={**QUICK, "max_connections": 1}) as pigeon:
        wait_until(lambda: pigeon.metric("pigeon_smtp_connections") == 0)  # the readiness probe's
        with RawSmtp(pigeon.smtp_port) as client:
            _open_transaction(client)
            client.expect(354, "DATA")
            with RawSmtp(pigeon.smtp_port) as other:  # in a transaction: it may not be evicted
                assert other.reply()[0] == 421
            took, lines = _trickle(client.sock, b"X-Slow: 1\r\n", 0.2, within=6)
            assert lines == [TIMEOUT]
            assert 0.8 < took < 4
        assert _timeout_rejections(pigeon, "DATA") == ["4.4.2"]
        wait_until(lambda: pigeon.metric("pigeon_smtp_connections") == 0)
        with RawSmtp(pigeon.smtp_port) as newcomer:
            newcomer.expect(220)


def test_bdat_chunk_trickled_a_byte_at_a_time_is_cut_with_421(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp=QUICK) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        _open_transaction(client)
        client.send(b"BDAT 100000 LAST\r\n")
        took, lines = _trickle(client.sock, b"x", 0.2, within=6)
        assert lines == [TIMEOUT]
        assert 0.8 < took < 4
        assert _timeout_rejections(pigeon, "BDAT") == ["4.4.2"]


def test_one_byte_bdat_chunks_are_one_slow_message_not_progress(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp=QUICK) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        _open_transaction(client)
        took, lines = _trickle(client.sock, b"BDAT 1\r\nx", 0.2, within=6)
        assert lines[-1] == TIMEOUT
        assert all(line.endswith("octets received") for line in lines[:-1])
        assert 0.8 < took < 4
        assert _timeout_rejections(pigeon, "BDAT") == ["4.4.2"]


def _content(pieces: int) -> list[bytes]:
    line = b"x" * 498 + b"\r\n"
    return [b"Subject: slow but steady\r\n\r\n" + line * 9] + [line * 10] * (pieces - 1)


@pytest.mark.parametrize("verb", ["DATA", "BDAT"])
def test_content_at_least_as_fast_as_min_data_rate_is_taken_however_long_it_takes(tmp_path: Path, verb: str) -> None:
    """About 40 kB/s for 3 s, three times command_timeout, with a minimum of 10 kB/s."""
    pieces = _content(24)
    size = sum(len(piece) for piece in pieces)
    with (
        PigeonProcess(tmp_path / "node", smtp={**QUICK, "min_data_rate": "10KB/s"}) as pigeon,
        RawSmtp(pigeon.smtp_port) as client,
    ):
        _open_transaction(client)
        if verb == "DATA":
            client.expect(354, "DATA")
        else:
            client.send(b"BDAT %d LAST\r\n" % size)
        started = time.monotonic()
        for piece in pieces:
            client.send(piece)
            time.sleep(0.125)
        code, text = client.command(b".") if verb == "DATA" else client.reply()
        assert code == 250 and text[0].startswith("2.0.0 Ok: queued as ")
        assert time.monotonic() - started > 2.5
    assert pigeon.records("Rejection") == []


def test_content_slower_than_min_data_rate_is_cut_with_421(tmp_path: Path) -> None:
    """2.5 kB/s against a minimum of 10 kB/s: each second earns a quarter of a second, so the
    deadline comes about 1.3 s (command_timeout / 0.75) after 354."""
    with (
        PigeonProcess(tmp_path / "node", smtp={**QUICK, "min_data_rate": "10KB/s"}) as pigeon,
        RawSmtp(pigeon.smtp_port) as client,
    ):
        _open_transaction(client)
        client.expect(354, "DATA")
        took, lines = _trickle(client.sock, b"x" * 498 + b"\r\n", 0.2, within=6)
        assert lines == [TIMEOUT]
        assert 1.1 < took < 4
        assert _timeout_rejections(pigeon, "DATA") == ["4.4.2"]
