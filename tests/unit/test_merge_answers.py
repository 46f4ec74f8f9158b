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
