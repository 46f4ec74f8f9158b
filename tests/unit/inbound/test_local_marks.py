"""Single-node done and failed marks kept in the spool (`pigeon.inbound.marks`): what the next
run of the node finds there, whether the last one stopped or was killed, and what it does not."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import pytest

from pigeon.inbound import arbitration, marks
from pigeon.inbound.arbitration import LocalArbiter, Standing

_KEYS = [("inbound:box:7:1", 1), ("inbound:box:7:2", 2), ("inbound:box:7:3", 3)]


async def test_a_done_mark_left_by_a_killed_run_is_taken_over_by_the_next_to_acknowledge(tmp_path: Path) -> None:
    path = tmp_path / "inbound-marks"
    first = LocalArbiter(path, node="mx-a")
    done, failed, _ = await first.claim(_KEYS, 30)
    await first.done([done])
    await first.failed([failed])
    # Killed: never closed. What it wrote is in the file all the same.
    second = LocalArbiter(path, node="mx-a")
    claims = await second.claim(_KEYS, 30)
    assert [c.standing for c in claims] == [Standing.ORPHANED, Standing.FAILED, Standing.CLAIMED]
    assert (claims[0].previous, claims[0].previous_name) == (first.token, "mx-a")
    assert second.marks_lost() is None
    # Taken over: the mark is the second run's now, in the file too.
    await second.close()
    third = LocalArbiter(path, node="mx-a")
    assert (await third.claim(_KEYS[:1], 30))[0].previous == second.token


async def test_a_mark_the_source_has_the_acknowledgement_of_is_not_left_for_the_next_run(tmp_path: Path) -> None:
    path = tmp_path / "inbound-marks"
    first = LocalArbiter(path)
    claims = await first.claim(_KEYS, 30)
    await first.done(claims)
    first.acknowledged([_KEYS[0][0], _KEYS[2][0]])
    # In this run it is still done (an older search may list it yet).
    assert (await first.claim(_KEYS[:1], 30))[0].standing is Standing.DONE
    await first.close()
    second = LocalArbiter(path)
    assert [c.standing for c in await second.claim(_KEYS, 30)] == [
        Standing.CLAIMED,
        Standing.ORPHANED,
        Standing.CLAIMED,
    ]


async def test_a_line_cut_short_by_a_crash_costs_that_mark_alone(tmp_path: Path) -> None:
    path = tmp_path / "inbound-marks"
    first = LocalArbiter(path)
    claims = await first.claim(_KEYS, 30)
    await first.done(claims[:2])
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) - 7])  # the second line's end never reached the disk
    second = LocalArbiter(path)
    orphaned, lost, fresh = await second.claim(_KEYS, 30)
    assert [orphaned.standing, lost.standing] == [Standing.ORPHANED, Standing.CLAIMED]
    await second.done([fresh])  # after a file written anew: on a line of its own
    third = LocalArbiter(path)
    assert [c.standing for c in await third.claim(_KEYS, 30)] == [
        Standing.ORPHANED,
        Standing.CLAIMED,
        Standing.ORPHANED,
    ]


async def test_marks_last_their_time_and_the_file_stays_the_size_of_what_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arbitration, "DONE_TTL", 0.2)
    monkeypatch.setattr(marks, "_COMPACT_AT", 50)
    path = tmp_path / "inbound-marks"
    arbiter = LocalArbiter(path)
    for n in range(100):  # handed over and acknowledged, one at a time
        claims = await arbiter.claim([(f"inbound:box:7:{n}", n)], 30)
        await arbiter.done(claims)
        arbiter.acknowledged([claims[0].key])
    assert len(path.read_bytes().splitlines()) <= 60
    (left,) = await arbiter.claim([("inbound:box:7:100", 100)], 30)
    await arbiter.done([left])
    await asyncio.sleep(0.3)
    assert [c.standing for c in await LocalArbiter(path).claim([(left.key, 100)], 30)] == [Standing.CLAIMED]


async def test_a_file_that_cannot_be_written_is_said_and_the_marks_stay_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "inbound-marks"
    arbiter = LocalArbiter(path)
    lost = arbiter.marks_lost()
    assert lost is not None and str(path) in lost
    (claim,) = await arbiter.claim(_KEYS[:1], 30)
    await arbiter.done([claim])
    assert (await arbiter.claim(_KEYS[:1], 30))[0].standing is Standing.DONE
    assert LocalArbiter().marks_lost() == "they are kept in memory only"


async def test_marks_a_full_disk_kept_from_the_file_are_in_it_once_it_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pigeon.inbound.marks")  # (the recovery is said at INFO)
    path = tmp_path / "inbound-marks"
    arbiter = LocalArbiter(path)
    first, second, third = await arbiter.claim(_KEYS, 30)
    write = os.write

    def full(fd: int, data: bytes) -> int:
        write(fd, data[:5])  # half a line, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    await arbiter.done([first])
    await arbiter.done([second])
    assert "No space left on device" in (arbiter.marks_lost() or "")
    assert "cannot keep done marks" in caplog.text
    monkeypatch.setattr(os, "write", write)
    await arbiter.done([third])
    assert arbiter.marks_lost() is None
    assert "done marks are kept in" in caplog.text
    claims = await LocalArbiter(path).claim(_KEYS, 30)
    assert [c.standing for c in claims] == [Standing.ORPHANED] * 3
