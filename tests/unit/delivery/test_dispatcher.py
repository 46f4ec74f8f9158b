"""The dispatcher, on a fake clock: connections to the ready queues, leases, and what a failure costs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from pigeon.config.schema import ReactionConfig
from pigeon.delivery.agent import Agent, Unreachable, Work
from pigeon.delivery.dispatcher import ideal_connections, rate_connections
from pigeon.delivery.reactor import Reactor
from pigeon.delivery.routes import Destination
from pigeon.queue.attempt import Attempt
from pigeon.queue.rules import Selector
from pigeon.shaping.effects import Board
from pigeon.shaping.gcra import Rate
from pigeon.shaping.reactions import Reactions
from pigeon.shaping.rules import Shaping
from pigeon.shaping.table import MemoryTable
from pigeon.shaping.throttles import Throttles
from pigeon.smtp.replies import Reply
from tests.support.queue_world import FakeClock
from tests.unit.conftest import MakeWorld

SITES = {"d1.test": "mx1.test"}
DOWN = Reply(451, "4.4.1", ("cannot connect to mx1.test: connection refused",))


def test_connections_follow_the_queue_up_to_the_limit() -> None:
    assert [ideal_connections(n, 32) for n in (0, 1, 2, 10, 50, 100, 1000)] == [0, 1, 2, 7, 22, 29, 32]
    assert ideal_connections(5, 1) == 1


def test_the_connection_ramp_is_what_the_readme_says_of_connection_limit() -> None:
    # README, [delivery] connection_limit: "10 messages waiting open 7 connections, 50 open 22,
    # 100 open 29, and all 32 only from 151 waiting (connection_limit = 10: 10 waiting open 3,
    # 100 open 9)".
    assert [ideal_connections(n, 32) for n in (10, 50, 100, 150, 151)] == [7, 22, 29, 31, 32]
    assert [ideal_connections(n, 10) for n in (10, 100)] == [3, 9]


async def test_a_backlog_opens_up_to_the_connection_limit_and_no_more(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"], connection_limit=3)
    for n in range(200):
        world.inject([f"r{n}@d1.test"])
    await world.quiesce()
    assert len(world.opened) == 3
    assert len(world.of_kind("attempt")) == 3  # one message per connection at a time
    await world.release_all()
    assert len(world.attempted) == 200 and len(world.logged("Delivery")) == 200


def test_a_message_rate_opens_only_the_connections_it_can_keep_busy() -> None:
    rates = ("1/min", "1/s", "5/s", "6/s", "20/s", "100/s")
    assert [rate_connections(Rate.parse(r)) for r in rates] == [1, 1, 1, 2, 4, 20]


async def test_a_slow_rate_does_not_open_the_connection_limit_for_a_backlog(make_world: MakeWorld) -> None:
    # An outside tester saw 17 connections under 1/s, each holding a message a reload could not move.
    shaping = Shaping(connection_limit=20, idle_timeout=3600.0, max_message_rate=Rate.parse("1/s"))
    world = make_world(SITES, ["d1.test"], shaping=shaping)
    for n in range(25):
        world.inject([f"r{n}@d1.test"])
    await world.quiesce()
    assert len(world.opened) == 1


async def test_a_message_an_operator_took_while_it_waited_for_its_turn_is_not_sent(make_world: MakeWorld) -> None:
    """Taken off the ready queue, waiting for the site's rate: a bounce takes it back."""
    shaping = Shaping(connection_limit=1, idle_timeout=3600.0, max_message_rate=Rate.parse("20/s"))
    world = make_world(SITES, ["d1.test"], shaping=shaping)
    first = world.inject(["a@d1.test"])
    second = world.inject(["b@d1.test"])
    await world.quiesce()
    await world.release_all("attempt")  # the first is sent; the second waits for the rate
    await asyncio.sleep(0)
    entry = world.active.get(second)
    assert entry is not None and entry.state.value == "in_flight" and not entry.started
    bounce = world.bounce(Selector(queue="*"))
    await world.release_all()
    assert bounce.result is not None and bounce.result["bounced"] == 1
    await asyncio.sleep(0.1)  # the rate lets the connection go on
    await world.release_all()
    assert [a.message for a in world.attempted] == [first]
    assert world.active.stale_results == {"attempt": 1}
    assert [type(r).__name__ for r in world.logged() if r.id == f"{second:016x}"] == ["AdminBounce"]


