"""Under systemd (Type=notify), the main process says READY=1 once mail is taken, STOPPING=1 on the way down."""

from __future__ import annotations

import secrets
import smtplib
import socket
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess


def _datagrams(receiver: socket.socket, timeout: float) -> list[str]:
    """Every datagram until none comes for `timeout` seconds."""
    found = []
    receiver.settimeout(timeout)
    while True:
        try:
            found.append(receiver.recv(4096).decode())
        except TimeoutError:
            return found


@pytest.mark.parametrize("workers", [1, 2])
def test_ready_is_sent_once_smtp_answers_and_stopping_when_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        if workers == 1:  # an abstract name, as systemd may give
            name = f"pigeon-test-{secrets.token_hex(4)}"
            receiver.bind("\0" + name)
            monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        else:
            receiver.bind(str(tmp_path / "notify"))
            monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
        pigeon = PigeonProcess(tmp_path / "node", node={"workers": workers}).start(wait=False)
        try:
            receiver.settimeout(30)
            ready = receiver.recv(4096).decode()
            assert ready.splitlines()[0] == "READY=1"
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:  # ready means ready
                assert client.noop()[0] == 250
            assert pigeon.http_get("/healthz")[0] == 200
            assert pigeon.stop() == 0
        finally:
            pigeon.kill()
        # The workers say nothing: READY is the main process's to say, and systemd ignores them.
        assert _datagrams(receiver, 0.5) == ["STOPPING=1"]
