"""Bouncing a 1,000,000-message queue while reception goes on: time, memory, reception rate.

    .venv/bin/python bench/bounce.py [--messages 1000000]

It writes the messages (deferred, one recipient domain) through Pigeon's spool API, starts
a node on that spool (delivery on, next hop a dead port, so nothing leaves), and measures
SMTP reception (`smtp-source`, to another domain) alone, then again while an admin bounce
of the whole queue runs. It prints how long the bounce took, the worker's resident memory
before and at its peak, and the reception rate during the bounce as a ratio to the one
before (the machine is shared: both are measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request

from deferred import memory, populate
from harness import Pigeon, smtp_source, workdir

from pigeon.spool.shards import shard_directory


def reception(port: int, messages: int) -> float:
    started = time.perf_counter()
    smtp_source(port, "-s", "10", "-l", "2048", "-m", str(messages), "-f", "a@src.test", "-t", "r@live.test")
    return messages / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--reception", type=int, default=20_000, help="messages smtp-source sends in each phase")
    args = parser.parse_args()
    with workdir("bounce-") as path:
        print(f"writing {args.messages:,} deferred messages for d0.example ...", flush=True)
        seconds = populate(path / "spool", args.messages, 1024, domains=1)
        db = shard_directory(path / "spool", 0) / "spool.db"
        print(f"  {seconds:.0f}s, spool.db {db.stat().st_size / 2**20:,.0f} MB", flush=True)
        node = Pigeon(
            path,
            1,
            delivery={"enabled": True, "retry_interval": "1h"},
            route=[{"domain": "*", "next_hop": "127.0.0.1:9", "tls": "disabled"}],
        )
        try:
            worker = node.pids()[-1]
            before = memory(worker)["VmRSS"]
            alone = reception(node.port, args.reception)
            print(f"reception alone: {alone:.0f} msg/s; worker {before / 1024:.0f} MB", flush=True)
            token = (node.process.spool_path / "api-token").read_text().strip()
            request = urllib.request.Request(
                f"http://127.0.0.1:{node.process.http_port}/api/v1/admin/bounce",
                data=json.dumps({"domain": "d0.example", "reason": "bench"}).encode(),
                method="POST",
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            answer: dict[str, object] = {}

            def bounce() -> None:
                started = time.perf_counter()
                with urllib.request.urlopen(request, timeout=3600) as response:
                    answer.update(json.loads(response.read()))
                answer["seconds"] = time.perf_counter() - started

            thread = threading.Thread(target=bounce)
            thread.start()
            during = reception(node.port, args.reception)
            thread.join()
            peak = memory(worker)["VmHWM"]
            after = memory(worker)["VmRSS"]
            health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{node.process.http_port}/healthz").read())
        finally:
            node.stop()
    print(f"reception during the bounce: {during:.0f} msg/s ({during / alone:.2f}x of alone)")
    bounced, took = int(str(answer["bounced"])), float(str(answer["seconds"]))
    print(f"bounce of {bounced:,} messages: {took:.1f}s ({bounced / took:,.0f}/s)")
    print(f"worker memory: {before / 1024:.0f} MB before, peak {peak / 1024:.0f} MB, {after / 1024:.0f} MB after")
    print(f"spool afterwards: {health['spool']['messages']} messages (the ones received meanwhile)")


if __name__ == "__main__":
    main()