async def test_a_connection_that_cannot_be_opened_costs_one_message_then_everything_waiting(
    make_world: MakeWorld,
) -> None:
    shaping = Shaping(connection_limit=1, idle_timeout=3600.0, connection_failures_before_delay=3)
    world = make_world(SITES, ["d1.test"], shaping=shaping, opener=_refused)
    for n in range(10):
        world.inject([f"r{n}@d1.test"])
    await world.release_all()
    failures = world.logged("TransientFailure")
    assert len(failures) == 10
    assert {f.response.text for f in failures} == {DOWN.text}
    assert len(world.spool.rows) == 10 and all(row.attempts == 1 for row in world.spool.rows.values())
    assert not len(world.active)


async def _refused(destination: Destination, source: str | None = None) -> Agent:
    raise Unreachable(DOWN)


async def test_a_host_that_answered_and_would_not_do_is_named_in_the_failure_with_its_tls(
    make_world: MakeWorld,
) -> None:
    """A 421 to the EHLO after STARTTLS: the records name the host and its TLS, as a delivery's
    would (found from outside: failures before the transaction had no `peer`)."""
    closing = Reply(421, "4.7.0", ("go away (answer of mx1.test [192.0.2.1]:25 to EHLO)",))

    async def turned_away(destination: Destination, source: str | None = None) -> Agent:
        raise Unreachable(closing, peer="mx1.test [192.0.2.1]:25", tls="TLSv1.3 TLS_AES_256_GCM_SHA384")

    world = make_world(SITES, ["d1.test"], connection_limit=1, opener=turned_away)
    world.inject(["a@d1.test"])
    await world.release_all()
    [failure, *_] = world.logged("TransientFailure")
    assert (failure.peer, failure.tls) == ("mx1.test [192.0.2.1]:25", "TLSv1.3 TLS_AES_256_GCM_SHA384")
    assert failure.response.code == 421


class _Hangs:
    """An agent whose connection is gone when it is next asked."""

    batch = 1
    separately = False

    def __init__(self) -> None:
        self.sent = 0

    def usable(self) -> bool:
        return self.sent == 0

    async def deliver(self, work: Sequence[Work]) -> list[Attempt]:
        self.sent += 1
        return [Attempt([Reply(250, "2.0.0", ("ok",))], [""], "mx1.test") for _ in work]

    async def close(self) -> None:
        pass

    def final(self) -> list[Attempt]:
        return []


async def test_a_message_taken_when_the_connection_died_is_not_sent_on_it(make_world: MakeWorld) -> None:
    agents: list[_Hangs] = []

    async def opener(destination: Destination, source: str | None = None) -> Agent:
        if agents:
            raise Unreachable(DOWN)  # the server is gone for good
        agents.append(_Hangs())
        return agents[0]

    world = make_world(SITES, ["d1.test"], connection_limit=1, opener=opener)
    world.inject(["a@d1.test"])
    second = world.inject(["b@d1.test"])
    await world.release_all()
    assert agents[0].sent == 1
    [failure] = world.logged("TransientFailure")
    assert (failure.id, failure.response.text) == (f"{second:016x}", DOWN.text)


