"""Settlement, on a fake clock: what each reply means, and that it is durable before it is told."""

from __future__ import annotations

import pytest

from pigeon.logs.records import Rebind, Response
from pigeon.message import AfterAttempt, RebindAfterAttempt
from pigeon.queue import settlement
from pigeon.queue.attempt import Attempt
from pigeon.queue.rules import Selector
from pigeon.queue.state import Lease
from pigeon.smtp.replies import Reply
from tests.support.queue_world import LATER, NO, OK, World
from tests.unit.conftest import MakeWorld

SITES = {"d1.test": "mx1.test", "elsewhere.test": "mx3.test"}
D1 = Selector(domain="d1.test")


def kinds(world: World) -> list[tuple[str, str]]:
    # (a Rebind names the recipients it moved)
    return [(type(r).__name__, getattr(r, "recipient", None) or ",".join(r.recipients)) for r in world.records.log]  # type: ignore[attr-defined]


async def test_each_recipient_gets_the_record_its_reply_calls_for(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [OK, NO, LATER])
    spool_id = world.inject(["ok@d1.test", "no@d1.test", "later@d1.test"])
    await world.release_all()
    assert sorted(kinds(world)) == [
        ("Bounce", "no@d1.test"),
        ("Delivery", "ok@d1.test"),
        ("TransientFailure", "later@d1.test"),
    ]
    [bounce] = world.logged("Bounce")
    assert bounce.classification == "NoSuchUser"  # the agent's class, not the queue's
    [transient] = world.logged("TransientFailure")
    row = world.spool.rows[spool_id]
    assert transient.next_attempt == row.due == pytest.approx(world.clock() + 300.0)
    assert row.attempts == 1
    assert [r.address for r in world.spool.get(spool_id).envelope.recipients] == ["later@d1.test"]  # type: ignore[union-attr]
    assert world.notices == [(spool_id, "no@d1.test")]


async def test_terminal_records_appear_only_once_their_commit_is_answered(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"])
    spool_id = world.inject(["a@d1.test"])
    await world.release_all("attempt")
    await world.release_all("land")
    assert spool_id not in world.spool.rows, "committed: readers see it gone"
    assert world.records.log == [], "but nothing is told before the settlement hears so"
    await world.release_all("answer")
    assert kinds(world) == [("Delivery", "a@d1.test")]
    assert not len(world.active)


async def test_a_dsn_and_the_failure_it_reports_are_committed_together(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [NO])
    spool_id = world.inject(["a@d1.test"])
    await world.release_all("attempt")
    assert [p.kind for p in world.pending] == ["dsn"], "no commit before the DSN is written"
    await world.release_all("dsn")
    assert [p.kind for p in world.pending] == ["land"], "one commit for the DSN and the bounce"
    assert world.notices == [] and spool_id in world.spool.rows
    await world.release_all("land")
    assert world.notices == [(spool_id, "a@d1.test")] and spool_id not in world.spool.rows
    await world.release_all()
    assert kinds(world) == [("Bounce", "a@d1.test")]


async def test_a_delay_warning_and_its_mark_are_committed_together_and_made_once(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [LATER], delay_warning=600.0)
    spool_id = world.inject(["a@d1.test"], created=world.clock() - 900.0)
    await world.release_all("attempt")
    assert [p.kind for p in world.pending] == ["dsn"], "no commit before the warning is written"
    await world.release_all("dsn")
    assert [p.kind for p in world.pending] == ["land"], "one commit for the warning and its mark"
    assert world.notices == [] and world.spool.get(spool_id).envelope.delay_warned is None  # type: ignore[union-attr]
    await world.release_all("land")
    assert world.notices == [(spool_id, "a@d1.test")]
    assert world.spool.get(spool_id).envelope.delay_warned == world.clock()  # type: ignore[union-attr]
    [report] = world.reported
    assert (report.action, report.retry_until) == ("delayed", pytest.approx(world.clock() - 900.0 + world.max_age))
    await world.release_all()
    for _ in range(3):  # retried, deferred again: no second warning
        world.clock.now += 1300.0
        world.tick()
        await world.release_all()
    assert [p.kind for p in world.pending] == [] and len(world.notices) == 1
    transients = world.logged("TransientFailure")
    assert len(transients) == 4 and [t.delay_notified for t in transients] == [True, False, False, False]


async def test_no_dsn_for_a_recipient_that_asked_for_none_or_a_null_sender(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [NO])
    world.inject(["a@d1.test"], sender="")
    await world.release_all()
    assert kinds(world) == [("Bounce", "a@d1.test")]
    assert world.notices == []


async def test_a_retry_that_would_come_after_max_age_is_due_at_the_expiry_and_expires_then(
    make_world: MakeWorld,
) -> None:
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [LATER], max_age=100.0)
    spool_id = world.inject(["a@d1.test"])
    created = world.clock()
    await world.release_all()
    assert world.spool.rows[spool_id].due == created + 100.0  # not a whole backoff (300 s) later
    world.clock.now = created + 100.0
    world.tick()
    await world.release_all()
    [expired] = world.logged("Expiration")
    assert (expired.response.code, expired.response.enhanced) == (554, "5.4.7")
    assert "last attempt: 451 4.3.0 try later" in expired.response.text
    assert world.notices == [(spool_id, "a@d1.test")] and not world.spool.rows
    # Its DSN's Last-Attempt-Date is the attempt's, not the expiry's (RFC 3464 2.3.7).
    assert [failure.attempted for failure in world.reported] == [created]


