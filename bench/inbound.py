"""Inbound handoff rates: IMAP to Sidekiq with 1 and 3 nodes, and SMTP to a webhook.

    .venv/bin/python bench/inbound.py [--messages 5000] [--size 5120]

A private Dovecot and Redis (started here, on loopback) hold the mailbox and Sidekiq's queue.
For each contender the inbox is filled with `--messages` messages of `--size` bytes, the
contender is started, and the clock runs until Sidekiq's queue holds every job and the inbox
has none unseen.

Contenders, alternately in one invocation (the machine is noisy):
* baseline: a mail_room-style loop (stdlib imaplib + redis-py, synchronous, one process):
  UID SEARCH UNSEEN, UID FETCH of the bodies a thousand at a time (which marks them \\Seen as
  it goes, as mail_room does), then per message SET NX EX arbitration and LPUSH;
* Pigeon, 1 node, and Pigeon, 3 nodes sharing the Redis for arbitration (claims, BODY.PEEK[],
  \\Seen only after the push).

Then SMTP to a webhook: `smtp-source` sends to an [[inbound]] route whose target is a local
webhook receiver; the clock runs until the receiver has every message. Pigeon relaying the
same load to `smtp-sink` in the same run is the baseline.

`--baseline-src DIR` runs every Pigeon contender again from another source tree (the `src` of a
checkout of the commit before a change) and prints the change's ratios against it.
"""

from __future__ import annotations

import argparse
import imaplib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import redis
from harness import Pigeon, free_port, median, require, smtp_source, tree_cpu_seconds, workdir
from tests.support.apps import WebhookApp, redis_in_use_for_a_while
from tests.support.services import Dovecot, RedisServer


