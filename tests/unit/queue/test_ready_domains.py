"""A domain a [[shaping]] block names has a ready queue of its own; a reload moves what waits."""

from __future__ import annotations

from dataclasses import dataclass

from pigeon.message import Envelope, Message, Recipient, SpoolId
from pigeon.queue.ready import ReadyQueue, ReadyQueues
from pigeon.queue.state import ActiveSet, Entry, State

SITE = "mx.host.example"


@dataclass(frozen=True)
class _Destination:
    site: str = SITE
    security: str = ""


def _entry(active: ActiveSet, spool_id: int, domain: str) -> Entry:
    envelope = Envelope("a@example.org", [Recipient(f"b@{domain}")])
    message = Message(SpoolId(spool_id), domain, envelope, created=0.0, size=10, body_id=SpoolId(spool_id))
    return active.add(message)


def _waiting(queues: ReadyQueues) -> dict[str, list[int]]:
    return {q.path: [e.id for e in q] for q in queues if len(q)}


def test_a_named_domain_waits_in_its_own_queue_and_the_others_share_the_sites() -> None:
    active = ActiveSet(100)
    kicked: list[str] = []
    queues = ReadyQueues(active, "default", lambda q: kicked.append(q.path), owns=lambda d: d == "limited.example")
    for n, domain in enumerate(["limited.example", "free.example", "other.example"], start=1):
        queues.enqueue(_entry(active, n, domain), _Destination())
    assert _waiting(queues) == {f"default->limited.example@{SITE}": [1], f"default->{SITE}": [2, 3]}
    own = queues.get(f"default->limited.example@{SITE}")
    assert own is not None and (own.domain, own.own) == ("limited.example", True)
    shared = queues.get(f"default->{SITE}")
    assert shared is not None and not shared.own


def test_a_reload_moves_each_waiting_message_once_in_order_and_leaves_taken_ones_alone() -> None:
    active = ActiveSet(100)
    kicked: list[str] = []
    queues = ReadyQueues(active, "default", lambda q: kicked.append(q.path))
    entries = [_entry(active, n, "limited.example" if n % 2 else "free.example") for n in range(1, 7)]
    for entry in entries:
        queues.enqueue(entry, _Destination())
    shared = queues.get(f"default->{SITE}")
    assert shared is not None
    taken = shared.take_nowait()  # message 1, in flight: not the reload's to move
    assert taken is not None and taken.id == 1
    generations = {e.id: e.generation for e in entries}
    kicked.clear()

    assert queues.rehome(lambda d: d == "limited.example") == 2
    assert _waiting(queues) == {f"default->limited.example@{SITE}": [3, 5], f"default->{SITE}": [2, 4, 6]}
    assert kicked == [f"default->limited.example@{SITE}"]
    assert entries[0].state is State.IN_FLIGHT and entries[0].generation == generations[1]
    for moved in (entries[2], entries[4]):  # a new generation: a lease on where it was is stale
        assert moved.state is State.READY and moved.generation != generations[moved.id]
    # The shared queue's deque still holds the moved entries: it skips them, never hands them out.
    handed = [lease.id for lease in iter(shared.take_nowait, None)]
    assert handed == [2, 4, 6]

    # The block removed again: the domain's mail goes back to the shared queue, once.
    assert queues.rehome(lambda d: False) == 2
    assert _waiting(queues) == {f"default->{SITE}": [3, 5]}


def test_an_empty_queue_idle_for_its_idle_timeout_is_forgotten_and_a_busy_one_is_kept() -> None:
    now = [100.0]
    active = ActiveSet(100)
    forgotten: list[ReadyQueue] = []
    busy: set[str] = set()
    queues = ReadyQueues(
        active,
        "default",
        lambda q: None,
        owns=lambda d: True,
        idle_timeout=lambda q: None if q.path in busy else 10.0,
        on_forget=forgotten.append,
        clock=lambda: now[0],
    )
    for n, domain in enumerate(["a.example", "b.example", "c.example"], start=1):
        queues.enqueue(_entry(active, n, domain), _Destination())
    a, b, c = (queues.get(f"default->{d}.example@{SITE}") for d in "abc")
    assert a is not None and b is not None and c is not None
    a.take_nowait()
    b.take_nowait()
    busy.add(b.path)  # a connection still open on it
    now[0] += 9.9
    assert queues.forget_idle() == []
    now[0] += 0.2
    assert queues.forget_idle() == [a.path]  # c still has mail, b a connection
    assert forgotten == [a] and queues.get(a.path) is None and len(queues) == 2
    # Mail for the domain again: a new queue.
    queues.enqueue(_entry(active, 4, "a.example"), _Destination())
    again = queues.get(a.path)
    assert again is not None and again is not a and [e.id for e in again] == [4]


def test_a_message_moved_away_and_back_is_listed_taken_and_moved_once() -> None:
    active = ActiveSet(100)
    queues = ReadyQueues(active, "default", lambda q: None)
    entries = [_entry(active, n, "limited.example" if n % 2 else "free.example") for n in range(1, 5)]
    for entry in entries:
        queues.enqueue(entry, _Destination())
    assert queues.rehome(lambda d: d == "limited.example") == 2
    assert queues.rehome(lambda d: False) == 2  # back: the shared queue's deque has them twice now
    shared = queues.get(f"default->{SITE}")
    assert shared is not None and len(shared) == 4
    assert sorted(e.id for e in shared) == [1, 2, 3, 4]
    assert queues.rehome(lambda d: d == "limited.example") == 2  # each moved once, not once per copy
    assert _waiting(queues) == {f"default->limited.example@{SITE}": [1, 3], f"default->{SITE}": [2, 4]}
    assert len(shared) == 2
    handed = [lease.id for lease in iter(shared.take_nowait, None)]
    assert handed == [2, 4] and len(shared) == 0
