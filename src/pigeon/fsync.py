"""Making a file system change durable beyond the file's own data."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    """fsync a directory: a file created, renamed or removed in it is only durable once the
    directory itself is (fsync of the file makes its data durable, not its name)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
