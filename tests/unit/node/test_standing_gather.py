"""What a supervisor takes from the spool shards at its start (`NodeRules.gather`), and how a
node of one worker keeps the node's rules (`NodeRules.kept`): no file, or one that lacks a rule
a shard holds, is filled in; a rule the file ended, or one that ran out, stays out."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pigeon.node.standing import NodeRules, decode
from pigeon.queue.rules import Rule, Selector

NOW = 1_000_000.0


def _rule(rule_id: str, kind: Literal["bounce", "suspend"] = "suspend", expires: float | None = None) -> Rule:
    return Rule(rule_id, kind, Selector(domain=f"{rule_id}.test"), NOW - 60, expires=expires)


def test_gather_takes_what_the_file_knows_nothing_of_and_leaves_what_it_ended(tmp_path: Path) -> None:
    rules = NodeRules(tmp_path / "admin-rules.json")
    rules.kept(_rule("ended"), True)
    rules.kept(_rule("ended"), False)  # a resume: its tombstone
    rules.kept(_rule("known", "bounce", NOW + 60), True)
    shards = [
        (0, _rule("unknown")),
        (1, _rule("ended")),  # a worker that missed the resume
        (1, _rule("known", "bounce", NOW + 60)),
        (0, _rule("ran-out", "bounce", NOW - 1)),
    ]
    taken = rules.gather(shards, NOW)
    assert [(shard, rule.id) for shard, rule in taken] == [(0, "unknown")]
    assert rules.save(NOW) is None
    kept = decode((tmp_path / "admin-rules.json").read_bytes())
    assert sorted(kept.in_force) == ["known", "unknown"]
    assert list(kept.ended) == ["ended"]
    assert kept.ended["ended"].kind == "suspend"
    assert kept.changed["unknown"] > kept.changed["known"]  # a change numbered after the others


def test_a_rule_kept_again_after_its_end_is_in_force_and_an_end_keeps_its_expiry(tmp_path: Path) -> None:
    rules = NodeRules(tmp_path / "admin-rules.json")
    bounce = _rule("b", "bounce", NOW + 3600)
    rules.kept(bounce, True)
    rules.kept(bounce, False)
    assert rules.standing.ended["b"].until == NOW + 3600  # dropped from the file once it would have ended
    rules.kept(bounce, True)
    assert "b" in rules.standing.in_force and "b" not in rules.standing.ended
