"""An exclusive `flock` held for one decision: how a node's worker processes take turns at the
files they share (the shaping table, the client table, the shaping effects directory)."""

from __future__ import annotations

import fcntl


class Flocked:
    """`with Flocked(fd):` holds an exclusive flock on the open file `fd` for the block."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
