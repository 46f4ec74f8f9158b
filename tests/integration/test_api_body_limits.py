"""The supervisor of a multi-worker node reads no API body before the headers carry a known
token, and holds only `[http] max_open_requests` bodies at once: anonymous clients sending
64 MiB bodies get 401 at once and cannot grow its memory; authorised requests still work."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until

BIG = 64 * 1024 * 1024
# What a flooding client announces: more than loopback carries in the second the server
# reads a refused body for, on any machine (a fast one carried 40 bodies of 64 MiB in it).
HUGE = 4 * 1024 * 1024 * 1024
_GIVE_UP = 20.0
CHUNK = b"x" * (256 * 1024)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _post_head(port: int, path: str, length: int, token: str | None = None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: pigeon\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {length}\r\n\r\n".encode()
    )
    return sock


def _answer(sock: socket.socket, timeout: float) -> bytes:
    """The answer's status line and headers (what came before `timeout` if it never ended)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def _closed(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes the connection within `timeout` (whatever else it sends)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def _status(request: urllib.request.Request) -> int:
    """The answer's status; 0 for a 503 (so that `wait_until` asks again)."""
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            assert "scheduled" in json.loads(response.read())
            return int(response.status)
    except urllib.error.HTTPError as error:
        return 0 if error.code == 503 else error.code


def _flood(port: int, answers: list[bytes], took: list[float], path: str = "/api/v1/inject") -> None:
    """One anonymous client: a body of `HUGE` announced, sent until the server answers and closes
    (or for `_GIVE_UP` seconds, so that a server that reads it all fails the test rather than
    hanging it); how long the server let it send."""
    started = time.monotonic()
    sock = _post_head(port, path, HUGE)
    total = 0
    try:
        while total < HUGE and time.monotonic() - started < _GIVE_UP:
            sock.sendall(CHUNK)
            total += len(CHUNK)
    except OSError:  # the server closed the connection: what we want
        pass
    took.append(time.monotonic() - started)
    answers.append(_answer(sock, 5))
    sock.close()


def test_anonymous_64_mib_bodies_are_refused_from_their_headers_and_do_not_grow_the_supervisor(
    tmp_path: Path,
) -> None:
    config = {"node": {"workers": 2}, "http": {"max_open_requests": 2}, "delivery": {"enabled": True}}
    with PigeonProcess(tmp_path / "node", **config) as pigeon:
        assert pigeon.process is not None
        supervisor = pigeon.process.pid
        # One anonymous client that sends 1 MiB of its 64 MiB and waits: answered at once.
        started = time.monotonic()
        sock = _post_head(pigeon.http_port, "/api/v1/inject", BIG)
        sock.sendall(CHUNK * 4)
        answer = _answer(sock, 5)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert time.monotonic() - started < 2
        assert _closed(sock, 5)
        sock.close()
        # Forty of them, each trying to send 4 GiB.
        before = _rss_kib(supervisor)
        answers: list[bytes] = []
        took: list[float] = []
        clients = [threading.Thread(target=_flood, args=(pigeon.http_port, answers, took)) for _ in range(40)]
        for client in clients:
            client.start()
        peak = before
        while any(c.is_alive() for c in clients):
            peak = max(peak, _rss_kib(supervisor))
            time.sleep(0.02)
        assert len(answers) == 40 and all(a.startswith(b"HTTP/1.1 401") for a in answers)
        # Refused bodies are read and thrown away for a second at most (so that the client reads
        # its 401 rather than a reset), then the connection is closed: aiohttp's default would
        # read on for 10 s. The margin is for a loaded machine's scheduling of 40 threads.
        assert max(took) < 6, sorted(took)
        grew_mib = (peak - before) / 1024
        print(f"supervisor RSS {before / 1024:.1f} MiB before, {peak / 1024:.1f} MiB at the peak")
        assert grew_mib < 32, f"the supervisor grew {grew_mib:.0f} MiB"

        # Authorised requests: a body in progress each, up to max_open_requests; the next is
        # refused with 503 at once, and those after work once the first are done.
        token = pigeon.local_token
        held = [_post_head(pigeon.http_port, "/api/v1/inject", 1000, token) for _ in range(2)]
        for sock in held:
            sock.sendall(b"{")
        time.sleep(0.5)  # both in the supervisor's hands, reading their bodies
        third = _post_head(pigeon.http_port, "/api/v1/inject", 2, token)
        third.sendall(b"{}")
        refused = _answer(third, 5)
        assert refused.startswith(b"HTTP/1.1 503"), refused[:200]
        assert _closed(third, 5)
        for sock in held:
            sock.close()  # mid-body: the supervisor gives their places back
        request = urllib.request.Request(f"http://127.0.0.1:{pigeon.http_port}/api/v1/queues")
        request.add_header("Authorization", f"Bearer {token}")
        status = wait_until(lambda: _status(request), 5, interval=0.1)
        assert status == 200
        status, answer = pigeon.http_post("/api/v1/inject", {"nonsense": True}, token)
        assert status == 400, answer  # reached a worker, which read the body and said why


