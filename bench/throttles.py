"""What cluster-wide limits cost: relaying with throttles shared through Redis, against local ones.

    .venv/bin/python bench/throttles.py [--rounds 5] [--messages 5000] [--workers 1]

`smtp-source` -> Pigeon -> `smtp-sink`, end to end, as bench/relay.py does, with limits that
never bind (`max_message_rate = "100000/s"`, `connection_limit = 64`) so that what is measured
is the price of asking them. Each round runs both contenders, alternately, on fresh spools:

* local: limits held in the node (in memory for one worker, in the workers' shared table for
  several);
* shared: the same with `[redis] url`: connection leases and GCRA slots in a private Redis
  (started here, on loopback), a block of slots per round trip.

It prints each run's messages per second and CPU milliseconds per message (Pigeon's process
tree; Redis's own CPU apart), the Redis round trips per message of the shared runs, then the
medians and the median of the per-round ratios shared / local. Target: shared costs <= 15%.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness import Pigeon, free_port, median, timed_relay, warm_up, workdir
from harness import smtp_sink as sink
from tests.support.services import RedisServer


def one_run(kind: str, redis: RedisServer, args: argparse.Namespace) -> tuple[float, float, float]:
    """(messages/s, CPU ms per message, Redis round trips per message)."""
    sink_port = free_port()
    sections: dict[str, object] = {
        "delivery": {"enabled": True, "retry_interval": "1s", "max_retry_interval": "2s", "connection_limit": 64,
                     "max_message_rate": "100000/s"},
        "route": [{"domain": "*", "next_hop": f"127.0.0.1:{sink_port}", "tls": "disabled"}],
    }  # fmt: skip
    if kind == "shared":
        sections["redis"] = {"url": redis.url, "key_prefix": f"bench{time.monotonic_ns()}"}
    with workdir(f"throttles-{kind}-") as path:
        warm = sink(sink_port, 200)
        mta = Pigeon(path, args.workers, **sections)
        try:
            warm_up(mta.port, warm, args.size)
            calls_before = _calls(mta)
            rate, cpu = timed_relay(mta.port, mta.root_pid(), sink_port, args.size, args.sessions, args.messages)
            calls = _calls(mta) - calls_before
        finally:
            mta.stop()
    return rate, cpu, calls / args.messages


def _calls(mta: Pigeon) -> float:
    try:
        return mta.process.metric("pigeon_shaping_redis_calls_total")
    except KeyError:
        return 0.0  # local limits: no Redis


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, float]]] = {"local": [], "shared": []}
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    with workdir("throttles-redis-") as root, RedisServer(Path(root) / "redis") as redis:
        for round_number in range(args.rounds):
            order = ("local", "shared") if round_number % 2 == 0 else ("shared", "local")
            this_round: dict[str, tuple[float, float, float]] = {}
            for kind in order:
                rate, cpu, calls = this_round[kind] = one_run(kind, redis, args)
                results[kind].append(this_round[kind])
                print(f"round {round_number + 1} {kind:6}: {rate:7.0f} msg/s  {cpu:5.2f} CPU ms/msg  "
                      f"{calls:6.3f} Redis round trips/msg", flush=True)  # fmt: skip
            ratios.append(this_round["shared"][0] / this_round["local"][0])
            cpu_ratios.append(this_round["shared"][1] / this_round["local"][1])
    for kind, runs in results.items():
        print(f"median {kind:6}: {median([r[0] for r in runs]):7.0f} msg/s  {median([r[1] for r in runs]):5.2f} "
              f"CPU ms/msg  {median([r[2] for r in runs]):6.3f} Redis round trips/msg")  # fmt: skip
    cost = 1 - median(ratios)
    print(
        f"shared / local: {median(ratios):.3f}x throughput (cost {cost:+.1%}), "
        f"{median(cpu_ratios):.3f}x CPU per message (medians of {args.rounds} per-round ratios)"
    )
    return 0 if cost <= 0.15 else 1


if __name__ == "__main__":
    sys.exit(main())
