"""Free loopback ports for the servers tests start, never handed to two test processes at once.

The kernel's pick for port 0 is free when it is made, for anyone: pytest-xdist workers (and
the test runs or benchmarks of other checkouts on the machine) asking at the same moment can
be handed the same port between one closing its probe and its server binding it, and a
server stopped to be restarted leaves its port open to the next asker. So each port picked
here is also reserved, machine-wide, with a lock on a file named after it: another process
skips a port it cannot lock. The locks are held by the process that picked the ports (the
kernel drops them when it exits, however it exits) until it has picked `_KEPT` newer ones.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

HOST = "127.0.0.1"
_RESERVATIONS = Path(tempfile.gettempdir()) / "pigeon-test-ports"
# Enough for every port of the tests that run while one test's servers restart (a test picks
# at most a few dozen), few enough to stay far below any limit on open files.
_KEPT = 256
_held: collections.deque[int] = collections.deque()  # lock file descriptors, oldest first


def free_port() -> int:
    """A TCP port nothing listens on on 127.0.0.1 now, which no other test process is given
    while this one may still be starting (or restarting) a server on it."""
    for _ in range(1000):
        with socket.socket() as probe:
            probe.bind((HOST, 0))
            port: int = probe.getsockname()[1]
        if _reserve(port):
            return port
    raise RuntimeError(f"no port the kernel picked could be reserved: are the locks in {_RESERVATIONS} stuck?")


def _reserve(port: int) -> bool:
    if not _RESERVATIONS.is_dir():
        with contextlib.suppress(FileExistsError):
            _RESERVATIONS.mkdir()
            _RESERVATIONS.chmod(0o1777)  # shared with test runs as other users, like /tmp
    descriptor = os.open(_RESERVATIONS / str(port), os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        # flock, unlike fcntl locks, also refuses this process a port it reserved itself
        # (each open file is its own lock holder): two servers of one test never share one.
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return False
    _held.append(descriptor)
    while len(_held) > _KEPT:
        os.close(_held.popleft())
    return True


def free_address(port: int) -> str:
    """A loopback address (127.x.y.z, all routed to lo) on which `port` is free now: for tests
    that need a fixed port, such as 25 or 587, which anything else may hold on 127.0.0.1.
    Picked at random from millions, so processes picking at once do not meet."""
    for _ in range(100):
        address = f"127.{random.randrange(2, 255)}.{random.randrange(256)}.{random.randrange(1, 255)}"
        with socket.socket() as probe:
            try:
                probe.bind((address, port))
            except OSError:
                continue
            return address
    raise RuntimeError(f"port {port} is taken on every loopback address tried")


__all__ = ["free_address", "free_port"]
