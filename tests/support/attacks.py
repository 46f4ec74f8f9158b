"""Hostile clients for resource-exhaustion tests and `bench/exhaustion.py`, and the one figure
they are judged by: the resident memory (VmRSS) of Pigeon's worker processes.

Attackers and the well-behaved client run on one asyncio loop in the test process, so the
well-behaved client's transaction happens *while* the attack holds its connections. Every
address is on loopback; the attackers and the well-behaved client may use different source
addresses in 127.0.0.0/8 (Linux routes the whole block to `lo`) so a per-client limit can
tell them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.process import PigeonProcess

GOOD_CLIENT: str = "127.0.0.2"
"""Source address of the well-behaved client (attackers use 127.0.0.1 or others)."""


# --- memory -----------------------------------------------------------------------------------
def worker_pids(pigeon: PigeonProcess) -> list[int]:
    """The processes that serve SMTP: the workers under a supervisor, else the node itself."""
    assert pigeon.process is not None
    pid = pigeon.process.pid
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return children or [pid]


def rss_kib(pid: int) -> int:
    """VmRSS of one process, in KiB (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def worker_rss_mib(pigeon: PigeonProcess) -> float:
    """The largest worker's RSS in MiB (a case loads one worker; the biggest is the one to watch)."""
    return max(rss_kib(pid) for pid in worker_pids(pigeon)) / 1024


class RssPeak:
    """Samples the workers' RSS every 20 ms in a thread while the `with` block runs."""

    def __init__(self, pigeon: PigeonProcess) -> None:
        self._pigeon = pigeon
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.peak_mib = 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mib = max(self.peak_mib, worker_rss_mib(self._pigeon))
            self._stop.wait(0.02)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mib = max(self.peak_mib, worker_rss_mib(self._pigeon))


def allow_open_files(count: int) -> None:
    """Raise this process's soft limit on open files to at least `count` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count if hard == resource.RLIM_INFINITY else min(count, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


# --- SMTP over asyncio streams -----------------------------------------------------------------
async def read_reply(reader: asyncio.StreamReader) -> tuple[int, str]:
    """One SMTP reply: its code and its last line's text (0, "" when the server hung up)."""
    while True:
        line = await reader.readline()
        if not line.endswith(b"\n"):
            return 0, ""
        if line[3:4] != b"-":
            return int(line[:3]), line[4:].decode(errors="replace").strip()


async def connect(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0), limit=1 << 20)


async def send_message(port: int, source: str = GOOD_CLIENT, within: float = 10.0) -> tuple[int, str]:
    """A well-behaved client's whole transaction; the reply to its message (or the reply that ended it)."""

    async def transaction() -> tuple[int, str]:
        reader, writer = await connect(port, source)
        try:
            reply = await read_reply(reader)
            if reply[0] != 220:
                return reply
            for command in (b"EHLO good.test", b"MAIL FROM:<good@example.org>", b"RCPT TO:<someone@example.net>"):
                writer.write(command + b"\r\n")
                reply = await read_reply(reader)
                if reply[0] != 250:
                    return reply
            writer.write(b"DATA\r\n")
            reply = await read_reply(reader)
            if reply[0] != 354:
                return reply
            writer.write(b"Subject: served\r\n\r\nDuring an attack.\r\n.\r\nQUIT\r\n")
            return await read_reply(reader)
        finally:
            writer.close()

    return await asyncio.wait_for(transaction(), within)


@dataclass
class Crowd:
    """Connections an attacker holds open, and the first reply each one got."""

    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    readers: list[asyncio.StreamReader] = field(default_factory=list)
    greetings: list[int] = field(default_factory=list)

    def count(self, code: int) -> int:
        return sum(1 for greeting in self.greetings if greeting == code)

    def close(self) -> None:
        for writer in self.writers:
            writer.transport.abort()


async def open_crowd(
    port: int, count: int, sources: list[str], *, parallel: int = 200, greeting_timeout: float = 30.0
) -> Crowd:
    """Open `count` connections (round-robin over `sources`) and read each greeting (-1: could
    not connect, 0: none in time or closed); keep them open."""
    crowd = Crowd()
    gate = asyncio.Semaphore(parallel)

    async def one(index: int) -> None:
        async with gate:
            try:
                reader, writer = await connect(port, sources[index % len(sources)])
            except OSError:
                crowd.greetings.append(-1)
                return
            crowd.readers.append(reader)
            crowd.writers.append(writer)
            try:
                code, _ = await asyncio.wait_for(read_reply(reader), greeting_timeout)
            except (TimeoutError, OSError):
                code = 0
            crowd.greetings.append(code)

    await asyncio.gather(*(one(i) for i in range(count)))
    return crowd


async def drip(crowd: Crowd, data: bytes, interval: float, duration: float) -> None:
    """Slowloris: every connection sends one byte of `data` each `interval` seconds, for `duration`."""
    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    position = 0
    while loop.time() < end:
        for reader, writer in zip(crowd.readers, crowd.writers, strict=True):
            if not (writer.transport.is_closing() or reader.at_eof()):  # not once the server hung up
                writer.write(data[position % len(data) : position % len(data) + 1])
        position += 1
        await asyncio.sleep(interval)


async def last_replies(crowd: Crowd, within: float) -> list[int]:
    """The last reply code each connection got before it was closed (0: none, still open or reset)."""

    async def last(reader: asyncio.StreamReader) -> int:
        code = 0
        with contextlib.suppress(TimeoutError, OSError):
            async with asyncio.timeout(within):
                while True:
                    got, _ = await read_reply(reader)
                    if got == 0:
                        break
                    code = got
        return code

    return await asyncio.gather(*(last(r) for r in crowd.readers))


# --- the HTTP API -------------------------------------------------------------------------------
def post_without_token(port: int, size: int) -> int:
    """POST `size` bytes to /api/v1/inject with no token, streaming them; the answer's status."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = f"POST /api/v1/inject HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
        sock.sendall(head.encode())
        chunk = b" " * (1 << 20)
        sent = 0
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            # The server may answer and close before it has all of it: what we want.
            while sent < size:
                sock.sendall(chunk[: size - sent])
                sent += len(chunk)
        answer = b""
        while b"\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    return int(answer.split(b" ", 2)[1])


def nested_multipart(depth: int) -> str:
    """A raw message whose text part sits inside `depth` nested multipart/mixed parts."""
    head = "From: app@example.org\r\nTo: ann@example.net\r\nSubject: deep\r\nMIME-Version: 1.0\r\n"
    opening = "".join(f'Content-Type: multipart/mixed; boundary="b{n}"\r\n\r\n--b{n}\r\n' for n in range(depth))
    closing = "".join(f"\r\n--b{n}--\r\n" for n in reversed(range(depth)))
    return head + opening + "Content-Type: text/plain\r\n\r\ninnermost\r\n" + closing


# --- addresses ----------------------------------------------------------------------------------
def sources(count: int) -> list[str]:
    """`count` distinct loopback addresses (127.1.0.1 upwards), none of them the good client's."""
    return [f"127.1.{n // 250}.{n % 250 + 1}" for n in range(count)]


@contextlib.contextmanager
def raised_open_files(count: int) -> Iterator[None]:
    """Within the block this process may open `count` files (sockets), as far as the hard limit allows."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    allow_open_files(count)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
