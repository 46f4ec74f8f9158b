"""Free loopback ports for the servers tests start, never handed to two test processes at once.

Not the kernel's pick for port 0: that comes from the ephemeral range, where anything binding
port 0 (a test's in-process server, another checkout's tests or benchmarks) and every
outgoing connection's source port may take it between the pick and the server binding it.
So ports come from just below that range, which the kernel never hands out by itself, at
random, each checked free by binding it and then reserved, machine-wide, with a lock on a
file named after it: another test process skips a port it cannot lock, even while a server
stopped to be restarted has left it unbound. The locks are held by the process that picked
the ports (the kernel drops them when it exits, however it exits) until it has picked
`_KEPT` newer ones.
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
    low, high = _range()
    for _ in range(1000):
        port = random.randrange(low, high)
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue  # in use, or still in TIME_WAIT from an earlier test's server
        if _reserve(port):
            return port
    raise RuntimeError(f"no free port in {low}-{high - 1} could be reserved (locks in {_RESERVATIONS})")


def _range() -> tuple[int, int]:
    """The 10,000 ports below the ephemeral range (22768-32767 on Linux's defaults), or above
    it when a lowered range leaves no room below."""
    try:
        ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        first, last = int(ephemeral[0]), int(ephemeral[1])
    except (OSError, ValueError, IndexError):
        first, last = 32768, 60999
    if first - 10_000 >= 1024:
        return first - 10_000, first
    if last + 10_000 <= 65535:
        return last + 1, last + 10_001
    return 1024, 65536  # no room outside it: the probe and the locks have to do


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
