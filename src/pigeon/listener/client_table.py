"""What a node's SMTP workers know about clients together: a fixed-size table in a shared file.

With several workers accepting on one listening socket (the supervisor's, inherited), the
first worker to accept takes each connection, so a limit kept per worker is `workers` times the limit for the node. The
listener's per-client limits (connections per client address, AUTH failures per address and
per user) are kept here instead when a node runs more than one worker; with one, they stay in
the worker's memory and this file is not used.

Layout: a header (with a random hash key, so that no one can pick addresses that collide),
then `SLOTS` fixed slots found by open addressing within a window of `PROBE` slots from a
keyed 64-bit hash of the key. A slot holds:

- `held`, the node's total of what its workers hold (open connections of a client address, or
  password checks in progress for an address or user), and each worker's own part of it;
- `until` (the end of a lockout, or of a known-good pair's exemption) and a sliding count of
  failures in `BUCKETS` + 1 time buckets of `window / BUCKETS` each: a failure counts for at
  least `window` and at most a bucket longer, never less (the count is exact in number);
- `touched` and `expires`: when the slot last changed, and when it will hold nothing that
  matters (its held total aside).

Bounded: the file never grows. A key finds a slot in its window: its own, else one that holds
nothing any more, else (a flood of distinct addresses) the one touched longest ago among those
that hold no connection or check, whose failures and lockout are then forgotten, as the
in-memory tables forget their quietest key. When every slot of the window holds something
(some `PROBE` consecutive slots all with open connections), the key is not in the table and
the caller falls back to a per-worker count (see `SharedConnections`).

Crashes: a worker that starts (again, after a crash or kill -9) zeroes its own parts and takes
them from the totals: whatever it held died with it. Until the supervisor has restarted it
(a second or more), a dead worker's connections still count. The supervisor makes the file
anew at each start, so nothing of an earlier run is counted. Each operation runs under an
exclusive `flock` on the file, which the kernel drops if its holder dies.

Clock: `time.monotonic()`, which is system-wide on Linux, so every worker reads the same one.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from pigeon.flock import Flocked
from pigeon.mapped_file import create_mapped_file

_log = logging.getLogger(__name__)

MAX_WORKERS: Final = 64  # [node] workers is at most 64
SLOTS: Final = 16_384
PROBE: Final = 16
BUCKETS: Final = 16
_MAGIC: Final = b"PGNCLI01"
_HEADER: Final = struct.Struct("<8sIII16s")  # magic, slots, slot size, buckets, hash key
_HEAD: Final = struct.Struct("<QdddI")  # key hash, touched, until, expires, held (node total)
_HASH: Final = struct.Struct("<Q")
_HELD: Final = struct.Struct("<I")
_HELD_AT: Final = 32
_COUNT: Final = struct.Struct("<H")  # one worker's part of `held`
_COUNTS_AT: Final = 40
_BUCKET: Final = struct.Struct("<QI")  # bucket number (time // width), failures in it
_BUCKETS_AT: Final = _COUNTS_AT + MAX_WORKERS * _COUNT.size
_SLOT_SIZE: Final = 384
_FIRST_SLOT: Final = 64
assert _BUCKETS_AT + (BUCKETS + 1) * _BUCKET.size <= _SLOT_SIZE


def client_table_path(spool: Path) -> Path:
    """The file a node's SMTP workers share what they know of clients in."""
    return spool / "run" / "clients"


def create_client_table(path: Path, slots: int = SLOTS) -> None:
    """A fresh, empty table (the supervisor, before it starts the workers; tests make small ones)."""
    create_mapped_file(
        path, _HEADER.pack(_MAGIC, slots, _SLOT_SIZE, BUCKETS, os.urandom(16)), _FIRST_SLOT + slots * _SLOT_SIZE
    )


