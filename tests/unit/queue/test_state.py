"""The message state machine: one way to move a message, a compare-and-set on (state, generation),
and leases that go stale when someone else moved the message."""

from __future__ import annotations

import asyncio

import pytest

from pigeon.message import Envelope, Message, Recipient, SpoolId
from pigeon.queue.state import ActiveSet, Entry, Lease, StaleTransition, State, transition

TERMINAL = [State.DELIVERED, State.BOUNCED, State.EXPIRED, State.ADMIN_BOUNCED]

# Every move the state machine allows (the module's diagram), and nothing else.
ALLOWED: set[tuple[State, State]] = {
    (State.SCHEDULED, State.READY),
    (State.SCHEDULED, State.SETTLING),
    (State.READY, State.SCHEDULED),  # its route changed (a reload): routed again
    (State.READY, State.READY),  # moved to another ready queue (a reload)
    (State.READY, State.IN_FLIGHT),
    (State.READY, State.SETTLING),
    (State.IN_FLIGHT, State.SCHEDULED),  # taken, not begun, its route changed (a reload)
    (State.IN_FLIGHT, State.READY),
    (State.IN_FLIGHT, State.SETTLING),
    (State.SETTLING, State.SCHEDULED),
    (State.SETTLING, State.DELIVERED),
    (State.SETTLING, State.BOUNCED),
    (State.SETTLING, State.EXPIRED),
    (State.SETTLING, State.ADMIN_BOUNCED),
}
NOT_ALLOWED = sorted(
    ((a, b) for a in State for b in State if (a, b) not in ALLOWED),
    key=lambda move: (move[0].value, move[1].value),
)


def message(spool_id: int = 1) -> Message:
    envelope = Envelope("a@example.org", [Recipient("b@example.net")])
    return Message(SpoolId(spool_id), "default", envelope, created=0.0, size=10, body_id=SpoolId(spool_id))


def entry_in(state: State) -> Entry:
    entry = ActiveSet(10).add(message())
    entry.state = state
    return entry


def test_a_new_entry_is_scheduled_and_active() -> None:
    entry = ActiveSet(10).add(message())
    assert (entry.state, entry.active, entry.started) == (State.SCHEDULED, True, False)


def test_a_message_goes_from_scheduled_to_delivered_with_a_new_generation_at_each_step() -> None:
    active = ActiveSet(10)
    entry = active.add(message())
    seen = [entry.generation]
    for expected, to in [
        (State.SCHEDULED, State.READY),
        (State.READY, State.IN_FLIGHT),
        (State.IN_FLIGHT, State.SETTLING),
    ]:
        seen.append(transition(entry, expected, entry.generation, to))
        assert (entry.state, entry.generation) == (to, seen[-1])
    active.finish(entry, State.DELIVERED)
    assert entry.state is State.DELIVERED and entry.state.terminal
    assert len(set(seen)) == len(seen), "a generation names one state"
    assert not entry.active and entry.id not in active


def test_generations_never_repeat_across_reloads_of_the_same_message() -> None:
    """A lease taken on one load of a message can not match a later load of it."""
    active = ActiveSet(10)
    first = active.add(message(7))
    lease = ActiveSet.lease(first)
    transition(first, State.SCHEDULED, first.generation, State.SETTLING)
    active.finish(first, State.SCHEDULED, due=100.0, now=0.0)
    again = active.add(message(7))
    assert again.generation != lease.generation
    assert active.current(lease, "route") is None
    assert active.stale_results == {"route": 1}


@pytest.mark.parametrize(("start", "to"), sorted(ALLOWED, key=lambda move: (move[0].value, move[1].value)))
def test_every_allowed_move_happens_and_changes_the_generation(start: State, to: State) -> None:
    entry = entry_in(start)
    before = entry.generation
    assert transition(entry, start, before, to) != before
    assert entry.state is to


def test_a_stale_generation_is_refused_and_changes_nothing() -> None:
    entry = entry_in(State.READY)
    generation = entry.generation
    with pytest.raises(StaleTransition, match="is not ready@"):
        transition(entry, State.READY, generation - 1, State.IN_FLIGHT)
    assert (entry.state, entry.generation) == (State.READY, generation)


def test_the_wrong_expected_state_is_refused_and_changes_nothing() -> None:
    entry = entry_in(State.IN_FLIGHT)
    generation = entry.generation
    with pytest.raises(StaleTransition, match="is not ready@"):
        transition(entry, State.READY, generation, State.IN_FLIGHT)
    assert (entry.state, entry.generation) == (State.IN_FLIGHT, generation)


