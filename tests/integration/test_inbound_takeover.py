"""What a node finds in Redis after another node died, against real servers: a private
Dovecot and Redis, a webhook receiver, and Pigeon as a process.

A dead node is played by writing what it leaves behind into Redis (a claim, a done mark) under
a token whose heartbeat has run out (or by an arbiter of this version that claims, then stops),
so each case happens every time rather than when a kill -9 lands at the right instant
(tests/stress/test_inbound_nodes.py has the kills).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from pathlib import Path
from typing import Any

from pigeon.inbound.arbitration import RedisArbiter
from tests.support.apps import (
    WebhookApp,
    customer_mail,
    imap_mailbox,
    mailbox_health,
    redis_in_use_for_a_while,
    webhook_target,
)
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot, RedisServer
from tests.support.sinks import wait_until

DEAD = "hdeadbeefdeadbeef"  # a node token ("h": it kept a heartbeat) that has none any more


def hook_node(tmp_path: Path, redis_server: RedisServer, app: WebhookApp, box: dict[str, Any]) -> PigeonProcess:
    """A node watching `box` with Redis arbitration, handing over to `app`."""
    return PigeonProcess(tmp_path / "p", redis={"url": redis_server.url}, target=[webhook_target(app)], mailbox=[box])


def claim_key(dovecot: Dovecot, uid: int) -> str:
    """The Redis key a node claims UID `uid` of the test user's INBOX under."""
    return f"pigeon:inbound:app@127.0.0.1:{dovecot.port}/INBOX:{dovecot.uidvalidity('app')}:{uid}"


