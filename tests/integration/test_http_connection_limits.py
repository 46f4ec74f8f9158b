"""The HTTP listener's bounds on its connections (`pigeon.listener.http.connections`): a request's
headers within `header_timeout`, its body at `min_body_rate` beyond `body_timeout`, a silent
keep-alive connection closed after `keepalive_timeout`, at most `max_connections` open, and SMTP
taking and delivering mail while idle HTTP clients hold as many connections as they may."""

from __future__ import annotations

import json
import select
import smtplib
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

TOKEN = "inject-token-0123456789"
TOKENS = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _read_to_the_end(sock: socket.socket, within: float = 10.0) -> bytes:
    """Everything the node sends until it closes the connection."""
    sock.settimeout(within)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def _closed(sock: socket.socket) -> bool:
    """Closed by the node (without anything more to read)?"""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


def _dribble(sock: socket.socket, data: bytes, interval: float) -> float:
    """Send `data` a byte every `interval` seconds until the node answers or closes; returns
    how long that took."""
    started = time.monotonic()
    for byte in data:
        readable, _, _ = select.select([sock], [], [], interval)
        if readable:
            break
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            break
    select.select([sock], [], [], 10)
    return time.monotonic() - started


def _status_and_error(answer: bytes) -> tuple[int, str]:
    """The status and `error` of a refusal the listener answers on its own: in the API's one
    error shape, `field` there and null (no one part of the request is at fault), which a
    client reading every error the same way relies on."""
    head, _, body = answer.partition(b"\r\n\r\n")
    refusal = json.loads(body)
    assert set(refusal) == {"error", "field"} and refusal["field"] is None, refusal
    return int(head.split()[1]), refusal["error"]


def _get(port: int, path: str = "/healthz") -> bytes:
    with closing(_connect(port)) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: pigeon\r\nConnection: close\r\n\r\n".encode())
        return _read_to_the_end(sock)


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(tmp_path: Path) -> None:
    with (
        PigeonProcess(tmp_path / "node", http={"header_timeout": "1s"}) as pigeon,
        closing(_connect(pigeon.http_port)) as sock,
    ):
        started = time.monotonic()
        assert _read_to_the_end(sock) == b""
        assert 0.8 < time.monotonic() - started < 3


