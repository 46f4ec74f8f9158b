"""Node-local limit state: connections held and the GCRA schedule, per limit key.

A node's limits hold for the node, not for each of its worker processes. One worker keeps the
state in memory (`MemoryTable`). Several share one table in a memory-mapped file under the
spool's run directory (`SharedTable`), so a connection limit of 5 means 5 for the node whether
it runs 1 worker or 8, and a rate of 200/s is one schedule, taken from by every worker.

Why a shared file and not each worker taking `limit / workers`: a share cannot go below one
connection (a worker holding mail for a site must be able to send it), so a limit under the
worker count would grow with the workers (a limit of 1 on 7 workers would be 7); and a site
whose mail sits in one worker's shard would get only that worker's share of the rate. The file
costs two `flock` calls and a few struct reads per decision: about 10 µs on the loaded 2-core
test machine, against 3 µs in memory; decisions are per connection opened and per message.

Layout: a header, then `SLOTS` fixed slots, found by open addressing on a 64-bit hash of the
key. A slot holds the key's hash, its TAT (`time.monotonic()`, which is system-wide on Linux),
the node's total of connections, and each worker's own count. A worker that starts (again,
after a crash) zeroes its own counts: whatever it held died with it. The file is recreated
when the supervisor starts. A slot whose key holds no connection and whose schedule is in the
past is free to be reused by another key. Each decision runs under an exclusive `flock` on the
file; the kernel drops the lock of a worker that dies holding it.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

from pigeon.flock import Flocked
from pigeon.mapped_file import create_mapped_file
from pigeon.shaping.gcra import Rate, take

_log = logging.getLogger(__name__)

MAX_WORKERS: Final = 64  # [node] workers is at most 64
SLOTS: Final = 8192
_MAGIC: Final = b"PGNTHR01"
_HEADER: Final = struct.Struct("<8sII")  # magic, slots, slot size
_HEAD: Final = struct.Struct("<QdI")  # key hash, TAT, node total of connections
_COUNT: Final = struct.Struct("<H")  # one worker's connections
_SLOT_SIZE: Final = 64 + MAX_WORKERS * _COUNT.size  # the head padded to 64 bytes, then the counts
_FIRST_SLOT: Final = 64


class Table(Protocol):
    """Connections and schedules of one node, per limit key."""

    def acquire(self, key: str, limit: int) -> bool:
        """One more connection for `key` if the node holds fewer than `limit`."""
        ...

    def release(self, key: str) -> None:
        """A connection of `key` this worker held ended."""
        ...

    def reserve(self, key: str, rate: Rate, count: int, not_before: float = 0.0) -> float:
        """Book `count` messages of `key` at `rate`, none before `not_before` (`now()`'s clock):
        seconds until the last may go."""
        ...

    def now(self) -> float:
        """The clock schedules are kept on."""
        ...

    def held(self, key: str) -> int:
        """Connections of `key` the node holds."""
        ...

    def mark(self, key: str, until: float) -> None:
        """Note, for every worker, that `key` holds until `until` (`now()`'s clock)."""
        ...

    def marked(self, key: str) -> bool:
        """Whether a mark of `key` holds now."""
        ...

    def close(self) -> None: ...


class MemoryTable:
    """One worker's limits, in memory, on the dispatcher's clock (tests turn it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._connections: dict[str, int] = {}
        self._tat: dict[str, float] = {}

    def acquire(self, key: str, limit: int) -> bool:
        held = self._connections.get(key, 0)
        if held >= limit:
            return False
        self._connections[key] = held + 1
        return True

    def release(self, key: str) -> None:
        held = self._connections.get(key, 0)
        if held > 1:
            self._connections[key] = held - 1
        else:
            self._connections.pop(key, None)

    def reserve(self, key: str, rate: Rate, count: int, not_before: float = 0.0) -> float:
        tat = max(self._tat.get(key, 0.0), not_before)
        self._tat[key], wait = take(tat, self._clock(), rate.interval, rate.burst, count)
        return wait

    def now(self) -> float:
        return self._clock()

    def held(self, key: str) -> int:
        return self._connections.get(key, 0)

    def mark(self, key: str, until: float) -> None:
        self._tat[key] = max(self._tat.get(key, 0.0), until)

    def marked(self, key: str) -> bool:
        return self._tat.get(key, 0.0) > self._clock()

    def close(self) -> None:
        pass


def shared_table_path(spool: Path) -> Path:
    """The file a node's workers share their limits in (made anew by the supervisor)."""
    return spool / "run" / "throttles"


def create_shared_table(path: Path) -> None:
    """A fresh, empty table for a node's workers (the supervisor, before it starts them)."""
    create_mapped_file(path, _HEADER.pack(_MAGIC, SLOTS, _SLOT_SIZE), _FIRST_SLOT + SLOTS * _SLOT_SIZE)


class SharedTable:
    """The node's limits in a file shared by its workers (see the module docstring)."""

    def __init__(self, path: Path, worker: int, workers: int) -> None:
        if not 0 <= worker < MAX_WORKERS:
            raise ValueError(f"worker {worker}: a shared table has room for {MAX_WORKERS} workers")
        if not path.exists():
            create_shared_table(path)  # started without a supervisor's table (tests, or by hand)
        self._worker = worker
        self._file = open(path, "r+b")  # noqa: SIM115 - held for the table's life
        self._map = mmap.mmap(self._file.fileno(), 0)
        magic, slots, size = _HEADER.unpack_from(self._map, 0)
        if magic != _MAGIC or size != _SLOT_SIZE or len(self._map) < _FIRST_SLOT + slots * size:
            raise ValueError(f"{path} is not a throttle table of this version")
        self._slots: int = slots
        self._where: dict[str, tuple[int, int]] = {}  # key: (its hash, the slot it was last found in)
        # Beyond the table's room, a key is limited in this worker alone, to its share.
        self._overflow = MemoryTable()
        self._overflowed: set[str] = set()
        self._share = max(1, workers)
        with self._locked():
            for slot in range(slots):  # whatever this worker index held before died with it
                offset = self._count_offset(slot)
                mine = _COUNT.unpack_from(self._map, offset)[0]
                if mine:
                    _COUNT.pack_into(self._map, offset, 0)
                    head = _FIRST_SLOT + slot * _SLOT_SIZE
                    digest, tat, total = _HEAD.unpack_from(self._map, head)
                    _HEAD.pack_into(self._map, head, digest, tat, max(0, total - mine))

    # --- the table's side -------------------------------------------------------------------
    def acquire(self, key: str, limit: int) -> bool:
        with self._locked():
            slot = self._slot(key)
            if slot is None:
                return self._overflow.acquire(key, max(1, limit // self._share))
            head = _FIRST_SLOT + slot * _SLOT_SIZE
            digest, tat, total = _HEAD.unpack_from(self._map, head)
            if total >= limit:
                return False
            _HEAD.pack_into(self._map, head, digest, tat, total + 1)
            offset = self._count_offset(slot)
            _COUNT.pack_into(self._map, offset, _COUNT.unpack_from(self._map, offset)[0] + 1)
            return True

    def release(self, key: str) -> None:
        if key in self._overflowed:
            self._overflow.release(key)
            return
        with self._locked():
            slot = self._slot(key, create=False)
            if slot is None:
                return
            offset = self._count_offset(slot)
            mine = _COUNT.unpack_from(self._map, offset)[0]
            if not mine:
                return
            _COUNT.pack_into(self._map, offset, mine - 1)
            head = _FIRST_SLOT + slot * _SLOT_SIZE
            digest, tat, total = _HEAD.unpack_from(self._map, head)
            _HEAD.pack_into(self._map, head, digest, tat, max(0, total - 1))

    def reserve(self, key: str, rate: Rate, count: int, not_before: float = 0.0) -> float:
        with self._locked():
            slot = self._slot(key)
            if slot is None:
                share = Rate(rate.per_second / self._share, max(1, rate.burst // self._share))
                return self._overflow.reserve(key, share, count, not_before)
            head = _FIRST_SLOT + slot * _SLOT_SIZE
            digest, tat, total = _HEAD.unpack_from(self._map, head)
            tat, wait = take(max(tat, not_before), time.monotonic(), rate.interval, rate.burst, count)
            _HEAD.pack_into(self._map, head, digest, tat, total)
            return wait

    def held(self, key: str) -> int:
        if key in self._overflowed:
            return self._overflow.held(key)
        with self._locked():
            slot = self._slot(key, create=False)
            if slot is None:
                return 0
            total: int = _HEAD.unpack_from(self._map, _FIRST_SLOT + slot * _SLOT_SIZE)[2]
            return total

    def mark(self, key: str, until: float) -> None:
        if key in self._overflowed:
            self._overflow.mark(key, until)
            return
        with self._locked():
            slot = self._slot(key)
            if slot is None:
                self._overflow.mark(key, until)
                return
            head = _FIRST_SLOT + slot * _SLOT_SIZE
            digest, tat, total = _HEAD.unpack_from(self._map, head)
            _HEAD.pack_into(self._map, head, digest, max(tat, until), total)

    def marked(self, key: str) -> bool:
        if key in self._overflowed:
            return self._overflow.marked(key)
        with self._locked():
            slot = self._slot(key, create=False)
            if slot is None:
                return False
            tat: float = _HEAD.unpack_from(self._map, _FIRST_SLOT + slot * _SLOT_SIZE)[1]
            return tat > time.monotonic()

    def now(self) -> float:
        return time.monotonic()

    def close(self) -> None:
        self._map.close()
        self._file.close()

    # --- slots ---------------------------------------------------------------------------------
    def _locked(self) -> Flocked:
        return Flocked(self._file.fileno())

    def _count_offset(self, slot: int) -> int:
        return _FIRST_SLOT + slot * _SLOT_SIZE + 64 + self._worker * _COUNT.size

    def _slot(self, key: str, *, create: bool = True) -> int | None:
        """`key`'s slot (under the lock), made if missing and `create`; None when full."""
        known = self._where.get(key)
        if known is not None:
            digest, slot = known
            current: int = _HEAD.unpack_from(self._map, _FIRST_SLOT + slot * _SLOT_SIZE)[0]
            if current == digest:
                return slot  # (a slot reused by another key has another hash: probe again)
        else:
            if key in self._overflowed:
                return None
            digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") | 1
        now = time.monotonic()
        reusable = None
        start = digest % self._slots
        # The whole chain up to a never-used slot: a key may sit beyond a slot freed since.
        for step in range(self._slots):
            slot = (start + step) % self._slots
            found: int
            found, tat, total = _HEAD.unpack_from(self._map, _FIRST_SLOT + slot * _SLOT_SIZE)
            if found == digest:
                self._where[key] = (digest, slot)
                return slot
            if found == 0:
                if reusable is None:
                    reusable = slot
                break
            if reusable is None and total == 0 and tat <= now:
                reusable = slot
        if not create:
            return None
        if reusable is None:
            if key not in self._overflowed:
                _log.warning("throttle table full: %s is limited per worker (its share)", key)
                self._overflowed.add(key)
            return None
        head = _FIRST_SLOT + reusable * _SLOT_SIZE
        _HEAD.pack_into(self._map, head, digest, 0.0, 0)
        counts = head + 64
        self._map[counts : counts + MAX_WORKERS * _COUNT.size] = bytes(MAX_WORKERS * _COUNT.size)
        self._where[key] = (digest, reusable)
        return reusable
