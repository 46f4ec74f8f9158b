"""Each resume of a suspension is a row of its own in the operations' progress, in time order,
with what it made due. A suspension until resumed is named by its selector, so suspending the
same mail again makes the same id; each resume was stored under it, over the one before:
`pigeon queue operations` listed one row, the last resume's counts, where the first one was."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.test_admin import _api, _cli, _node, _send
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, wait_until


def _held(pigeon: PigeonProcess, ids: list[str]) -> bool:
    return all(_api(pigeon, "GET", f"/api/v1/messages/{i}")[1]["suspended_by"] for i in ids)


@pytest.mark.parametrize("workers", [1, 2])
def test_each_resume_of_a_suspension_is_listed_with_what_it_made_due(tmp_path: Path, workers: int) -> None:
    with ScriptedSink() as sink, _node(tmp_path / "node", sink, workers=workers) as pigeon:
        rule_ids, delivered = [], 0
        for count in (3, 1, 2):  # three suspend/resume cycles of the same selector
            status, answer = _api(pigeon, "POST", "/api/v1/admin/suspend", {"domain": "held.test"})
            assert status == 200, answer
            rule_ids.append(answer["rule"]["id"])
            ids = _send(pigeon, ["ok@held.test"], count=count)
            wait_until(lambda ids=ids: _held(pigeon, ids))
            status, answer = _api(pigeon, "DELETE", f"/api/v1/admin/suspend/{rule_ids[-1]}")
            assert (status, answer["made_due"]) == (200, count), answer
            delivered += count
            sink.wait_for(delivered)
            time.sleep(0.05)  # (their start times apart)
        (rule_id,) = set(rule_ids)  # the same id each time: named by what it holds
        status, progress = _api(pigeon, "GET", "/api/v1/admin/operations")
        resumes = [row for row in progress["operations"] if row["kind"] == "resume"]
        assert [(row["operation"], row["acted_on"], row["running"]) for row in resumes] == [
            (rule_id, 3, 0),
            (rule_id, 1, 0),
            (rule_id, 2, 0),
        ], progress
        assert [row["started"] for row in resumes] == sorted(row["started"] for row in resumes)
        # What the operator reads: a row per resume, in that order.
        listed = _cli("queue", "operations", "-c", str(pigeon.config_path)).stdout.splitlines()
        rows = [line.split() for line in listed if line.startswith(rule_id)]
        assert [(row[1], row[3]) for row in rows] == [("resume", "3"), ("resume", "1"), ("resume", "2")], listed