class ClientTable:
    """One worker's handle on the node's client table. Keys are strings; their users prefix
    them by kind ("c:" connections, "a:" and "u:" failures, "k:" known-good pairs).

    Methods that name a slot must run inside `with table.locked():`.
    """

    def __init__(
        self, path: Path, worker: int, *, window: float = 600.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`window`: how long a failure counts; `clock`: system-wide (tests turn a fake one)."""
        if not 0 <= worker < MAX_WORKERS:
            raise ValueError(f"worker {worker}: the client table has room for {MAX_WORKERS} workers")
        if not path.exists():
            create_client_table(path)  # started without a supervisor (tests, or by hand)
        self.worker = worker
        self.window = window
        self.now = clock
        """The table's clock."""
        self._width = max(window / BUCKETS, 1e-3)
        self._file = open(path, "r+b")  # noqa: SIM115 - held for the table's life
        self._fd = self._file.fileno()
        self._map = mmap.mmap(self._fd, 0)
        magic, slots, size, buckets, key = _HEADER.unpack_from(self._map, 0)
        if magic != _MAGIC or size != _SLOT_SIZE or buckets != BUCKETS or len(self._map) < _FIRST_SLOT + slots * size:
            raise ValueError(f"{path} is not a client table of this version")
        self.slots: int = slots
        self._key: bytes = key
        self._mine = _COUNTS_AT + worker * _COUNT.size
        self._decided: set[int] = set()
        with self.locked():
            self._forget_my_parts()

    def close(self) -> None:
        self._map.close()
        self._file.close()

    def locked(self) -> Flocked:
        """An exclusive lock on the table for one decision."""
        self._decided.clear()
        return Flocked(self._fd)

    # --- slots -------------------------------------------------------------------------------
    def find(self, key: str, now: float, *, create: bool = True) -> int | None:
        """The offset of `key`'s slot; made (reusing or evicting another) if missing and
        `create`; None if missing, or if every slot of its window holds something.

        A slot found earlier in the same decision is never given to another key: a check
        finds its address slot, then its user slot, before it holds either, and the second
        must not take the first (unheld, it would look free)."""
        digest: int = _HASH.unpack(hashlib.blake2b(key.encode(), digest_size=8, key=self._key).digest())[0] | 1
        memory = self._map
        start = digest % self.slots
        free = None
        oldest = None
        oldest_touched = 0.0
        for step in range(min(PROBE, self.slots)):
            offset: int = _FIRST_SLOT + ((start + step) % self.slots) * _SLOT_SIZE
            found, touched, _, expires, held = _HEAD.unpack_from(memory, offset)
            if found == digest:
                self._decided.add(offset)
                return offset
            if found == 0:
                # Never used: nothing of this key lies further on (slots are reused, never emptied).
                if free is None:
                    free = offset
                break
            if held or offset in self._decided:
                continue
            if expires <= now:
                if free is None:
                    free = offset
            elif oldest is None or touched < oldest_touched:
                oldest, oldest_touched = offset, touched
        if not create:
            return None
        if free is None:
            if oldest is None:
                return None
            free = oldest  # the quietest key of the window is forgotten, as in memory
        _HEAD.pack_into(memory, free, digest, now, 0.0, 0.0, 0)
        memory[free + _COUNTS_AT : free + _SLOT_SIZE] = bytes(_SLOT_SIZE - _COUNTS_AT)
        self._decided.add(free)
        return free

    def held(self, slot: int) -> int:
        """What the node's workers hold of the slot's key."""
        held: int = _HELD.unpack_from(self._map, slot + _HELD_AT)[0]
        return held

    def hold(self, slot: int, now: float) -> None:
        """This worker holds one more (a connection, a check in progress)."""
        memory = self._map
        _HELD.pack_into(memory, slot + _HELD_AT, _HELD.unpack_from(memory, slot + _HELD_AT)[0] + 1)
        mine = slot + self._mine
        _COUNT.pack_into(memory, mine, _COUNT.unpack_from(memory, mine)[0] + 1)
        struct.pack_into("<d", memory, slot + 8, now)

    def let_go(self, slot: int) -> None:
        """This worker holds one less; nothing if it held none (its part was reset meanwhile)."""
        memory = self._map
        mine = slot + self._mine
        count = _COUNT.unpack_from(memory, mine)[0]
        if not count:
            return
        _COUNT.pack_into(memory, mine, count - 1)
        _HELD.pack_into(memory, slot + _HELD_AT, max(0, _HELD.unpack_from(memory, slot + _HELD_AT)[0] - 1))

    def until(self, slot: int) -> float:
        """The end of the slot's lockout (or exemption); 0 if none was set."""
        until: float = struct.unpack_from("<d", self._map, slot + 16)[0]
        return until

    def set_until(self, slot: int, until: float, now: float) -> None:
        memory = self._map
        expires = struct.unpack_from("<d", memory, slot + 24)[0]
        struct.pack_into("<ddd", memory, slot + 8, now, until, max(expires, until))

    def failures(self, slot: int, now: float) -> int:
        """Failures counted in the slot within the window."""
        current = int(now // self._width)
        total = 0
        for number, count in _BUCKET.iter_unpack(self._buckets(slot)):
            if count and current - BUCKETS <= number <= current:
                total += count
        return total

    def fail(self, slot: int, now: float) -> None:
        """Count one failure at `now`."""
        memory = self._map
        number = int(now // self._width)
        offset = slot + _BUCKETS_AT + (number % (BUCKETS + 1)) * _BUCKET.size
        found, count = _BUCKET.unpack_from(memory, offset)
        _BUCKET.pack_into(memory, offset, number, count + 1 if found == number else 1)
        # It counts until the end of the last bucket that holds it.
        counted_until = (number + BUCKETS + 1) * self._width
        until, expires = struct.unpack_from("<dd", memory, slot + 16)
        struct.pack_into("<ddd", memory, slot + 8, now, until, max(expires, counted_until))

    def clear_failures(self, slot: int, now: float, *, lockout: bool = False) -> None:
        """Forget the slot's failures (and its lockout too, if `lockout`)."""
        memory = self._map
        start = slot + _BUCKETS_AT
        memory[start : start + (BUCKETS + 1) * _BUCKET.size] = bytes((BUCKETS + 1) * _BUCKET.size)
        if lockout:
            struct.pack_into("<ddd", memory, slot + 8, now, 0.0, 0.0)

    def _buckets(self, slot: int) -> memoryview:
        start = slot + _BUCKETS_AT
        return memoryview(self._map)[start : start + (BUCKETS + 1) * _BUCKET.size]

    def _forget_my_parts(self) -> None:
        """Whatever this worker index held before died with it (under the lock)."""
        memory = self._map
        for index in range(self.slots):
            slot = _FIRST_SLOT + index * _SLOT_SIZE
            mine = _COUNT.unpack_from(memory, slot + self._mine)[0]
            if mine:
                _COUNT.pack_into(memory, slot + self._mine, 0)
                held = _HELD.unpack_from(memory, slot + _HELD_AT)[0]
                _HELD.pack_into(memory, slot + _HELD_AT, max(0, held - mine))
