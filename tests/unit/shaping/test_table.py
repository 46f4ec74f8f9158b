"""Node-local limits: one table per node, whether it runs one worker or several.

Two `SharedTable`s on one file are two workers (each opens the file itself, so each has its
own flock, as two processes would)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pigeon.shaping.gcra import Rate
from pigeon.shaping.table import MemoryTable, SharedTable, create_shared_table


def workers(path: Path, count: int) -> list[SharedTable]:
    create_shared_table(path)
    return [SharedTable(path, index, count) for index in range(count)]


def test_a_connection_limit_holds_for_the_node_whatever_worker_asks(tmp_path: Path) -> None:
    first, second = workers(tmp_path / "throttles", 2)
    granted = [table.acquire("site:mx.test", 3) for table in (first, second, first, second, first)]
    assert granted == [True, True, True, False, False]
    assert first.held("site:mx.test") == second.held("site:mx.test") == 3


def test_a_limit_below_the_worker_count_is_not_raised_to_one_each(tmp_path: Path) -> None:
    tables = workers(tmp_path / "throttles", 4)
    assert [table.acquire("site:small.test", 1) for table in tables] == [True, False, False, False]
    tables[0].release("site:small.test")
    assert tables[3].acquire("site:small.test", 1)


def test_a_release_frees_a_slot_for_another_worker(tmp_path: Path) -> None:
    first, second = workers(tmp_path / "throttles", 2)
    assert first.acquire("k", 1)
    assert not second.acquire("k", 1)
    first.release("k")
    assert second.acquire("k", 1)


def test_a_worker_that_starts_again_gives_up_what_it_held_before(tmp_path: Path) -> None:
    """A worker that died held connections that died with it: its restart frees them."""
    path = tmp_path / "throttles"
    first, second = workers(path, 2)
    assert first.acquire("k", 2) and first.acquire("k", 2) and second.acquire("j", 5)
    assert not second.acquire("k", 2)
    restarted = SharedTable(path, 0, 2)  # worker 0 again, after a crash
    assert restarted.held("k") == 0
    assert second.held("j") == 1  # the other worker's connections stay counted
    assert second.acquire("k", 2)


def test_keys_are_counted_apart(tmp_path: Path) -> None:
    first, second = workers(tmp_path / "throttles", 2)
    for n in range(200):
        assert first.acquire(f"site:mx{n}.test", 1)
    assert all(not second.acquire(f"site:mx{n}.test", 1) for n in range(200))
    assert second.acquire("site:other.test", 1)


def test_a_rate_is_one_schedule_for_every_worker(tmp_path: Path) -> None:
    first, second = workers(tmp_path / "throttles", 2)
    rate = Rate(1.0)
    waits = [table.reserve("k", rate, 1) for table in (first, second, first, second)]
    # One schedule: a second apart whoever asks, not two schedules of 1/s each.
    assert waits == pytest.approx([0.0, 1.0, 2.0, 3.0], abs=0.1)
    assert second.reserve("k", rate, 3) == pytest.approx(6.0, abs=0.1)  # three more: the last at +6 s


def test_a_schedule_can_be_told_to_start_later(tmp_path: Path) -> None:
    (table,) = workers(tmp_path / "throttles", 1)
    assert table.reserve("k", Rate(10.0), 1, not_before=table.now() + 1.0) == pytest.approx(1.0, abs=0.1)


def test_freed_slots_are_reused_and_a_key_is_found_beyond_one(tmp_path: Path) -> None:
    """A key whose state is all past (no connection, schedule over) leaves its slot to others;
    a key further down the probe chain is still found, never given a second slot."""
    first, second = workers(tmp_path / "throttles", 2)
    for n in range(50):
        first.acquire(f"k{n}", 5)
    for n in range(0, 50, 2):
        first.release(f"k{n}")
    for n in range(50, 100):
        second.acquire(f"k{n}", 5)
    assert all(first.held(f"k{n}") == (n % 2 or n >= 50) for n in range(100))
    assert all(second.acquire(f"k{n}", 2) for n in range(1, 50, 2))
    assert all(first.held(f"k{n}") == 2 for n in range(1, 50, 2))


def test_the_memory_table_follows_its_clock() -> None:
    now = [100.0]
    table = MemoryTable(lambda: now[0])
    rate = Rate(2.0, burst=2)
    assert [table.reserve("k", rate, 1) for _ in range(3)] == [0.0, 0.0, 0.5]
    now[0] += 10
    assert table.reserve("k", rate, 2) == 0.0  # the burst came back, no more
    assert table.acquire("k", 1) and not table.acquire("k", 1)
    table.release("k")
    assert table.held("k") == 0


def test_a_decision_in_the_shared_table_costs_microseconds(tmp_path: Path) -> None:
    """The price of holding limits per node: two flock calls and a few struct reads."""
    first, _ = workers(tmp_path / "throttles", 2)
    rate = Rate(1e9)
    started = time.perf_counter()
    for _ in range(10_000):
        first.reserve("site:mx.test", rate, 1)
    per_decision = (time.perf_counter() - started) / 10_000
    assert per_decision < 100e-6  # measured about 2-3 µs; the bound survives a loaded machine


async def test_a_limit_lowered_under_what_the_workers_hold_ends_just_the_excess_whichever_holds_it(
    tmp_path: Path,
) -> None:
    """An outside tester lowered a site's connection_limit from 4 to 1 (a `limit` reaction, a
    reload) on a 2-worker node: each worker ended only what was over the limit in itself, so
    2 connections (one a worker) went on for the whole effect."""
    from pigeon.shaping.throttles import Throttles

    first, second = (Throttles(table) for table in workers(tmp_path / "throttles", 2))
    holds = [await throttles.connect("site:mx", 4) for throttles in (first, second, first, second)]
    assert all(holds)
    asked = [(throttles, hold) for throttles, hold in zip((first, second, first, second), holds, strict=True)]
    kept = [throttles.keep(hold, 1) for throttles, hold in asked if hold is not None]
    assert kept.count(True) == 1  # three end, after their batch; not all four
    assert [throttles.keep(hold, 1) for throttles, hold in asked if hold is not None] == kept  # (asked again)
    assert await first.connect("site:mx", 1) is None  # those ending count until they are closed
    for (throttles, hold), goes_on in zip(asked, kept, strict=True):
        if not goes_on and hold is not None:
            throttles.disconnect(hold)
    assert first.table.held("site:mx") == 1
    assert all(
        throttles.keep(hold, 1) for (throttles, hold), goes_on in zip(asked, kept, strict=True) if goes_on and hold
    )
    assert await second.connect("site:mx", 2) is not None  # raised again: room for another


async def test_a_connection_that_had_its_turn_makes_room_for_another_worker_waiting_for_a_full_limit() -> None:
    """Found from outside: with connection_limit = 1 on two workers (or two nodes), the one
    holding the slot kept it for as long as its queue had mail: the other's mail waited (past
    a minute with a backlog, to max_age under steady traffic). Now one that has had its
    `TURN` while another waits makes room, one at a time."""
    from pigeon.shaping.throttles import TURN, Throttles

    now = [100.0]
    table = MemoryTable(clock=lambda: now[0])  # (one table, two workers' throttles: as a shared one)
    first, second = Throttles(table), Throttles(table)
    hold = await first.connect("site:mx", 1)
    assert hold is not None
    assert first.keep(hold, 1)  # nobody waits: it goes on, turn or not
    now[0] += TURN + 1
    assert first.keep(hold, 1)
    assert await second.connect("site:mx", 1) is None  # refused: it waits, and says so
    now[0] += 0.1
    assert first.keep(hold, 1) is False and hold.yielding  # its turn is over: it makes room
    assert await second.connect("site:mx", 1) is None  # (until it is closed)
    first.disconnect(hold)
    other = await second.connect("site:mx", 1)
    assert other is not None and second.keep(other, 1)  # the waiter's turn begins
    assert await first.connect("site:mx", 1) is None
    assert second.keep(other, 1)  # the first waits now, but the second's turn has just begun


async def test_of_several_connections_one_makes_room_at_a_time() -> None:
    from pigeon.shaping.throttles import TURN, Throttles

    now = [100.0]
    table = MemoryTable(clock=lambda: now[0])
    first, second = Throttles(table), Throttles(table)
    holds = [await first.connect("site:mx", 3) for _ in range(3)]
    now[0] += TURN + 1
    assert await second.connect("site:mx", 3) is None
    kept = [first.keep(hold, 3) for hold in holds if hold is not None]
    assert kept == [False, True, True]