FULL = Reply(452, "4.2.2", ("mailbox full",))


async def test_each_recipient_expiring_while_it_waits_names_its_own_last_reply(make_world: MakeWorld) -> None:
    """Read back from the spool at its expiry (as after a restart), each recipient's
    `Expiration` and DSN name the reply that recipient last got, not its neighbour's."""
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [LATER, FULL], max_age=100.0)
    world.inject(["a@d1.test", "b@d1.test"])
    created = world.clock()
    await world.release_all()
    world.clock.now = created + 100.0
    world.tick()
    await world.release_all()
    said = {r.recipient: r.response.text for r in world.logged("Expiration")}
    assert said == {
        "a@d1.test": "Message expired: not delivered within 1 minute 40 seconds; last attempt: 451 4.3.0 try later",
        "b@d1.test": "Message expired: not delivered within 1 minute 40 seconds; last attempt: 452 4.2.2 mailbox full",
    }
    assert {f.recipient.address: f.reply.text for f in world.reported} == said


async def test_each_recipient_expiring_at_the_end_of_an_attempt_names_its_own_reply(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [FULL, LATER], max_age=100.0)
    world.inject(["a@d1.test", "b@d1.test"])
    await world.release_all("lookup")
    world.clock.now += 100.0  # the attempt ends past max_age: no retry, an expiry
    await world.release_all()
    said = {r.recipient: r.response.text for r in world.logged("Expiration")}
    assert said == {
        "a@d1.test": "Message expired: not delivered within 1 minute 40 seconds; last attempt: 452 4.2.2 mailbox full",
        "b@d1.test": "Message expired: not delivered within 1 minute 40 seconds; last attempt: 451 4.3.0 try later",
    }
    assert {f.recipient.address: f.reply.text for f in world.reported} == said


async def test_an_attempt_under_way_at_max_age_is_finished_and_its_250_is_a_delivery(make_world: MakeWorld) -> None:
    # As the README says of max_age: mail on the wire is not expired; the attempt ends first.
    world = make_world(SITES, ["d1.test"], max_age=100.0)
    spool_id = world.inject(["a@d1.test"])
    await world.release_all("lookup")
    assert [p.kind for p in world.pending] == ["attempt"]
    assert world.active.get(spool_id).state.value == "in_flight"  # type: ignore[union-attr]
    world.clock.now += 101.0
    world.scheduler.sweep()
    world.tick()
    await world.release_all()
    assert kinds(world) == [("Delivery", "a@d1.test")]
    assert world.notices == [] and not world.spool.rows


