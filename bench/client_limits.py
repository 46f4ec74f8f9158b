"""What node-wide per-client limits cost: connections accepted per second, against the code before.

    .venv/bin/python bench/client_limits.py --baseline-src /tmp/before/src [--rounds 5]

(`git worktree add /tmp/before <commit>`, or `git archive <commit> | tar -x -C /tmp/before`.)

Load: `smtp-source -s 20 -m 5000` (20 sessions, one message, so one connection, each) into a
node of `--workers` (2) workers, from 127.0.0.1, which is kept out of `relay_networks` so that
every connection is counted against `max_connections_per_client` (the mail goes to
`<postmaster>`, which anyone may send to). With several workers the count is kept in the
workers' shared client table: a lock and a few reads and writes when a connection opens and
again when it closes. Each round runs both trees, alternately, on fresh spools; it prints
connections per second and CPU milliseconds per connection (the node's process tree), then the
medians and the median of the per-round ratios this tree / baseline.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness import Pigeon, median, smtp_source, tree_cpu_seconds, workdir

SECTIONS: dict[str, object] = {"smtp": {"relay_networks": ["192.0.2.0/24"]}}


def one_run(source: Path | None, args: argparse.Namespace) -> tuple[float, float]:
    """(connections per second, CPU ms per connection)."""
    with workdir("client-limits-") as path:
        mta = Pigeon(path, args.workers, source=source, **SECTIONS)
        try:
            smtp_source(mta.port, "-s", "5", "-m", "200", "-f", "w@src.test", "-t", "postmaster")  # warm up
            cpu_before = tree_cpu_seconds(mta.root_pid())
            started = time.monotonic()
            smtp_source(mta.port, "-s", "20", "-m", str(args.messages), "-f", "a@src.test", "-t", "postmaster")
            elapsed = time.monotonic() - started
            cpu = tree_cpu_seconds(mta.root_pid()) - cpu_before
        finally:
            mta.stop()
    return args.messages / elapsed, 1000 * cpu / args.messages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-src", type=Path, required=True, help="the `src` of the code to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    trees: dict[str, Path | None] = {"baseline": args.baseline_src.resolve(), "this": None}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    for round_number in range(args.rounds):
        order = ("baseline", "this") if round_number % 2 == 0 else ("this", "baseline")
        this_round: dict[str, tuple[float, float]] = {}
        for name in order:
            rate, cpu = this_round[name] = one_run(trees[name], args)
            results[name].append(this_round[name])
            print(f"round {round_number + 1} {name:8}: {rate:7.0f} connections/s  {cpu:5.2f} CPU ms/connection",
                  flush=True)  # fmt: skip
        ratios.append(this_round["this"][0] / this_round["baseline"][0])
        cpu_ratios.append(this_round["this"][1] / this_round["baseline"][1])
    for name, runs in results.items():
        print(f"median {name:8}: {median([r[0] for r in runs]):7.0f} connections/s  "
              f"{median([r[1] for r in runs]):5.2f} CPU ms/connection")  # fmt: skip
    print(
        f"this / baseline: {median(ratios):.3f}x connections per second, "
        f"{median(cpu_ratios):.3f}x CPU per connection (medians of {args.rounds} per-round ratios)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
