"""Start-up time and memory of a node holding a large deferred queue: 1,000,000 messages by default.

    .venv/bin/python bench/deferred.py [--messages 1000000] [--baseline-src DIR] [--rounds 2]

It writes the messages through Pigeon's own spool API (the same rows and bodies a reception
writes), due between one hour and a day from now, spread over many domains, tenants and
campaigns. Then, in the same run, it starts nodes with delivery on, one on an empty spool
(the baseline for memory) and, `--rounds` times, one on the full spool (alternately with
the same from `--baseline-src`, the `src` of a checkout before a change), and prints for each:

* start-up time: from starting `pigeon serve` until the node is ready, that is, `/healthz`
  answers 200 and the SMTP port accepts connections;
* resident memory (VmRSS) and its peak (VmHWM) of the worker and of the whole node, once
  started and again after relaying fresh mail past the deferred queue (smtp-source ->
  Pigeon -> smtp-sink), which proves the full node still delivers.

`--spool DIR` starts the nodes on a spool root written by an earlier run (`--keep DIR`
keeps the one this run writes there), to skip the minute that writing a million takes.

Targets (issue 12): with 1,000,000 deferred messages, start-up <= 2 s and RSS <= 100 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import time
from pathlib import Path

from harness import Pigeon, free_port, require, smtp_source, workdir

from pigeon.message import Envelope, Recipient
from pigeon.queue.names import scheduled_queue
from pigeon.spool.shards import shard_directory
from pigeon.spool.spool import NewMessage
from pigeon.spool.sqlite import SqliteSpool

FRESH = 2000


def populate(spool_root: Path, messages: int, size: int, domains: int = 20_000) -> float:
    """Write `messages` deferred messages into shard 0, spread over `domains` recipient
    domains (and 100 tenants, 10 campaigns); returns the seconds it took."""

    async def write() -> None:
        spool = SqliteSpool(shard_directory(spool_root, 0), max_batch=4096)
        spool.open(asyncio.get_running_loop())
        rng = random.Random(7)
        body = b"Subject: deferred\r\n\r\n" + (b"x" * 76 + b"\r\n") * max(1, size // 78)
        now = time.time()
        try:
            done = 0
            while done < messages:
                n = min(20_000, messages - done)
                futures = []
                for spool_id in spool.new_ids(n):
                    domain = f"d{rng.randrange(domains)}.example"
                    queue = scheduled_queue(domain, f"tenant{rng.randrange(100)}", f"c{rng.randrange(10)}")
                    recipients = [Recipient(f"user{rng.randrange(10**6)}@{domain}")]
                    writer = spool.body_writer(spool_id)
                    writer.write(body)
                    envelope = Envelope("bulk@sender.example", recipients, peer="127.0.0.1", helo="bench")
                    due = now + rng.uniform(3600, 86400)
                    message = NewMessage(spool_id, queue, envelope, created=now, due=due)
                    futures.append(spool.store(writer.finish(), [message]))
                await asyncio.gather(*futures)
                done += n
                print(f"\r  written {done:>9,}", end="", flush=True)
            print()
        finally:
            spool.close()

    started = time.perf_counter()
    asyncio.run(write())
    return time.perf_counter() - started


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of one process, in kB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def measure(node: Pigeon) -> dict[str, int]:
    pids = node.pids()
    worker = pids[1] if len(pids) > 1 else pids[0]  # the supervisor forks one worker
    figures = {f"worker {k}": v for k, v in memory(worker).items()}
    figures["node VmRSS"] = sum(memory(pid)["VmRSS"] for pid in pids)
    return figures


def run_node(path: Path, label: str, source: Path | None = None, spool: Path | None = None) -> dict[str, object]:
    sink_port = free_port()
    sink = subprocess.Popen(
        [require("/usr/sbin/smtp-sink", "postfix"), "-u", "nobody", "-M", str(FRESH), f"127.0.0.1:{sink_port}", "256"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started = time.perf_counter()
    node = Pigeon(
        path,
        1,
        source=source,
        spool={"path": str(spool or path / "spool")},
        delivery={"enabled": True},
        route=[{"domain": "*", "next_hop": f"127.0.0.1:{sink_port}", "tls": "disabled"}],
    )
    startup = time.perf_counter() - started  # `Pigeon` returns once /healthz says 200 and SMTP accepts
    try:
        time.sleep(3)  # a few scheduler ticks over the full due index
        at_rest = measure(node)
        smtp_source(node.port, "-s", "10", "-l", "5120", "-m", str(FRESH), "-f", "a@src.test", "-t", "r@fresh.test")
        sink.wait(120)  # smtp-sink -M exits once it has taken every fresh message
        after = measure(node)
    finally:
        node.stop()
        sink.kill()
    print(f"  {label}: started in {startup:.1f}s; at rest {fmt(at_rest)}; after relaying {FRESH}: {fmt(after)}")
    return {"startup": startup, "rest": at_rest, "after": after}


def fmt(figures: dict[str, int]) -> str:
    return ", ".join(f"{k} {v / 1024:.0f} MB" for k, v in figures.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes per message")
    parser.add_argument("--rounds", type=int, default=2, help="starts on the full spool, per contender")
    parser.add_argument("--baseline-src", type=Path, help="also start nodes from this source tree, as a baseline")
    parser.add_argument("--spool", type=Path, help="a spool root written by an earlier run (--keep): no writing")
    parser.add_argument("--keep", type=Path, help="write the spool root here and keep it, for --spool")
    args = parser.parse_args()
    with workdir("deferred-empty-") as empty, workdir("deferred-full-") as full:
        spool = args.spool or args.keep or full / "spool"
        if args.spool is None:
            print(f"writing {args.messages:,} deferred messages into {spool} ...")
            seconds = populate(spool, args.messages, args.size)
            print(f"  {seconds:.0f}s ({args.messages / seconds:,.0f} msg/s)")
        db = shard_directory(spool, 0) / "spool.db"
        print(f"spool.db {db.stat().st_size / 2**20:,.0f} MB")
        base = run_node(empty, "empty spool")
        contenders: dict[str, Path | None] = {"this": None}
        if args.baseline_src:
            contenders["baseline"] = args.baseline_src
        results: dict[str, list[dict[str, object]]] = {name: [] for name in contenders}
        for round_no in range(args.rounds):
            order = list(contenders) if round_no % 2 == 0 else list(reversed(contenders))
            for name in order:
                node_dir = full / f"node-{name}-{round_no}"
                label = f"round {round_no + 1}, {name}"
                results[name].append(run_node(node_dir, label, contenders[name], spool.resolve()))
    for name, runs in results.items():
        startup = statistics.median(float(r["startup"]) for r in runs)  # type: ignore[arg-type]
        rss = statistics.median(r["after"]["node VmRSS"] for r in runs)  # type: ignore[index]
        peak = max(r["after"]["worker VmHWM"] for r in runs)  # type: ignore[index]
        extra = rss - base["after"]["node VmRSS"]  # type: ignore[index]
        print(f"{name}: node holding {args.messages:,} deferred messages starts in {startup:.2f}s "
              f"(empty: {base['startup']:.2f}s), {rss / 1024:.0f} MB resident ({extra / 1024:+.0f} MB over "
              f"the empty node; worker peak {peak / 1024:.0f} MB); targets <= 2 s, <= 100 MB")  # fmt: skip
    if args.baseline_src:
        this = statistics.median(float(r["startup"]) for r in results["this"])  # type: ignore[arg-type]
        before = statistics.median(float(r["startup"]) for r in results["baseline"])  # type: ignore[arg-type]
        print(f"start-up, this / baseline: {this / before:.2f}x ({this:.2f}s vs {before:.2f}s)")


if __name__ == "__main__":
    main()
