"""Claims in a real Redis: what two nodes (two arbiters) see of each other's claims."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pigeon.inbound.arbitration import ArbitrationUnavailable, RedisArbiter, Standing
from tests.support.services import RedisServer

Nodes = tuple[RedisArbiter, RedisArbiter]


@pytest.fixture
async def nodes(redis_server: RedisServer) -> AsyncIterator[Nodes]:
    """Two nodes' arbiters on one Redis."""
    one, two = RedisArbiter(redis_server.url), RedisArbiter(redis_server.url)
    yield one, two
    await one.close()
    await two.close()


KEYS = [("inbound:app@h:143/INBOX:7:1", 1), ("inbound:app@h:143/INBOX:7:2", 2)]


async def test_one_node_claims_a_message_and_the_other_sees_it_held(nodes: Nodes) -> None:
    one, two = nodes
    assert [c.standing for c in await one.claim(KEYS, 30)] == [Standing.CLAIMED] * 2
    assert [c.standing for c in await two.claim(KEYS, 30)] == [Standing.HELD] * 2


async def test_a_holder_whose_lease_ran_out_cannot_overwrite_the_new_owner(
    nodes: Nodes,
) -> None:
    one, two = nodes
    (late,) = await one.claim(KEYS[:1], 0.1)
    await asyncio.sleep(0.2)
    (owner,) = await two.claim(KEYS[:1], 30)
    assert owner.standing is Standing.CLAIMED
    await one.done([late])  # compare-and-set fails: the key is two's
    await one.release([late])
    await one.renew([late], 30)
    assert late.lost
    assert (await one.claim(KEYS[:1], 30))[0].standing is Standing.HELD
    await two.done([owner])
    assert (await one.claim(KEYS[:1], 30))[0].standing is Standing.DONE


async def test_a_claim_renewed_after_redis_lost_it_is_put_back(nodes: Nodes, redis_server: RedisServer) -> None:
    one, two = nodes
    claims = await one.claim(KEYS, 30)
    redis_server.client().flushall()  # what a restart without persistence does
    await one.renew(claims, 30)
    assert not any(c.lost for c in claims)
    assert [c.standing for c in await two.claim(KEYS, 30)] == [Standing.HELD] * 2


async def test_backoff_is_respected_by_every_node_and_counts_attempts(nodes: Nodes) -> None:
    one, two = nodes
    (claim,) = await one.claim(KEYS[:1], 30)
    await one.backoff([(claim, 0.3)])
    assert (await two.claim(KEYS[:1], 30))[0].standing is Standing.WAITING
    await asyncio.sleep(0.4)
    (retry,) = await two.claim(KEYS[:1], 30)
    assert (retry.standing, retry.attempts) == (Standing.CLAIMED, 1)


async def test_no_redis_means_no_claims_rather_than_a_guess(redis_server: RedisServer) -> None:
    arbiter = RedisArbiter(redis_server.url, timeout=0.5)
    try:
        redis_server.stop()
        with pytest.raises(ArbitrationUnavailable):
            await arbiter.claim(KEYS, 30)
        redis_server.start()
        assert [c.standing for c in await arbiter.claim(KEYS, 30)] == [Standing.CLAIMED] * 2
    finally:
        await arbiter.close()


async def test_after_redis_lost_its_data_claims_pause_while_holders_put_theirs_back(
    redis_server: RedisServer,
) -> None:
    holder, other = RedisArbiter(redis_server.url, timeout=0.2), RedisArbiter(redis_server.url, timeout=0.2)
    try:
        claims = await holder.claim(KEYS[:1], 3.0)
        assert [c.standing for c in await other.claim(KEYS[1:], 3.0)] == [Standing.CLAIMED]
        redis_server.restart()  # empty: every claim is gone
        # The other node knew Redis before: it waits a third of a lease and two timeouts and a
        # second (2.4 s here) instead of grabbing the
        # message the holder is still handing over ...
        assert [c.standing for c in await other.claim(KEYS[:1], 3.0)] == [Standing.WAITING]
        await holder.renew(claims, 3.0)  # ... which the holder's next renewal puts back.
        assert not claims[0].lost
        await asyncio.sleep(2.5)
        assert [c.standing for c in await other.claim(KEYS[:1], 3.0)] == [Standing.HELD]
    finally:
        await holder.close()
        await other.close()


async def test_keys_carry_the_configured_prefix(redis_server: RedisServer) -> None:
    arbiter = RedisArbiter(redis_server.url, prefix="cluster-a")
    try:
        await arbiter.claim(KEYS[:1], 30)
        assert redis_server.client().exists(f"cluster-a:{KEYS[0][0]}")
    finally:
        await arbiter.close()
