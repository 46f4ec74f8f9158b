"""Exclusive `flock`s: held for one decision, how a node's worker processes take turns at the
files they share (the shaping table, the client table, the shaping effects directory); or
held for a process's life, a pid file that keeps a second process out (`take_pid_lock`)."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Final

_NO_ROOM: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


class LockHeld(Exception):
    """Another process holds the lock; `holder` is the pid it wrote ("?" if none)."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def take_pid_lock(path: Path, mode: int) -> int:
    """Lock `path` (made with `mode`) for this process, without waiting, and write its pid
    there; returns the descriptor, to be kept open as long as the lock is wanted (closing it
    releases the lock). Raises `LockHeld` when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise LockHeld(holder) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as error:
        if error.errno not in _NO_ROOM:
            os.close(fd)
            raise
        # The pid only helps an operator reading the file; a full disk must not stop a
        # process whose spool waits for room (it says so itself).
    return fd


class Flocked:
    """`with Flocked(fd):` holds an exclusive flock on the open file `fd` for the block."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
