"""The systemd unit in contrib/ is one systemd accepts, for the `pigeon` this venv installs."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import zygote
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


def _unit_values(section: str, key: str) -> list[str]:
    """Every value `key` has in `[section]` of the unit (systemd keys may repeat)."""
    values, current = [], None
    for line in UNIT.read_text().splitlines():
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section and line.startswith(f"{key}="):
            values.append(line.partition("=")[2])
    return values


def _serve(config: Path) -> subprocess.CompletedProcess[bytes]:
    return zygote.run(["serve", "-c", str(config)], timeout=60)


def test_the_unit_does_not_restart_a_node_refused_for_its_configuration_but_does_one_refused_for_a_busy_port(
    tmp_path: Path,
) -> None:
    """Found from outside: Restart=on-failure restarted a node with a wrong key every 5 s for
    ever. The exit statuses are `pigeon serve`'s own, as it exits for each."""
    prevented = {int(code) for value in _unit_values("Service", "RestartPreventExitStatus") for code in value.split()}
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[smtp]\nmax_mesage_size = "10MiB"\n')
    refused = _serve(wrong)
    assert refused.returncode != 0 and refused.returncode in prevented, refused.stderr
    with socket.socket() as taken:  # a port another program holds (a node on its way out): tried again
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = tmp_path / "busy.toml"
        busy.write_text(f'[smtp]\nlisten = ["127.0.0.1:{port}"]\n[spool]\npath = "spool"\n[log]\npath = "log"\n')
        failed = _serve(busy)
    assert failed.returncode != 0 and failed.returncode not in prevented, failed.stderr
    # And a node that keeps failing for other reasons is given up on, not started for ever.
    assert _unit_values("Service", "Restart") == ["on-failure"]
    (interval,) = _unit_values("Unit", "StartLimitIntervalSec")
    (burst,) = _unit_values("Unit", "StartLimitBurst")
    (delay,) = _unit_values("Service", "RestartSec")
    assert interval == "10min" and delay == "5s" and 0 < int(burst) < 600 / 5  # trips within the interval