@pytest.mark.parametrize(
    ("max_age", "said"),
    [
        (5 * 86400.0, "5 days"),
        (1.5 * 86400.0, "1 day 12 hours"),
        (86400.0 + 61.0, "1 day 1 minute"),
        (3600.0, "1 hour"),
        (100.0, "1 minute 40 seconds"),
        (0.2, "1 second"),
    ],
)
def test_an_expiry_says_how_long_the_message_was_tried_in_words_not_the_settings_name(
    max_age: float, said: str
) -> None:
    """A DSN gives its sender this text to read: "max_age" meant nothing to them."""
    reply = settlement.expired_reply("451 4.3.0 try later", max_age)
    assert str(reply) == f"554 5.4.7 Message expired: not delivered within {said}; last attempt: 451 4.3.0 try later"
    assert settlement.expired_reply(None, max_age).text == f"Message expired: not delivered within {said}"


async def test_a_commit_that_fails_is_written_again_and_told_once(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settlement, "_RETRY_WRITE", 0.0)
    world = make_world(SITES, ["d1.test"])
    world.inject(["a@d1.test"])
    await world.release_all("attempt")
    world.failing_commits = 1
    await world.release_all()
    assert kinds(world) == [("Delivery", "a@d1.test")]
    assert not world.spool.rows and not len(world.active)


async def test_a_dsn_that_cannot_be_stored_is_tried_again_before_the_commit(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settlement, "_RETRY_WRITE", 0.0)
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [NO])
    spool_id = world.inject(["a@d1.test"])
    await world.release_all("attempt")
    world.failing_notices = 1
    await world.release(world.of_kind("dsn")[0])
    assert [p.kind for p in world.pending] == ["dsn"], "stored again, and still no commit"
    await world.release_all()
    assert world.notices == [(spool_id, "a@d1.test")]
    assert kinds(world) == [("Bounce", "a@d1.test")]
    assert not world.spool.rows


async def test_a_stale_report_is_dropped_and_counted(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"])
    spool_id = world.inject(["a@d1.test"])
    await world.quiesce()
    world.settlement.report(Lease(spool_id, 1), _attempt([OK]))
    await world.quiesce()
    assert world.active.stale_results == {"attempt": 1}
    assert world.records.log == []
    await world.release_all()
    assert kinds(world) == [("Delivery", "a@d1.test")]


def _attempt(replies: list[Reply]) -> Attempt:
    return Attempt(replies, [""] * len(replies), "mx1.test")


async def test_an_attempt_on_the_wire_when_bounced_admin_bounces_what_it_leaves(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [OK, LATER])
    spool_id = world.inject(["a1@d1.test", "a2@d1.test"])
    await world.quiesce()
    bounce = world.bounce(D1, reason="stop")
    await world.quiesce()
    assert bounce.result is None, "answered only once the bounce is in the message's row"
    await world.release_all("land")
    assert world.spool.get(spool_id).envelope.after_attempt == AfterAttempt("bounce", "stop", "op")  # type: ignore[union-attr]
    await world.release_all("answer")
    assert bounce.result == {"bounced": 1, "after_attempt": 1, "rule": None}
    await world.release_all()
    assert sorted(kinds(world)) == [("AdminBounce", "a2@d1.test"), ("Delivery", "a1@d1.test")]
    assert world.notices == [] and spool_id not in world.spool.rows
    assert [a.message for a in world.attempted] == [spool_id]
    # What the server said to the recipient the operator then bounced is not lost with it.
    [bounced] = world.logged("AdminBounce")
    assert (bounced.response.code, bounced.reason) == (550, "stop")
    assert bounced.attempt_response == Response.of(LATER) and bounced.site == "mx1.test"


async def test_a_rebind_leaves_mail_of_an_inbound_route_as_it_is_on_the_wire_or_only_in_the_spool(
    make_world: MakeWorld,
) -> None:
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [OK, LATER] if seen.site == "mx1.test" else [OK])
    on_the_wire = world.inject(["a1@d1.test", "a2@d1.test"], target="app")
    await world.quiesce()
    in_the_spool = world.inject(["b@d1.test"], target="app", due=world.clock() + 600, admit=False)
    rebind = world.rebind(D1, queue="moved", routing_domain="elsewhere.test")
    await world.quiesce()
    assert rebind.result == {"rebound": 0, "after_attempt": 0, "inbound_left": 2}
    assert in_the_spool not in world.active  # not even claimed: its due time stands
    await world.release_all()
    for spool_id in (on_the_wire, in_the_spool):
        row = world.spool.get(spool_id)
        assert row is not None
        assert (row.queue, row.envelope.routing_domain, row.envelope.target) == ("inbound:app", None, "app")
    assert world.spool.rows[in_the_spool].due == world.clock() + 600
    world.clock.now += 600
    world.tick()
    await world.release_all()
    assert {a.site for a in world.attempted} == {"mx1.test"}  # (the test's stand-in for the target)


