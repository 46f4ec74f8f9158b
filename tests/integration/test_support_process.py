"""The test harness's PigeonProcess leaves no node running behind a test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.process import PigeonProcess


def test_a_running_pigeon_process_refuses_a_second_start_and_one_node_stops_on_exit(tmp_path: Path) -> None:
    node = PigeonProcess(tmp_path / "node")
    with node:
        assert node.process is not None
        first = node.process
        with pytest.raises(RuntimeError, match="already running"):
            node.start()
        assert node.process is first
    assert first.poll() is not None
