"""The node's /metrics, added up from its workers': counters that never go back.

Each worker process counts from 0, and a counter that goes back reads to Prometheus as a reset
(rate() spikes). So the supervisor keeps, per worker slot, what it last read from the slot's
process (`answered`). When that process ends (`ended`; or a reading comes from another process),
its cumulative samples (counters; histogram buckets, counts and sums) are carried: added to
what the slot's next processes count, for as long as the supervisor runs. A worker that does
not answer a scrape is served from its last reading: its cumulative samples as they were, its
gauges left out (what a hung or restarting process holds open or queued is not known: absent
rather than stale). `pigeon_workers_answered` says how many workers the answer's gauges are of.

BUGS: what a process counted after the last reading of it is lost with it: the node's counters
do not go back, but they miss that much. The supervisor's own restart starts them all at 0.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from pigeon.node.answers import (
    Exposition,
    Family,
    cap_labels,
    cumulative,
    merge_expositions,
    parse_exposition,
    render_exposition,
)


@dataclass
class _Reading:
    pid: int
    exposition: Exposition


class Tally:
    """What the workers of one node have counted, across their processes."""

    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._last: list[_Reading | None] = [None] * workers
        self._carried: list[Exposition] = [{} for _ in range(workers)]
        self._labelled: dict[str, set[str]] = {}  # queues and sites with a series of their own (`cap_labels`)

    def answered(self, worker: int, pid: int, text: str) -> None:
        """Worker `worker`'s process `pid` answered /metrics with `text` (raises ValueError if it
        is no exposition). Call it only while that process runs: a process that has `ended` must
        not be read again."""
        exposition = parse_exposition(text)
        last = self._last[worker]
        if last is not None and last.pid != pid:
            self._carry(worker)  # its process ended unnoticed
        self._last[worker] = _Reading(pid, exposition)

    def ended(self, worker: int, pid: int) -> None:
        """Worker `worker`'s process `pid` has ended: what it counted is carried."""
        last = self._last[worker]
        if last is not None and last.pid == pid:
            self._carry(worker)

    def exposition(self, answering: Collection[int]) -> str:
        """The node's exposition: the workers in `answering` as they answered just now, the others
        as they last did (counters only), and every worker's carried counters."""
        parts: list[Exposition] = []
        for worker in range(self._workers):
            last = self._last[worker]
            if last is not None:
                parts.append(last.exposition if worker in answering else cumulative(last.exposition))
            parts.append(self._carried[worker])
        merged = cap_labels(merge_expositions(parts), self._labelled)
        _gauge(merged, "pigeon_workers", "Worker processes of the node ([node] workers)", self._workers)
        _gauge(
            merged,
            "pigeon_workers_answered",
            "Workers that answered this scrape: the others' counters are as they last answered, their gauges "
            "are left out",
            len(answering),
        )
        return render_exposition(merged)

    def _carry(self, worker: int) -> None:
        last = self._last[worker]
        assert last is not None
        self._carried[worker] = merge_expositions([self._carried[worker], cumulative(last.exposition)])
        self._last[worker] = None


def _gauge(exposition: Exposition, name: str, doc: str, value: float) -> None:
    exposition[name] = Family("gauge", doc, {(name, ()): float(value)})
