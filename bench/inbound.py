"""Inbound drain rates: an IMAP backlog handed to a log file, a Maildir or Sidekiq, against
mail_room (the real gem and a Python loop of its shape); and SMTP to a webhook.

    .venv/bin/python bench/inbound.py [--messages 5000] [--size 5120] [--only NAME,...]

A private Dovecot and Redis (started here, on loopback) hold the mailbox and Sidekiq's queue.
For each contender the inbox is filled with `--messages` messages of `--size` bytes (one
MULTIAPPEND), and the clock runs until the target holds every message.

Start-up is not drain time, and processes start at different speeds (Ruby, Python, one or
three nodes; on a busy machine, a second more or less from one run to the next). So each
process contender is started and hands over a backlog of one message first; meanwhile the
backlog of `--messages` is appended to another folder and written out (sync). Then one
`UID MOVE` puts it all in INBOX at once, and the clock runs from the server's answer to the
MOVE until the target holds every message; likewise the CPU of the contender's processes.

Contenders, alternately in one invocation (the machine is noisy):
* gem-log, gem-sidekiq: the real mail_room gem (Debian's `ruby-mail-room`, with `ruby-redis`
  and `ruby-charlock-holmes` for its sidekiq delivery), default configuration (no
  arbitration), delivery `logger` to a file, or `sidekiq` to the private Redis. It fetches
  the whole backlog with `UID FETCH RFC822` (which marks it \\Seen before any delivery) and
  never fsyncs. Left out, with a note, when `mail_room` is not installed;
* shaped-log, shaped-sidekiq: the same loop in Python, in this process (stdlib imaplib,
  redis-py): UID SEARCH UNSEEN, one UID FETCH RFC822, then per message a line written to a
  file or an LPUSH;
* Pigeon, `log`, `maildir` or `sidekiq` target: 1 node without [redis], 1 node with [redis]
  arbitration ("1r"), 3 nodes sharing the Redis ("3r"). Durable: each handoff is fsynced
  (or in Sidekiq's Redis) before the message is flagged \\Seen.

Then SMTP to a webhook (`relay`, `webhook`): `smtp-source` sends to an [[inbound]] route whose
target is a local webhook receiver; the clock runs until the receiver has every message.
Pigeon relaying the same load to `smtp-sink` in the same run is the baseline.

`--baseline-src DIR` runs every Pigeon contender again from another source tree (the `src` of a
checkout of the commit before a change) and prints the change's ratios against it.
"""

from __future__ import annotations

import argparse
import contextlib
import imaplib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from harness import Pigeon, free_port, median, require, smtp_source, tree_cpu_seconds, workdir
from tests.support.apps import WebhookApp, redis_in_use_for_a_while
from tests.support.services import Dovecot, RedisServer

MAIL_ROOM = "/usr/bin/mail_room"
QUEUE = "queue:mail"
LOGGER_MARK = b"]  INFO -- : "


