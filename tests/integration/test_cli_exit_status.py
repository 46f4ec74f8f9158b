"""What `pigeon inject` and `pigeon top` exit with, and say, when things go wrong: a script
or an MTA calling them decides from the status alone whether to retry, fix or give up."""

from __future__ import annotations

import http.server
import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.test_cli import pigeon_cli
from tests.support.ports import free_port
from tests.support.process import PigeonProcess, to_toml

APP_TOKEN = "app-token-0123456789abcdef"
READER_TOKEN = "reader-token-0123456789abcdef"
TOKENS = {
    "token": [
        {"name": "app", "token": APP_TOKEN, "scopes": ["inject"]},
        {"name": "reader", "token": READER_TOKEN, "scopes": ["read"]},
    ]
}


def _inject(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return pigeon_cli("inject", "-c", str(config), "--from", "me@example.org", *args, "--text", "hi {{ code }}",
                      "--var", "code=1")  # fmt: skip


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PigeonProcess]:
    with PigeonProcess(tmp_path_factory.mktemp("node"), http=TOKENS) as pigeon:
        yield pigeon


def test_inject_every_recipient_accepted_exits_0(node: PigeonProcess) -> None:
    result = _inject(node.config_path, "--token", APP_TOKEN, "--to", "a@example.net", "--to", "b@example.net")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2


def test_inject_recipient_refused_for_good_exits_1(node: PigeonProcess) -> None:
    result = pigeon_cli("inject", "-c", str(node.config_path), "--token", APP_TOKEN, "--from", "me@example.org",
                        "--to", "a@example.net", "--text", "Your code: {{ missing }}")  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "refused: 554 5.6.0" in result.stdout


def test_inject_usage_and_input_errors_exit_2(node: PigeonProcess, tmp_path: Path) -> None:
    missing = _inject(node.config_path, "--token", APP_TOKEN, "--to", "a@example.net", "--attach", str(tmp_path / "no"))
    assert missing.returncode == 2 and "No such file" in missing.stderr
    malformed = _inject(node.config_path, "--token", APP_TOKEN, "--to", "not an address")
    assert malformed.returncode == 2 and "recipients[0].email" in malformed.stderr
    no_scheme = _inject(node.config_path, "--url", f"127.0.0.1:{node.http_port}", "--to", "a@example.net")
    assert no_scheme.returncode == 2 and "give http://HOST:PORT" in no_scheme.stderr
    assert "Traceback" not in no_scheme.stderr


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999", "http://127.0.0.1:port", "http://:8025"])
@pytest.mark.parametrize("command", ["inject", "queue"])
def test_a_malformed_url_is_a_usage_error_exit_2_for_every_command(node: PigeonProcess, url: str, command: str) -> None:
    # Exit 75 would have a calling MTA retry for ever, and 1 would say some mail was taken.
    args = ("--to", "a@example.net") if command == "inject" else ("summary",)
    if command == "inject":
        result = _inject(node.config_path, "--url", url, *args)
    else:
        result = pigeon_cli("queue", "summary", "-c", str(node.config_path), "--url", url)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "give http://HOST:PORT" in result.stderr and "Traceback" not in result.stderr


def test_inject_over_https_to_the_plain_http_listener_exits_2_saying_so(node: PigeonProcess) -> None:
    result = _inject(node.config_path, "--url", f"https://127.0.0.1:{node.http_port}", "--to", "a@example.net")
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "TLS with https://127.0.0.1" in result.stderr and "give http://HOST:PORT" in result.stderr


def test_inject_with_an_unknown_token_exits_77_ex_noperm(node: PigeonProcess) -> None:
    result = _inject(node.config_path, "--token", "x" * 24, "--to", "a@example.net")
    assert result.returncode == 77
    assert "401: unknown token" in result.stderr


def test_inject_with_a_token_lacking_the_inject_scope_exits_77_ex_noperm(node: PigeonProcess) -> None:
    result = _inject(node.config_path, "--token", READER_TOKEN, "--to", "a@example.net")
    assert result.returncode == 77
    assert "403: token 'reader' lacks the 'inject' scope" in result.stderr


