"""A `[spool] path` or `[log] path` that cannot be made: the start names the key (exit 2, a
configuration error), and `pigeon serve --check` says so where it can tell without making it."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_cli import pigeon_cli

_LISTEN = '[smtp]\nlisten = ["127.0.0.1:0"]\n[http]\nlisten = "127.0.0.1:0"\n'


@pytest.mark.parametrize("key", ["spool", "log"])
def test_a_start_on_a_path_that_cannot_be_made_names_the_key_and_exits_2(tmp_path: Path, key: str) -> None:
    # Found from outside: it passed --check, then the start said `cannot start: [Errno 2] No such
    # file or directory: '/proc/newuser-log'` (exit 1, restarted by systemd), naming no key.
    made = Path(f"/proc/pigeon-test-{secrets.token_hex(4)}")  # (proc makes no directory, even for root)
    paths = {"spool": tmp_path / "spool", "log": tmp_path / "log", key: made}
    config = tmp_path / "pigeon.toml"
    config.write_text(f'[spool]\npath = "{paths["spool"]}"\n[log]\npath = "{paths["log"]}"\n{_LISTEN}')
    result = pigeon_cli("serve", "-c", str(config))
    assert result.returncode == 2, result.stderr
    line = 2 if key == "spool" else 4
    said = result.stderr.splitlines()[-1]  # (after the warning of running as root, as root)
    assert said.startswith(
        f"pigeon: cannot start: configuration error: {config}, line {line}: [{key}] path: {made} cannot be made: "
    ), result.stderr
    assert "Errno" not in result.stderr and "Traceback" not in result.stderr
    assert not made.exists()


@pytest.fixture
def closed(tmp_path: Path) -> Iterator[Path]:
    """A directory in which the user running the test cannot make one: read-only to it, or,
    for root (whom no mode stops), immutable (`chattr +i`)."""
    directory = tmp_path / "closed"
    directory.mkdir()
    if os.geteuid() != 0:
        directory.chmod(0o555)
        yield directory
        directory.chmod(0o755)
        return
    made = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"chattr +i: {made.stderr!r}")
    try:
        yield directory
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


@pytest.mark.parametrize("key", ["spool", "log"])
def test_serve_check_says_a_path_in_a_directory_closed_to_it_cannot_be_made_and_makes_nothing(
    tmp_path: Path, closed: Path, key: str
) -> None:
    wanted = closed / "var" / key
    config = tmp_path / "pigeon.toml"
    config.write_text(f'[{key}]\npath = "{wanted}"\n')
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.startswith(
        f"pigeon: configuration error: {config}, line 2: [{key}] path: {wanted} cannot be made: {closed} is not"
        " writable"
    ), result.stderr
    assert list(closed.iterdir()) == []


def test_serve_check_of_paths_still_to_be_made_in_a_writable_directory_says_ok_and_makes_nothing(
    tmp_path: Path,
) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text('[spool]\npath = "a/b/spool"\n[log]\npath = "a/c/log"\n')
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert (result.returncode, result.stdout) == (0, f"{config}: ok\n"), result.stderr
    assert not (tmp_path / "a").exists()
