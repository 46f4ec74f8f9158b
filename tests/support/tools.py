"""The independent SMTP clients the tests drive Pigeon with: swaks and Postfix's smtp-source."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SMTP_SOURCE = "/usr/sbin/smtp-source"


def require(tool: str) -> str:
    """The path of `tool`, or fail: CI must install every peer the tests use (see .ci/run)."""
    path = shutil.which(tool) or (tool if Path(tool).exists() else None)
    if path is None:
        pytest.fail(f"{tool} is not installed: run the test command from the README, which installs it")
    return path


def swaks(port: int, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run swaks against 127.0.0.1:port; output is the transcript (stdout + stderr)."""
    command = [require("swaks"), "--server", f"127.0.0.1:{port}", "--hide-informational", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def smtp_source(port: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = [require(SMTP_SOURCE), *args, f"127.0.0.1:{port}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
