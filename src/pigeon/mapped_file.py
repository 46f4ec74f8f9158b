"""Files of a fixed size that a node's workers share through `mmap` (the shaping limits' table,
the SMTP clients' table), made afresh by the supervisor before it starts them."""

from __future__ import annotations

import os
from pathlib import Path


def create_mapped_file(path: Path, header: bytes, size: int) -> None:
    """`path` made anew: `header`, then zeros up to `size` bytes, replacing any file there whole
    (a worker that opens it meanwhile sees the old one or this). Its blocks are allocated now: a
    sparse file on a full disk would kill the worker that first touches a page of it (SIGBUS),
    where this raises ENOSPC, to be said and waited out."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".new")
    try:
        with open(temporary, "wb") as file:
            file.write(header)
            os.posix_fallocate(file.fileno(), 0, size)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)
