"""Shared pieces of the benchmarks: MTAs under test, the load, and what we measure.

Everything runs on loopback. Figures are only comparable within one invocation: the
machine is shared and noisy, so every benchmark runs its contenders alternately and
reports ratios.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMTP_SOURCE = "/usr/sbin/smtp-source"
sys.path.insert(0, str(ROOT))

from tests.support.process import PigeonProcess, free_port  # noqa: E402


def require(path: str, package: str) -> str:
    found = shutil.which(path) or (path if Path(path).exists() else None)
    if found is None:
        sys.exit(f"{path} not found: apt-get install {package}")
    return found


# --- CPU accounting -------------------------------------------------------------------------
_CLK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def tree_cpu_seconds(root_pid: int) -> float:
    """CPU seconds of a process tree: live processes, plus reaped children (cutime/cstime)."""
    total = 0
    stack = [root_pid]
    while stack:
        pid = stack.pop()
        fields = _stat(pid)
        if fields is None:
            continue
        # fields[11..14] = utime, stime, cutime, cstime (after the ")" of the comm field)
        total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        stack += _children(pid)
    return total / _CLK


def machine_busy_seconds() -> tuple[float, float]:
    """(CPU seconds every process on the machine has run, seconds the CPUs were idle), from
    /proc/stat: what a relay's harness (smtp-source, smtp-sink) and the kernel take besides
    the MTA, which a ratio of relay rates also pays for."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]
    return busy / _CLK, (fields[3] + fields[4]) / _CLK


# --- contenders -------------------------------------------------------------------------------
class Mta:
    name: str
    port: int

    def root_pid(self) -> int:
        raise NotImplementedError

    def pids(self) -> list[int]:
        found, stack = [], [self.root_pid()]
        while stack:
            pid = stack.pop()
            found.append(pid)
            stack += _children(pid)
        return found

    def stop(self) -> None:
        raise NotImplementedError

    def queued(self) -> int:
        """Messages in the MTA's queue."""
        raise NotImplementedError


class Pigeon(Mta):
    def __init__(
        self, workdir: Path, workers: int | str, *, wait: bool = True, source: Path | None = None, **sections: object
    ) -> None:
        """`source`: a Pigeon source tree (a checkout's `src`) to run instead of this one, to
        compare a change with the code before it in one invocation."""
        self.name = f"pigeon ({workers} worker{'s' if workers != 1 else ''})"
        self.process = PigeonProcess(
            workdir, source=source, reserve=None, node={"workers": workers}, log={"level": "warning"}, **sections
        )
        self.process.start(wait=wait)
        self.port = self.process.smtp_port

    def root_pid(self) -> int:
        assert self.process.process is not None
        return self.process.process.pid

    def stop(self) -> None:
        self.process.stop()

    def queued(self) -> int:
        _, body = self.process.http_get("/healthz")
        return int(json.loads(body)["spool"]["messages"])


