"""The node lock: one `pigeon serve` per spool, said before anything else is touched.

The main process (the supervisor, or the only worker) takes an exclusive flock on
`<spool>/node.lock` before it binds a port or starts a worker, and holds it until it exits
(the kernel drops it then, even after SIGKILL). A second node on the same spool stops at
once, naming the file and the holder's pid, instead of starting workers that would each
find their spool shard taken. The shards keep their own locks (`pigeon.spool.sqlite`):
those guard a shard against any process, this one names the node that holds them all.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from pigeon.flock import LockHeld, take_pid_lock

_log = logging.getLogger(__name__)


class NodeLocked(Exception):
    """Another node holds the spool's node lock; the message names the file and its pid."""


def node_lock_path(spool: Path) -> Path:
    return spool / "node.lock"


def take_node_lock(spool: Path) -> int:
    """Lock `<spool>/node.lock` for this process and write its pid there; returns the
    descriptor, to be kept open for as long as the node runs (closing it releases the lock).
    Raises `NodeLocked` when another node holds it, `OSError` when it cannot be opened."""
    path = node_lock_path(spool)
    _make_private(spool)
    try:
        return take_pid_lock(path, 0o600)
    except LockHeld as held:
        raise NodeLocked(
            f"another node holds {path} (pid {held.holder}): one spool serves one node; "
            "stop that one, or give this one another [spool] path"
        ) from None


def _make_private(spool: Path) -> None:
    """Make the spool (mode 0700; missing parents as the umask says), or take other users'
    bits off one that has them: it holds the mail, the API token and the workers' control
    sockets. Taken first by the process that serves the spool, before any of that is made
    (and before the umask 077 of `pigeon serve`, which must not apply to the parents: a
    `[node] user` has to reach its spool through them)."""
    spool.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(os.stat(spool).st_mode)
    if not mode & 0o077:
        return
    try:
        os.chmod(spool, mode & 0o700)
    except OSError as error:
        _log.warning("%s: mode %04o lets other users in, and cannot be changed (%s)", spool, mode, error.strerror)
    else:
        _log.warning("%s: mode %04o let other users in; made it %04o (the spool is private)", spool, mode, mode & 0o700)
