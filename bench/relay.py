"""End-to-end relaying: smtp-source -> MTA -> smtp-sink, Pigeon against Postfix.

    sudo .venv/bin/python bench/relay.py                 # as root (it runs a private Postfix)

For each contender, alternately for `--rounds` rounds, it prints the median of:

* end-to-end messages per second: from smtp-source's start until smtp-sink has taken the
  last message (`smtp-sink -M`), fsync on in both MTAs;
* CPU milliseconds per message of the MTA's process tree.

`--drain N` also measures how fast each MTA empties a backlog of N queued messages once the
sink comes up (`--rounds 0 --drain 100000` measures only that).

`--baseline-src DIR` adds each Pigeon contender again, run from another source tree (the `src`
of a checkout of the commit before a change), and prints the change's ratio against it:

    git worktree add /tmp/before HEAD~1
    sudo .venv/bin/python bench/relay.py --baseline-src /tmp/before/src
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

from harness import (
    SMTP_SOURCE,
    Mta,
    Pigeon,
    Postfix,
    free_port,
    median,
    require,
    smtp_source,
    tree_cpu_seconds,
    workdir,
)


def sink(port: int, messages: int) -> subprocess.Popen[bytes]:
    binary = require("/usr/sbin/smtp-sink", "postfix")
    process = subprocess.Popen(
        [binary, "-u", "nobody", "-M", str(messages), f"127.0.0.1:{port}", "1024"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.3)
    return process


def pigeon(path: Path, workers: str, sink_port: int, source: Path | None = None) -> Pigeon:
    return Pigeon(
        path,
        workers if workers == "auto" else int(workers),
        source=source,
        delivery={"enabled": True, "retry_interval": "1s", "max_retry_interval": "2s", "connection_limit": 32},
        route=[{"domain": "*", "next_hop": f"127.0.0.1:{sink_port}", "tls": "disabled"}],
    )


BASELINE = " (baseline)"


def start(kind: str, path: Path, sink_port: int, baseline: Path | None) -> Mta:
    if kind == "postfix":
        return Postfix(path, relay_port=sink_port, defer=False)
    workers = kind.removesuffix(BASELINE).split(":", 1)[1]
    return pigeon(path, workers, sink_port, baseline if kind.endswith(BASELINE) else None)


def one_run(kind: str, args: argparse.Namespace) -> tuple[float, float]:
    sink_port = free_port()
    with workdir(f"relay-{kind.replace(':', '-').replace(' ', '')}-") as path:
        warm = sink(sink_port, 200)
        mta = start(kind, path, sink_port, args.baseline_src)
        try:
            smtp_source(mta.port, "-s", "5", "-l", str(args.size), "-m", "200", "-f", "w@src.test", "-t", "w@sink.test")
            warm.wait(60)
            measured = sink(sink_port, args.messages)
            cpu_before = tree_cpu_seconds(mta.root_pid())
            started = time.perf_counter()
            load = ["-s", str(args.sessions), "-l", str(args.size), "-m", str(args.messages)]
            smtp_source(mta.port, *load, "-f", "a@src.test", "-t", "r@sink.test")
            measured.wait(600)
            elapsed = time.perf_counter() - started
            cpu = tree_cpu_seconds(mta.root_pid()) - cpu_before
            return args.messages / elapsed, cpu * 1000 / args.messages
        finally:
            mta.stop()


def drain(args: argparse.Namespace) -> None:
    """A backlog of `args.drain` messages waits in the MTA's queue; the sink comes up: how fast
    does it empty? Pigeon accepts with delivery off, then restarts with it on (the timer runs
    from that restart, start-up included); Postfix accepts with its smtp transport deferred,
    then is reloaded without the deferral and flushed."""
    results = {}
    for kind in ("postfix", "pigeon:1"):
        sink_port = free_port()
        with workdir(f"drain-{kind.replace(':', '-')}-") as path:
            load = ["-d", "-s", "20", "-l", str(args.size), "-m", str(args.drain)]
            load += ["-f", "a@src.test", "-t", "r@sink.test"]
            if kind == "postfix":
                mta: Mta = Postfix(path, relay_port=sink_port, defer=True)
                smtp_source(mta.port, *load)
                measured = sink(sink_port, args.drain)
                cpu_before, started = tree_cpu_seconds(mta.root_pid()), time.perf_counter()
                assert isinstance(mta, Postfix)
                mta.release()
            else:
                accepting = Pigeon(path, 1, delivery={"enabled": False})
                smtp_source(accepting.port, *load)
                accepting.stop()
                measured = sink(sink_port, args.drain)
                started = time.perf_counter()
                mta = pigeon(path, "1", sink_port)
                cpu_before = 0.0  # a new process: all its CPU is the drain's
            try:
                measured.wait(3600)
                elapsed = time.perf_counter() - started
                cpu = tree_cpu_seconds(mta.root_pid()) - cpu_before
            finally:
                mta.stop()
        results[kind] = args.drain / elapsed
        print(f"drain {kind:9} {args.drain} messages in {elapsed:6.1f}s = {results[kind]:6.0f} msg/s, "
              f"{cpu * 1000 / args.drain:.2f} CPU ms/msg", flush=True)  # fmt: skip
    print(f"drain pigeon / postfix: {results['pigeon:1'] / results['postfix']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--size", type=int, default=5120)
    parser.add_argument("--rounds", type=int, default=2, help="relay rounds (0: only --drain)")
    parser.add_argument("--pigeon-workers", default="1,2")
    parser.add_argument("--drain", type=int, default=0, help="also measure draining a backlog of this many")
    parser.add_argument("--baseline-src", type=Path, help="also run each Pigeon from this source tree, as a baseline")
    args = parser.parse_args()
    require(SMTP_SOURCE, "postfix")
    if args.rounds:
        relay(args)
    if args.drain:
        drain(args)


def relay(args: argparse.Namespace) -> None:
    pigeons = [f"pigeon:{w.strip()}" for w in args.pigeon_workers.split(",")]
    kinds = ["postfix", *pigeons, *([p + BASELINE for p in pigeons] if args.baseline_src else [])]
    results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    for round_no in range(args.rounds):
        for kind in kinds if round_no % 2 == 0 else list(reversed(kinds)):
            rate, cpu = one_run(kind, args)
            results[kind].append((rate, cpu))
            print(f"round {round_no + 1}: {kind:12} {rate:8.0f} msg/s end to end  {cpu:5.2f} CPU ms/msg", flush=True)
    print(f"\nsmtp-source -s {args.sessions} -l {args.size} -m {args.messages} -> MTA -> smtp-sink, medians:")
    summary = {kind: (median([r for r, _ in v]), median([c for _, c in v])) for kind, v in results.items()}
    for kind, (rate, cpu) in summary.items():
        print(f"{kind:25}{rate:10.0f} msg/s{cpu:10.2f} CPU ms/msg")
    postfix_rate, postfix_cpu = summary["postfix"]
    for kind in kinds[1:]:
        rate, cpu = summary[kind]
        print(f"{kind} / postfix: {rate / postfix_rate:.2f}x the rate, {postfix_cpu / cpu:.2f}x less CPU per message")
    for kind in pigeons if args.baseline_src else []:
        (rate, cpu), (base_rate, base_cpu) = summary[kind], summary[kind + BASELINE]
        print(f"{kind} / its baseline: {rate / base_rate:.2f}x the rate, {cpu / base_cpu:.2f}x the CPU per message")


if __name__ == "__main__":
    main()