def test_a_dead_node_s_claim_is_taken_over_at_once_and_its_done_mark_acknowledged_and_recorded(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    held, handed, fresh = (customer_mail(i) for i in range(3))
    uids = dovecot.append("app", [held, handed, fresh])
    redis_in_use_for_a_while(redis_server)
    client = redis_server.client()
    # The dead node held the first message (its second attempt, with the default 60 s lease),
    # and had handed the second over, marked it done, and died before acknowledging it.
    client.set(claim_key(dovecot, uids[0]), f"c:{DEAD}.7:1", px=60_000)
    client.set(claim_key(dovecot, uids[1]), f"d:{DEAD}", px=86_400_000)
    with WebhookApp() as app:
        box = imap_mailbox(dovecot, "hook")  # lease: the default 60 s
        with hook_node(tmp_path, redis_server, app, box) as node:
            started = time.monotonic()
            wait_until(lambda: not dovecot.unseen("app"), 30)
            took = time.monotonic() - started
            records = node.wait_records("InboundDelivery", 3)
    key = {raw: hashlib.sha256(raw).hexdigest() for raw in (held, handed, fresh)}
    assert took < 20, f"{took:.1f}s: the dead node's claim waited for its lease"
    # The held message and the fresh one were handed over; the handed one was not again.
    assert set(app.accepted) == {key[held], key[fresh]}
    assert sum(app.accepted.values()) == 2
    by_key = {r["dedupe_key"]: r for r in records}
    assert set(by_key) == set(key.values())
    assert by_key[key[held]]["attempt"] == 2  # the dead node's attempt counted
    recovered = by_key[key[handed]]
    assert recovered["detail"].startswith(f"recovered: handed over by node {DEAD}")
    assert recovered["recovered_from"] == DEAD
    assert (recovered["uid"], recovered["acknowledged"]) == (uids[1], "seen")
    assert not by_key[key[fresh]]["detail"].startswith("recovered")
    assert by_key[key[fresh]].get("recovered_from") is None
    assert client.get(claim_key(dovecot, uids[1])).decode().startswith("d:h")  # done, by the live node now


def test_a_live_node_s_done_mark_is_left_to_it_and_recorded_by_whoever_takes_it_once_it_dies(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    """A node that marked a handoff done may not have written its record yet: acknowledging
    the message for it while it lives (as a done mark seen twice used to be) would leave the
    handoff without a record if it then died."""
    live = "hfeedfacefeedface"
    raw = customer_mail(0)
    (uid,) = dovecot.append("app", [raw])
    redis_in_use_for_a_while(redis_server)
    client = redis_server.client()
    client.set(claim_key(dovecot, uid), f"d:{live}", px=86_400_000)
    heartbeat_runs_out_in(redis_server, live, 60_000)
    with (
        WebhookApp() as app,
        hook_node(tmp_path, redis_server, app, imap_mailbox(dovecot, "hook")) as node,
    ):
        time.sleep(5)  # several looks at it, 2 s apart
        assert dovecot.unseen("app") == [uid], "acknowledged behind the back of the node that handed it over"
        heartbeat_runs_out_in(redis_server, live, 0)  # it dies before acknowledging
        wait_until(lambda: not dovecot.unseen("app"), 15)
        (record,) = node.wait_records("InboundDelivery", 1)
    assert not app.accepted  # not handed over again
    assert record["detail"].startswith(f"recovered: handed over by node {live}")
    assert record["recovered_from"] == live
    assert record["dedupe_key"] == hashlib.sha256(raw).hexdigest()


def test_a_takeover_is_logged_with_the_dead_node_s_name_and_token(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    """An operator running several nodes must be able to tell which one died: a token alone
    (one per process) names none of them. A node of an earlier version published no name, and
    is named by its token."""
    held, handed, old = (customer_mail(i) for i in range(3))
    uids = dovecot.append("app", [held, handed, old])
    redis_in_use_for_a_while(redis_server)
    # Node mx-dead held the first message and had handed the second over (done, not
    # acknowledged) when it stopped; a node of an earlier version held the third.
    mx_dead = asyncio.run(named_node_leaves(redis_server, "mx-dead", claim_key(dovecot, uids[0]),
                                            claim_key(dovecot, uids[1])))  # fmt: skip
    redis_server.client().set(claim_key(dovecot, uids[2]), f"c:{DEAD}.3:0", px=60_000)
    with (
        WebhookApp() as app,
        hook_node(tmp_path, redis_server, app, imap_mailbox(dovecot, "hook")) as node,
    ):
        wait_until(lambda: not dovecot.unseen("app"), 30)
        records = node.wait_records("InboundDelivery", 3)
        node.wait_stderr(f"from node mx-dead (token {mx_dead}), whose heartbeat stopped")
        node.wait_stderr(f"from node {DEAD}, whose heartbeat stopped")
    (recovered,) = [r for r in records if r.get("recovered_from")]
    assert recovered["recovered_from"] == mx_dead  # the token: what tells one process from another
    assert recovered["detail"].startswith(f"recovered: handed over by node mx-dead (token {mx_dead}), which")
    assert set(app.accepted) == {hashlib.sha256(raw).hexdigest() for raw in (held, old)}


async def named_node_leaves(redis_server: RedisServer, name: str, held: str, handed: str) -> str:
    """A node of this version named `name` claims `held` and `handed`, hands `handed` over
    (marks it done) and stops before acknowledging either; its token."""
    arbiter = RedisArbiter(redis_server.url, node=name)
    try:
        prefix = "pigeon:"  # (claim_key's keys carry it; the arbiter adds it)
        claims = await arbiter.claim([(held.removeprefix(prefix), 1), (handed.removeprefix(prefix), 2)], 60)
        await arbiter.done(claims[1:])
    finally:
        await arbiter.close()  # its heartbeat is gone: as dead as a kill -9 leaves it, 5 s sooner
    return arbiter.token


def heartbeat_runs_out_in(redis_server: RedisServer, token: str, ms: int) -> None:
    """Set node `token`'s heartbeat to run out `ms` from now (Redis clock)."""
    client = redis_server.client()
    now, micros = client.time()
    client.hset("pigeon:inbound:nodes", token, int(now * 1000 + micros // 1000 + ms))


def named_hook_node(
    tmp_path: Path, name: str, redis_server: RedisServer, app: WebhookApp, dovecot: Dovecot
) -> PigeonProcess:
    """Node `name` watching the test mailbox, 2 handoffs at a time; its requests say who it is
    (X-Test-Node), so the application can hold them."""
    hook = webhook_target(app, headers={"X-Test-Node": name})
    box = imap_mailbox(dovecot, "hook", concurrency=2)  # lease: the default 60 s
    redis = {"url": redis_server.url}
    return PigeonProcess(tmp_path / name, node={"name": name}, redis=redis, target=[hook], mailbox=[box])


def test_what_a_node_killed_mid_batch_held_is_recorded_as_taken_over_from_it(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    """A node killed while its batch is with the target may have handed any of it over: its
    answers never came back to mark it done. The node that takes its claims over hands them
    over again, and its records name the dead node (`taken_over_from`, its token, as
    `recovered_from` does), so the application's possible second copies can be told from the
    log; the INFO line of the takeover says so too. What it hands over that no dead node held
    carries no such mark."""
    held = [customer_mail(i) for i in range(4)]
    fresh = [customer_mail(i, tag="fresh") for i in range(2)]
    redis_in_use_for_a_while(redis_server)
    with WebhookApp() as app:
        app.hold("victim")  # its requests reach the application, whose answers wait
        uids = dovecot.append("app", held)  # there before it starts: its first search finds them all
        victim = named_hook_node(tmp_path, "victim", redis_server, app, dovecot).start()
        survivor = named_hook_node(tmp_path, "survivor", redis_server, app, dovecot)
        try:
            # All four claimed in one batch, two of them on the wire (its concurrency).
            wait_until(lambda: mailbox_health(victim)["claims"] == 4 and app.started == 2, 30, interval=0.01)
            token = redis_server.client().get(claim_key(dovecot, uids[0])).decode().split(":")[1].split(".")[0]
            survivor.start()  # finds them all held by a live node
            victim.kill()
            app.release("victim")  # the application takes the two it had: their answers go nowhere
            wait_until(lambda: app.accepted_from("victim") == 2, 10)
            dovecot.append("app", fresh)
            wait_until(lambda: not dovecot.unseen("app"), 30)
            records = survivor.wait_records("InboundDelivery", 6)
            # All 4 taken over: in one claim, or in shares (the survivor may still count the
            # victim among the live nodes when it claims: `Arbiter.live` is learnt each beat),
            # said by the first share's line and, after shares, one closing line's total.
            first = re.compile(
                rf"took over (\d+) messages? from node victim \(token {token}\), whose heartbeat stopped"
            )
            closing = re.compile(rf"took over (\d+) more messages? from node victim \(token {token}\) in later batches")

            def total() -> int:
                logged = survivor.stderr()
                return sum(int(n) for n in first.findall(logged) + closing.findall(logged))

            wait_until(lambda: total() == 4, 10)
            lines = [line for line in survivor.stderr().splitlines() if first.search(line) or closing.search(line)]
        finally:
            for node in (victim, survivor):
                node.kill()
    key = {raw: hashlib.sha256(raw).hexdigest() for raw in held + fresh}
    by_key = {r["dedupe_key"]: r for r in records}
    assert set(by_key) == set(key.values()) and len(records) == 6
    assert sum(app.accepted.values()) == 8  # the two the victim had on the wire, twice
    assert not victim.records("InboundDelivery")  # it died before any answer came
    for raw in held:
        record = by_key[key[raw]]
        assert record["taken_over_from"] == token, record
        assert record.get("recovered_from") is None and not record.get("repeated_by_takeover")
    for raw in fresh:
        assert "taken_over_from" not in by_key[key[raw]], by_key[key[raw]]
    assert all("taken_over_from" in line for line in lines), lines  # the operator is told where to look


def test_a_taken_over_message_s_records_name_the_dead_node_through_its_retries(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    """The node that takes over a dead node's claim may meet a target that refuses for now: the
    message waits out its backoff, and may be tried again by any node. The dead node may have
    handed it over already all the same, so every record of it until it is handed over says
    `taken_over_from` (the failures too), and not only the first attempt's; the INFO line of the
    takeover is said once, not at each retry."""
    raw = customer_mail(0)
    (uid,) = dovecot.append("app", [raw])
    redis_in_use_for_a_while(redis_server)
    # The dead node was on its first attempt, with the default 60 s lease, when it died.
    redis_server.client().set(claim_key(dovecot, uid), f"c:{DEAD}.7:0", px=60_000)
    with WebhookApp() as app:
        app.answers = [(500, {}), (500, {})]  # then 202
        hook = webhook_target(app, retry_interval="500ms", max_retry_interval="500ms")
        box = imap_mailbox(dovecot, "hook")
        with PigeonProcess(tmp_path / "p", redis={"url": redis_server.url}, target=[hook], mailbox=[box]) as node:
            wait_until(lambda: not dovecot.unseen("app"), 30)
            (delivered,) = node.wait_records("InboundDelivery", 1)
            failures = node.wait_records("InboundFailure", 2)
            said = node.stderr()
    assert sum(app.accepted.values()) == 1
    assert [r["attempt"] for r in failures] == [1, 2] and delivered["attempt"] == 3
    for record in [*failures, delivered]:
        assert record["taken_over_from"] == DEAD, record
        assert record["dedupe_key"] == hashlib.sha256(raw).hexdigest()
    assert said.count(f"took over 1 message from node {DEAD}") == 1, said


def test_a_takeover_in_several_batches_is_one_info_line_and_one_closing_total(
    tmp_path: Path, dovecot: Dovecot, redis_server: RedisServer
) -> None:
    """A dead node's messages taken over in several batches (a small `batch`, or a big backlog)
    were one INFO line per batch: 14 lines within 4 s for one takeover. Now the first batch says
    it, as before, and one line ends it with how many it took in all."""
    raws = [customer_mail(i) for i in range(7)]
    uids = dovecot.append("app", raws)
    redis_in_use_for_a_while(redis_server)
    client = redis_server.client()
    for uid in uids[:5]:  # held when it died
        client.set(claim_key(dovecot, uid), f"c:{DEAD}.7:0", px=60_000)
    for uid in uids[5:]:  # handed over, not acknowledged
        client.set(claim_key(dovecot, uid), f"d:{DEAD}", px=86_400_000)
    with WebhookApp() as app:
        box = imap_mailbox(dovecot, "hook", batch=2)
        with hook_node(tmp_path, redis_server, app, box) as node:
            wait_until(lambda: not dovecot.unseen("app"), 30)
            node.wait_records("InboundDelivery", 7)
            closing = node.wait_stderr(f"more messages from node {DEAD} in later batches", timeout=10)
            time.sleep(0.5)
            said = [line for line in node.stderr().splitlines() if f"from node {DEAD}" in line]
    assert sum(app.accepted.values()) == 5
    assert len(said) == 2, said
    first, last = said
    assert re.search(rf"INFO .*mailbox support: took over 2 messages from node {DEAD}, whose heartbeat stopped", first)
    assert re.search(
        rf"INFO .*mailbox support: took over 5 more messages from node {DEAD} in later batches: 7 in all, "
        rf"5 it held .*; 2 it had handed over",
        last,
    ), closing
