"""Coverage-guided fuzzing (atheris, libFuzzer) of the SMTP server and client sessions, the
MIME writer, the config loader and IMAP response handling: a few seconds each in the default
run, five minutes each with `-m slow`. A crash fails the test with the input that caused it
(saved under the test's tmp_path); each one found so far is a named regression test next to
the code's unit tests.

Each target runs in its own process (`tests.fuzz.atheris_run`): libFuzzer owns the process
it fuzzes in.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

TARGETS = ["smtp_server", "smtp_client", "mime_roundtrip", "config_loader", "imap_responses"]
_DONE = re.compile(rb"Done (\d+) runs in (\d+) second")


def _fuzz(target: str, seconds: int, tmp_path: Path) -> None:
    crashes = tmp_path / "crashes"
    crashes.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.atheris_run", target, f"-max_total_time={seconds}", "-seed=1",
         f"-artifact_prefix={crashes}/", "-print_final_stats=1"],
        # (TMPDIR: what a target makes in a temporary directory, config_loader's file, goes with
        # the test's; libFuzzer ends the process without running its atexit clean-up.)
        capture_output=True, timeout=seconds + 120, env={**os.environ, "PYTHONHASHSEED": "0", "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    found = sorted(crashes.iterdir())
    assert done.returncode == 0 and not found, (found, done.stderr.decode(errors="replace")[-4000:])
    runs = _DONE.search(done.stderr)
    assert runs is not None, done.stderr.decode(errors="replace")[-2000:]
    print(f"{target}: {int(runs.group(1))} runs in {int(runs.group(2))} s")


@pytest.mark.parametrize("target", TARGETS)
def test_fuzzing_for_a_few_seconds_finds_no_crash(target: str, tmp_path: Path) -> None:
    _fuzz(target, 4, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_fuzzing_for_five_minutes_finds_no_crash(target: str, tmp_path: Path) -> None:
    _fuzz(target, 300, tmp_path)