def test_the_loser_of_a_race_gets_stale_transition() -> None:
    """A dispatcher and an admin bounce both saw READY at one generation; only the first moves it."""
    entry = entry_in(State.READY)
    seen = entry.generation
    transition(entry, State.READY, seen, State.SETTLING)
    with pytest.raises(StaleTransition):
        transition(entry, State.READY, seen, State.IN_FLIGHT)
    assert entry.state is State.SETTLING


@pytest.mark.parametrize(("start", "to"), NOT_ALLOWED)
def test_a_move_not_in_the_table_is_a_value_error_and_changes_nothing(start: State, to: State) -> None:
    entry = entry_in(start)
    generation = entry.generation
    with pytest.raises(ValueError, match=f"no move from {start.value} to {to.value}"):
        transition(entry, start, generation, to)
    assert (entry.state, entry.generation) == (start, generation)


@pytest.mark.parametrize("state", TERMINAL)
def test_terminal_states_are_reached_only_from_settling(state: State) -> None:
    assert state.terminal
    assert {start for start, to in ALLOWED if to is state} == {State.SETTLING}


def test_a_lease_is_current_until_the_message_moves() -> None:
    active = ActiveSet(10)
    entry = active.add(message())
    lease = ActiveSet.lease(entry)
    assert active.current(lease, "route") is entry
    transition(entry, State.SCHEDULED, entry.generation, State.READY)
    assert active.current(lease, "route") is None
    assert active.current(Lease(SpoolId(99), lease.generation), "attempt") is None
    assert active.stale_results == {"route": 1, "attempt": 1}


def test_begin_marks_a_leased_message_as_being_sent_and_refuses_a_stale_lease() -> None:
    active = ActiveSet(10)
    entry = active.add(message())
    transition(entry, State.SCHEDULED, entry.generation, State.READY)
    transition(entry, State.READY, entry.generation, State.IN_FLIGHT)
    lease = ActiveSet.lease(entry)
    assert active.begin(lease) is entry.message
    assert entry.started
    transition(entry, State.IN_FLIGHT, entry.generation, State.SETTLING)
    assert active.begin(lease) is None


def test_a_settling_message_can_not_move_but_to_its_outcome() -> None:
    entry = entry_in(State.SETTLING)
    for to in (State.READY, State.IN_FLIGHT, State.SETTLING):
        with pytest.raises(ValueError, match="no move from settling"):
            transition(entry, State.SETTLING, entry.generation, to)


def test_active_set_adds_finds_and_lets_go_of_entries() -> None:
    active = ActiveSet(limit=3)
    assert (len(active), active.room, active.limit) == (0, 3, 3)
    first = active.add(message(1))
    second = active.add(message(2))
    assert (len(active), active.room) == (2, 1)
    assert active.get(1) is first
    assert active.get(3) is None
    assert 1 in active and 3 not in active
    assert list(active) == [first, second]
    transition(first, State.SCHEDULED, first.generation, State.SETTLING)
    active.finish(first, State.BOUNCED)
    assert not first.active
    assert active.get(1) is None
    assert (len(active), active.room) == (1, 2)
    assert list(active) == [second]


def test_a_message_let_go_already_due_moves_the_scheduler_back() -> None:
    active = ActiveSet(10)
    for spool_id, due in [(1, 50.0), (2, 40.0), (3, 500.0)]:
        entry = active.add(message(spool_id))
        transition(entry, State.SCHEDULED, entry.generation, State.SETTLING)
        active.finish(entry, State.SCHEDULED, due=due, now=100.0)
    assert active.due_again == 40.0  # 500 is in the future: the scheduler reaches it anyway


def test_active_set_room_never_goes_below_zero() -> None:
    active = ActiveSet(limit=1)
    active.add(message(1))
    active.add(message(2))  # the scheduler reads `room`; the set itself does not refuse
    assert active.room == 0


def test_adding_the_same_message_twice_is_refused_and_keeps_the_first_entry() -> None:
    active = ActiveSet(limit=10)
    first = active.add(message(7))
    with pytest.raises(ValueError, match="0000000000000007 is already active"):
        active.add(message(7))
    assert active.get(7) is first
    assert len(active) == 1


async def test_waiting_for_a_settlement_resolves_when_the_entry_leaves_memory() -> None:
    active = ActiveSet(limit=10)
    entry = active.add(message(1))
    transition(entry, State.SCHEDULED, entry.generation, State.SETTLING)
    settled = active.settled(entry)
    await asyncio.sleep(0)
    assert not settled.done()
    active.finish(entry, State.ADMIN_BOUNCED)
    await asyncio.sleep(0)
    assert settled.done()
    assert active.settled(entry).done()  # asked afterwards: at once