async def test_an_attempt_on_the_wire_when_rebound_moves_what_it_leaves_due_now(make_world: MakeWorld) -> None:
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [OK, LATER] if seen.site == "mx1.test" else [OK])
    spool_id = world.inject(["a1@d1.test", "a2@d1.test"])
    await world.quiesce()
    rebind = world.rebind(D1, queue="moved", routing_domain="elsewhere.test")
    await world.quiesce()
    assert rebind.result is None, "answered only once the rebind is in the message's row"
    await world.release_all("land")
    marked = world.spool.get(spool_id)
    assert marked is not None and marked.queue == "d1.test"  # (moved when the attempt ends)
    assert marked.envelope.rebind_after_attempt == RebindAfterAttempt("moved", "elsewhere.test", "op")
    await world.release_all("answer")
    assert rebind.result == {"rebound": 1, "after_attempt": 1, "inbound_left": 0}
    await world.release_all()
    row = world.spool.get(spool_id)
    assert row is not None
    assert (row.queue, row.envelope.routing_domain, row.due) == ("moved", "elsewhere.test", world.clock())
    assert row.envelope.rebind_after_attempt is None  # (applied by the attempt's outcome)
    world.tick()
    await world.release_all()
    assert [(a.site, a.recipients) for a in world.attempted] == [
        ("mx1.test", ("a1@d1.test", "a2@d1.test")),
        ("mx3.test", ("a2@d1.test",)),
    ]
    assert sorted(kinds(world)) == [
        ("Delivery", "a1@d1.test"),
        ("Delivery", "a2@d1.test"),
        ("Rebind", "a2@d1.test"),  # what the attempt left, moved when it ended
        ("TransientFailure", "a2@d1.test"),
    ]
    (moved,) = [r for r in world.records.log if isinstance(r, Rebind)]
    assert (moved.queue, moved.from_queue, moved.route) == ("moved", "d1.test", "elsewhere.test")


async def test_inspect_shows_the_routing_domain_a_rebind_gave(make_world: MakeWorld) -> None:
    """Delivery routes it as the rebind's domain, but `pigeon inspect` did not say so."""
    world = make_world(SITES, ["d1.test"], answer=lambda world, seen: [LATER])
    spool_id = world.inject(["a@d1.test"])
    await world.quiesce()
    await world.release_all()
    before = world.admin.inspect(spool_id)
    assert before is not None and before["routing_domain"] is None
    rebind = world.rebind(D1, routing_domain="elsewhere.test")
    await world.quiesce()
    await world.release_all()
    assert rebind.result == {"rebound": 1, "after_attempt": 0, "inbound_left": 0}
    world.tick()  # (due now)
    await world.release_all()
    assert [a.site for a in world.attempted] == ["mx1.test", "mx3.test"]  # (routed as elsewhere.test)
    shown = world.admin.inspect(spool_id)
    assert shown is not None and shown["routing_domain"] == "elsewhere.test"
    assert shown["recipients"] == ["a@d1.test"]