def message(n: int, size: int) -> bytes:
    head = (
        f"From: customer{n}@example.com\r\nTo: support@app.example\r\nMessage-ID: <b{n}.{secrets.token_hex(4)}@x>\r\n"
    )
    head += f"Subject: bench {n}\r\n\r\n"
    line = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod.\r\n"
    body = line * max(1, (size - len(head)) // len(line))
    return (head + body).encode()


def fill(dovecot: Dovecot, first: int, count: int, size: int, folder: str = "INBOX") -> None:
    """`count` messages into app's `folder` with one MULTIAPPEND (LITERAL+): quick, and they
    appear at once."""
    with socket.create_connection(("127.0.0.1", dovecot.port)) as sock, sock.makefile("rb") as replies:
        replies.readline()
        sock.sendall(b"a LOGIN app secret\r\nz CREATE %s\r\n" % folder.encode())
        while not (line := replies.readline()).startswith(b"z "):
            pass
        parts = [b"b APPEND " + folder.encode()]
        for n in range(first, first + count):
            raw = message(n, size)
            parts.append(b" {%d+}\r\n" % len(raw) + raw)
        sock.sendall(b"".join(parts) + b"\r\nc LOGOUT\r\n")
        while not (line := replies.readline()).startswith(b"b "):
            pass
        if not line.startswith(b"b OK"):
            raise RuntimeError(f"APPEND: {line!r}")
    # The bench's Dovecot does not fsync (mail_fsync = never), so the backlog it was just given
    # sits dirty in the page cache, and so does what the last contender wrote. A contender that
    # makes its own writes durable with syncfs (the Maildir target) would write all of that out
    # on its clock: it is written out here, before the clock starts, for every contender alike.
    os.sync()


def move_all(dovecot: Dovecot, folder: str) -> None:
    """Every message of `folder` moved to INBOX with one UID MOVE: they appear there at once,
    just before the answer this returns on."""
    with socket.create_connection(("127.0.0.1", dovecot.port)) as sock, sock.makefile("rb") as replies:
        replies.readline()
        sock.sendall(b"a LOGIN app secret\r\nb SELECT %s\r\n" % folder.encode())
        while not (line := replies.readline()).startswith(b"b "):
            pass
        sock.sendall(b"c UID MOVE 1:* INBOX\r\n")
        while not (line := replies.readline()).startswith(b"c "):
            pass
        if not line.startswith(b"c OK"):
            raise RuntimeError(f"MOVE: {line!r}")


# --- where the messages go, and how many are there ---------------------------------------------
@dataclass
class Sink:
    kind: str  # "log", "maildir", "sidekiq"
    path: Path
    client: redis.Redis
    marker: bytes = b"\n"  # one per message in a log file
    _offset: int = 0
    _seen: int = 0
    _tail: bytes = b""  # the last read's end, too short to hold a marker (it may start one)

    def count(self) -> int:
        if self.kind == "sidekiq":
            return int(self.client.llen(QUEUE))
        if self.kind == "maildir":
            try:
                return len(os.listdir(self.path / "new"))
            except FileNotFoundError:
                return 0
        try:
            with open(self.path, "rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return 0
        self._offset += len(data)
        data = self._tail + data
        self._seen += data.count(self.marker)
        self._tail = data[len(data) - len(self.marker) + 1 :]
        return self._seen

    def wait_for(self, count: int, alive: Callable[[], None], timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        pause = 0.02 if self.kind == "maildir" else 0.005
        while self.count() < count:
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.kind}: {self.count()} of {count} after {timeout}s")
            time.sleep(pause)


# --- the contenders -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Contender:
    name: str
    kind: str  # "gem", "shaped", "pigeon"
    target: str  # "log", "maildir", "sidekiq"
    nodes: int = 1
    arbitration: bool = False  # Pigeon: [redis] shared by the nodes
    source: Path | None = None  # Pigeon: another source tree

    @property
    def label(self) -> str:
        if self.kind == "gem":
            what = f"mail_room gem, {'logger' if self.target == 'log' else 'sidekiq'} delivery"
        elif self.kind == "shaped":
            what = f"mail_room-shaped Python loop, {self.target}"
        else:
            nodes = f"{self.nodes} node{'s' if self.nodes > 1 else ''}" + (" + Redis" if self.arbitration else "")
            what = f"Pigeon, {self.target} target, {nodes}"
        return what + (", baseline source" if self.source else "")


class Process:
    """A contender's processes: started, measured, stopped."""

    def cpu(self) -> float:
        raise NotImplementedError

    def check(self) -> None:
        """Raise if the contender died."""

    def stop(self) -> None:
        raise NotImplementedError


def _yaml(mapping: dict[str, object], indent: str) -> str:
    """A block mapping in mail_room's YAML, whose keys are Ruby symbols (":name")."""
    lines = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:\n{_yaml(value, indent + '  ')}")
        else:  # a JSON string, number or boolean is one in YAML too
            lines.append(f"{indent}{key}: {json.dumps(value)}\n")
    return "".join(lines)


class GemStalled(Exception):
    """mail_room stopped short of the backlog (it sometimes leaves part of it until its IDLE
    times out, 29 minutes later): the round is run again."""


GEM_STALL = 60.0  # seconds: the gem drains the default backlog in 1-2 s


class Gem(Process):
    def __init__(self, root: Path, dovecot: Dovecot, sink: Sink, redis_url: str) -> None:
        box: dict[str, object] = {":email": "app", ":password": "secret", ":host": "127.0.0.1", ":ssl": False,
                                  ":port": dovecot.port, ":start_tls": False, ":name": "INBOX"}  # fmt: skip
        if sink.kind == "log":
            box |= {":delivery_method": "logger", ":log_path": str(sink.path)}
        else:
            options = {":redis_url": redis_url, ":queue": "mail", ":worker": "InboundEmailJob"}
            box |= {":delivery_method": "sidekiq", ":delivery_options": options}
        root.mkdir(parents=True, exist_ok=True)
        config, self.stderr = root / "mail_room.yml", root / "mail_room.stderr"
        config.write_text(":mailboxes:\n  -\n" + _yaml(box, "    "))
        self.process = subprocess.Popen(
            [MAIL_ROOM, "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.stderr, "ab"),  # noqa: SIM115 - the child's
            start_new_session=True,
        )

    def cpu(self) -> float:
        return tree_cpu_seconds(self.process.pid)

    def check(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"mail_room exited with {self.process.returncode}: see {self.stderr}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


class Nodes(Process):
    def __init__(self, root: Path, contender: Contender, dovecot: Dovecot, sink: Sink, redis_url: str) -> None:
        if sink.kind == "sidekiq":
            target = {"name": "out", "kind": "sidekiq", "queue": "mail", "redis_url": redis_url}
        else:
            target = {"name": "out", "kind": sink.kind, "path": str(sink.path)}
        box = {"name": "support", "host": "127.0.0.1", "port": dovecot.port, "tls": "none", "username": "app",
               "password": "secret", "target": "out"}  # fmt: skip
        sections: dict[str, object] = {"target": [target], "mailbox": [box]}
        if contender.arbitration:
            sections["redis"] = {"url": redis_url}
        self.nodes = [
            Pigeon(root / f"node{n}", 1, wait=False, source=contender.source, **sections)
            for n in range(contender.nodes)
        ]

    def cpu(self) -> float:
        return sum(tree_cpu_seconds(node.root_pid()) for node in self.nodes)

    def check(self) -> None:
        for node in self.nodes:
            if node.process.process is not None and node.process.process.poll() is not None:
                raise RuntimeError(f"pigeon exited: {node.process.stderr()}")

    def stop(self) -> None:
        for node in self.nodes:  # gracefully: each acknowledges what it handed over
            node.stop()


def mail_room_shaped(dovecot: Dovecot, sink: Sink) -> None:
    """mail_room's loop with its default configuration, in this process: UID SEARCH UNSEEN,
    one UID FETCH RFC822 of them all (marking them \\Seen before any delivery), then each
    message written to a file (no fsync) or LPUSHed, one at a time."""
    imap = imaplib.IMAP4("127.0.0.1", dovecot.port)
    imap.login("app", "secret")
    imap.select("INBOX")
    log = open(sink.path, "ab") if sink.kind == "log" else None  # noqa: SIM115
    try:
        while True:
            _, data = imap.uid("SEARCH", "UNSEEN")
            uids = data[0].split()
            if not uids:
                break
            for item in imap.uid("FETCH", b",".join(uids).decode(), "(UID RFC822)")[1]:
                if not isinstance(item, tuple):
                    continue
                if log is not None:  # as Ruby's Logger writes it, unbuffered
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%S").encode()
                    log.write(b"I, [%s #%d]%s%s\n" % (stamp, os.getpid(), LOGGER_MARK, item[1]))
                    log.flush()
                else:
                    job = {"class": "InboundEmailJob", "args": [item[1].decode()], "queue": "mail",
                           "jid": secrets.token_hex(12), "retry": False, "enqueued_at": time.time()}  # fmt: skip
                    sink.client.lpush(QUEUE, json.dumps(job))
    finally:
        if log is not None:
            log.close()
        imap.logout()


def _drain(process: Process, dovecot: Dovecot, sink: Sink, count: int, args: argparse.Namespace) -> tuple[float, float]:
    """Seconds and CPU seconds the running contender takes to hand over a backlog of `count`
    moved into INBOX at once (after its first message: it is up, connected and idle)."""
    sink.wait_for(1, process.check)
    fill(dovecot, 1, count, args.size, folder="Backlog")
    cpu = process.cpu()
    move_all(dovecot, "Backlog")
    started = time.perf_counter()
    if isinstance(process, Gem):
        try:
            sink.wait_for(1 + count, process.check, timeout=GEM_STALL)
        except TimeoutError as error:
            raise GemStalled(str(error)) from None
    else:
        sink.wait_for(1 + count, process.check)
    return time.perf_counter() - started, process.cpu() - cpu


def run_imap(contender: Contender, root: Path, args: argparse.Namespace) -> tuple[float, float]:
    """Seconds and CPU seconds the contender takes to drain the backlog (start-up excluded)."""
    with Dovecot(root / "dovecot") as dovecot, RedisServer(root / "redis") as redis_server:
        client = redis_server.client()
        # The Pigeon log target writes a JSON line per message, the gem's logger (and the
        # shaped loop) a line starting "I, [<time> #<pid>]  INFO -- : " and the message.
        marker = b"\n" if contender.kind == "pigeon" else LOGGER_MARK
        path = root / ("maildir" if contender.target == "maildir" else "handed.log")
        sink = Sink(contender.target, path, client, marker)
        if contender.kind == "shaped":
            fill(dovecot, 0, args.messages, args.size)
            cpu, started = time.process_time(), time.perf_counter()
            mail_room_shaped(dovecot, sink)
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            assert sink.count() == args.messages, sink.count()
            return seconds, cpu
        if contender.arbitration:
            # A Redis in use for a while, as in production: on a brand-new one nodes pause
            # claims for a few seconds first (it might have lost claims a moment ago).
            redis_in_use_for_a_while(redis_server)
        fill(dovecot, 0, 1, args.size)
        process: Process = (
            Gem(root / "gem", dovecot, sink, redis_server.url)
            if contender.kind == "gem"
            else Nodes(root / "run", contender, dovecot, sink, redis_server.url)
        )
        try:
            drained = _drain(process, dovecot, sink, args.messages, args)
        finally:
            process.stop()
        if unseen := dovecot.unseen("app"):
            raise RuntimeError(f"{contender.name}: {len(unseen)} messages handed over and not acknowledged")
        if os.environ.get("BENCH_VERBOSE"):
            print(f"    {contender.name}: {drained}", file=sys.stderr)
        return drained


def run_gem(contender: Contender, root: Path, args: argparse.Namespace) -> tuple[float, float]:
    """`run_imap` for the gem, again (up to twice) when it stalls."""
    for attempt in range(3):
        try:
            return run_imap(contender, root / f"try{attempt}", args)
        except GemStalled as error:
            print(f"  {contender.name} stalled ({error}): that round again", file=sys.stderr)
    raise RuntimeError(f"{contender.name} stalled three times")


def run_smtp(contender: str, source: Path | None, root: Path, args: argparse.Namespace) -> tuple[float, float]:
    if contender == "relay":
        sink_port = free_port()
        sink = subprocess.Popen(
            [require("/usr/sbin/smtp-sink", "postfix"), "-u", "nobody", f"127.0.0.1:{sink_port}", "1024"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            node = Pigeon(root / "relay", 1, source=source, delivery={"enabled": True},
                          route=[{"domain": "*", "next_hop": f"127.0.0.1:{sink_port}"}])  # fmt: skip
            try:
                started = time.perf_counter()
                smtp_source(node.port, "-s", "20", "-l", str(args.size), "-m", str(args.messages),
                            "-f", "a@b.test", "-t", "support@app.example")  # fmt: skip
                while node.process.metric("pigeon_spool_messages") > 0:
                    time.sleep(0.01)
                return time.perf_counter() - started, tree_cpu_seconds(node.root_pid())
            finally:
                node.stop()
        finally:
            sink.terminate()
    with WebhookApp() as app:
        node = Pigeon(root / "inbound", 1, source=source, delivery={"enabled": True},
                      target=[{"name": "hook", "kind": "webhook", "url": app.url}],
                      inbound=[{"domain": "app.example", "target": "hook"}])  # fmt: skip
        try:
            started = time.perf_counter()
            smtp_source(node.port, "-s", "20", "-l", str(args.size), "-m", str(args.messages),
                        "-f", "a@b.test", "-t", "support@app.example")  # fmt: skip
            while sum(app.accepted.values()) < args.messages:
                time.sleep(0.01)
            return time.perf_counter() - started, tree_cpu_seconds(node.root_pid())
        finally:
            node.stop()


IMAP_CONTENDERS = {
    "gem-log": Contender("gem-log", "gem", "log"),
    "gem-sidekiq": Contender("gem-sidekiq", "gem", "sidekiq"),
    "shaped-log": Contender("shaped-log", "shaped", "log"),
    "shaped-sidekiq": Contender("shaped-sidekiq", "shaped", "sidekiq"),
    "log-1": Contender("log-1", "pigeon", "log"),
    "maildir-1": Contender("maildir-1", "pigeon", "maildir"),
    "sidekiq-1": Contender("sidekiq-1", "pigeon", "sidekiq"),
    "log-1r": Contender("log-1r", "pigeon", "log", arbitration=True),
    "log-3r": Contender("log-3r", "pigeon", "log", nodes=3, arbitration=True),
    "sidekiq-1r": Contender("sidekiq-1r", "pigeon", "sidekiq", arbitration=True),
}
SMTP_CONTENDERS = {"relay": "SMTP -> smtp-sink, Pigeon relay", "webhook": "SMTP -> webhook, Pigeon [[inbound]] route"}
BASELINE = " (baseline)"
RATIOS = [  # (numerator, denominator, what)
    ("log-1", "gem-log", "Pigeon log, 1 node / gem logger"),
    ("maildir-1", "gem-log", "Pigeon maildir, 1 node / gem logger"),
    ("sidekiq-1", "gem-sidekiq", "Pigeon sidekiq, 1 node / gem sidekiq"),
    ("sidekiq-1r", "gem-sidekiq", "Pigeon sidekiq, 1 node + Redis / gem sidekiq"),
    ("log-1", "shaped-log", "Pigeon log, 1 node / shaped loop"),
    ("log-3r", "log-1", "Pigeon log, 3 nodes + Redis / 1 node"),
    ("log-3r", "log-1r", "Pigeon log, 3 nodes + Redis / 1 node + Redis"),
    ("webhook", "relay", "SMTP webhook / relay"),
]


def _without_journal(directory: Path) -> bool:
    """Whether `directory` is on an ext4 filesystem without a journal (as this project's test
    machines' root is): there, creating a file skips every inode freed in the last one to five
    minutes, one at a time (`recently_deleted` in the kernel's ext4 inode allocator)."""
    where, device, kind, source = str(directory.resolve()), "", "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        point = fields[1] if len(fields) > 2 else ""
        if point and (where == point or where.startswith(point.rstrip("/") + "/")) and len(point) >= len(device):
            device, kind = point, fields[2]
            source = fields[0]
    if kind != "ext4":
        return False
    task = Path("/sys/fs/ext4") / Path(source).name / "journal_task"
    try:
        return task.read_text().strip() == "<none>"
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--size", type=int, default=5120)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", help="comma-separated contenders: " + ", ".join([*IMAP_CONTENDERS, *SMTP_CONTENDERS]))
    parser.add_argument("--baseline-src", type=Path, help="also run each Pigeon from this source tree, as a baseline")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the private Dovecot drops to its own users")
    chosen = args.only.split(",") if args.only else [*IMAP_CONTENDERS, *SMTP_CONTENDERS]
    unknown = set(chosen) - set(IMAP_CONTENDERS) - set(SMTP_CONTENDERS)
    if unknown:
        sys.exit(f"unknown contenders: {', '.join(sorted(unknown))}")
    if not shutil.which(MAIL_ROOM) and any(c.startswith("gem-") for c in chosen):
        print(f"{MAIL_ROOM} not found (apt-get install ruby-mail-room ruby-redis ruby-charlock-holmes): no gem")
        chosen = [c for c in chosen if not c.startswith("gem-")]
    if "maildir-1" in chosen and _without_journal(Path(os.environ.get("BENCH_TMP") or tempfile.gettempdir())):
        print(
            "note: the work directory is on ext4 without a journal, where each file made within minutes of many\n"
            "  deletions there costs up to 0.5 ms more (measured: 1,000 files 30 ms idle, 450-800 ms after 8,000\n"
            "  were deleted): the Maildir contender measures low after another run's clean-up; give it 5 idle minutes."
        )
    again = [BASELINE] if args.baseline_src else []
    runs: list[str] = []
    for name in chosen:
        pigeon = name in SMTP_CONTENDERS or IMAP_CONTENDERS[name].kind == "pigeon"
        runs += [name + suffix for suffix in ["", *(again if pigeon else [])]]
    results: dict[str, list[tuple[float, float]]] = {}
    # Every contender's files stay until the end of the run. Deleting a contender's (tens of
    # thousands of files: Dovecot's mail, a Maildir) just before the next one starts would tax
    # the next one's file creations: ext4 without a journal (this machine's) skips inodes freed
    # in the last minute or more when it allocates one, scanning past each (measured: creating
    # 1,000 files took 3-6x as long right after 20,000 were deleted). Only a contender that
    # creates files on the clock (the Maildir target) paid it, depending on who ran before it.
    with contextlib.ExitStack() as kept:
        for _ in range(args.rounds):
            for run in runs:
                name = run.removesuffix(BASELINE)
                source = args.baseline_src if run.endswith(BASELINE) else None
                root = kept.enter_context(workdir(f"inbound-{name}-"))
                if name in SMTP_CONTENDERS:
                    result = run_smtp(name, source, root, args)
                else:
                    contender = IMAP_CONTENDERS[name]
                    if source is not None:
                        contender = Contender(**{**contender.__dict__, "source": source})
                    result = (
                        run_gem(contender, root, args) if contender.kind == "gem" else run_imap(contender, root, args)
                    )
                results.setdefault(run, []).append(result)
    rates, cpus = {}, {}
    print(f"{args.messages} messages of {args.size} bytes, medians of {args.rounds} rounds")
    for run, measured in results.items():
        rate = median([args.messages / seconds for seconds, _ in measured])
        cpu = median([cpu * 1000 / args.messages for _, cpu in measured])
        rates[run], cpus[run] = rate, cpu
        name = run.removesuffix(BASELINE)
        label = SMTP_CONTENDERS[name] if name in SMTP_CONTENDERS else IMAP_CONTENDERS[name].label
        label += ", baseline source" if run.endswith(BASELINE) else ""
        each = " ".join(f"{args.messages / seconds:,.0f}" for seconds, _ in measured)
        print(f"  {name + ':':<16}{label:<62} {rate:8,.0f} msg/s  {cpu:5.2f} CPU ms/msg  (rounds: {each})")
    for top, bottom, what in RATIOS:
        if top in rates and bottom in rates:
            print(f"  {what}: {rates[top] / rates[bottom]:.2f}x the rate, {cpus[top] / cpus[bottom]:.2f}x the CPU/msg")
    for run in rates:
        if run.endswith(BASELINE):
            name = run.removesuffix(BASELINE)
            print(f"  {name} / its baseline source: {rates[name] / rates[run]:.2f}x the rate, "
                  f"{cpus[name] / cpus[run]:.2f}x the CPU per message")  # fmt: skip


if __name__ == "__main__":
    main()
