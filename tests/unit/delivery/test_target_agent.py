"""The target agent: `[[inbound]]` route mail handed to an application's target in batches,
its answers turned into replies the queue settles like any other."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from pigeon.delivery.classify import Classifier
from pigeon.delivery.routes import Destination, Kind, TlsPolicy
from pigeon.delivery.target_agent import TargetAgents
from pigeon.inbound.message import InboundMessage
from pigeon.inbound.targets.base import Handoff, Target, Verdict
from tests.support.queue_world import World


class App(Target):
    """An application that refuses mail to "never@", defers "later@" and takes the rest, a
    batch in one step (as Sidekiq's, PostgreSQL's and Maildir's targets do)."""

    batches = True

    def __init__(self, concurrency: int = 8) -> None:
        super().__init__("app", concurrency=concurrency)
        self.handed: list[list[str]] = []

    async def deliver_many(self, messages: Sequence[InboundMessage]) -> list[Handoff]:
        self.handed.append([m.recipients[0] for m in messages])
        answers = []
        for message in messages:
            local = message.recipients[0].partition("@")[0]
            verdict = {"never": Verdict.PERMANENT, "later": Verdict.TRANSIENT}.get(local, Verdict.ACCEPTED)
            answers.append(Handoff(verdict, f"{verdict.value} by the app"))
        return answers


TARGET = Destination("inbound:app", (), TlsPolicy.DISABLED, False, Kind.TARGET, "app")


class OneByOne(App):
    """An application told of each message by a call of its own (as a webhook is). A call for
    a recipient in `holding` is answered once the test sets its event."""

    batches = False

    def __init__(self, concurrency: int = 8) -> None:
        super().__init__(concurrency)
        self.holding: dict[str, asyncio.Event] = {}
        self.running = 0
        self.most = 0  # calls at once, at the most

    async def deliver(self, message: InboundMessage) -> Handoff:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            held = self.holding.get(message.recipients[0])
            await (held.wait() if held is not None else asyncio.sleep(0))
            (answer,) = await super().deliver_many([message])
        finally:
            self.running -= 1
        return answer

    async def deliver_many(self, messages: Sequence[InboundMessage]) -> list[Handoff]:
        return await Target.deliver_many(self, messages)  # a call each, `concurrency` at once


@pytest.fixture
async def world() -> AsyncIterator[tuple[World, App, list[tuple[str, Verdict]]]]:
    app = App()
    counted: list[tuple[str, Verdict]] = []
    agents = TargetAgents({"app": app}, Classifier(), lambda target, verdict: counted.append((target, verdict)))
    world = World(opener=agents.open).build({})
    world.routes.cache["app.test"] = TARGET
    yield world, app, counted
    await world.close()


async def test_mail_goes_to_the_target_in_batches_and_each_answer_settles_it(
    world: tuple[World, App, list[tuple[str, Verdict]]],
) -> None:
    queue_world, app, counted = world
    for n in range(100):
        queue_world.inject([f"user{n}@app.test"])
    never = queue_world.inject(["never@app.test"])
    later = queue_world.inject(["later@app.test"])
    await queue_world.release_all()
    assert sum(len(b) for b in app.handed) == 102
    assert max(len(b) for b in app.handed) == 64, "up to 64 messages a batch"
    assert len(queue_world.logged("Delivery")) == 100
    [bounce] = queue_world.logged("Bounce")
    assert (bounce.id, bounce.response.code, bounce.site) == (f"{never:016x}", 550, "inbound:app")
    assert bounce.response.text == "app: permanent by the app"
    [deferred] = queue_world.logged("TransientFailure")
    assert (deferred.id, deferred.response.code) == (f"{later:016x}", 451)
    assert list(queue_world.spool.rows) == [later]
    assert sorted({v for _, v in counted}, key=str) == sorted(set(Verdict), key=str)


async def test_a_target_missing_from_the_configuration_defers_its_mail() -> None:
    agents = TargetAgents({}, Classifier(), lambda target, verdict: None)
    world = World(opener=agents.open).build({})
    world.routes.cache["app.test"] = TARGET
    try:
        spool_id = world.inject(["a@app.test"])
        await world.release_all()
        [deferred] = world.logged("TransientFailure")
        assert (deferred.response.code, deferred.response.enhanced) == (451, "4.3.5")
        assert "no [[target]] called 'app'" in deferred.response.text
        assert spool_id in world.spool.rows
    finally:
        await world.close()


async def test_a_target_told_of_each_message_on_its_own_gets_no_more_at_once_than_it_runs_side_by_side() -> None:
    """A webhook is called once per message, no more calls at once than its concurrency,
    however many connections the queue runs (each takes a batch of that many: more would only
    wait for their turn)."""
    app = OneByOne(concurrency=4)
    agents = TargetAgents({"app": app}, Classifier(), lambda target, verdict: None)
    world = World(opener=agents.open).build({})
    world.routes.cache["app.test"] = TARGET
    try:
        for n in range(40):
            world.inject([f"user{n}@app.test"])
        await world.release_all()
        assert sum(len(b) for b in app.handed) == 40
        assert app.most == 4
        assert len(world.logged("Delivery")) == 40
    finally:
        await world.close()


async def test_a_call_answered_is_recorded_at_once_whatever_the_calls_beside_it_wait_for() -> None:
    """Found from outside: a webhook's batch was recorded once its slowest call answered, so
    the answered calls of many batches waited unrecorded behind one slow call each, and a
    kill -9 made them all again (66 to 102 repeated calls per kill, where 16 were ever on the
    wire). Each call's outcome is settled as it answers: one call held keeps only itself."""
    app = OneByOne(concurrency=4)
    agents = TargetAgents({"app": app}, Classifier(), lambda target, verdict: None)
    world = World(opener=agents.open).build({})
    world.routes.cache["app.test"] = TARGET
    held = app.holding["user0@app.test"] = asyncio.Event()
    try:
        for n in range(40):
            world.inject([f"user{n}@app.test"])
        await world.release_all()
        assert app.running == 1  # the held call, on the wire
        delivered = world.logged("Delivery")
        assert sorted(d.recipient for d in delivered) == sorted(f"user{n}@app.test" for n in range(1, 40))
        assert len(world.spool.rows) == 1  # the held one's
        held.set()
        await world.release_all()
        assert len(world.logged("Delivery")) == 40
        assert not world.spool.rows
    finally:
        await world.close()
