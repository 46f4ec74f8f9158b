"""Single-node arbitration: the same states as the Redis arbiter, in memory."""

from __future__ import annotations

import asyncio

from pigeon.inbound.arbitration import LocalArbiter, Standing


async def test_a_claim_is_exclusive_until_released() -> None:
    first, keys = LocalArbiter(), [("k1", 1), ("k2", 2)]
    claims = await first.claim(keys, 30)
    assert [c.standing for c in claims] == [Standing.CLAIMED, Standing.CLAIMED]
    again = await first.claim(keys, 30)
    assert [c.standing for c in again] == [Standing.HELD, Standing.HELD]
    await first.release(claims[:1])
    assert [c.standing for c in await first.claim(keys, 30)] == [Standing.CLAIMED, Standing.HELD]


async def test_an_expired_claim_can_be_taken_and_the_old_holder_cannot_mark_it_done() -> None:
    arbiter = LocalArbiter()
    (old,) = await arbiter.claim([("k", 1)], 0.05)
    await asyncio.sleep(0.1)
    (new,) = await arbiter.claim([("k", 1)], 30)
    assert new.standing is Standing.CLAIMED
    await arbiter.done([old])  # too late: must not overwrite the new owner's claim
    assert (await arbiter.claim([("k", 1)], 30))[0].standing is Standing.HELD
    await arbiter.done([new])
    assert (await arbiter.claim([("k", 1)], 30))[0].standing is Standing.DONE


async def test_backoff_holds_everyone_off_then_counts_the_attempts() -> None:
    arbiter = LocalArbiter()
    (claim,) = await arbiter.claim([("k", 1)], 30)
    await arbiter.backoff([(claim, 0.1)])
    assert (await arbiter.claim([("k", 1)], 30))[0].standing is Standing.WAITING
    await asyncio.sleep(0.15)
    (retry,) = await arbiter.claim([("k", 1)], 30)
    assert retry.standing is Standing.CLAIMED
    assert retry.attempts == 1