def _get_head(port: int, path: str, length: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: pigeon\r\nContent-Length: {length}\r\n\r\n".encode())
    return sock


def test_the_openapi_document_is_open_to_get_only_and_anonymous_clients_take_no_authorised_places(
    tmp_path: Path,
) -> None:
    """GET /api/openapi.json needs no token; any other method there is refused (405, before
    any token is asked for), so 64 MiB bodies sent to it are refused from their headers; bodies
    sent with a GET are not read; and
    anonymous clients holding connections open leave `max_open_requests` to the authorised."""
    config = {"node": {"workers": 2}, "http": {"max_open_requests": 2}}
    with PigeonProcess(tmp_path / "node", **config) as pigeon:
        assert pigeon.process is not None
        supervisor = pigeon.process.pid
        with urllib.request.urlopen(f"http://127.0.0.1:{pigeon.http_port}/api/openapi.json", timeout=10) as document:
            assert document.status == 200 and "openapi" in json.loads(document.read())
        started = time.monotonic()
        sock = _post_head(pigeon.http_port, "/api/openapi.json", BIG)
        sock.sendall(CHUNK * 4)
        answer = _answer(sock, 5)
        assert answer.startswith(b"HTTP/1.1 405"), answer[:200]
        assert b"\r\nAllow: GET,HEAD\r\n" in answer
        assert time.monotonic() - started < 2
        sock.close()
        # A GET with a 64 MiB body: answered without reading it, then the connection closes.
        sock = _get_head(pigeon.http_port, "/api/openapi.json", BIG)
        sock.sendall(CHUNK * 4)
        answer = _answer(sock, 5)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert _closed(sock, 5)
        sock.close()

        before = _rss_kib(supervisor)
        answers: list[bytes] = []
        took: list[float] = []
        clients = [
            threading.Thread(target=_flood, args=(pigeon.http_port, answers, took, "/api/openapi.json"))
            for _ in range(4)
        ]
        for client in clients:
            client.start()
        peak = before
        while any(c.is_alive() for c in clients):
            peak = max(peak, _rss_kib(supervisor))
            time.sleep(0.02)
        assert len(answers) == 4 and all(a.startswith(b"HTTP/1.1 405") for a in answers), answers
        assert max(took) < 6, sorted(took)
        grew_mib = (peak - before) / 1024
        assert grew_mib < 32, f"the supervisor grew {grew_mib:.0f} MiB"

        # 64 anonymous clients, each having sent a byte of its body, keep their connections open.
        slow = [_post_head(pigeon.http_port, "/api/openapi.json", 1_000_000) for _ in range(32)]
        slow += [_get_head(pigeon.http_port, "/api/openapi.json", 1_000_000) for _ in range(32)]
        for sock in slow:
            sock.sendall(b"x")
        time.sleep(0.5)
        status, answer = pigeon.http_post("/api/v1/inject", {"nonsense": True}, pigeon.local_token)
        assert status == 400, answer  # a worker read the body and said why: not 503
        for sock in slow:
            sock.close()