def message(n: int, size: int) -> bytes:
    head = (
        f"From: customer{n}@example.com\r\nTo: support@app.example\r\nMessage-ID: <b{n}.{secrets.token_hex(4)}@x>\r\n"
    )
    head += f"Subject: bench {n}\r\n\r\n"
    line = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod.\r\n"
    body = line * max(1, (size - len(head)) // len(line))
    return (head + body).encode()


def fill(dovecot: Dovecot, count: int, size: int) -> None:
    for start in range(0, count, 500):
        dovecot.append("app", [message(n, size) for n in range(start, min(count, start + 500))])


def mail_room_style(dovecot: Dovecot, url: str) -> None:
    """The baseline, in this process: what mail_room does per poll, synchronously."""
    client = redis.Redis.from_url(url)
    imap = imaplib.IMAP4("127.0.0.1", dovecot.port)
    imap.login("app", "secret")
    imap.select("INBOX")
    while True:
        _, data = imap.uid("SEARCH", "UNSEEN")
        uids = data[0].split()
        if not uids:
            break
        # A thousand at a time: mail_room's limit_max_unread (its PR #114), as a long UID list
        # is refused with "Too long argument".
        fetched = []
        for start in range(0, len(uids), 1000):
            fetched += imap.uid("FETCH", b",".join(uids[start : start + 1000]).decode(), "(UID RFC822)")[1]
        for item in fetched:
            if not isinstance(item, tuple):
                continue
            uid = item[0].split(b"UID ")[1].split()[0].decode()
            if client.set(f"delivered:{uid}", 1, nx=True, ex=600):
                job = {"class": "InboundEmailJob", "args": [item[1].decode()], "queue": "mail",
                       "jid": secrets.token_hex(12), "retry": True, "enqueued_at": time.time()}  # fmt: skip
                client.lpush("queue:mail", json.dumps(job))
    imap.logout()


BASELINE = " (baseline)"


def _source(contender: str, args: argparse.Namespace) -> Path | None:
    return args.baseline_src if contender.endswith(BASELINE) else None


def run_imap(contender: str, root: Path, args: argparse.Namespace) -> tuple[float, float]:
    """Seconds and CPU seconds (the contender's processes) to hand over every message."""
    with Dovecot(root / "dovecot") as dovecot, RedisServer(root / "redis") as redis_server:
        fill(dovecot, args.messages, args.size)
        client = redis_server.client()
        if contender == "baseline":
            cpu = time.process_time()
            started = time.perf_counter()
            mail_room_style(dovecot, redis_server.url)
            seconds = time.perf_counter() - started
            assert client.llen("queue:mail") == args.messages
            return seconds, time.process_time() - cpu
        count = 1 if contender.startswith("pigeon-1") else 3
        # A Redis in use for a while, as in production: a brand-new one makes nodes pause
        # claims for a few seconds at first (it might have lost claims a moment ago), which
        # is not handoff time.
        redis_in_use_for_a_while(redis_server)
        target = {"name": "jobs", "kind": "sidekiq", "queue": "mail"}
        box = {"name": "support", "host": "127.0.0.1", "port": dovecot.port, "tls": "none", "username": "app",
               "password": "secret", "target": "jobs", "batch": 100}  # fmt: skip
        # The clock starts once every node is up (start-up is not handoff): the nodes are
        # started without waiting, then waited for; whatever the first did meanwhile is
        # subtracted by counting from the jobs already pushed.
        sections = {"redis": {"url": redis_server.url}, "target": [target], "mailbox": [box]}
        nodes = [
            Pigeon(root / f"node{n}", 1, wait=False, source=_source(contender, args), **sections) for n in range(count)
        ]
        try:
            for node in nodes:
                node.process.wait_ready()
            started = time.perf_counter()
            already = client.llen("queue:mail")
            cpu_before = sum(tree_cpu_seconds(node.root_pid()) for node in nodes)
            while client.llen("queue:mail") < args.messages:
                time.sleep(0.005)
            seconds = (time.perf_counter() - started) * args.messages / (args.messages - already)
            cpu = sum(tree_cpu_seconds(node.root_pid()) for node in nodes) - cpu_before
            cpu *= args.messages / (args.messages - already)
            while dovecot.unseen("app"):
                time.sleep(0.05)
        finally:
            for node in nodes:
                node.stop()
        assert client.llen("queue:mail") == args.messages
        return seconds, cpu


def run_smtp(contender: str, root: Path, args: argparse.Namespace) -> tuple[float, float]:
    if contender.startswith("relay"):
        sink_port = free_port()
        sink = subprocess.Popen(
            [require("/usr/sbin/smtp-sink", "postfix"), "-u", "nobody", f"127.0.0.1:{sink_port}", "1024"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            node = Pigeon(root / "relay", 1, source=_source(contender, args), delivery={"enabled": True},
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
        node = Pigeon(root / "inbound", 1, source=_source(contender, args), delivery={"enabled": True},
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--size", type=int, default=5120)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-src", type=Path, help="also run each Pigeon from this source tree, as a baseline")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the private Dovecot drops to its own users")
    results: dict[str, list[tuple[float, float]]] = {}
    again = [BASELINE] if args.baseline_src else []
    for _ in range(args.rounds):
        for contender in ["baseline"] + [p + s for s in ["", *again] for p in ("pigeon-1", "pigeon-3")]:
            with workdir(f"inbound-{contender.replace(' ', '')}-") as root:
                results.setdefault(contender, []).append(run_imap(contender, root, args))
        for contender in [p + s for s in ["", *again] for p in ("relay", "webhook")]:
            with workdir(f"inbound-{contender.replace(' ', '')}-") as root:
                results.setdefault(contender, []).append(run_smtp(contender, root, args))
    names = {
        "baseline": "IMAP -> Sidekiq, mail_room-style loop (baseline)",
        "pigeon-1": "IMAP -> Sidekiq, Pigeon, 1 node",
        "pigeon-3": "IMAP -> Sidekiq, Pigeon, 3 nodes + Redis arbitration",
        "relay": "SMTP -> smtp-sink, Pigeon relay (baseline)",
        "webhook": "SMTP -> webhook, Pigeon [[inbound]] route",
    }
    rates, cpus = {}, {}
    print(f"{args.messages} messages of {args.size} bytes, medians of {args.rounds} rounds")
    for contender, runs in results.items():
        rate = median([args.messages / seconds for seconds, _ in runs])
        cpu = median([cpu * 1000 / args.messages for _, cpu in runs])
        rates[contender], cpus[contender] = rate, cpu
        name = names[contender.removesuffix(BASELINE)] + (", baseline source" if contender.endswith(BASELINE) else "")
        print(f"  {name:<74} {rate:8,.0f} msg/s  {cpu:5.2f} CPU ms/msg")
    print(f"  Pigeon 1 node / baseline: {rates['pigeon-1'] / rates['baseline']:.2f}x; "
          f"3 nodes / 1 node: {rates['pigeon-3'] / rates['pigeon-1']:.2f}x; "
          f"webhook / relay: {rates['webhook'] / rates['relay']:.2f}x")  # fmt: skip
    for contender in ("pigeon-1", "pigeon-3", "relay", "webhook") if args.baseline_src else ():
        base = contender + BASELINE
        print(f"  {contender} / its baseline: {rates[contender] / rates[base]:.2f}x the rate, "
              f"{cpus[contender] / cpus[base]:.2f}x the CPU per message")  # fmt: skip


if __name__ == "__main__":
    main()
