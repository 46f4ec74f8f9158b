"""The README's command that tells which compiled modules an install has works whether they
were built or not: it used to import them, a ModuleNotFoundError traceback without them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path


def test_the_readme_check_of_the_compiled_modules_names_each_compiled_or_python() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    (command,) = re.findall(r"`(\.venv/bin/python -c '[^']*find_spec[^']*')`", readme)
    argv = shlex.split(command)
    assert argv[0] == ".venv/bin/python"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    result = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [
        "pigeon.smtp._scan",
        "pigeon.inbound.targets._maildir",
        "pigeon.listener.smtp",
    ]
    assert all(line.split()[1] in ("compiled", "Python") for line in lines), lines
