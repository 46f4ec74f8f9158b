"""What a supervisor takes from the spool shards at its start (`NodeRules.gather`), and how a
node of one worker keeps the node's rules (`NodeRules.kept`): no file, or one that lacks a rule
a shard holds, is filled in; a rule the file ended, or one that ran out, stays out."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Literal

import msgspec
import pytest

from pigeon.node.standing import NodeRules, decode, gather_shard_rules
from pigeon.queue.rules import Rule, Selector
from pigeon.spool.shards import shard_directory
from pigeon.spool.sqlite import SqliteSpool

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


def test_rules_an_older_pigeon_kept_in_every_shard_are_said_once_each_as_an_upgrade(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Pigeon before the node's rules file kept each rule in every shard: an upgrade, said once
    per rule with the shards that hold it, not a warning that one shard alone had it."""
    root = tmp_path / "spool"

    async def stored_in_both_shards() -> None:
        for shard in (0, 1):
            spool = SqliteSpool(shard_directory(root, shard), shard=shard)
            spool.open(asyncio.get_running_loop())
            try:
                rule = _rule("held")
                await spool.save_rule(rule.id, msgspec.msgpack.encode(rule))
            finally:
                spool.close()

    asyncio.run(stored_in_both_shards())
    rules = NodeRules(root / "admin-rules.json")
    with caplog.at_level(logging.INFO, logger="pigeon.node.standing"):
        gather_shard_rules(rules, root, NOW)
    said = [r for r in caplog.records if "held.test" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    assert "kept by shards 0, 1 (a Pigeon before this one kept no admin-rules.json)" in said[0].getMessage()
    assert sorted(decode((root / "admin-rules.json").read_bytes()).in_force) == ["held"]