async def test_nothing_is_taken_for_a_suspended_site_and_delivery_resumes_after(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"])
    hold = world.suspend(Selector(site="mx1.*"), rule_id="h")
    await world.release_all()
    assert hold.answered is not None
    spool_id = world.inject(["a@d1.test"])
    await world.release_all()
    assert world.attempted == []
    assert world.active.get(spool_id).state.value == "ready"  # type: ignore[union-attr]
    world.resume("h")
    await world.release_all()
    assert [a.message for a in world.attempted] == [spool_id]
    assert len(world.logged("Delivery")) == 1


async def test_resuming_a_site_suspension_counts_the_mail_it_held_as_due_now(make_world: MakeWorld) -> None:
    # `pigeon suspend --site` answered "held: 3"; its resume answered "0 messages due now",
    # and all 3 went out. The count is what waited for the site and goes now: none while
    # another suspension still holds the site.
    world = make_world(SITES, ["d1.test"])
    world.suspend(Selector(site="mx1.*"), rule_id="h")
    await world.release_all()
    ids = [world.inject([f"r{n}@d1.test"]) for n in range(3)]
    await world.release_all()
    held = world.suspend(Selector(site="mx1.test"), rule_id="also")
    await world.release_all()
    assert held.result is not None and held.result["held"] == 3
    first = world.resume("h")
    await world.release_all()
    assert first.result == {"cancelled": True, "made_due": 0}  # "also" holds them still
    assert world.attempted == []
    resumed = world.resume("also")
    await world.release_all()
    assert resumed.result == {"cancelled": True, "made_due": 3}
    assert sorted(a.message for a in world.attempted) == sorted(ids)


async def test_the_queue_summary_counts_what_a_suspension_holds_as_suspended(make_world: MakeWorld) -> None:
    # `pigeon suspend` answered "held: 3" and `queue summary` showed "held 0": its held column
    # counts [[inbound]] mail alone. Mail a suspension holds has its own column, "suspended".
    world = make_world({"d1.test": "mx1.test", "d2.test": "mx2.test"}, ["d2.test"])
    world.suspend(Selector(site="mx2.test"), rule_id="site")
    await world.release_all()
    for n in range(3):
        world.inject([f"r{n}@d1.test"])
        world.inject([f"s{n}@d2.test"])
    world.inject(["t@d2.test"])
    await world.release_all(but="lookup")  # d1's mail in memory, its route being looked up
    held = world.suspend(Selector(domain="d1.test"), rule_id="domain")
    await world.release_all(but="lookup")
    assert held.result is not None and held.result["held"] == 3
    rows = {row["queue"]: row for row in (await world.admin.summary())["scheduled"]}
    assert (rows["d1.test"]["suspended"], rows["d1.test"]["held"]) == (3, 0)  # back in the spool, held
    assert (rows["d2.test"]["suspended"], rows["d2.test"]["ready"]) == (4, 4)  # in the held site's ready queue
    world.resume("site")
    world.resume("domain")
    await world.release_all()
    rows = {row["queue"]: row for row in (await world.admin.summary())["scheduled"]}
    assert all(row["suspended"] == 0 for row in rows.values())


class _Breaks:
    batch = 1
    separately = False

    def usable(self) -> bool:
        return True

    async def deliver(self, work: Sequence[Work]) -> list[Attempt]:
        raise RuntimeError("a bug in an agent")

    async def close(self) -> None:
        pass

    def final(self) -> list[Attempt]:
        return []


async def test_an_agent_that_raises_leaves_no_message_in_flight(make_world: MakeWorld) -> None:
    async def opener(destination: Destination, source: str | None = None) -> Agent:
        return _Breaks()

    world = make_world(SITES, ["d1.test"], opener=opener)
    spool_id = world.inject(["a@d1.test"])
    await world.release_all()
    [failure] = world.logged("TransientFailure")
    assert (failure.response.code, failure.response.enhanced) == (451, "4.3.0")
    assert not len(world.active)
    assert world.spool.rows[spool_id].attempts == 1


async def test_a_body_that_cannot_be_read_is_a_transient_failure(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world(SITES, ["d1.test"])
    world.spool.bodies.clear()

    def unreadable(body_id: int) -> bytes:
        from pigeon.spool.spool import SpoolWriteError

        raise SpoolWriteError("body 0000000000000040 is not in the spool")

    monkeypatch.setattr(world.spool, "body", unreadable)
    spool_id = world.inject(["a@d1.test"])
    await world.release_all()
    assert world.attempted == []
    [failure] = world.logged("TransientFailure")
    assert failure.response.code == 451
    assert world.spool.rows[spool_id].attempts == 1


async def test_a_connection_takes_at_most_its_deliveries_then_another_opens(make_world: MakeWorld) -> None:
    shaping = Shaping(connection_limit=1, idle_timeout=3600.0, max_deliveries_per_connection=2)
    world = make_world(SITES, ["d1.test"], shaping=shaping)
    for n in range(5):
        world.inject([f"r{n}@d1.test"])
    await world.release_all()
    assert len(world.logged("Delivery")) == 5
    assert len(world.opened) == 3


async def test_a_destination_no_agent_can_serve_defers_its_mail(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"])
    world.dispatcher._agents = {}  # a build without the SMTP agent
    spool_id = world.inject(["a@d1.test"])
    await world.release_all()
    [failure] = world.logged("TransientFailure")
    assert (failure.response.code, failure.response.enhanced) == (451, "4.3.5")
    assert world.spool.rows[spool_id].attempts == 1 and not len(world.active)


async def test_a_connection_sends_no_third_message_while_the_first_ones_outcome_is_unwritten(
    make_world: MakeWorld,
) -> None:
    """A kill -9 redelivers what was sent but not yet recorded. However slow the disk, one
    connection has at most two such messages: the one whose outcome is being written and the
    one on the wire."""
    world = make_world(SITES, ["d1.test"], connection_limit=1)
    sent = [world.inject([f"r{n}@d1.test"]) for n in range(5)]
    await world.quiesce()
    for _ in range(4):  # deliveries succeed at once; the disk answers nothing
        for attempt in world.of_kind("attempt"):
            await world.release(attempt)
        await world.quiesce()
    assert [a.message for a in world.attempted] == sent[:2]
    assert len(world.of_kind("land")) == 2  # both outcomes still to be written

    await world.release(world.of_kind("land")[0])  # the first outcome is durable: one more goes
    await world.release_all("answer")
    await world.quiesce()
    assert [a.message for a in world.attempted] == sent[:3]

    await world.release_all()
    assert [a.message for a in world.attempted] == sent
    assert len(world.logged("Delivery")) == 5


async def test_a_site_whose_connections_are_all_held_elsewhere_is_asked_again_until_one_frees(
    make_world: MakeWorld,
) -> None:
    table = MemoryTable()
    assert table.acquire("site:mx1.test", 1)  # another worker of the node holds the only one
    world = make_world(SITES, ["d1.test"], connection_limit=1, throttles=Throttles(table))
    spool_id = world.inject(["a@d1.test"])
    await world.release_all()
    await asyncio.sleep(0.25)  # asked again, and again refused
    await world.release_all()
    assert world.opened == [] and world.active.get(spool_id).state.value == "ready"  # type: ignore[union-attr]
    table.release("site:mx1.test")
    await asyncio.sleep(0.25)
    await world.release_all()
    assert [a.message for a in world.attempted] == [spool_id]
    assert table.held("site:mx1.test") == 1  # the connection, open (idle) for more mail, counts


# --- shaping that reacts ------------------------------------------------------------------------
RATE_LIMITED = Reply(421, "4.7.0", ("rate limited, slow down",))
PATH = "default->mx1.test"  # the ready queue's path (source->site)


def _reactor(tmp_path: Path, world_clock: Callable[[], float], **rule: Any) -> Reactor:
    rule.setdefault("id", "rated")
    rule.setdefault("match", r"^421 4\.7\.0 .*rate limited")
    reactions = Reactions.from_config([ReactionConfig(**rule)], defaults=False)
    return Reactor(reactions, Board(tmp_path / "effects", node="n1", clock=world_clock))


def _first_rate_limited(world: Any, seen: Any) -> list[Reply]:
    first = not any(a.replies for a in world.attempted if a is not seen)
    return [RATE_LIMITED if first else Reply(250, "2.0.0", ("ok",))] * len(seen.recipients)


async def test_a_reply_that_matches_suspends_the_site_until_the_effect_ends(
    make_world: MakeWorld, tmp_path: Path
) -> None:
    reactor = _reactor(tmp_path, world_clock := FakeClock(), action="suspend", duration=60)
    world = make_world(SITES, ["d1.test"], connection_limit=1, clock=world_clock, reactor=reactor,
                       answer=_first_rate_limited)  # fmt: skip
    first, *rest = [world.inject([f"r{n}@d1.test"]) for n in range(3)]
    await world.release_all()
    # The 421 began a suspension of the site: the other two wait in the ready queue, untried.
    [effect] = reactor.board.live()
    assert (effect.key, effect.action, effect.rule, effect.reply) == (
        "site:mx1.test", "suspend", "rated", str(RATE_LIMITED))  # fmt: skip
    assert [a.message for a in world.attempted] == [first]
    assert all(world.active.get(m).state.value == "ready" for m in rest)  # type: ignore[union-attr]
    # The message that got it is due again when the suspension ends, not at its backoff (300 s).
    [failure] = world.logged("TransientFailure")
    assert failure.next_attempt == pytest.approx(effect.expires_at)
    # A repeat while it lives changes nothing.
    assert reactor.observe(PATH, "mx1.test", "d1.test", [RATE_LIMITED]) == effect
    assert len(reactor.board.live()) == 1
    reactor.board._end(effect.id)  # (its time has come)
    await world.release_all()
    assert [a.message for a in world.attempted][1:] == rest
    assert len(world.logged("Delivery")) == 2


async def test_a_bounce_reaction_bounces_what_waits_for_the_site(make_world: MakeWorld, tmp_path: Path) -> None:
    reactor = _reactor(tmp_path, world_clock := FakeClock(), action="bounce", duration=60)
    world = make_world(SITES, ["d1.test"], connection_limit=1, clock=world_clock, reactor=reactor,
                       answer=_first_rate_limited)  # fmt: skip
    for n in range(3):
        world.inject([f"r{n}@d1.test"])
    await world.release_all()
    assert len(world.attempted) == 1  # the others are bounced without a try
    bounces = world.logged("Bounce")
    assert len(bounces) == 3 and not world.logged("TransientFailure")
    assert {b.response.code for b in bounces} == {554}
    assert all("rated" in b.response.text and b.classification == "PolicyRelated" for b in bounces)
    world.inject(["late@d1.test"])  # and new mail for it while the effect lives
    await world.release_all()
    assert len(world.logged("Bounce")) == 4 and len(world.attempted) == 1


async def test_the_dsn_of_a_reaction_bounce_says_pigeon_bounced_it_not_the_server(
    make_world: MakeWorld, tmp_path: Path
) -> None:
    # The server answered 421 (for later); the 554 is the reaction's, Pigeon's own.
    reactor = _reactor(tmp_path, world_clock := FakeClock(), action="bounce", duration=60)
    world = make_world(SITES, ["d1.test"], clock=world_clock, reactor=reactor, answer=_first_rate_limited)
    world.inject(["r0@d1.test"])
    await world.release_all()
    [failure] = world.reported
    assert (failure.reply.code, failure.remote_mta) == (554, "mx1.test")
    assert failure.diagnostic_type == "X-Pigeon"
    [bounce] = world.logged("Bounce")
    assert bounce.said_by == "pigeon" and bounce.peer is not None  # a server was there, and said 421


async def test_a_limit_reaction_lowers_the_sites_limits_while_it_lives(make_world: MakeWorld, tmp_path: Path) -> None:
    reactor = _reactor(tmp_path, world_clock := FakeClock(), action="limit", connection_limit=1,
                       max_message_rate="1/min", duration=60)  # fmt: skip
    shaping = Shaping(connection_limit=4, idle_timeout=3600.0, max_message_rate=Rate.parse("100/s"))
    world = make_world(SITES, ["d1.test"], shaping=shaping, clock=world_clock, reactor=reactor)
    keys = reactor.keys(PATH, "mx1.test")
    assert reactor.limits(keys) == (None, None)
    reactor.observe(PATH, "mx1.test", "d1.test", [RATE_LIMITED])
    assert reactor.limits(keys) == (1, Rate.parse("1/min"))
    for n in range(50):
        world.inject([f"r{n}@d1.test"])
    await world.quiesce()
    assert len(world.opened) == 1  # not 4


def test_the_reactor_keeps_a_suspended_attempt_for_the_end_and_leaves_successes_alone(tmp_path: Path) -> None:
    clock = FakeClock()
    reactor = _reactor(tmp_path, clock, action="suspend", duration=30)
    effect = reactor.observe(PATH, "mx1.test", "d1.test", [Reply(250, "2.0.0", ("ok",)), RATE_LIMITED])
    assert effect is not None
    attempt = Attempt([RATE_LIMITED], [""], "mx1.test")
    assert reactor.apply(attempt, effect).retry_after == pytest.approx(30)
    delivered = Attempt([Reply(250, "2.0.0", ("ok",))], [""], "mx1.test")
    assert reactor.apply(delivered, effect) is delivered
    assert reactor.observe(PATH, "mx1.test", "d1.test", [Reply(250, "2.0.0", ("ok",))]) is None


# --- a bug past the agent ----------------------------------------------------------------------
class _ObserveBreaks(Reactor):
    def observe(self, path: str, site: str, domain: str, replies: Any) -> Any:
        raise RuntimeError("a bug in the reactions")


class _ReviewBreaks:
    """Delivery hooks whose review of an outcome raises (a bug of ours, not the hook's)."""

    vets = False
    reviews = True

    def after(self, message: Any, attempt: Attempt, delivery: Any = None) -> Attempt:
        raise RuntimeError("a bug in the outcome hook's machinery")


async def test_a_bug_after_the_agent_answered_reports_each_attempt_as_made_and_sends_nothing_again(
    make_world: MakeWorld, tmp_path: Path
) -> None:
    """Found from outside: an error in reviewing an outcome reached the connection's catch-all,
    which reported every message of the batch as an internal error (451 4.3.0): the one the
    server had taken was sent again at every retry, and the one it refused (550) was retried
    instead of bounced."""
    refused = Reply(550, "5.1.1", ("no such user",))
    rules = _reactor(tmp_path, FakeClock(), action="suspend", duration=60)
    reactor = _ObserveBreaks(rules.reactions, rules.board)

    def answer(world: Any, seen: Any) -> list[Reply]:
        return [refused if r.startswith("no@") else Reply(250, "2.0.0", ("ok",)) for r in seen.recipients]

    world = make_world(SITES, ["d1.test"], reactor=reactor, answer=answer, dsn=False)
    world.inject(["no@d1.test"])
    await world.release_all()
    world.dispatcher._hooks = _ReviewBreaks()  # type: ignore[assignment]
    world.inject(["yes@d1.test"])
    await world.release_all()
    [bounce] = world.logged("Bounce")
    assert (bounce.recipient, bounce.response.code) == ("no@d1.test", 550)
    [delivery] = world.logged("Delivery")
    assert delivery.recipient == "yes@d1.test"
    assert world.logged("TransientFailure") == []
    assert len(world.attempted) == 2 and not len(world.active)
