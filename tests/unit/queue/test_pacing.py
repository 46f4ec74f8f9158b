"""Queue rates: what a paced queue keeps in memory, and what goes back to the spool."""

from __future__ import annotations

import asyncio
import itertools

from pigeon.message import SpoolId
from pigeon.queue.pacing import Pacer, QueueRates
from pigeon.queue.state import Lease
from pigeon.shaping.gcra import Rate
from pigeon.shaping.throttles import Throttles


async def test_a_big_paced_backlog_keeps_a_few_seconds_of_its_rate_in_memory_and_spreads_the_rest_one_slot_apart() -> (
    None
):
    """Found in review: every paced message waited in memory, so a paced campaign of 100,000
    filled the worker's active set and every other tenant's mail waited behind it, at the
    campaign's pace. At 5/s, a hundred (ten seconds' worth, at least 100) wait in memory; the
    others go back to the spool, each due one slot (0.2 s) after the one before, after what
    waits."""
    released: list[Lease] = []
    put_back: list[tuple[Lease, float]] = []
    now = 1000.0
    pacer = Pacer(
        QueueRates([("*:acme@*", Rate.parse("5/s"))]),
        Throttles(),
        released.append,
        put_back=lambda lease, until: put_back.append((lease, until)),
        clock=lambda: now,
    )
    leases = [Lease(SpoolId(n), 1) for n in range(250)]
    try:
        for lease in leases:
            pacer.hold("c:acme@example.com", lease)
        assert pacer.waiting("c:acme@example.com") + len(released) == 100
        assert [lease for lease, _ in put_back] == leases[100:]
        dues = [until for _, until in put_back]
        assert abs(dues[0] - (now + 100 / 5 + 0.2)) < 1e-6
        assert all(abs(b - a - 0.2) < 1e-6 for a, b in itertools.pairwise(dues))
        # Another queue's mail is not put back behind it.
        pacer.hold("c:other@example.com", Lease(SpoolId(999), 1))
        assert len(put_back) == 150
    finally:
        await pacer.stop()


async def test_a_paced_queue_under_its_memory_share_puts_nothing_back() -> None:
    released: list[Lease] = []
    put_back: list[tuple[Lease, float]] = []
    pacer = Pacer(
        QueueRates([("*", Rate.parse("100/s"))]),
        Throttles(),
        released.append,
        put_back=lambda lease, until: put_back.append((lease, until)),
    )
    try:
        for n in range(200):
            pacer.hold("q@example.com", Lease(SpoolId(n), 1))
        await asyncio.sleep(0.3)
        assert put_back == [] and len(released) >= 20
    finally:
        await pacer.stop()


async def test_paced_queues_together_keep_no_more_than_their_budget_in_memory_but_one_each() -> None:
    """A thousand paced campaigns of a few hundred messages each would fill the active set too."""
    put_back: list[tuple[Lease, float]] = []
    pacer = Pacer(
        QueueRates([("*", Rate.parse("1/s"))]),
        Throttles(),
        lambda lease: None,
        put_back=lambda lease, until: put_back.append((lease, until)),
        budget=150,
    )
    try:
        for n in range(300):
            pacer.hold(f"c{n % 3}:t@example.com", Lease(SpoolId(n), 1))
        waiting = [pacer.waiting(f"c{q}:t@example.com") for q in range(3)]
        assert sum(waiting) == 150 and min(waiting) >= 1
        assert len(put_back) == 300 - 150  # (the rest went back to the spool)
        pacer.hold("new:t@example.com", Lease(SpoolId(1000), 1))
        assert pacer.waiting("new:t@example.com") == 1  # one per queue, whatever the budget
    finally:
        await pacer.stop()


async def test_mail_made_due_again_or_a_new_rate_is_spread_afresh_not_behind_the_old_promises() -> None:
    """Found from outside: after a rate was raised and `pigeon retry --queue` made the paced
    mail due, what had to wait again was set behind the slots promised at the old rate (and
    its own old ones), two minutes away, though the new rate allowed it in seconds."""
    put_back: list[tuple[Lease, float]] = []
    now = 1000.0
    pacer = Pacer(
        QueueRates([("*", Rate.parse("10/s"))]),
        Throttles(),
        lambda lease: None,
        put_back=lambda lease, until: put_back.append((lease, until)),
        clock=lambda: now,
    )
    try:
        for n in range(250):
            pacer.hold("q@example.com", Lease(SpoolId(n), 1))
        assert abs(put_back[-1][1] - (now + 100 / 10 + 150 / 10)) < 1e-6  # the last promise: 25 s away
        pacer.forget()  # (an operator's retry)
        pacer.hold("q@example.com", Lease(SpoolId(1000), 1))
        assert abs(put_back[-1][1] - (now + 100 / 10 + 0.1)) < 1e-6  # after what waits, not after 25 s
        pacer.rates = QueueRates([("*", Rate.parse("20/s"))])  # (a reload: forgets too)
        for n in range(2000, 2101):  # (200 wait at 20/s: the 201st goes back)
            pacer.hold("q@example.com", Lease(SpoolId(n), 1))
        assert abs(put_back[-1][1] - (now + 200 / 20 + 1 / 20)) < 1e-6
    finally:
        await pacer.stop()


async def test_a_worker_spaces_what_it_puts_back_by_its_share_of_the_rate() -> None:
    """Found from outside: with two workers each spaced its put-back mail at the node's whole
    rate, so it came back twice as early as its slots, to be put back again."""
    put_back: list[tuple[Lease, float]] = []
    now = 1000.0
    pacer = Pacer(
        QueueRates([("*", Rate.parse("10/s"))]),
        Throttles(),
        lambda lease: None,
        put_back=lambda lease, until: put_back.append((lease, until)),
        clock=lambda: now,
        share=2,
    )
    try:
        for n in range(102):
            pacer.hold("q@example.com", Lease(SpoolId(n), 1))
        # 100 wait here, a worker's half of 10/s is 5/s: 20 s of them, then 0.2 s apart.
        assert [round(until - now, 6) for _, until in put_back] == [20.2, 20.4]
    finally:
        await pacer.stop()
