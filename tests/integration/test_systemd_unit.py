"""The systemd unit in contrib/ is one systemd accepts, for the `pigeon` this venv installs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.process import ROOT

UNIT = ROOT / "contrib" / "systemd" / "pigeon.service"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_finds_nothing_to_say_about_the_unit(tmp_path: Path) -> None:
    pigeon = Path(sys.executable).parent / "pigeon"
    assert pigeon.exists()
    # verify checks that ExecStart's program exists: this venv's, not /opt/pigeon's.
    text = UNIT.read_text().replace("/opt/pigeon/.venv/bin/pigeon", str(pigeon))
    assert text != UNIT.read_text()
    unit = tmp_path / "pigeon.service"
    unit.write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert str(unit) not in result.stderr + result.stdout  # warnings name the file and still exit 0
