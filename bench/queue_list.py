"""`pigeon queue list` (GET /api/v1/messages) over a large deferred queue: the time a page takes.

    .venv/bin/python bench/queue_list.py [--messages 100000] [--spool DIR] [--keep DIR]

Writes the deferred messages as bench/deferred.py does (shard 0, 20,000 domains, 100 tenants,
10 campaigns), starts a node with delivery on, and times, through the API as a client sees it:
the first page of 100 and of 1,000, a page 50 pages in (followed by its cursors), a page of a
filter that matches one message in about 20,000 (domain, read as far as the per-page budget),
a state filter. Meanwhile it asks /healthz over and over and says the slowest answer: how long
a page holds the worker's event loop.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from deferred import populate
from harness import Pigeon, workdir

TOKEN = "bench-token-0123456789"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--spool", type=Path, help="a spool root written by an earlier run (--keep)")
    parser.add_argument("--keep", type=Path, help="write the spool root here, and keep it")
    args = parser.parse_args()
    with workdir("queue-list") as path:
        spool = args.spool or args.keep or path / "spool"
        if args.spool is None:
            print(f"writing {args.messages:,} deferred messages: {populate(spool, args.messages, 2048):.0f}s")
        tokens = [{"name": "bench", "token": TOKEN, "scopes": ["read"]}]
        node = Pigeon(
            path,
            1,
            spool={"path": str(spool)},
            delivery={"enabled": True},
            http={"token": tokens},
            route=[{"domain": "*", "next_hop": "127.0.0.1:9", "tls": "disabled"}],
        )
        try:
            run(node)
        finally:
            node.stop()


def run(node: Pigeon) -> None:
    process = node.process

    def page(query: str) -> tuple[float, dict[str, Any]]:
        started = time.perf_counter()
        status, answer = process.http_call("GET", f"/api/v1/messages?{query}", None, TOKEN)
        assert status == 200, answer
        return time.perf_counter() - started, answer

    slowest = [0.0]
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            process.http_get("/healthz")
            slowest[0] = max(slowest[0], time.perf_counter() - started)
            time.sleep(0.01)

    def timed(label: str, query: str, rounds: int = 5) -> dict[str, Any]:
        times = []
        answer: dict[str, Any] = {}
        for _ in range(rounds):
            took, answer = page(query)
            times.append(took)
        print(f"  {label:44} {statistics.median(times) * 1000:7.1f} ms  ({len(answer['messages'])} listed)")
        return answer

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    time.sleep(3)
    print(f"  slowest /healthz answer in 3 s at rest: {slowest[0] * 1000:.0f} ms")
    slowest[0] = 0.0
    try:
        timed("first page of 100", "limit=100")
        timed("first page of 1000", "limit=1000")
        after = ""
        started = time.perf_counter()
        for _ in range(50):
            _, answer = page(f"limit=100{after}")
            after = f"&after={answer['next']}"
        print(f"  {'50 pages of 100, each after the last':44} {(time.perf_counter() - started) * 20:7.1f} ms a page")
        timed("page 51 of 100", f"limit=100{after}")
        timed("--domain d7.example (1 in 20,000)", "domain=d7.example&limit=100")
        timed("--tenant tenant7 --campaign c3 (1 in 1,000)", "tenant=tenant7&campaign=c3&limit=100")
        timed("--state due (none)", "state=due&limit=100")
    finally:
        stop.set()
        prober.join()
    print(f"  slowest /healthz answer meanwhile: {slowest[0] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
