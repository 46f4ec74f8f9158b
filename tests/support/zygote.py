"""Start `pigeon` processes for tests by forking one that has already imported Pigeon.

A node's start is mostly imports: a third of a CPU second of them (aiohttp, dnspython, Pigeon's
own modules), paid again by every node and every CLI command a test runs, and the suite runs
thousands. So each pytest process keeps one zygote: a child that imports what `pigeon serve`
imports, then forks a copy of itself for each process a test asks for. The copy becomes what
`python -m pigeon ARGS` would be (its own session, working directory, environment, standard
streams, `pigeon.__main__` run as `__main__`) and ends as an interpreter does, atexit handlers
and all. What such a start does not go through (the interpreter's own start, `-m`'s path
handling, the imports themselves) is what the tests that run a node from another source tree
(`PigeonProcess(source=...)`) and the packaging tests still start the usual way.

The zygote is the forks' parent, so it reaps them and reports each exit (status and CPU) to the
test's process: `ForkedProcess` answers as much of `subprocess.Popen` as the tests use.

Run as a script, this module is the zygote; imported, it is the client (`spawn`, `run`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

_PR_SET_PDEATHSIG = 1
# What must be the same in a request's environment as in the zygote's for a fork to be what an
# exec would be: these act while the interpreter starts and imports, which a fork has done.
_AT_START = ("PYTHON", "PIGEON_PURE_PYTHON")
_MESSAGE = 1 << 20  # bytes: a request (its environment) fits


# --- the zygote ----------------------------------------------------------------------------------
def _zygote(channel: socket.socket) -> None:
    """Fork a process per request; report each one's exit. Runs until the client is gone."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        readable, _, _ = select.select([channel, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _report_exits(channel)
        if channel in readable:
            data, fds, _, _ = socket.recv_fds(channel, _MESSAGE, 3)
            if not data:
                return  # the test's process has gone: its children get SIGTERM with us
            request = json.loads(data)
            pid = os.fork()
            if pid == 0:
                # Becomes the process asked for, and never comes back here: its SystemExit
                # ends this interpreter as `python -m pigeon` would end.
                channel.close()
                _become(request, fds, zygote=os.getppid())
                return
            for fd in fds:
                os.close(fd)
            channel.sendall(json.dumps({"spawned": pid}).encode())


def _report_exits(channel: socket.socket) -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        channel.sendall(json.dumps({"exited": pid, "code": code, "cpu": usage.ru_utime + usage.ru_stime}).encode())


def _become(request: dict[str, Any], fds: list[int], zygote: int) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    prepare_child(request["open_files"])
    if os.getppid() != zygote:
        os._exit(70)  # the zygote died before the line above: nobody would stop this one
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["pigeon", *request["args"]]
    import runpy

    runpy.run_module("pigeon", run_name="__main__", alter_sys=True)


def _warm() -> None:
    """Import what `pigeon serve` imports before it starts a worker or a supervisor."""
    import pigeon.cli.main
    import pigeon.cli.serve

    for command in set(pigeon.cli.main.COMMANDS.values()):
        __import__(f"pigeon.cli.{command}")
    import pigeon.listener.passwords
    import pigeon.node.node
    import pigeon.node.supervisor
    import pigeon.policy.hooks
    import pigeon.spool.spool


# --- the client ----------------------------------------------------------------------------------
class ZygoteGone(Exception):
    """The zygote stopped answering; processes are started the usual way from then on."""


