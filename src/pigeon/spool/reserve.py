"""The reserve: room kept on an uncapped spool's disk for delivery, given up when the disk fills.

Settling a delivered message writes before it frees anything: its row is deleted and the
segment's count updated in a transaction whose pages go to the WAL, and the WAL's checkpoint
may grow the database. Without `[spool] max_size`, a disk filled by mail (or by anything
else) left those writes no room: the spool refused new mail, as it should, but could not let
go of what it delivered either (a site found down could not even be noted), so it drained
nothing until an operator freed space by hand.

So a shard with no cap keeps `reserve`, a file in its directory with its blocks allocated
(`posix_fallocate`) while there is room. The first commit that finds the disk full gives
the reserve back (the file is truncated, not removed) and is tried again: from then on new
mail is refused (451) before it is written, so the room goes to delivery alone. Settlements
commit, the WAL is checkpointed and cut back, and each delivered message frees its segment
share, body file or pages. The reserve is taken again once the disk has its size and an
ordinary message free besides another reserve, and mail is taken again from then on.

New mail is refused before the disk is full, too: while the disk has less than another
reserve and an ordinary message free. The shards of a node share one disk, and each keeps
its own reserve: without that floor, a shard whose reserve is still held took new mail into
the room another had just given back to its deliveries, which then could not be settled
(and so were delivered again).

Its size: a sixteenth of the disk, at most `[spool] reserve` (by default `_LARGEST`, twice the
WAL's largest: a checkpoint may have to grow the database by the WAL's new pages first) and
at least `_SMALLEST` (unless `[spool] reserve` is smaller). The
WAL is checkpointed at half the reserve (`wal_pages`), so that a small disk's reserve covers it.

On a file system that does not allocate ahead (copy-on-write ones such as ZFS say yes to
`posix_fallocate` without setting blocks aside), the reserve holds no room; refusing new mail
once the disk filled still leaves delivery what the WAL's checkpoint and removals free.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

_log = logging.getLogger(__name__)
_LARGEST: Final = 32 * 1024 * 1024
_SMALLEST: Final = 256 * 1024
_ORDINARY: Final = 1024 * 1024  # an ordinary message, as /healthz counts it (an eighth of a tiny disk)
_NO_ROOM: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
_HELD, _GIVEN_BACK, _OFF = range(3)


def remove_reserve(path: Path) -> None:
    """A shard that keeps no reserve (`[spool] reserve = 0`, or a `max_size`) removes one an
    earlier run left: its blocks are allocated, and no cap counts them."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class Reserve:
    """The reserve file of one spool shard. `open()` first; then any thread."""

    def __init__(self, path: Path, free: Callable[[], int], largest: int = _LARGEST) -> None:
        """`free`: bytes an unprivileged writer may still use on the disk (-1: unknown).
        `largest`: the most it keeps, whatever the disk's size (`[spool] reserve`)."""
        self.path = path
        self._largest = largest
        self.size = min(_SMALLEST, largest)
        self._free = free
        self._margin = _ORDINARY
        self._state = _OFF
        self._lock = threading.Lock()

    def open(self, disk: int) -> None:
        """Size the reserve for a disk of `disk` bytes (-1: unknown) and take it if there is room
        (a reserve file left by an earlier run is already allocated: taking it costs nothing)."""
        if disk > 0:
            self.size = min(self._largest, max(_SMALLEST, disk // 16))
            self._margin = min(_ORDINARY, disk // 8)
        with self._lock:
            self._state = _GIVEN_BACK
            self._allocate()

    def wal_pages(self, page_size: int) -> int:
        """The WAL's checkpoint threshold in pages: no more than half the reserve."""
        return max(4, min(1000, self.size // 2 // page_size))

    @property
    def given_back(self) -> bool:
        """The disk filled up: new mail is refused until the reserve is taken again."""
        return self._state == _GIVEN_BACK

    def refusing(self) -> bool:
        """Whether new mail must be refused now: held, when the disk has less than another
        reserve and an ordinary message free (the shards of a node share a disk: one that
        gave its reserve back must not see that room taken by another's new mail); given
        back, until there is room to take it again and still have that free (then it is)."""
        if self._state == _OFF:
            return False
        free = self._free()
        if free < 0:
            return self._state == _GIVEN_BACK
        if self._state == _HELD:
            return free < self.size + self._margin
        if free < 2 * self.size + self._margin:
            return True
        with self._lock:
            if self._state == _GIVEN_BACK and self._allocate():
                _log.info(
                    "spool %s: room on its disk again: its reserve of %d bytes is taken back, and new mail is taken",
                    self.path.parent,
                    self.size,
                )
        return self._state == _GIVEN_BACK

    def room(self, free: int) -> int:
        """What of `free` bytes new mail may have (`refusing` says no below an ordinary
        message): what is free beyond another reserve, and beyond the reserve itself too
        while it is given back."""
        if free < 0 or self._state == _OFF:
            return free
        return max(0, free - (2 if self._state == _GIVEN_BACK else 1) * self.size)

    def give_back(self) -> bool:
        """The disk is full (any thread): free the reserve's blocks. True if it was held (the
        write that failed may now be tried again), False if it was given back already."""
        with self._lock:
            if self._state != _HELD:
                return False
            try:
                os.truncate(self.path, 0)
            except OSError as error:
                _log.error("spool %s: cannot give back its reserve: %s", self.path.parent, error)
                return False
            self._state = _GIVEN_BACK
        _log.warning(
            "spool %s: its disk is full: new mail gets 451, and the %d bytes of its reserve go to delivering"
            " and removing the mail it holds; mail is taken again once %d bytes are free",
            self.path.parent,
            self.size,
            2 * self.size + self._margin,
        )
        return True

    def _allocate(self) -> bool:
        """Allocate the reserve's blocks (under the lock); True if it is held now."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as error:
            return self._failed(error)
        try:
            if os.fstat(fd).st_size > self.size:
                os.ftruncate(fd, self.size)  # `[spool] reserve` was lowered since it was made
            os.posix_fallocate(fd, 0, self.size)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # not half of it: what it got is given back
            return self._failed(error)
        finally:
            os.close(fd)
        self._state = _HELD
        return True

    def _failed(self, error: OSError) -> bool:
        if error.errno not in _NO_ROOM:
            # The reserve cannot be made here at all: the spool does without one, as before.
            _log.error("spool %s: cannot keep a reserve on its disk (%s): none is kept", self.path.parent, error)
            self._state = _OFF
        return False