def test_headers_dribbled_a_byte_at_a_time_get_408_after_the_header_timeout(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", http={"header_timeout": "1s"}) as pigeon:
        with closing(_connect(pigeon.http_port)) as sock:
            took = _dribble(sock, b"GET /healthz HTTP/1.1\r\nHost: slowloris.test\r\nX-Pad: " + b"x" * 100, 0.1)
            status, error = _status_and_error(_read_to_the_end(sock))
        assert status == 408
        assert "[http] header_timeout (1s)" in error
        assert 0.8 < took < 3


def test_the_supervisor_s_listener_cuts_dribbled_headers_too(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": 2}, http={"header_timeout": "1s"}) as pigeon:
        with closing(_connect(pigeon.http_port)) as sock:
            took = _dribble(sock, b"GET /healthz HTTP/1.1\r\nHost: slowloris.test\r\nX-Pad: " + b"x" * 100, 0.1)
            assert _status_and_error(_read_to_the_end(sock))[0] == 408
        assert took < 3


def test_a_keep_alive_connection_silent_after_its_answer_is_closed_after_the_keepalive_timeout(
    tmp_path: Path,
) -> None:
    """A connection that has had an answer waits `keepalive_timeout` (2 s) for its next request,
    not `header_timeout` (1 s), and a request within it is answered."""
    http = {"header_timeout": "1s", "keepalive_timeout": "2s"}
    with PigeonProcess(tmp_path / "node", http=http) as pigeon, closing(_connect(pigeon.http_port)) as sock:
        request = b"GET /healthz HTTP/1.1\r\nHost: pigeon\r\n\r\n"
        for _ in range(2):
            sock.sendall(request)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(1.5)
        started = time.monotonic()
        assert _read_to_the_end(sock) == b""
        assert time.monotonic() - started < 1.5  # closed 2 s after the last answer


def _inject_head(length: int) -> bytes:
    return (
        f"POST /api/v1/inject HTTP/1.1\r\nHost: pigeon\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _injection(padding: int) -> bytes:
    request = {
        "envelope_sender": "app@example.org",
        "recipients": [{"email": "ann@example.net"}],
        "content": "From: a@example.org\r\nSubject: paced\r\n\r\n" + "x" * padding + "\r\n",
        "template": False,
    }
    return json.dumps(request).encode()


def test_a_body_slower_than_min_body_rate_gets_408_and_one_as_fast_is_taken(tmp_path: Path) -> None:
    """`body_timeout` 1 s, `min_body_rate` 100 B/s: a body at 50 B/s is cut about 2 s after its
    headers (1 s, plus half a second for each second of it), one of 300 bytes at 200 B/s is
    taken whole though it takes longer than `body_timeout`."""
    http = {"token": TOKENS, "body_timeout": "1s", "min_body_rate": "100B/s"}
    with PigeonProcess(tmp_path / "node", http=http) as pigeon:
        with closing(_connect(pigeon.http_port)) as sock:
            body = _injection(1000)
            sock.sendall(_inject_head(len(body)))
            took = _dribble(sock, body, 0.02)
            status, error = _status_and_error(_read_to_the_end(sock))
        assert status == 408
        assert "[http] min_body_rate (100 bytes a second) beyond [http] body_timeout (1s)" in error
        assert 1.5 < took < 4
        with closing(_connect(pigeon.http_port)) as sock:
            body = _injection(300 - len(_injection(0)))
            sock.sendall(_inject_head(len(body)))
            started = time.monotonic()
            for start in range(0, len(body), 10):
                sock.sendall(body[start : start + 10])
                time.sleep(0.05)
            assert time.monotonic() - started > 1.4
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert len(pigeon.spool_messages()) == 1
        # The handler whose read the 408 cut short has no error of its own to log.
        assert "Error handling request" not in pigeon.stderr()


def test_past_max_connections_a_newcomer_takes_the_place_of_the_connection_idle_longest(tmp_path: Path) -> None:
    http = {"max_connections": 3, "header_timeout": "60s"}  # none closed for its silence meanwhile
    with PigeonProcess(tmp_path / "node", http=http) as pigeon, ExitStack() as stack:
        idle = []
        for _ in range(3):
            idle.append(stack.enter_context(closing(_connect(pigeon.http_port))))
            time.sleep(0.1)  # in this order at the node too
        assert _get(pigeon.http_port).startswith(b"HTTP/1.1 200")
        wait_until(lambda: _closed(idle[0]), timeout=3)
        assert not _closed(idle[1]) and not _closed(idle[2])


def test_past_max_connections_with_none_idle_a_newcomer_gets_503(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", http={"max_connections": 2}) as pigeon, ExitStack() as stack:
        for _ in range(2):  # each halfway through its headers: not idle
            busy = stack.enter_context(closing(_connect(pigeon.http_port)))
            busy.sendall(b"GET /healthz HTTP/1.1\r\n")
        time.sleep(0.2)
        status, error = _status_and_error(_get(pigeon.http_port))
        assert status == 503
        assert error == "2 connections open ([http] max_connections), none of them idle: try again shortly"
        pigeon.wait_stderr("newcomers refused (503)")


def _idle_http_connections(port: int, count: int) -> Iterator[socket.socket]:
    for _ in range(count):
        try:
            yield _connect(port)
        except OSError:
            return


def test_smtp_takes_and_delivers_mail_while_idle_http_connections_take_all_they_may(tmp_path: Path) -> None:
    """With an open files limit of 500 (the node keeps to 30 HTTP connections and 214 SMTP ones,
    and says so), 600 idle HTTP connections leave SMTP, the spool (a 300 KB body is a file of
    its own) and delivery working, and /healthz answered."""
    with (
        ScriptedSink() as sink,
        PigeonProcess(tmp_path / "node", open_files=500, **delivery_config(sink.endpoint)) as pigeon,
        ExitStack() as stack,
    ):
        assert "this process keeps to 214 SMTP and 30 HTTP connections" in pigeon.stderr()
        idle = [stack.enter_context(closing(sock)) for sock in _idle_http_connections(pigeon.http_port, 600)]
        assert len(idle) == 600
        time.sleep(0.5)
        for size in (1000, 300_000):
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
                data = b"From: a@example.org\r\nSubject: fd\r\n\r\n" + (b"x" * 98 + b"\r\n") * (size // 100)
                assert client.sendmail("a@example.org", [f"r{size}@example.net"], data) == {}
        assert sorted(r.recipients[0] for r in sink.wait_for(2)) == ["r1000@example.net", "r300000@example.net"]
        assert _get(pigeon.http_port).startswith(b"HTTP/1.1 200")
        assert "Too many open files" not in pigeon.stderr()


def test_a_client_that_reads_none_of_its_answers_is_cut_off_after_the_body_timeout(tmp_path: Path) -> None:
    """A hundred requests for the OpenAPI document (140 KB each) sent at once, none of the
    answers read: once the socket's buffers are full, the connection is closed `body_timeout`
    later rather than held for ever."""
    with PigeonProcess(tmp_path / "node", http={"body_timeout": "1s"}) as pigeon, closing(socket.socket()) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", pigeon.http_port))
        sock.sendall(b"GET /api/openapi.json HTTP/1.1\r\nHost: pigeon\r\n\r\n" * 100)
        pigeon.wait_stderr("closing a connection: its answer unread for [http] body_timeout", timeout=5)
        answers = _read_to_the_end(sock).count(b"HTTP/1.1 200")
        assert 0 < answers < 100
