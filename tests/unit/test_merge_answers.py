"""Answers of several workers (or nodes) added up into one, as `queue summary` shows them."""

from __future__ import annotations

from pigeon.node.answers import merge_answers


def test_a_ready_queue_seen_by_two_workers_adds_their_counts_and_lists_each_effect_once() -> None:
    suspend = {"id": "e1", "rule": "gmail-421", "action": "suspend", "expires_at": 100.0}
    limit = {"id": "e2", "rule": "slow", "action": "limit", "expires_at": 90.0, "connection_limit": 1}
    one = {"scheduled": [], "ready": [{"path": "default->mx.a", "queued": 3, "connections": 1, "effects": [suspend]}]}
    two = {
        "scheduled": [],
        "ready": [{"path": "default->mx.a", "queued": 2, "connections": 0, "effects": [suspend, limit]}],
    }
    status, merged = merge_answers([(200, one), (200, two)])
    assert status == 200
    [row] = merged["ready"]
    assert (row["queued"], row["connections"]) == (5, 1)
    assert [effect["id"] for effect in row["effects"]] == ["e1", "e2"]


def test_operations_of_several_nodes_read_oldest_first_whatever_their_ids() -> None:
    # Operation ids are random: sorted by them, "recent operations" read out of order.
    def op(operation: str, started: float) -> dict[str, object]:
        return {"operation": operation, "kind": "retry", "started": started, "matched": 1, "acted": 1}

    a = {"operations": [op("df7c", 10.0), op("0689", 40.0)]}
    b = {"operations": [op("54dd", 30.0), op("0689", 41.0), op("5cf1", 50.0)]}
    status, merged = merge_answers([(200, a), (200, b)])
    assert status == 200
    assert [row["operation"] for row in merged["operations"]] == ["df7c", "54dd", "0689", "5cf1"]
    assert next(r for r in merged["operations"] if r["operation"] == "0689")["started"] == 40.0


def test_a_site_one_worker_found_down_reads_down_for_the_node() -> None:
    # Each worker finds a dead site by itself: the first to answer may not have yet.
    up = {"scheduled": [], "ready": [{"path": "default->mx.a", "queued": 0, "connections": 0, "down": False}]}
    down = {"scheduled": [], "ready": [{"path": "default->mx.a", "queued": 0, "connections": 0, "down": True}]}
    for answers in ([up, down], [down, up]):
        _, merged = merge_answers([(200, answer) for answer in answers])
        [row] = merged["ready"]
        assert row["down"] is True


def test_an_id_one_worker_found_reads_as_that_workers_word_whichever_answered_first() -> None:
    # Every worker says of every id it was asked: not_found of those another worker holds.
    found = [{"id": "a", "result": "bounced", "recipients": 2}, {"id": "b", "result": "not_found"}]
    other = [{"id": "a", "result": "not_found"}, {"id": "b", "result": "not_found"}]
    for answers in ([found, other], [other, found]):
        status, merged = merge_answers(
            [(200, {"bounced": n, "messages": rows}) for n, rows in zip((1, 0), answers, strict=True)]
        )
        assert status == 200
        assert merged["messages"] == [
            {"id": "a", "result": "bounced", "recipients": 2},
            {"id": "b", "result": "not_found"},
        ]
