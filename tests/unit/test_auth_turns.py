"""An AUTH waiting for checks in progress looks again as soon as one is counted on this worker,
or after a short while (a check counted on another worker is not signalled here)."""

from __future__ import annotations

import asyncio

from pigeon.listener.auth_turns import AuthTurns


async def test_a_waiting_auth_looks_again_when_a_check_is_counted() -> None:
    turns = AuthTurns()
    loop = asyncio.get_running_loop()
    first, second = turns.turn(loop.time() + 60), turns.turn(loop.time() + 60)
    await asyncio.sleep(0)
    assert not first.done() and not second.done()
    turns.counted()
    await asyncio.wait_for(asyncio.gather(first, second), 1)
    assert turns.waiting == 0


async def test_a_waiting_auth_looks_again_after_a_while_if_no_check_is_counted_here() -> None:
    turns = AuthTurns()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(turns.turn(started + 0.05), 1)
    assert loop.time() >= started + 0.05
    # What a turn given up leaves behind is gone: the next count finds no one waiting.
    assert turns.waiting == 0
    turns.counted()
    later = turns.turn(loop.time() + 60)
    turns.counted()
    await asyncio.wait_for(later, 1)
