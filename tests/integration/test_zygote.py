"""The suite's forked `pigeon` processes (tests/support/zygote.py) behave as the `python -m
pigeon` they stand in for, or every test started through them would prove less."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess


def _exec(args: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pigeon", *args]
    done: subprocess.CompletedProcess[str]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, **options)
    return done


def test_a_forked_command_prints_exits_and_reads_stdin_as_an_executed_one(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text("[smtp]\nlisten = 'nowhere'\n")
    for args in (["--version"], ["serve", "--check", "-c", "pigeon.toml"], ["no-such-command"]):
        forked, executed = zygote.run(args, text=True, cwd=tmp_path), _exec(args, cwd=tmp_path)
        assert (forked.returncode, forked.stdout, forked.stderr) == (
            executed.returncode, executed.stdout, executed.stderr,
        ), args  # fmt: skip
    assert zygote.run(["serve", "--check", "-c", "pigeon.toml"], cwd=tmp_path).returncode == 2


def test_a_forked_command_sees_the_environment_it_is_given() -> None:
    # argparse wraps the help at the terminal width COLUMNS says.
    shown = {}
    for columns in ("40", "200"):
        environment = {**os.environ, "COLUMNS": columns}
        forked = zygote.run(["top", "--help"], text=True, env=environment)
        assert forked.stdout == _exec(["top", "--help"], env=environment).stdout
        shown[columns] = forked.stdout
    assert shown["40"] != shown["200"]


def test_a_forked_node_runs_in_its_own_session_and_reports_how_it_ended(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node") as node:
        assert isinstance(node.process, zygote.ForkedProcess)
        pid = node.process.pid
        assert os.getpgid(pid) == os.getsid(pid) == pid
        assert Path(f"/proc/{pid}/cwd").resolve() == node.root.resolve()
        assert node.process.poll() is None
        os.kill(pid, signal.SIGKILL)
        assert node.process.wait(10) == -signal.SIGKILL
    node.start()
    assert node.stop() == 0


def test_a_forked_node_that_cannot_start_is_reported_when_it_exits_not_after_the_ready_wait(tmp_path: Path) -> None:
    # poll() read none of the zygote's reports of exits: a node refusing its configuration was
    # waited for as if starting (30 s), and then reported as not ready.
    node = PigeonProcess(tmp_path / "node", delivery={"no_such_key": 1})
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="pigeon exited with 2") as refused:
        node.start()
    assert time.monotonic() - started < 10
    assert "no_such_key" in str(refused.value)
    assert isinstance(node.process, zygote.ForkedProcess)
