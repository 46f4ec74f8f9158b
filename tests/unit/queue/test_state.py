"""The message state machine: one way to move a message, a compare-and-set on (state, generation)."""

from __future__ import annotations

import pytest

from pigeon.message import Envelope, Message, Recipient, SpoolId
from pigeon.queue.state import ActiveSet, Entry, StaleTransition, State, transition

LIVE = [State.SCHEDULED, State.READY, State.IN_FLIGHT]
TERMINAL = [State.DELIVERED, State.BOUNCED, State.EXPIRED, State.ADMIN_BOUNCED]

# Every move the state machine allows (the module's diagram), and nothing else.
ALLOWED = {
    (State.SCHEDULED, State.READY),
    (State.SCHEDULED, State.IN_FLIGHT),  # an attempt that fails before any connection (no DNS answer)
    (State.SCHEDULED, State.SCHEDULED),
    (State.SCHEDULED, State.EXPIRED),
    (State.SCHEDULED, State.BOUNCED),
    (State.SCHEDULED, State.ADMIN_BOUNCED),
    (State.READY, State.IN_FLIGHT),
    (State.READY, State.SCHEDULED),
    (State.READY, State.EXPIRED),
    (State.READY, State.ADMIN_BOUNCED),
    (State.IN_FLIGHT, State.SCHEDULED),
    (State.IN_FLIGHT, State.READY),
    (State.IN_FLIGHT, State.DELIVERED),
    (State.IN_FLIGHT, State.BOUNCED),
    (State.IN_FLIGHT, State.EXPIRED),
    (State.IN_FLIGHT, State.ADMIN_BOUNCED),
}
NOT_ALLOWED = sorted(
    ((a, b) for a in State for b in State if (a, b) not in ALLOWED and not a.terminal),
    key=lambda move: (move[0].value, move[1].value),
)


def message(spool_id: int = 1) -> Message:
    envelope = Envelope("a@example.org", [Recipient("b@example.net")])
    return Message(SpoolId(spool_id), "default", envelope, created=0.0, size=10, body_id=SpoolId(spool_id))


def entry_in(state: State, generation: int = 3) -> Entry:
    return Entry(message(), state=state, generation=generation)


def test_a_new_entry_is_scheduled_at_generation_zero() -> None:
    entry = ActiveSet(10).add(message())
    assert (entry.state, entry.generation, entry.settled) == (State.SCHEDULED, 0, False)


def test_a_message_goes_from_scheduled_to_delivered_bumping_the_generation_each_time() -> None:
    entry = ActiveSet(10).add(message())
    generation = transition(entry, State.SCHEDULED, 0, State.READY)
    assert (entry.state, entry.generation, generation) == (State.READY, 1, 1)
    generation = transition(entry, State.READY, generation, State.IN_FLIGHT)
    assert (entry.state, generation) == (State.IN_FLIGHT, 2)
    generation = transition(entry, State.IN_FLIGHT, generation, State.DELIVERED)
    assert (entry.state, entry.generation, generation) == (State.DELIVERED, 3, 3)
    assert entry.state.terminal


@pytest.mark.parametrize(("start", "to"), sorted(ALLOWED, key=lambda move: (move[0].value, move[1].value)))
def test_every_allowed_move_happens_and_bumps_the_generation(start: State, to: State) -> None:
    entry = entry_in(start, generation=7)
    assert transition(entry, start, 7, to) == 8
    assert (entry.state, entry.generation) == (to, 8)


def test_a_stale_generation_is_refused_and_changes_nothing() -> None:
    entry = entry_in(State.READY, generation=5)
    with pytest.raises(StaleTransition, match="ready@5, not ready@4"):
        transition(entry, State.READY, 4, State.IN_FLIGHT)
    assert (entry.state, entry.generation) == (State.READY, 5)


def test_the_wrong_expected_state_is_refused_and_changes_nothing() -> None:
    entry = entry_in(State.IN_FLIGHT, generation=5)
    with pytest.raises(StaleTransition, match="in_flight@5, not ready@5"):
        transition(entry, State.READY, 5, State.IN_FLIGHT)
    assert (entry.state, entry.generation) == (State.IN_FLIGHT, 5)


def test_the_loser_of_a_race_gets_stale_transition() -> None:
    """A tick and an admin bounce both saw READY@1; only the first one moves the message."""
    entry = entry_in(State.READY, generation=1)
    transition(entry, State.READY, 1, State.ADMIN_BOUNCED)
    with pytest.raises(StaleTransition):
        transition(entry, State.READY, 1, State.IN_FLIGHT)
    assert (entry.state, entry.generation) == (State.ADMIN_BOUNCED, 2)


@pytest.mark.parametrize(("start", "to"), NOT_ALLOWED)
def test_a_move_not_in_the_table_is_a_value_error_and_changes_nothing(start: State, to: State) -> None:
    entry = entry_in(start, generation=2)
    with pytest.raises(ValueError, match=f"no move from {start.value} to {to.value}"):
        transition(entry, start, 2, to)
    assert (entry.state, entry.generation) == (start, 2)


@pytest.mark.parametrize("start", TERMINAL)
@pytest.mark.parametrize("to", list(State))
def test_terminal_states_have_no_moves_out(start: State, to: State) -> None:
    assert start.terminal
    entry = entry_in(start, generation=4)
    with pytest.raises(ValueError, match="no move from"):
        transition(entry, start, 4, to)
    assert (entry.state, entry.generation) == (start, 4)


@pytest.mark.parametrize("state", LIVE)
def test_live_states_are_not_terminal(state: State) -> None:
    assert not state.terminal


def test_active_set_adds_finds_and_removes_entries() -> None:
    active = ActiveSet(limit=3)
    assert (len(active), active.room, active.limit) == (0, 3, 3)
    first = active.add(message(1))
    second = active.add(message(2))
    assert (len(active), active.room) == (2, 1)
    assert active.get(1) is first
    assert active.get(2) is second
    assert active.get(3) is None
    assert 1 in active
    assert 3 not in active
    assert list(active) == [first, second]

    active.remove(first)
    assert first.settled
    assert active.get(1) is None
    assert 1 not in active
    assert (len(active), active.room) == (1, 2)
    assert list(active) == [second]


def test_active_set_room_never_goes_below_zero() -> None:
    active = ActiveSet(limit=1)
    active.add(message(1))
    active.add(message(2))  # the scheduler reads `room`; the set itself does not refuse
    assert active.room == 0


def test_active_set_limit_can_change() -> None:
    active = ActiveSet(limit=1)
    active.add(message(1))
    active.limit = 5
    assert active.room == 4


def test_adding_the_same_message_twice_is_refused_and_keeps_the_first_entry() -> None:
    active = ActiveSet(limit=10)
    first = active.add(message(7))
    with pytest.raises(ValueError, match="0000000000000007 is already active"):
        active.add(message(7))
    assert active.get(7) is first
    assert len(active) == 1


def test_removing_a_replaced_entry_leaves_the_new_one() -> None:
    active = ActiveSet(limit=10)
    old = active.add(message(1))
    active.remove(old)
    new = active.add(message(1))
    active.remove(old)  # a late settlement of the old entry must not drop the new one
    assert active.get(1) is new
    assert old.settled
    assert not new.settled


def test_iterating_while_removing_is_safe() -> None:
    active = ActiveSet(limit=10)
    for spool_id in range(1, 6):
        active.add(message(spool_id))
    for entry in active:
        active.remove(entry)
    assert len(active) == 0
