"""A worker ends with its supervisor: the kernel sends it SIGTERM when the supervisor dies.

A supervisor killed with SIGKILL (or dead of a crash) cannot stop its workers; left alone they
would run on under init, holding the SMTP port and their spool shards, so that the next start
could neither listen nor take the shards. Linux's PR_SET_PDEATHSIG asks the kernel to signal
a process when its parent goes; the worker asks for SIGTERM, its usual, graceful stop.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from typing import Final

_log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG: Final = 1


class ParentGone(Exception):
    """The supervisor died before the worker could ask to follow it."""


def follow_parent(parent: int) -> None:
    """Get SIGTERM when `parent` (this process's parent) dies; `ParentGone` if it already has.

    A parent that died before the request went unnoticed by the kernel (this process then
    belongs to init or a subreaper): comparing getppid() with `parent` after it closes that gap.
    """
    if sys.platform != "linux":  # pragma: no cover - Pigeon runs on Linux; elsewhere, no guard
        _log.warning("cannot ask to stop with the supervisor on %s: stop workers by hand if it dies", sys.platform)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != parent:
        raise ParentGone(f"the supervisor (pid {parent}) is gone; this worker stops")