class _Client:
    def __init__(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.environment = {k: v for k, v in os.environ.items() if k.startswith(_AT_START)}
        self.process = subprocess.Popen(
            [sys.executable, __file__],
            pass_fds=[child.fileno()],
            env={**os.environ, "PIGEON_ZYGOTE_FD": str(child.fileno())},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            preexec_fn=prepare_child,
        )
        child.close()
        self.channel = parent
        self.lock = threading.Lock()
        self.exits: dict[int, tuple[int, float]] = {}
        self.cpu = 0.0  # seconds: of every process reaped so far
        self.pid = self.process.pid

    def fits(self, env: Mapping[str, str]) -> bool:
        return {k: v for k, v in env.items() if k.startswith(_AT_START)} == self.environment

    def spawn(
        self, args: Sequence[str], cwd: str, env: Mapping[str, str], fds: Sequence[int], open_files: int | None
    ) -> int:
        request = {"args": list(args), "cwd": cwd, "env": dict(env), "open_files": open_files}
        with self.lock:
            try:
                socket.send_fds(self.channel, [json.dumps(request).encode()], list(fds))
                while True:
                    message = self._receive(None)
                    if "spawned" in message:
                        return int(message["spawned"])
            except OSError as error:
                raise ZygoteGone(str(error)) from error

    def exit_of(self, pid: int, timeout: float | None) -> tuple[int, float] | None:
        """The process's exit code and CPU once it has exited (waiting up to `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.lock:
                if pid in self.exits:
                    return self.exits[pid]
                # (Read what came at least once, timeout 0 too: a poll() that only looked at
                # what was read before never saw a node exit, and waited for it to be ready.)
                remaining = 0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic()))
                try:
                    self._drain(remaining)
                except OSError:
                    return _exit_without_zygote(pid)
                if pid in self.exits:
                    return self.exits[pid]
                if deadline is not None and time.monotonic() >= deadline:
                    return None

    def _drain(self, timeout: float) -> None:
        """Take in the exits reported, waiting up to `timeout` for the first."""
        while self._receive(timeout):
            timeout = 0

    def _receive(self, timeout: float | None) -> dict[str, Any]:
        readable, _, _ = select.select([self.channel], [], [], timeout)
        if not readable:
            return {}
        data = self.channel.recv(_MESSAGE)
        if not data:
            raise ConnectionResetError("the zygote has gone")
        message: dict[str, Any] = json.loads(data)
        if "exited" in message:
            self.exits[message["exited"]] = (message["code"], message["cpu"])
            self.cpu += message["cpu"]
        return message


def _exit_without_zygote(pid: int) -> tuple[int, float] | None:
    """A fork whose zygote has died got SIGTERM with it (and belongs to init now)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return -signal.SIGTERM, 0.0
    return None


def prepare_child(open_files: int | None = None) -> None:
    """In a child being made (before its exec, or as a fork becomes `pigeon`): SIGTERM when the
    process (thread) that made it dies, so that a test runner killed mid-run (a CI timeout,
    kill -9) leaves no node behind holding ports and CPU; and its open files limit, if given."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if open_files is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))


_client: _Client | None = None
_broken = False


def _zygote_for(env: Mapping[str, str]) -> _Client | None:
    """This process's zygote, started on first use; None where a fork would not be an exec."""
    global _client, _broken
    if _broken or os.environ.get("PIGEON_TEST_NO_ZYGOTE"):
        return None
    if _client is None:
        # Its death signal follows the thread that starts it: only the main one lives long enough.
        if threading.current_thread() is not threading.main_thread():
            return None
        _client = _Client()
    if _client.process.poll() is not None:
        _broken = True
        return None
    return _client if _client.fits(env) else None


def reaped_cpu() -> float:
    """CPU seconds of the processes the zygote has reaped (they are not this process's children)."""
    return _client.cpu if _client is not None else 0.0


class ForkedProcess:
    """As much of `subprocess.Popen` as the tests use, for a process the zygote forked."""

    def __init__(self, client: _Client, pid: int, args: Sequence[str]) -> None:
        self._client = client
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and (found := self._client.exit_of(self.pid, 0)) is not None:
            self.returncode = found[0]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            found = self._client.exit_of(self.pid, timeout)
            if found is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self.returncode = found[0]
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(
    args: Sequence[str], *, cwd: os.PathLike[str] | str, stdout: int, stderr: int, open_files: int | None = None
) -> ForkedProcess | subprocess.Popen[bytes]:
    """`python -m pigeon ARGS` in a new session in `cwd`, its output to the files open at
    `stdout` and `stderr`, stdin /dev/null, SIGTERM when this thread ends: forked from the
    zygote where one can be, started the usual way where not."""
    env = dict(os.environ)
    client = _zygote_for(env)
    if client is not None:
        with open(os.devnull, "rb") as null:
            try:
                pid = client.spawn(args, os.fspath(cwd), env, [null.fileno(), stdout, stderr], open_files)
            except ZygoteGone:
                global _broken
                _broken = True
            else:
                return ForkedProcess(client, pid, args)
    return subprocess.Popen(
        [sys.executable, "-m", "pigeon", *args],
        cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True,
        preexec_fn=functools.partial(prepare_child, open_files),
    )  # fmt: skip


def run(
    args: Sequence[str],
    *,
    input: str | bytes | None = None,
    text: bool = False,
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    cwd: os.PathLike[str] | str | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run([sys.executable, "-m", "pigeon", *args], capture_output=True, ...)`,
    forked from the zygote where one can be: its output captured, `input` on its stdin."""
    import tempfile

    environment = dict(os.environ if env is None else env)
    client = _zygote_for(environment)
    if client is None:
        return subprocess.run(
            [sys.executable, "-m", "pigeon", *args], input=input, capture_output=True, text=text,
            timeout=timeout, env=env, cwd=cwd, check=check,
        )  # fmt: skip
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        if input is not None:
            stdin.write(input.encode() if isinstance(input, str) else input)
            stdin.seek(0)
        # With no input, the command reads what the test's own stdin is, as subprocess.run has it.
        fds = [stdin.fileno() if input is not None else 0, stdout.fileno(), stderr.fileno()]
        pid = client.spawn(args, os.fspath(cwd or os.getcwd()), environment, fds, None)
        process = ForkedProcess(client, pid, args)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pid, signal.SIGKILL)
            process.wait()
            raise
        outputs: list[Any] = []
        for file in (stdout, stderr):
            file.seek(0)
            data = file.read()
            # (text=True decodes strictly and reads universal newlines, as subprocess.run does)
            outputs.append(data.decode().replace("\r\n", "\n").replace("\r", "\n") if text else data)
    done = subprocess.CompletedProcess([sys.executable, "-m", "pigeon", *args], code, outputs[0], outputs[1])
    if check:
        done.check_returncode()
    return done


if __name__ == "__main__":
    del sys.path[0]  # this file's directory: the forks' import path is `python -m pigeon`'s
    _channel = socket.socket(fileno=int(os.environ.pop("PIGEON_ZYGOTE_FD")))
    _warm()
    _zygote(_channel)
