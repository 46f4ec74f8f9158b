"""Durable acceptance: how fast Pigeon and Postfix take mail into their queues, fsync on.

    sudo .venv/bin/python bench/accept.py            # as root (it runs a private Postfix)

Load: `smtp-source -s 20 -l 5120 -m 20000` (20 sessions, 5 KiB, a new connection per
message), against Pigeon and against Postfix (apt's, a private instance that accepts into
its queue and defers delivery), alternately for `--rounds` rounds. For each contender it
prints the median of:

* accepted messages per second (wall time of smtp-source);
* CPU milliseconds per message (the MTA's whole process tree: user + system);
* p50/p99 latency from end of data to 250, from a probe client beside the load;
* fsyncs per message (a separate, shorter run under strace, which slows things down);
* with `--paced`, p50/p99 end of data to 250 under a load offered at half of each MTA's own
  median accept rate (open loop, 32 reused connections of our own client, every message timed).

Then the ratio Pigeon / Postfix.

`--baseline-src DIR` adds each Pigeon contender again, run from another source tree (the `src`
of a checkout of the commit before a change), and prints the change's ratio against it:

    git worktree add /tmp/before HEAD~1
    sudo .venv/bin/python bench/accept.py --baseline-src /tmp/before/src --paced 10
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from harness import (
    SMTP_SOURCE,
    Mta,
    Pigeon,
    Postfix,
    Run,
    count_fsyncs,
    fetch,
    median,
    message_body,
    paced_latencies,
    probe_latencies,
    require,
    smtp_source,
    tree_cpu_seconds,
    workdir,
)

BASELINE = " (baseline)"


def start(kind: str, path: Path, baseline: Path | None = None) -> Mta:
    """ "postfix", or "pigeon:<workers>" (a number, or auto: one per core), with BASELINE
    appended to run it from `baseline`."""
    if kind == "postfix":
        return Postfix(path)
    workers = kind.removesuffix(BASELINE).split(":", 1)[1]
    source = baseline if kind.endswith(BASELINE) else None
    mta = Pigeon(path, workers if workers == "auto" else int(workers), source=source)
    mta.name += BASELINE if source else ""
    return mta


def stored(mta: Mta) -> int:
    if isinstance(mta, Postfix):
        return mta.queued()
    assert isinstance(mta, Pigeon)
    for line in fetch(f"http://127.0.0.1:{mta.process.http_port}/metrics").decode().splitlines():
        if line.startswith("pigeon_spool_messages "):
            return int(float(line.split()[1]))
    raise RuntimeError("no pigeon_spool_messages metric")


def one_run(kind: str, args: argparse.Namespace) -> Run:
    with workdir(f"bench-{kind.replace(':', '-')}-") as path:
        mta = start(kind, path, args.baseline_src)
        try:
            smtp_source(mta.port, "-s", "5", "-l", str(args.size), "-m", "200", "-f", "w@src.test", "-t", "w@sink.test")
            time.sleep(0.5)
            before_count = stored(mta)
            latencies: list[float] = []
            stop_probe = threading.Event()
            probe = threading.Thread(
                target=lambda: latencies.extend(probe_latencies(mta.port, stop_probe, message_body(args.size)))
            )
            cpu_before = tree_cpu_seconds(mta.root_pid())
            started = time.perf_counter()
            probe.start()
            load = ["-s", str(args.sessions), "-l", str(args.size), "-m", str(args.messages)]
            smtp_source(mta.port, *load, "-f", "a@src.test", "-t", "r@sink.test")
            elapsed = time.perf_counter() - started
            stop_probe.set()
            probe.join()
            cpu = tree_cpu_seconds(mta.root_pid()) - cpu_before
            time.sleep(1.0)
            accepted = stored(mta) - before_count
            expected = args.messages + len(latencies)
            if accepted < expected:
                raise RuntimeError(f"{mta.name}: {accepted} messages queued, expected {expected}")
            return Run(mta.name, args.messages + len(latencies), elapsed, cpu, latencies)
        finally:
            mta.stop()


def fsyncs(kind: str, args: argparse.Namespace) -> float:
    with workdir(f"bench-{kind.replace(':', '-')}-fsync-") as path:
        mta = start(kind, path, args.baseline_src)
        try:
            smtp_source(mta.port, "-s", "5", "-l", str(args.size), "-m", "100", "-f", "w@src.test", "-t", "w@sink.test")
            n = args.fsync_messages
            load = ["-s", str(args.sessions), "-l", str(args.size), "-m", str(n)]
            calls = count_fsyncs(mta, lambda: smtp_source(mta.port, *load, "-f", "a@src.test", "-t", "r@x.test"))
            return calls / n
        finally:
            mta.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--size", type=int, default=5120)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--pigeon-workers",
        default="1,2",
        help="Pigeon worker counts to run, comma-separated (default: 1,2). On a 2-core machine that also runs "
        "the load generator, one worker beats two: the second competes with smtp-source for the cores.",
    )
    parser.add_argument("--fsync-messages", type=int, default=3000)
    parser.add_argument("--paced", type=float, default=0.0, help="seconds of a half-rate load, timed (0: none)")
    parser.add_argument("--baseline-src", type=Path, help="also run each Pigeon contender from this source tree")
    args = parser.parse_args()
    require(SMTP_SOURCE, "postfix")

    kinds = ["postfix"] + [f"pigeon:{w.strip()}" for w in args.pigeon_workers.split(",")]
    if args.baseline_src:
        kinds += [kind + BASELINE for kind in kinds[1:]]
    runs: dict[str, list[Run]] = {kind: [] for kind in kinds}
    for round_no in range(args.rounds):
        for kind in kinds if round_no % 2 == 0 else list(reversed(kinds)):
            run = one_run(kind, args)
            runs[kind].append(run)
            print(
                f"round {round_no + 1}: {run.name:22} {run.rate:8.0f} msg/s  {run.cpu_ms:5.2f} CPU ms/msg  "
                f"p50 {run.percentile(0.5):6.2f} ms  p99 {run.percentile(0.99):7.2f} ms",
                flush=True,
            )
    fsync_rates = {kind: fsyncs(kind, args) for kind in runs}

    print()
    print(f"smtp-source -s {args.sessions} -l {args.size} -m {args.messages}, {args.rounds} rounds, medians:")
    print(f"{'':24}{'msg/s':>10}{'CPU ms/msg':>12}{'p50 ms':>9}{'p99 ms':>9}{'fsync/msg':>11}")
    summary = {}
    for kind, kind_runs in runs.items():
        rate = median([r.rate for r in kind_runs])
        cpu = median([r.cpu_ms for r in kind_runs])
        p50 = median([r.percentile(0.5) for r in kind_runs])
        p99 = median([r.percentile(0.99) for r in kind_runs])
        summary[kind] = (rate, cpu)
        print(f"{kind_runs[0].name:24}{rate:10.0f}{cpu:12.2f}{p50:9.2f}{p99:9.2f}{fsync_rates[kind]:11.3f}")
    postfix_rate, postfix_cpu = summary["postfix"]
    if args.paced:
        print(f"\nat half of each one's own median rate, {args.paced:.0f} s, every message timed:")
        for kind in kinds:
            rate = summary[kind][0] / 2
            with workdir(f"bench-{kind.replace(':', '-')}-paced-") as path:
                mta = start(kind, path, args.baseline_src)
                try:
                    found = sorted(paced_latencies(mta.port, rate, args.paced, message_body(args.size)))
                finally:
                    mta.stop()
            p50, p99 = (found[int(q * (len(found) - 1))] * 1000 for q in (0.5, 0.99))
            print(f"{runs[kind][0].name:24}{rate:8.0f} msg/s offered  p50 {p50:6.2f} ms  p99 {p99:7.2f} ms", flush=True)
    print()
    for kind in kinds[1:]:
        rate, cpu = summary[kind]
        print(
            f"{runs[kind][0].name} / postfix: {rate / postfix_rate:.2f}x the accepted messages per second, "
            f"{postfix_cpu / cpu:.2f}x less CPU per message"
        )
    for kind in kinds[1:]:
        if kind + BASELINE in summary:
            (rate, cpu), (base_rate, base_cpu) = summary[kind], summary[kind + BASELINE]
            name = runs[kind][0].name
            print(f"{name} / its baseline: {rate / base_rate:.2f}x the rate, {cpu / base_cpu:.2f}x the CPU")


if __name__ == "__main__":
    main()
