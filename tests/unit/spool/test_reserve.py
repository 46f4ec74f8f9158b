"""The reserve an uncapped spool keeps for delivery: given back when the disk fills, taken again
once there is room for it and an ordinary message."""

from __future__ import annotations

import os
from pathlib import Path

from pigeon.spool.reserve import Reserve
from pigeon.spool.spool import SpoolFull
from pigeon.spool.sqlite import SqliteSpool
from tests.support.disks import tmpfs
from tests.unit.spool.test_group_commit import opened
from tests.unit.spool.test_segments import deliver, store


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_the_reserve_is_given_back_once_and_taken_again_only_with_room_for_it_and_a_message(tmp_path: Path) -> None:
    free = [1 << 30]
    reserve = Reserve(tmp_path / "reserve", lambda: free[0])
    reserve.open(64 << 20)  # a sixteenth of the disk
    assert reserve.size == 4 << 20 and _allocated(reserve.path) >= reserve.size
    assert not reserve.refusing() and reserve.room(10 << 20) == 6 << 20  # (another reserve kept free)
    # Held, new mail is refused below another reserve and a message free: a disk shared by
    # several shards keeps the room one gives back for that one's deliveries.
    free[0] = reserve.size + (512 << 10)
    assert reserve.refusing() and not reserve.given_back
    free[0] = 1 << 30
    assert reserve.give_back() and not reserve.give_back()  # the first write to meet a full disk
    assert _allocated(reserve.path) == 0 and reserve.given_back
    free[0] = 2 * reserve.size + (512 << 10)  # room for the reserve and another, not a message besides
    assert reserve.refusing() and reserve.room(free[0]) == 512 << 10
    free[0] = 2 * reserve.size + (1 << 20)
    assert not reserve.refusing() and not reserve.given_back
    assert _allocated(reserve.path) >= reserve.size


def test_the_reserve_is_sized_by_its_disk_and_bounds_the_wal(tmp_path: Path) -> None:
    small, large = Reserve(tmp_path / "a", lambda: 1 << 40), Reserve(tmp_path / "b", lambda: 1 << 40)
    small.open(3 << 20)
    large.open(1 << 40)
    assert (small.size, large.size) == (256 << 10, 32 << 20)
    assert (small.wal_pages(16384), large.wal_pages(16384)) == (8, 1000)  # SQLite's own above 512 MiB


def test_a_reserve_kept_smaller_or_not_at_all_gives_its_blocks_back(tmp_path: Path) -> None:
    reserve = Reserve(tmp_path / "reserve", lambda: 1 << 40, 4 << 20)
    reserve.open(1 << 40)
    assert _allocated(reserve.path) >= 4 << 20
    smaller = Reserve(tmp_path / "reserve", lambda: 1 << 40, 1 << 20)  # [spool] reserve lowered
    smaller.open(1 << 40)
    assert 1 << 20 <= _allocated(smaller.path) < 2 << 20
    SqliteSpool(tmp_path, reserve=0)  # none kept now: the file an earlier run left goes
    assert not smaller.path.exists()


def _fill(disk: Path) -> None:
    """Take every byte left on `disk`."""
    with open(disk / "filler", "wb", buffering=0) as stream:
        for size in (65536, 4096, 512, 64, 1):
            try:
                while True:
                    stream.write(b"\0" * size)
            except OSError:
                pass


async def test_one_shard_s_new_mail_does_not_take_the_room_another_gave_back_to_its_deliveries(
    tmp_path: Path,
) -> None:
    # Two workers' shards on one disk. A finds the disk full and gives its reserve back for
    # its deliveries; B, whose reserve is still held, must not take that room for new mail,
    # or A's delivered messages cannot be settled (and would be delivered again).
    with tmpfs(tmp_path / "disk", "40m") as disk:
        a = SqliteSpool(disk / "a", reserve=32 << 20, inline_limit=64 * 1024)
        b = SqliteSpool(disk / "b", reserve=32 << 20, inline_limit=64 * 1024)
        with opened(a), opened(b):
            queued = [await store(a, b"m%03d " % n * 400) for n in range(40)]
            _fill(disk)
            for message in queued[:20]:  # the first settlement to meet the full disk gives A's reserve back
                await deliver(a, message)
            assert a._reserve is not None and a._reserve.given_back
            taken_by_b = 0
            for _ in range(20):
                try:
                    await store(b, b"L" * 300_000)
                    taken_by_b += 1
                except SpoolFull:
                    pass
            for message in queued[20:]:  # every delivery settles: none is left to be sent again
                await deliver(a, message)
            assert taken_by_b == 0