class Postfix(Mta):
    """A private Postfix instance: its own config, queue and port; nothing touches /etc/postfix.

    `nameserver`: deliver by MX, asking only this DNS server (an address on loopback port 53):
    Postfix runs in a mount namespace of its own whose /etc/resolv.conf names that server and
    nothing else. Without it, everything goes to `relay_port`, with no DNS at all.
    `settings`: main.cf parameters to set besides (or instead of) the bench's own."""

    def __init__(
        self,
        workdir: Path,
        relay_port: int | None = None,
        defer: bool = True,
        *,
        nameserver: str | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.name = "postfix"
        require("/usr/sbin/postfix", "postfix")
        self.dir = workdir
        workdir.chmod(0o755)  # the postfix user must reach its queue
        self.port = free_port()
        etc, spool, data = workdir / "etc", workdir / "spool", workdir / "data"
        for d in (etc, spool, data):
            d.mkdir(parents=True, exist_ok=True)
        shutil.chown(data, "postfix")
        (etc / "master.cf").write_text(_master_cf(self.port))
        main = {
            **_MAIN_CF,
            "queue_directory": str(spool),
            "data_directory": str(data),
            "maillog_file": f"{workdir}/maillog",
            "maillog_file_prefixes": str(workdir),
            "relayhost": f"[127.0.0.1]:{relay_port}" if relay_port else "[127.0.0.1]:9",
            "defer_transports": "smtp" if defer else "",
        }
        if nameserver is not None:
            main.update(relayhost="", disable_dns_lookups="no", smtp_dns_support_level="enabled")
            main.update(smtp_host_lookup="dns")
        main.update(settings or {})
        (etc / "main.cf").write_text("".join(f"{key} = {value}\n" for key, value in main.items()))
        subprocess.run(["postfix", "-c", str(etc), "check"], check=False, capture_output=True)
        start = ["postfix", "-c", str(etc), "start"]
        if nameserver is not None:
            resolv = workdir / "resolv.conf"
            resolv.write_text(f"nameserver {nameserver}\noptions attempts:2 timeout:2\n")
            # The master and every daemon it forks stay in this namespace: they see our resolv.conf.
            bind = f"mount --bind {resolv} /etc/resolv.conf && exec {' '.join(start)}"
            start = [require("unshare", "util-linux"), "--mount", "--propagation", "private", "sh", "-c", bind]
        subprocess.run(start, check=True, capture_output=True)
        _wait_port(self.port)

    def root_pid(self) -> int:
        return int((self.dir / "spool" / "pid" / "master.pid").read_text().split()[0])

    def queued(self) -> int:
        spool = self.dir / "spool"
        return sum(1 for q in ("incoming", "active", "deferred", "hold") for p in (spool / q).rglob("*") if p.is_file())

    def release(self) -> None:
        """Stop deferring the smtp transport and flush the queue (after `defer=True`)."""
        etc = self.dir / "etc"
        main_cf = etc / "main.cf"
        main_cf.write_text(main_cf.read_text().replace("defer_transports = smtp", "defer_transports ="))
        subprocess.run(["postfix", "-c", str(etc), "reload"], check=True, capture_output=True)
        subprocess.run(["postqueue", "-c", str(etc), "-f"], check=True, capture_output=True)

    def stop(self) -> None:
        subprocess.run(["postfix", "-c", str(self.dir / "etc"), "stop"], check=False, capture_output=True)
        time.sleep(1)


_MAIN_CF = {
    "compatibility_level": "3.6",
    "mail_owner": "postfix",
    "setgid_group": "postdrop",
    "myhostname": "bench.pigeon.test",
    "mydomain": "pigeon.test",
    "myorigin": "$myhostname",
    "mydestination": "",
    "inet_interfaces": "127.0.0.1",
    "inet_protocols": "ipv4",
    "mynetworks": "127.0.0.0/8",
    "smtpd_relay_restrictions": "permit_mynetworks, reject",
    "smtpd_client_connection_count_limit": "0",
    "smtpd_client_connection_rate_limit": "0",
    "default_process_limit": "100",
    "disable_dns_lookups": "yes",
    "smtp_dns_support_level": "disabled",
    "smtpd_peername_lookup": "no",
    "alias_maps": "",
    "alias_database": "",
    "local_recipient_maps": "",
    "smtputf8_enable": "no",
    "biff": "no",
}


def _master_cf(port: int) -> str:
    lines = []
    for line in Path("/etc/postfix/master.cf").read_text().splitlines():
        if not line.strip() or line.startswith(("#", " ", "\t")):
            continue
        fields = line.split()
        if fields[0] in ("maildrop", "uucp", "ifmail", "bsmtp", "scalemail-backend", "mailman"):
            continue
        if fields[0] == "smtp" and fields[1] == "inet":
            fields[0] = f"127.0.0.1:{port}"
        if len(fields) >= 5:
            fields[4] = "n"  # no chroot: the private queue has no copy of /etc
        lines.append("  ".join(fields))
    return "\n".join(lines) + "\n"


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


@contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("BENCH_TMP")))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- load and measurements ----------------------------------------------------------------------
@dataclass
class Run:
    name: str
    messages: int
    seconds: float
    cpu_seconds: float
    latencies: list[float]
    fsyncs_per_message: float | None = None

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def cpu_ms(self) -> float:
        return self.cpu_seconds * 1000 / self.messages

    def percentile(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000


def smtp_source(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    command = [require(SMTP_SOURCE, "postfix"), *args, f"127.0.0.1:{port}"]
    return subprocess.run(command, capture_output=True, text=True, check=True)


async def _timed_transactions(
    port: int, name: str, more: Callable[[], Awaitable[bool]], body: bytes, results: list[float]
) -> None:
    """One reused connection sending a message each time `more()` says so; the time from end of
    data to 250 of each goes to `results`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def reply() -> bytes:
        while True:
            line = await reader.readline()
            if line[3:4] != b"-":
                return line

    await reply()
    writer.write(f"EHLO {name}.test\r\n".encode())
    await reply()
    while await more():
        writer.write(f"MAIL FROM:<{name}@src.test>\r\n".encode())
        await reply()
        writer.write(f"RCPT TO:<{name}@sink.test>\r\n".encode())
        await reply()
        writer.write(b"DATA\r\n")
        await reply()
        writer.write(body)
        started = time.perf_counter()
        writer.write(b".\r\n")
        if (await reply()).startswith(b"250"):
            results.append(time.perf_counter() - started)
    writer.write(b"QUIT\r\n")
    writer.close()


def smtp_sink(port: int, messages: int) -> subprocess.Popen[bytes]:
    """Postfix's smtp-sink on 127.0.0.1:`port`, exiting once it has taken `messages` (-M)."""
    binary = require("/usr/sbin/smtp-sink", "postfix")
    process = subprocess.Popen(
        [binary, "-u", "nobody", "-M", str(messages), f"127.0.0.1:{port}", "1024"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.3)
    return process


def warm_up(port: int, warm: subprocess.Popen[bytes], size: int) -> None:
    """200 messages through the MTA on `port` into `warm` (a sink started for 200)."""
    smtp_source(port, "-s", "5", "-l", str(size), "-m", "200", "-f", "w@src.test", "-t", "w@sink.test")
    warm.wait(60)


def timed_relay(
    port: int, root_pid: int, sink_port: int, size: int, sessions: int, messages: int
) -> tuple[float, float]:
    """smtp-source -> the MTA on `port` -> a new smtp-sink on `sink_port`: (messages a second
    end to end, CPU milliseconds per message of the MTA's process tree under `root_pid`)."""
    measured = smtp_sink(sink_port, messages)
    cpu_before = tree_cpu_seconds(root_pid)
    started = time.perf_counter()
    smtp_source(
        port, "-s", str(sessions), "-l", str(size), "-m", str(messages), "-f", "a@src.test", "-t", "r@sink.test"
    )
    measured.wait(600)
    elapsed = time.perf_counter() - started
    cpu = tree_cpu_seconds(root_pid) - cpu_before
    return messages / elapsed, cpu * 1000 / messages


def probe_latencies(
    port: int, stop: threading.Event, body: bytes, connections: int = 2, interval: float = 0.02
) -> list[float]:
    """End-of-data to 250, from a client of our own running beside the load at a low rate."""

    async def main() -> list[float]:
        results: list[float] = []

        def paced() -> Callable[[], Awaitable[bool]]:
            first = True

            async def more() -> bool:
                nonlocal first
                if not first:
                    await asyncio.sleep(interval)
                first = False
                return not stop.is_set()

            return more

        await asyncio.gather(*(_timed_transactions(port, "probe", paced(), body, results) for _ in range(connections)))
        return results

    return asyncio.run(main())


def paced_latencies(port: int, rate: float, seconds: float, body: bytes, connections: int = 32) -> list[float]:
    """End-of-data to 250 for every message of a load offered at `rate` messages per second
    for `seconds` (open loop: message i is due at i / rate, on the first free of `connections`
    reused connections, so a slow MTA meets a queue, not a slower client)."""
    import uvloop

    async def main() -> list[float]:
        results: list[float] = []
        due: asyncio.Queue[bool] = asyncio.Queue()

        async def pace() -> None:
            start = time.perf_counter()
            for i in range(int(rate * seconds)):
                wait = start + i / rate - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                due.put_nowait(True)
            for _ in range(connections):
                due.put_nowait(False)

        clients = (_timed_transactions(port, "paced", due.get, body, results) for _ in range(connections))
        await asyncio.gather(pace(), *clients)
        return results

    return uvloop.run(main())


def message_body(size: int) -> bytes:
    line = b"X" * 78 + b"\r\n"
    head = b"From: <probe@src.test>\r\nTo: <probe@sink.test>\r\nSubject: latency probe\r\n\r\n"
    return head + line * max(1, (size - len(head)) // len(line))


def count_fsyncs(mta: Mta, action: Callable[[], object]) -> int:
    """fsync + fdatasync system calls made by the MTA's processes while `action` runs."""
    require("strace", "strace")
    args = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", "/dev/stderr"]
    for pid in mta.pids():
        args += ["-p", str(pid)]
    tracer = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # let strace attach
    try:
        action()
    finally:
        time.sleep(0.5)
        tracer.send_signal(signal.SIGINT)
        _, err = tracer.communicate(timeout=30)
    total = 0
    for line in err.splitlines():
        match = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(fsync|fdatasync)$", line)
        if match:
            total += int(match.group(1))
    return total


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        data: bytes = response.read()
        return data
