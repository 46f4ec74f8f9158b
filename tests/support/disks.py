"""A small disk that really fills up, for the tests of what a full one does."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (`"3m"`) mounted on `mount_point` (made here) while the block runs;
    the test is skipped where it cannot be mounted (not root, as CI is)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of `disk`; remove the returned file to give them back."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as stream:  # unbuffered: nothing left to write at close
        while True:
            try:
                stream.write(b"\0" * 65536)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                return filler
