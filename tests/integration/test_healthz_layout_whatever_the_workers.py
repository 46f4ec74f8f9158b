"""/healthz has the same top-level components, each with its `status`, whatever the number of
workers: a probe reading `.log.status` or `.smtp.status` works on a node of one worker and on
one of several. Found from outside: with 2 workers the top level had `"smtp": {"connections":
0}` (no status) and no `log` at all (only inside `workers[]`)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.disks import fill, tmpfs
from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until
from tests.support.tools import smtp_source

COMPONENTS = {"spool", "smtp", "log", "config", "shaping"}
ONE_WORKERS_OWN = {"worker", "uptime"}  # a node of one worker is that worker: these are its own


def health(pigeon: PigeonProcess) -> dict[str, Any]:
    _, body = pigeon.http_get("/healthz")
    answer: dict[str, Any] = json.loads(body)
    return answer


def layout(answer: dict[str, Any]) -> dict[str, set[str]]:
    """Each component's keys (counts and status), the node's own ones left out."""
    return {name: set(value) for name, value in answer.items() if isinstance(value, dict)}


def test_the_top_level_components_and_their_keys_are_the_same_for_one_worker_and_two(tmp_path: Path) -> None:
    answers = []
    for workers in (1, 2):
        with PigeonProcess(
            tmp_path / f"node{workers}", node={"workers": workers}, delivery={"enabled": True}
        ) as pigeon:
            answer = health(pigeon)
        assert answer.keys() >= COMPONENTS, answer
        assert all(answer[name]["status"] == "ok" for name in COMPONENTS), answer
        answers.append(answer)
    one, two = answers
    assert set(one) - ONE_WORKERS_OWN == set(two) - {"workers"}
    assert layout(one) == layout({name: value for name, value in two.items() if name != "workers"})
    assert [w["log"]["status"] for w in two["workers"]] == ["ok", "ok"]


def test_a_worker_that_does_not_answer_is_named_as_uncounted_in_each_component_it_adds_to(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:
        stopped = pigeon.shard_owner(1)
        os.kill(stopped, signal.SIGSTOP)
        try:
            answer = health(pigeon)
        finally:
            os.kill(stopped, signal.SIGCONT)
    assert answer["status"] == "down" and answer["workers"][1]["status"] == "down"
    for name in ("spool", "smtp", "log"):
        assert answer[name]["status"] == "ok" and answer[name]["uncounted"] == [1], answer
    assert answer["config"] == {"status": "ok"}


@pytest.mark.root
def test_the_top_level_log_status_is_the_worst_of_the_workers(tmp_path: Path) -> None:
    # One worker's log cannot be written (its disk full): the node's `log` says degraded, with
    # that worker's error, whichever worker it is.
    with (
        tmpfs(tmp_path / "logdisk", "1m") as log_disk,
        PigeonProcess(tmp_path / "node", node={"workers": 2}, log={"path": str(log_disk / "log")}) as pigeon,
    ):
        filler = fill(log_disk)

        def one_degraded() -> dict[str, Any] | None:
            answer = health(pigeon)
            if "degraded" in [w["log"]["status"] for w in answer["workers"]]:
                return answer
            result = smtp_source(pigeon.smtp_port, "-m", "5", "-f", "a@src.test", "-t", "r@x.test")
            assert result.returncode == 0, result.stderr
            return None

        answer = wait_until(one_degraded, timeout=60)
        assert answer["log"]["status"] == "degraded", answer
        assert "No space left on device" in answer["log"]["error"]
        assert answer["log"]["pending"] == sum(w["log"]["pending"] for w in answer["workers"])
        filler.unlink()
        wait_until(lambda: health(pigeon)["log"]["status"] == "ok", timeout=30)
