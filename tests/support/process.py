"""Run Pigeon as a real process for integration tests: its own config, ports and data."""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pigeon.logs.reader import read_records
from tests.support import zygote
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
_STDERR_TAIL = 20_000  # characters of a failed test's node's stderr shown with the failure


def to_toml(config: dict[str, Any]) -> str:
    """Enough TOML for our configs: tables (and arrays of tables, given as lists of dicts)
    of strings, numbers, booleans and lists of those."""
    lines = []
    for section, values in config.items():
        tables = values if isinstance(values, list) else [values]
        header = f"[[{section}]]" if isinstance(values, list) else f"[{section}]"
        for table in tables:
            lines.append(header)
            for key, value in table.items():
                lines.append(f"{key} = {_toml_value(value)}")
            lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table: [{...}] is an array of tables too
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


class PigeonProcess:
    """`pigeon serve` in a subprocess, with a config written under `root`."""

    def __init__(
        self,
        root: Path,
        *,
        source: Path | None = None,
        tables: dict[str, Any] | None = None,
        open_files: int | None = None,
        reserve: str | None = "2MiB",
        **sections: Any,
    ) -> None:
        """`source`: run the Pigeon in this source tree (a checkout's `src`) instead of this one's.
        `tables`: more sections, for names that keyword arguments cannot take (`[[source]]`).
        `open_files`: the node's RLIMIT_NOFILE, soft and hard (it raises the soft one to the hard).
        `reserve`: its spool's `[spool] reserve`, less than the default 32 MiB (a suite starts
        hundreds of nodes); None leaves the key out: the default (benchmarks, older sources)."""
        self.root = root
        self.source = source
        self.open_files = open_files
        root.mkdir(parents=True, exist_ok=True)
        self.smtp_port = free_port()
        self.http_port = free_port()
        config: dict[str, Any] = {
            "node": {"name": "test-node", "workers": 1, "shutdown_timeout": "10s"},
            "smtp": {"listen": [f"127.0.0.1:{self.smtp_port}"], "hostname": "mx.pigeon.test"},
            "http": {"listen": f"127.0.0.1:{self.http_port}"},
            "spool": {"path": "spool"} | ({"reserve": reserve} if reserve is not None else {}),
            "log": {"path": "log", "level": "debug"},
            # Reception tests keep their mail; delivery tests turn this on with routes to
            # their own sinks. Nothing may ask the system resolver: a dead local port.
            "delivery": {"enabled": False},
            "dns": {"nameservers": ["127.0.0.1:9"], "timeout": "1s"},
        }
        for section, values in {**sections, **(tables or {})}.items():
            if isinstance(values, list):
                config[section] = values
            else:
                config.setdefault(section, {}).update(values)
        self.config = config
        self.config_path = root / "pigeon.toml"
        self.config_path.write_text(to_toml(config))
        self.process: subprocess.Popen[bytes] | zygote.ForkedProcess | None = None
        self.stderr_path = root / "stderr.log"
        self._stderr_offset = 0

    # --- life cycle ------------------------------------------------------------------------
    def start(self, *, wait: bool = True) -> PigeonProcess:
        """Start the node (again, once the last run has ended); refused while it runs, since the
        running one would be left behind with no one to stop it."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"pigeon is already running (pid {self.process.pid}): stop it first")
        stderr = open(self.stderr_path, "ab")  # noqa: SIM115 - owned by the child
        self._stderr_offset = stderr.tell()
        args = ["serve", "-c", str(self.config_path)]
        if self.source is None:
            # Forked from a process that has imported Pigeon (tests/support/zygote.py).
            self.process = zygote.spawn(
                args, cwd=self.root, stdout=stderr.fileno(), stderr=stderr.fileno(), open_files=self.open_files
            )
        else:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pigeon", *args],
                cwd=self.root,
                env={**os.environ, "PYTHONPATH": str(self.source)},
                stdout=stderr,
                stderr=stderr,
                start_new_session=True,
                # A test runner killed mid-run (a CI timeout, kill -9) must not leave nodes
                # behind, holding ports and CPU for every later test: they get SIGTERM when it goes.
                preexec_fn=functools.partial(zygote.prepare_child, self.open_files),
            )
        stderr.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"pigeon exited with {self.process.returncode}:\n{self.stderr()}")
            try:
                status, _ = self.http_get("/healthz")
                if status == 200 and self._smtp_accepts():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"pigeon not ready after {timeout}s:\n{self.stderr()}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        """The exit status of a run expected to end by itself (a start that must fail)."""
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"pigeon still running after {timeout}s:\n{self.stderr()}") from None

    def _smtp_accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.smtp_port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit status."""
        process = self.process
        if process is None or process.poll() is not None:
            return process.returncode if process else 0
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """kill -9 the whole process group (the supervisor and its workers), also when the
        supervisor itself is already gone: workers it left behind must not outlive the test."""
        process = self.process
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def __enter__(self) -> PigeonProcess:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is not None and self.process is not None:
            # A test that failed with the node running: what the node said is most of the
            # diagnosis, and CI keeps nothing else (pytest shows this under "Captured stderr").
            print(f"--- the end of pigeon's stderr ({self.stderr_path}) ---", file=sys.stderr)
            print(self.stderr()[-_STDERR_TAIL:], file=sys.stderr)
        try:
            self.stop()
        finally:
            self.kill()

    def cli(self, *args: str) -> str:
        """`pigeon ARGS -c <this node's config>`'s output; it must exit 0."""
        shown = zygote.run([*args, "-c", str(self.config_path)], text=True, cwd=self.root)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        return shown.stdout

    # --- looking at it -----------------------------------------------------------------------
    def stderr(self) -> str:
        """What this run of the process wrote to stderr (earlier runs in the same root excluded)."""
        if not self.stderr_path.exists():
            return ""
        with open(self.stderr_path, "rb") as stream:
            stream.seek(self._stderr_offset)
            return stream.read().decode(errors="replace")

    def wait_stderr(self, text: str, count: int = 1, timeout: float = 10.0) -> str:
        """This run's stderr once `text` is in it `count` times (a line logged by work the node
        does after it is ready, such as the spool's check); fails when time runs out."""
        deadline = time.monotonic() + timeout
        while (found := self.stderr()).count(text) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} {found.count(text)} times in {timeout}s, not {count}:\n{found}")
            time.sleep(0.02)
        return found

    def http_get(self, path: str) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def http_post(self, path: str, body: Any, token: str | None = None, *, raw: bytes | None = None) -> tuple[int, Any]:
        """POST `body` as JSON (or `raw` bytes as they are); returns the status and the decoded JSON answer."""
        return self._request("POST", path, raw if raw is not None else json.dumps(body).encode(), token)

    def http_call(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        """Any API request (`body`, if any, sent as JSON): the status and the decoded JSON answer."""
        return self._request(method, path, None if body is None else json.dumps(body).encode(), token)

    def _request(self, method: str, path: str, data: bytes | None, token: str | None) -> tuple[int, Any]:
        """The status and the answer: decoded JSON, or its text when it is not JSON."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                status, answer = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, answer = error.code, error.read()
        try:
            return status, json.loads(answer)
        except ValueError:
            return status, answer.decode(errors="replace")

    def worker_call(self, index: int, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        """A request to worker `index` alone, over its control socket, as its supervisor makes
        them (with the node's local token): the status and the decoded JSON answer."""
        socket_path = str(self.spool_path / "run" / f"worker-{index}.sock")

        class Control(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(30)
                self.sock.connect(socket_path)

        connection = Control("worker")
        try:
            connection.request(method, path, body, headers={"Authorization": f"Bearer {self.local_token}"})
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    @property
    def local_token(self) -> str:
        return (self.spool_path / "api-token").read_text().strip()

    def metric(self, name: str) -> float:
        """The value of one unlabelled sample in /metrics."""
        _, body = self.http_get("/metrics")
        for line in body.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        records = read_records(self.root / "log")
        return [r for r in records if kind is None or r["type"] == kind]

    def wait_records(self, kind: str, count: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The records of `kind` once there are at least `count` (the event log is written a
        moment after the reply that caused a record); fails when time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.records(kind)
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(found)} {kind} records in {timeout}s, not {count}")
            time.sleep(0.02)

    def wait_record(self, kind: str, match: Callable[[dict[str, Any]], bool], timeout: float = 10.0) -> dict[str, Any]:
        """The last record of `kind` that `match`es, once there is one: a node a module's tests
        share has earlier tests' records, which may be written after a later test's reply."""
        deadline = time.monotonic() + timeout
        while True:
            found = [record for record in self.records(kind) if match(record)]
            if found:
                return found[-1]
            if time.monotonic() > deadline:
                raise AssertionError(f"no matching {kind} record in {timeout}s")
            time.sleep(0.02)

    def spool_messages(self) -> list[dict[str, Any]]:
        """Every message in every spool shard, with its body bytes."""
        for _ in range(20):
            try:
                return list(_spool_rows(self.spool_path))
            except FileNotFoundError:
                # Read from a running node: a segment was emptied and removed between reading
                # a row and opening the file (the row is gone too by now): read again.
                time.sleep(0.05)
        return list(_spool_rows(self.spool_path))

    def shard_owner(self, index: int, timeout: float = 10.0) -> int:
        """Worker `index`'s pid, by the lock of the spool shard it owns (read again while a
        worker starting has emptied it and not yet written its pid)."""
        lock = self.spool_path / f"shard-{index}" / "lock"
        deadline = time.monotonic() + timeout
        while not (text := lock.read_text().strip()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{lock} names no pid in {timeout}s")
            time.sleep(0.01)
        return int(text)

    def shard_owners(self, timeout: float = 10.0) -> list[int]:
        """Worker i's pid, by the lock of the spool shard i it owns. A worker starting writes its
        pid there after emptying the file: an empty one is read again until it names a pid."""
        deadline = time.monotonic() + timeout
        while True:
            texts = [p.read_text().strip() for p in sorted(self.spool_path.glob("shard-*/lock"))]
            if texts and all(texts):
                return [int(text) for text in texts]
            if time.monotonic() > deadline:
                raise AssertionError(f"the shards' locks name no pid in {timeout}s: {texts}")
            time.sleep(0.01)

    @property
    def spool_path(self) -> Path:
        return self.root / self.config["spool"]["path"]  # an absolute path replaces root


def _spool_rows(spool_root: Path) -> Iterator[dict[str, Any]]:
    from pigeon.message import ENVELOPE_DECODER, format_id

    for db in sorted(spool_root.glob("shard-*/spool.db")):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = conn.execute(
                "SELECT m.id, m.queue, m.envelope, b.id, b.data, b.segment, b.at, b.size"
                " FROM message m JOIN body b ON b.id = m.body ORDER BY m.id"
            ).fetchall()
        finally:
            conn.close()
        for spool_id, queue, envelope, body_id, data, segment, at, size in rows:
            if data is None and segment is not None:
                with open(db.parent / "segments" / format_id(segment), "rb") as file:
                    data = os.pread(file.fileno(), size, at)
            elif data is None:
                data = (db.parent / "data" / format_id(body_id)).read_bytes()
            decoded = ENVELOPE_DECODER.decode(envelope)
            yield {
                "id": format_id(spool_id),
                "body_id": format_id(body_id),
                "queue": queue,
                "sender": decoded.sender,
                "recipients": [r.address for r in decoded.recipients],
                "envelope": decoded,
                "data": bytes(data),
            }
