"""The node's counters do not go back when a worker process ends and another takes its place,
nor when a worker does not answer: what it counted stays in the sum (`pigeon.node.tally`)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pigeon.metrics import MAX_QUEUE_LABELS, MAX_SITE_LABELS, MAX_SOURCE_LABELS, Metrics
from pigeon.node.tally import Tally


def worker(received: int, connections: int = 0, commits: int = 0) -> str:
    """A worker's exposition, as its process counted so far."""
    metrics = Metrics()
    metrics.counts.messages_received = received
    metrics.rejections.labels("RCPT", "550").inc(received)
    for _ in range(commits):
        metrics.observe_commit(1, 0.001)
    metrics.track_smtp_connections(lambda: connections)
    return generate_latest(metrics.registry).decode()


def value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def test_a_restarted_workers_counters_add_to_what_its_last_process_counted() -> None:
    tally = Tally(2)
    tally.answered(0, 100, worker(108, connections=3))
    tally.answered(1, 200, worker(106, connections=2, commits=4))
    before = tally.exposition({0, 1})
    assert value(before, "pigeon_messages_received_total") == 214

    tally.ended(1, 200)  # kill -9: its process is gone, a new one counts from 0
    tally.answered(0, 100, worker(110, connections=3))
    tally.answered(1, 201, worker(1, connections=1, commits=1))
    after = tally.exposition({0, 1})

    assert value(after, "pigeon_messages_received_total") == 110 + 106 + 1
    assert value(after, "pigeon_rejections_total", command="RCPT", code="550") == 110 + 106 + 1
    assert value(after, "pigeon_spool_commit_batch_size_count") == 5
    assert value(after, "pigeon_spool_commit_batch_size_bucket", le="1.0") == 5
    assert value(after, "pigeon_smtp_connections") == 4  # gauges: the live processes' only
    assert value(after, "pigeon_workers_answered") == 2
    assert value(after, "pigeon_workers") == 2


def test_a_new_process_that_answers_before_its_predecessor_is_known_ended_still_adds_up() -> None:
    tally = Tally(1)
    tally.answered(0, 100, worker(50))
    tally.answered(0, 101, worker(2))  # another pid: the one before ended unseen
    tally.ended(0, 100)  # said late: nothing counted twice
    assert value(tally.exposition({0}), "pigeon_messages_received_total") == 52


def test_a_worker_that_does_not_answer_keeps_its_last_counters_and_its_gauges_are_left_out() -> None:
    tally = Tally(2)
    tally.answered(0, 100, worker(108, connections=3))
    tally.answered(1, 200, worker(106, connections=2))
    tally.answered(0, 100, worker(109, connections=3))  # worker 1 stopped (SIGSTOP): no answer

    text = tally.exposition({0})

    assert value(text, "pigeon_messages_received_total") == 109 + 106
    assert value(text, "pigeon_smtp_connections") == 3
    assert value(text, "pigeon_workers_answered") == 1
    assert value(text, "pigeon_workers") == 2


def test_counters_never_go_back_whatever_the_workers_do() -> None:
    tally = Tally(2)
    pids, counted, shown = [100, 200], [0, 0], 0.0
    for step in range(60):
        index = step % 2
        if step % 7 == 3:
            tally.ended(index, pids[index])
            pids[index] += 1
            counted[index] = 0
        counted[index] += step
        answering = {index} if step % 5 else {0, 1}
        for w in answering:
            tally.answered(w, pids[w], worker(counted[w]))
        now = value(tally.exposition(answering), "pigeon_messages_received_total")
        assert now is not None and now >= shown
        shown = now


def _by_queue(text: str, family_name: str = "pigeon_queue_recipients", label: str = "queue") -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == family_name:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    values[sample.labels[label]] = values.get(sample.labels[label], 0.0) + sample.value
    return values


def test_the_node_shows_at_most_max_queue_labels_queues_sites_and_sources_however_many_workers_saw() -> None:
    # Found from outside: the cap was each worker's, on (outcome, queue) pairs, and the node
    # showed their sum: 1,200 tenants gave 1,422 queue values and no `_other`.
    tally = Tally(2)
    for index in range(2):
        metrics = Metrics()
        for n in range(index * 300, index * 300 + 900):  # 900 each, 1,200 in all
            metrics.counts.outcome("Delivery", f"t{n}@example.com", f"mx{n}.example.com", source=f"ip-{n}")
        tally.answered(index, 100 + index, generate_latest(metrics.registry).decode())
    first = tally.exposition({0, 1})
    for family, label, cap in (
        ("pigeon_queue_recipients", "queue", MAX_QUEUE_LABELS),
        ("pigeon_site_recipients", "site", MAX_SITE_LABELS),
        ("pigeon_source_recipients", "source", MAX_SOURCE_LABELS),  # (sources renamed by reloads)
    ):
        shown = _by_queue(first, family, label)
        assert len(shown) == cap + 1 and "_other" in shown
        assert sum(shown.values()) == 2 * 900  # nothing lost: the rest counted as `_other`

    # A queue keeps its own series from one scrape to the next, whatever workers count later.
    metrics = Metrics()
    metrics.counts.outcome("Delivery", "a-new-queue-that-sorts-first", "mx.example.com")
    tally.answered(0, 102, generate_latest(metrics.registry).decode())  # worker 0 restarted
    second = _by_queue(tally.exposition({0, 1}))
    assert "a-new-queue-that-sorts-first" not in second
    assert second.keys() == _by_queue(first).keys()
    assert second["_other"] == _by_queue(first)["_other"] + 1


def test_a_worker_keeps_max_queue_labels_queues_whatever_their_outcomes() -> None:
    metrics = Metrics()
    for n in range(MAX_QUEUE_LABELS):
        for outcome in ("Delivery", "TransientFailure", "Bounce"):
            metrics.counts.outcome(outcome, f"t{n}@example.com", "mx.example.com")
    metrics.counts.outcome("Delivery", "one-too-many@example.com", "mx.example.com")
    shown = _by_queue(generate_latest(metrics.registry).decode())
    assert len(shown) == MAX_QUEUE_LABELS + 1 and shown["_other"] == 1
