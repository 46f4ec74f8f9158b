"""Claims in a real Redis: what two nodes (two arbiters) see of each other's claims.

Most tests start on a Redis that has been in use for a while (`redis_in_use_for_a_while`);
the ones about Redis losing its data restart it, or start on an empty one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pigeon.inbound import arbitration
from pigeon.inbound.arbitration import BEAT, BEAT_TTL, DONE_TTL, ArbitrationUnavailable, RedisArbiter, Standing
from tests.support.apps import redis_in_use_for_a_while
from tests.support.services import RedisServer

Nodes = tuple[RedisArbiter, RedisArbiter]


@pytest.fixture
async def nodes(redis_server: RedisServer) -> AsyncIterator[Nodes]:
    """Two nodes' arbiters on one Redis."""
    redis_in_use_for_a_while(redis_server)
    one, two = RedisArbiter(redis_server.url), RedisArbiter(redis_server.url)
    yield one, two
    await one.close()
    await two.close()


KEYS = [("inbound:app@h:143/INBOX:7:1", 1), ("inbound:app@h:143/INBOX:7:2", 2)]
NODES_KEY = "pigeon:inbound:nodes"
NAMES_KEY = "pigeon:inbound:names"


def redis_ms(redis_server: RedisServer) -> int:
    now, micros = redis_server.client().time()
    return int(now * 1000 + micros // 1000)


def heartbeat_runs_out(redis_server: RedisServer, token: str, *, in_ms: int = 0) -> None:
    """What Redis sees of a node killed with kill -9: its heartbeat stops being renewed."""
    redis_server.client().hset(NODES_KEY, token, redis_ms(redis_server) + in_ms)


async def test_one_node_claims_a_message_and_the_other_sees_it_held(nodes: Nodes) -> None:
    one, two = nodes
    assert [c.standing for c in await one.claim(KEYS, 30)] == [Standing.CLAIMED] * 2
    assert [c.standing for c in await two.claim(KEYS, 30)] == [Standing.HELD] * 2


async def test_each_heartbeat_counts_the_live_nodes(nodes: Nodes, redis_server: RedisServer) -> None:
    """What a mailbox shares a backlog among: nodes whose heartbeats run, not those that
    stopped (their heartbeats ran out) or said they stop."""
    one, two = nodes
    assert one.live == 1  # before any heartbeat: as if alone
    await one.ping()
    assert one.live == 1
    await two.ping()
    await one.claim(KEYS[:1], 30)  # claims go with a heartbeat too
    assert (one.live, two.live) == (2, 2)
    heartbeat_runs_out(redis_server, "hdeadbeefdeadbeef")
    await one.ping()
    assert one.live == 2
    await two.close()
    await one.ping()
    assert one.live == 1


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


async def test_a_dead_node_s_claims_are_taken_over_as_soon_as_its_heartbeat_runs_out(
    nodes: Nodes, redis_server: RedisServer
) -> None:
    one, two = nodes
    (claim,) = await one.claim(KEYS[:1], 60)
    await one.backoff([(claim, 0)])  # a first attempt failed ...
    (claim,) = await one.claim(KEYS[:1], 60)  # ... and `one` is on its second when it dies
    await one.close()
    heartbeat_runs_out(redis_server, one.token, in_ms=400)
    (held,) = await two.claim(KEYS[:1], 60)
    assert held.standing is Standing.HELD
    assert 0 < held.retry_in <= 0.4  # when to look again: when the heartbeat runs out
    await asyncio.sleep(held.retry_in + 0.05)
    (taken,) = await two.claim(KEYS[:1], 60)  # 60 s lease or not
    assert (taken.standing, taken.previous, taken.attempts) == (Standing.CLAIMED, one.token, 1)


async def test_a_live_holder_keeps_its_claim_for_the_whole_lease_however_slow(nodes: Nodes) -> None:
    one, two = nodes
    (claim,) = await one.claim(KEYS[:1], 3 * BEAT)
    for _ in range(2):  # a holder that hands over slowly, and never renews: its heartbeat goes on
        await asyncio.sleep(BEAT)
        assert (await two.claim(KEYS[:1], 30))[0].standing is Standing.HELD
        assert one.holds(claim)
    await asyncio.sleep(BEAT * 1.2)
    (taken,) = await two.claim(KEYS[:1], 30)
    assert (taken.standing, taken.previous) == (Standing.CLAIMED, "")  # by the lease, not by liveness


async def test_a_node_that_stops_frees_the_claims_it_could_not_give_back_at_once(nodes: Nodes) -> None:
    one, two = nodes
    await one.claim(KEYS, 60)
    await one.close()
    taken = await two.claim(KEYS, 60)
    assert [(c.standing, c.previous) for c in taken] == [(Standing.CLAIMED, one.token)] * 2


async def test_a_holder_whose_heartbeat_lapsed_trusts_its_claims_only_once_verified_again(
    nodes: Nodes, redis_server: RedisServer
) -> None:
    one, two = nodes
    claims = await one.claim(KEYS, 60)
    assert all(one.holds(c) for c in claims)
    heartbeat_runs_out(redis_server, one.token)  # `one` stalled (a long pause, a partition) ...
    (taken,) = await two.claim(KEYS[:1], 60)  # ... and `two` took one of its messages meanwhile
    assert taken.previous == one.token
    lapse = one.lapse_signal()
    await asyncio.wait_for(lapse.wait(), BEAT * 3)  # `one`'s next heartbeat finds the lapse
    assert not any(one.holds(c) for c in claims)
    await one.renew(claims, 60)  # what the watcher does at once on a lapse
    assert [c.lost for c in claims] == [True, False]
    assert one.holds(claims[1]) and not one.holds(claims[0])


async def test_a_dead_node_s_done_mark_is_taken_over_once_to_be_acknowledged_and_recorded(
    nodes: Nodes, redis_server: RedisServer
) -> None:
    one, two = nodes
    (claim,) = await one.claim(KEYS[:1], 60)
    await one.done([claim])
    (done,) = await two.claim(KEYS[:1], 60)
    assert (done.standing, done.holder) == (Standing.DONE, one.token)  # `one` acknowledges it: left to it
    heartbeat_runs_out(redis_server, one.token)  # `one` died before it did
    (orphan,) = await two.claim(KEYS[:1], 60)
    assert (orphan.standing, orphan.previous) == (Standing.ORPHANED, one.token)
    third = RedisArbiter(redis_server.url)
    try:  # the done mark is `two`'s now: nobody else records it too
        assert (await third.claim(KEYS[:1], 60))[0].standing is Standing.DONE
    finally:
        await third.close()


async def test_a_takeover_names_the_dead_node_if_it_published_a_name(redis_server: RedisServer) -> None:
    redis_in_use_for_a_while(redis_server)
    named, unnamed = RedisArbiter(redis_server.url, node="mx1"), RedisArbiter(redis_server.url)
    taker = RedisArbiter(redis_server.url, node="mx2")
    try:
        _, handed = await named.claim(KEYS, 60)
        await named.done([handed])
        await unnamed.claim([("inbound:app@h:143/INBOX:7:3", 3)], 60)
        assert [c.previous_name for c in await taker.claim(KEYS, 60)] == ["", ""]  # alive: nothing taken
        await named.close()
        await unnamed.close()
        taken = await taker.claim([*KEYS, ("inbound:app@h:143/INBOX:7:3", 3)], 60)
        assert [(c.standing, c.previous, c.previous_name) for c in taken] == [
            (Standing.CLAIMED, named.token, "mx1"),
            (Standing.ORPHANED, named.token, "mx1"),
            (Standing.CLAIMED, unnamed.token, ""),  # as from a node of an earlier version
        ]
        assert taken[0].previous_node == f"mx1 (token {named.token})"
        assert taken[2].previous_node == unnamed.token
    finally:
        await taker.close()


async def test_the_sweep_forgets_a_dead_node_s_name_once_nothing_of_it_can_be_taken_over(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names must not pile up in Redis, one per process start: each is kept as long as its
    node's done marks may be taken over, and no longer."""
    monkeypatch.setattr(arbitration, "_SWEEP_EVERY", 0.0)  # a sweep with every heartbeat
    redis_in_use_for_a_while(redis_server)
    client = redis_server.client()
    client.hset(NAMES_KEY, "hstale", f"{redis_ms(redis_server) - 1}:long-gone")  # kept until a moment ago
    dead = RedisArbiter(redis_server.url, node="just-died")
    await dead.claim(KEYS[:1], 60)
    await dead.close()
    arbiter = RedisArbiter(redis_server.url, node="mx1")
    try:
        await arbiter.claim(KEYS[1:], 60)  # starts its heartbeat, and sweeps with the next one
        await asyncio.sleep(BEAT * 2.5)
        names = {k.decode(): v.decode() for k, v in client.hgetall(NAMES_KEY).items()}
        assert set(names) == {dead.token, arbiter.token}
        assert names[arbiter.token].endswith(":mx1")
        assert 0 < client.pttl(NAMES_KEY) <= (BEAT_TTL + DONE_TTL) * 1000  # and the hash, if no node is left
    finally:
        await arbiter.close()


async def test_a_claim_renewed_after_redis_lost_it_is_put_back(nodes: Nodes, redis_server: RedisServer) -> None:
    one, two = nodes
    claims = await one.claim(KEYS, 30)
    redis_server.client().flushall()  # what a restart without persistence does
    redis_in_use_for_a_while(redis_server)  # (this test is not about the pause that follows)
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


async def test_the_dead_node_a_claim_was_taken_from_stays_with_it_until_it_is_handed_over(
    nodes: Nodes, redis_server: RedisServer
) -> None:
    """The dead node may have handed the message over before it died: whoever tries it next,
    after a failed attempt's backoff or a claim given back untried (none attempted yet, too),
    records `taken_over_from` it; only a takeover made now is a takeover to log (`carried`)."""
    one, two = nodes
    dead = "hdeadbeefdeadbeef"
    client = redis_server.client()
    for key, _ in KEYS:
        client.set(f"pigeon:{key}", f"c:{dead}.7:0", px=60_000)  # its first attempts, when it died
    failing, untried = await one.claim(KEYS, 60)
    assert [(c.previous, c.carried, c.taken_over_from) for c in (failing, untried)] == [(dead, False, dead)] * 2
    # The target refused it for now: 2 s, that a loaded machine (the suite's other tests) cannot
    # let run out before the next line asks (0.2 s did, once).
    await one.backoff([(failing, 2.0)])
    await one.release([untried])  # given back before its turn came (the node stops, say)
    assert (await two.claim(KEYS[:1], 60))[0].standing is Standing.WAITING
    await asyncio.sleep(2.1)
    retried, taken = await two.claim(KEYS, 60)
    assert [(c.standing, c.attempts, c.previous, c.carried) for c in (retried, taken)] == [
        (Standing.CLAIMED, 1, dead, True),
        (Standing.CLAIMED, 0, dead, True),
    ]
    await two.backoff([(retried, 0)])  # failed again, on `two` this time: still the dead node's
    (again,) = await one.claim(KEYS[:1], 60)
    assert (again.attempts, again.taken_over_from, again.carried) == (2, dead, True)
    await one.done([again])
    await two.done([taken])
    assert [c.standing for c in await two.claim(KEYS, 60)] == [Standing.DONE] * 2


async def test_no_redis_means_no_claims_rather_than_a_guess(redis_server: RedisServer) -> None:
    arbiter = RedisArbiter(redis_server.url, timeout=0.5)
    try:
        redis_server.stop()
        with pytest.raises(ArbitrationUnavailable):
            await arbiter.claim(KEYS, 30)
        redis_server.start()  # empty: it may have lost claims a moment ago, for all it knows
        assert [c.standing for c in await arbiter.claim(KEYS, 30)] == [Standing.WAITING] * 2
        assert 0 < arbiter.paused_for() <= arbiter.grace
        await asyncio.sleep(arbiter.paused_for())
        assert [c.standing for c in await arbiter.claim(KEYS, 30)] == [Standing.CLAIMED] * 2
    finally:
        await arbiter.close()


async def test_after_redis_lost_its_data_claims_pause_while_holders_put_theirs_back(
    redis_server: RedisServer,
) -> None:
    redis_in_use_for_a_while(redis_server)
    holder, other = RedisArbiter(redis_server.url, timeout=0.2), RedisArbiter(redis_server.url, timeout=0.2)
    try:
        claims = await holder.claim(KEYS[:1], 3.0)
        assert [c.standing for c in await other.claim(KEYS[1:], 3.0)] == [Standing.CLAIMED]
        redis_server.restart()  # empty: every claim and heartbeat is gone
        # The other node knew Redis before: it waits a heartbeat, two timeouts and a second
        # (2.4 s here) instead of grabbing the message the holder is still handing over ...
        assert [c.standing for c in await other.claim(KEYS[:1], 3.0)] == [Standing.WAITING]
        assert other.paused_for() > 2
        await holder.renew(claims, 3.0)  # ... which the holder's renewal (at once on a lapse) puts back.
        assert not claims[0].lost
        await asyncio.sleep(other.paused_for() + 0.1)
        assert [c.standing for c in await other.claim(KEYS[:1], 3.0)] == [Standing.HELD]
    finally:
        await holder.close()
        await other.close()


async def test_a_node_that_starts_after_redis_lost_its_data_pauses_too(redis_server: RedisServer) -> None:
    """It never knew the Redis before, so it cannot tell; what it can tell is how long ago this
    Redis was first used by Pigeon (its epoch): a while ago, nothing is still missing."""
    redis_in_use_for_a_while(redis_server)
    holder = RedisArbiter(redis_server.url, timeout=0.2)
    try:
        claims = await holder.claim(KEYS[:1], 30)
        redis_server.client().flushall()  # Redis lost its data ...
        await holder.renew(claims, 30)  # ... and the holder put its claim back
    finally:
        await holder.close()  # then died: its claim may be taken over, but not during the pause
    newcomer = RedisArbiter(redis_server.url, timeout=0.2)
    try:
        assert [c.standing for c in await newcomer.claim(KEYS, 30)] == [Standing.WAITING] * 2
        assert 0 < newcomer.paused_for() <= newcomer.grace
    finally:
        await newcomer.close()
    redis_in_use_for_a_while(redis_server)
    latecomer = RedisArbiter(redis_server.url, timeout=0.2)
    try:
        taken = await latecomer.claim(KEYS, 30)
        assert [(c.standing, c.previous) for c in taken] == [(Standing.CLAIMED, holder.token), (Standing.CLAIMED, "")]
    finally:
        await latecomer.close()


async def test_keys_carry_the_configured_prefix(redis_server: RedisServer) -> None:
    redis_in_use_for_a_while(redis_server, "cluster-a")
    arbiter = RedisArbiter(redis_server.url, prefix="cluster-a")
    try:
        await arbiter.claim(KEYS[:1], 30)
        assert redis_server.client().exists(f"cluster-a:{KEYS[0][0]}")
        assert redis_server.client().hexists("cluster-a:inbound:nodes", arbiter.token)
    finally:
        await arbiter.close()


async def test_a_done_or_failed_mark_lasts_as_long_again_each_time_a_claim_finds_it(
    nodes: Nodes, redis_server: RedisServer
) -> None:
    # A message whose acknowledgement the server refuses (and that it would not flag) is found
    # by every search: its mark must outlive the refusal, or it would be handed over again.
    one, two = nodes
    done, failed = await one.claim(KEYS, 30)
    await one.done([done])
    await one.failed([failed])
    client = redis_server.client()
    keys = [f"pigeon:{key}" for key, _ in KEYS]
    for key in keys:
        client.pexpire(key, 5000)  # as if it had been there all but 5 s of its day
    assert [c.standing for c in await two.claim(KEYS, 30)] == [Standing.DONE, Standing.FAILED]
    assert all(client.pttl(key) > (DONE_TTL - 60) * 1000 for key in keys)
