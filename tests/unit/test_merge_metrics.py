"""/metrics of a node with several workers: the supervisor adds up what each worker exposes,
so a scrape sees one node, with the same families and types a single worker would show."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pigeon.metrics import MAX_QUEUE_LABELS, LogState, Metrics
from pigeon.node.answers import merge_metrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def exposition(metrics: Metrics) -> str:
    return generate_latest(metrics.registry).decode()


def samples(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def family_types(text: str) -> dict[str, str]:
    """Metric family name -> type, for families that have samples."""
    return {family.name: family.type for family in text_string_to_metric_families(text) if family.samples}


def two_workers() -> tuple[Metrics, Metrics]:
    first, second = Metrics(), Metrics()
    first.counts.messages_received = 3
    first.counts.bytes_received = 3000
    first.counts.receptions["smtp"] = 2
    first.counts.smtp_connections_accepted = 5
    first.rejections.labels("RCPT", "550").inc()
    first.observe_commit(3, 0.0004)
    first.observe_commit(1, 0.003)
    first.track_spool(lambda: 10)

    second.counts.messages_received = 4
    second.counts.bytes_received = 500
    second.counts.receptions.update(smtp=5, submission=1)
    second.rejections.labels("RCPT", "550").inc(2)
    second.rejections.labels("DATA", "554").inc()
    second.observe_commit(40, 0.3)
    second.track_spool(lambda: 7)
    return first, second


def test_counters_and_gauges_of_all_workers_add_up() -> None:
    first, second = two_workers()
    merged = samples(merge_metrics([exposition(first), exposition(second)]))

    assert merged[("pigeon_messages_received_total", ())] == 7
    assert merged[("pigeon_bytes_received_total", ())] == 3500
    assert merged[("pigeon_smtp_connections_accepted_total", ())] == 5
    assert merged[("pigeon_receptions_total", (("listener", "smtp"),))] == 7
    assert merged[("pigeon_receptions_total", (("listener", "submission"),))] == 1
    assert merged[("pigeon_rejections_total", (("code", "550"), ("command", "RCPT")))] == 3
    assert merged[("pigeon_rejections_total", (("code", "554"), ("command", "DATA")))] == 1
    assert merged[("pigeon_spool_messages", ())] == 17


def test_histogram_buckets_counts_and_sums_add_up() -> None:
    first, second = two_workers()
    merged = samples(merge_metrics([exposition(first), exposition(second)]))

    def bucket(name: str, le: str) -> float:
        return merged[(f"{name}_bucket", (("le", le),))]

    batch = "pigeon_spool_commit_batch_size"
    assert [bucket(batch, le) for le in ("1.0", "2.0", "4.0", "32.0", "64.0", "+Inf")] == [1, 1, 2, 2, 3, 3]
    assert merged[(f"{batch}_count", ())] == 3
    assert merged[(f"{batch}_sum", ())] == 44
    seconds = "pigeon_spool_commit_seconds"
    assert [bucket(seconds, le) for le in ("0.0005", "0.005", "0.25", "0.5", "+Inf")] == [1, 2, 2, 3, 3]
    assert merged[(f"{seconds}_count", ())] == 3
    assert merged[(f"{seconds}_sum", ())] == pytest.approx(0.3034)


def test_every_sample_of_each_worker_is_in_the_merge_and_created_keeps_the_earliest() -> None:
    first, second = two_workers()
    texts = [exposition(first), exposition(second)]
    one, two = samples(texts[0]), samples(texts[1])
    merged = samples(merge_metrics(texts))

    assert set(merged) == set(one) | set(two)
    created = [key for key in merged if key[0].endswith("_created")]
    assert created
    for key in created:
        assert merged[key] == min(value for value in (one.get(key), two.get(key)) if value is not None)
    # the first worker's Metrics was made first: its creation times win where both have them
    assert all(merged[key] == one[key] for key in created if key in one)


def test_single_worker_merge_changes_no_value() -> None:
    first, _ = two_workers()
    text = exposition(first)
    assert samples(merge_metrics([text])) == samples(text)


def test_merged_text_parses_as_prometheus_exposition() -> None:
    first, second = two_workers()
    merged = merge_metrics([exposition(first), exposition(second)])

    assert merged.endswith("\n")
    families = list(text_string_to_metric_families(merged))
    assert families
    assert "pigeon_spool_commit_batch_size" in {family.name for family in families}
    histogram = family_types(merged)
    assert histogram["pigeon_spool_commit_batch_size"] == "histogram"
    assert histogram["pigeon_spool_messages"] == "gauge"


def test_merged_counters_are_still_counters() -> None:
    first, second = two_workers()
    single = family_types(exposition(first))
    merged = family_types(merge_metrics([exposition(first), exposition(second)]))

    assert single["pigeon_messages_received"] == "counter"
    assert merged == single


def test_log_failing_is_0_or_1_for_the_node_however_many_workers_fail() -> None:
    # Found from outside: 2.0 on a 2-worker node whose workers' logs both failed, though its
    # HELP says "1 while ...". The node's value is the highest of its workers'.
    def worker(failing: bool) -> str:
        metrics = Metrics()
        metrics.track_log(lambda: LogState(failing, 1, 0, 0, 0, 0))
        return exposition(metrics)

    for states, expected in (((True, True), 1), ((True, False), 1), ((False, False), 0)):
        merged = samples(merge_metrics([worker(failing) for failing in states]))
        assert merged[("pigeon_log_failing", ())] == expected
        assert merged[("pigeon_log_write_errors_total", ())] == 2  # counters still add up


def test_a_cluster_wide_sum_shows_at_most_max_queue_labels_queues() -> None:
    nodes = []
    for index in range(2):
        metrics = Metrics()
        for n in range(index * 600, index * 600 + 600):
            metrics.counts.outcome("Delivery", f"t{n:04d}@example.com", "mx.example.com")
        nodes.append(exposition(metrics))
    queues: dict[str, float] = {}
    for (name, labels), value in samples(merge_metrics(nodes)).items():
        if name == "pigeon_queue_recipients_total":
            queues[dict(labels)["queue"]] = value
    assert len(queues) == MAX_QUEUE_LABELS + 1
    assert queues["_other"] == 200 and sum(queues.values()) == 1200
    assert "t0999@example.com" in queues and "t1000@example.com" not in queues  # the first in sorted order