def test_inject_to_a_node_that_cannot_be_reached_exits_75_ex_tempfail(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = pigeon_cli("inject", "--url", url, "--token", APP_TOKEN, "--from", "me@example.org",
                        "--to", "a@example.net", "--text", "hi")  # fmt: skip
    assert result.returncode == 75
    assert f"pigeon: cannot reach {url}" in result.stderr and "Traceback" not in result.stderr


@contextmanager
def _answering(status: int, body: bytes) -> Iterator[str]:
    """A stand-in node on loopback that answers every request with `status` and `body`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (503, b'{"error": "no worker is ready"}'),  # a supervisor between workers: no per-recipient answer
        (429, b'{"error": "too many requests"}'),
        (502, b"<html>bad gateway</html>"),  # a proxy in front of the node
    ],
)
def test_inject_answered_busy_or_failing_exits_75_ex_tempfail(status: int, body: bytes) -> None:
    with _answering(status, body) as url:
        result = pigeon_cli("inject", "--url", url, "--token", APP_TOKEN, "--from", "me@example.org",
                            "--to", "a@example.net", "--text", "hi")  # fmt: skip
    assert result.returncode == 75, result.stderr
    assert f"pigeon: {status}:" in result.stderr


def test_top_of_a_node_that_cannot_be_reached_exits_3_saying_where_it_looked() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = pigeon_cli("top", "--url", url, "--once")
    assert result.returncode == 3
    assert result.stderr.startswith(f"pigeon: cannot reach {url}: ")
    assert "is `pigeon serve` running?" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def _frames(command: list[str], stdout: int, wait_for: bytes, read_fd: int | None = None) -> bytes:
    """What `pigeon top` wrote to `stdout` once `wait_for` showed twice, or 20 s passed."""
    process = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE)
    fd = read_fd if read_fd is not None else process.stdout.fileno()  # type: ignore[union-attr]
    seen = b""
    deadline = time.monotonic() + 20
    try:
        while seen.count(wait_for) < 2 and time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the pty's other end closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        process.terminate()
        process.wait(10)
    return seen


def test_top_on_a_pipe_writes_frames_without_terminal_escape_codes(node: PigeonProcess) -> None:
    command = [sys.executable, "-m", "pigeon", "top", "-c", str(node.config_path), "--interval", "0.2"]
    output = _frames(command, subprocess.PIPE, b"pigeon top  http://")
    assert output.count(b"pigeon top  http://") >= 2, output
    assert b"\x1b" not in output


def test_top_on_a_terminal_refreshes_the_frame_in_place(node: PigeonProcess) -> None:
    controller, terminal = pty.openpty()
    command = [sys.executable, "-m", "pigeon", "top", "-c", str(node.config_path), "--interval", "0.2"]
    try:
        output = _frames(command, terminal, b"pigeon top  http://", read_fd=controller)
    finally:
        os.close(terminal)
        os.close(controller)
    assert b"\x1b[H\x1b[2Jpigeon top  http://" in output


@pytest.mark.parametrize(
    "breakage",
    [
        {"spool": {"colour": "red"}},  # a key misspelt
        {"smtp": {"tls_certificate": "gone.pem", "tls_private_key": "gone.key"}},  # files moved away
    ],
)
def test_a_config_file_broken_while_the_node_runs_still_lets_the_operator_look(
    tmp_path: Path, breakage: dict[str, dict[str, str]]
) -> None:
    """The node runs on the last configuration that loaded; the file on disk no longer does.
    `pigeon logs`, `pigeon queue` and `pigeon top` still reach it, with the keys they need
    taken from the file and a warning naming what is wrong, rather than exit 2; a command
    that checks the whole file (`pigeon shaping check FILE`) still refuses it."""
    with PigeonProcess(tmp_path / "node") as pigeon:
        pigeon.wait_records("Reception", 0)
        broken = json.loads(json.dumps(pigeon.config))
        for section, values in breakage.items():
            broken.setdefault(section, {}).update(values)
        pigeon.config_path.write_text(to_toml(broken))
        config = str(pigeon.config_path)
        for command in (["logs"], ["queue", "summary"], ["top", "--once"]):
            result = pigeon_cli(*command, "-c", config)
            assert result.returncode == 0, (command, result.stderr)
            warning = result.stderr.splitlines()[0]
            assert warning.startswith("pigeon: warning: configuration error: "), result.stderr
            assert next(iter(breakage["spool" if "spool" in breakage else "smtp"])) in warning
        refused = pigeon_cli("shaping", "check", config)
        assert refused.returncode != 0 and "problem" in refused.stderr, refused.stderr


def test_after_the_http_address_was_edited_and_reloaded_the_cli_still_finds_the_node(tmp_path: Path) -> None:
    """`[http] listen` changed and reloaded takes effect at the next restart: until then the
    node listens where it started (the spool's http-address), and the `pigeon` command, reading
    the edited file, asks there, rather than exit 3 calling a running node unreachable. Once
    that node is gone, the configured address is asked, after a note."""
    with PigeonProcess(tmp_path / "node") as pigeon:
        edited = json.loads(json.dumps(pigeon.config))
        elsewhere = f"127.0.0.1:{free_port()}"
        edited["http"]["listen"] = elsewhere
        pigeon.config_path.write_text(to_toml(edited))
        assert pigeon.process is not None
        pigeon.process.send_signal(signal.SIGHUP)
        pigeon.wait_stderr("[http] listen changed; it takes effect at the next restart")
        result = pigeon_cli("queue", "summary", "-c", str(pigeon.config_path))
        assert (result.returncode, result.stderr) == (0, "")
        given = pigeon_cli("queue", "summary", "--url", f"http://{elsewhere}")  # asked for there: only there
        assert given.returncode == 3 and "is `pigeon serve` running?" in given.stderr
    gone = pigeon_cli("queue", "summary", "-c", str(pigeon.config_path))
    assert gone.returncode == 3
    assert gone.stderr.startswith(
        f"pigeon: note: http://127.0.0.1:{pigeon.http_port}, where the node on this spool listened when it started "
        f"(its http-address), cannot be reached ([Errno 111] Connection refused): asking http://{elsewhere} "
        "([http] listen)\n"
        f"pigeon: cannot reach http://{elsewhere}: [Errno 111] Connection refused (is `pigeon serve` running?)"
    ), gone.stderr
