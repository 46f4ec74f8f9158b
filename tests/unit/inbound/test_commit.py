"""Group commit: what completes while a commit runs is committed together, right after it."""

from __future__ import annotations

import asyncio

import pytest

from pigeon.inbound.commit import BackgroundSync, GroupCommit


class Recorder:
    """A commit that takes until `release` is set, and remembers each group it was given."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail_on: int | None = None

    async def __call__(self, group: list[int]) -> None:
        self.groups.append(group)
        await self.release.wait()
        if self.fail_on in group:
            raise OSError("disk full")


async def test_what_arrives_during_a_commit_is_the_next_group_and_each_waits_for_its_own() -> None:
    commit = Recorder()
    group: GroupCommit[int] = GroupCommit(commit)
    first = asyncio.create_task(group.add([1]))
    await asyncio.sleep(0)
    later = [asyncio.create_task(group.add([n])) for n in (2, 3, 4)]
    await asyncio.sleep(0)
    assert commit.groups == [[1]]  # 2, 3, 4 wait for the first commit to end
    assert not first.done()
    commit.release.set()
    await asyncio.gather(first, *later)
    assert commit.groups == [[1], [2, 3, 4]]


async def test_a_failed_commit_fails_its_own_group_only() -> None:
    commit = Recorder()
    commit.fail_on = 1
    group: GroupCommit[int] = GroupCommit(commit)
    first = asyncio.create_task(group.add([1]))
    await asyncio.sleep(0)
    second = asyncio.create_task(group.add([2]))
    commit.release.set()
    with pytest.raises(OSError, match="disk full"):
        await first
    await second
    assert commit.groups == [[1], [2]]


async def test_a_waiter_cancelled_does_not_cancel_the_commit_it_shares() -> None:
    commit = Recorder()
    group: GroupCommit[int] = GroupCommit(commit)
    impatient = asyncio.create_task(group.add([1]))
    await asyncio.sleep(0)
    patient = asyncio.create_task(group.add([2]))
    await asyncio.sleep(0)
    impatient.cancel()
    commit.release.set()
    await patient
    assert commit.groups == [[1], [2]]


async def test_an_idle_group_commits_each_item_at_once() -> None:
    commit = Recorder()
    commit.release.set()
    group: GroupCommit[int] = GroupCommit(commit)
    for n in range(3):
        await group.add([n])
    assert commit.groups == [[0], [1], [2]]


async def test_under_load_commits_wait_for_the_window_unless_enough_have_gathered() -> None:
    window = 0.3
    commit = Recorder()
    commit.release.set()
    slow: GroupCommit[int] = GroupCommit(commit, window=window, enough=3)
    loop = asyncio.get_running_loop()
    await slow.add([1])  # idle: at once
    started = loop.time()
    await asyncio.gather(slow.add([2]), slow.add([3]))  # within the window: they wait for it, together
    assert loop.time() - started >= window * 0.9
    started = loop.time()
    await asyncio.gather(slow.add([4]), slow.add([5]), slow.add([6]))  # enough: at once
    assert loop.time() - started < window / 2
    assert commit.groups == [[1], [2, 3], [4, 5, 6]]


async def test_a_background_sync_asked_for_while_one_runs_runs_once_more_after_it() -> None:
    release = asyncio.Event()
    runs = 0

    async def sync() -> None:
        nonlocal runs
        runs += 1
        await release.wait()

    syncs = BackgroundSync(sync)
    syncs.soon()
    await asyncio.sleep(0)
    for _ in range(5):  # asked for five times while the first runs: one more covers them all
        syncs.soon()
    release.set()
    await syncs.wait()
    assert runs == 2
