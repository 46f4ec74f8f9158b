"""Single-node arbitration: the same states as the Redis arbiter, in memory."""

from __future__ import annotations

import asyncio

import pytest

from pigeon.inbound import arbitration
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


async def test_a_done_or_failed_mark_lasts_as_long_again_each_time_a_claim_finds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A message whose acknowledgement the server refuses (and that it would not flag) is found
    # by every search: its mark must outlive the refusal, or it would be handed over again.
    monkeypatch.setattr(arbitration, "DONE_TTL", 0.3)
    arbiter = LocalArbiter()
    keys = [("k1", 1), ("k2", 2)]
    done, failed = await arbiter.claim(keys, 30)
    await arbiter.done([done])
    await arbiter.failed([failed])
    for _ in range(4):  # 0.6 s in all: twice the mark's time to live
        await asyncio.sleep(0.15)
        assert [c.standing for c in await arbiter.claim(keys, 30)] == [Standing.DONE, Standing.FAILED]
    await asyncio.sleep(0.4)  # no claim found it meanwhile: it lapses
    assert [c.standing for c in await arbiter.claim(keys, 30)] == [Standing.CLAIMED, Standing.CLAIMED]


async def test_the_node_a_claim_was_taken_over_from_outlasts_its_backoff_and_release() -> None:
    """One node takes nothing over from another (no shared store), but the states are the
    Redis arbiter's: a dead node's token kept with a backoff, or a claim given back untried,
    comes back with the next claim (see test_arbitration_redis)."""
    arbiter = LocalArbiter()
    failing, untried = await arbiter.claim([("k1", 1), ("k2", 2)], 30)
    failing.previous = untried.previous = "hdead"
    await arbiter.backoff([(failing, 0.05)])
    await arbiter.release([untried])
    await asyncio.sleep(0.1)
    again = await arbiter.claim([("k1", 1), ("k2", 2)], 30)
    assert [(c.attempts, c.taken_over_from, c.carried) for c in again] == [(1, "hdead", True), (0, "hdead", True)]
