"""What a webhook that cannot be reached is said to have done, in the records and replies an
operator reads: where Pigeon could not connect, and why, in plain words (not aiohttp's
"ssl:default" for a plain http URL, nor the address twice; not the repr of what aiohttp parsed of
an answer cut off)."""

from __future__ import annotations

import contextlib
import smtplib
import socket
import threading
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.process import PigeonProcess


def test_a_webhook_nobody_listens_at_is_said_to_refuse_the_connection_in_plain_words(tmp_path: Path) -> None:
    dead = free_port()
    url = f"http://127.0.0.1:{dead}/json"
    node = PigeonProcess(
        tmp_path / "p",
        delivery={"enabled": True, "retry_interval": "1s"},
        target=[{"name": "hook", "kind": "webhook", "url": url}],
        inbound=[{"recipient": "support@app.example", "target": "hook"}],
    )
    with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
        client.sendmail("customer@example.com", ["support@app.example"], b"Subject: x\r\n\r\nhello\r\n")
        (failure, *_) = node.wait_records("TransientFailure", 1, timeout=20)
    text = failure["response"]["text"]
    assert text == f"hook: {url}: cannot connect to 127.0.0.1:{dead}: Connection refused", text


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        # The start of a status line, then the server hangs up: what aiohttp parsed of it was
        # said as its repr (`<RawResponseMessage(version=HttpVersion(major=1, ...)>`).
        (b"HTTP/1.1 2", 'bad HTTP response: cut off after "HTTP/1.1 2"'),
        # A status line aiohttp refuses: said on four lines, with a caret under it and the URL again.
        (
            b"HTTP/1.1 2000 OK\r\n\r\n",
            "bad HTTP response: Bad status line: Invalid response status: b'HTTP/1.1 2000 OK'",
        ),
    ],
    ids=["cut-off", "bad-status"],
)
def test_a_webhook_that_answers_a_broken_status_line_is_said_in_plain_words(
    tmp_path: Path, answer: bytes, said: str
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/inbound"
        threading.Thread(target=_cut_off, args=(listener, answer), daemon=True).start()
        node = PigeonProcess(
            tmp_path / "p",
            delivery={"enabled": True, "retry_interval": "1s"},
            target=[{"name": "hook", "kind": "webhook", "url": url}],
            inbound=[{"recipient": "support@app.example", "target": "hook"}],
        )
        with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as client:
            client.sendmail("customer@example.com", ["support@app.example"], b"Subject: x\r\n\r\nhello\r\n")
            (failure, *_) = node.wait_records("TransientFailure", 1, timeout=20)
    text = failure["response"]["text"]
    assert text == f"hook: {url}: {said}", text


def _cut_off(listener: socket.socket, answer: bytes) -> None:
    """Answer each request with `answer`, then close (once the request's head has come)."""
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return  # the test is over
        with connection:
            connection.settimeout(5)
            request = b""
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in request and (chunk := connection.recv(65536)):
                    request += chunk
                connection.sendall(answer)
