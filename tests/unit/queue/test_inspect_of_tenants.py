"""`pigeon inspect` (`Admin.inspect`) for a token bound to tenants: another tenant's message is
answered as absent before its row is read whole. It used to be read (its envelope decoded, its
state and pool worked out) and only then refused: 0.210 ms against 0.165 ms for an id of none,
over HTTP, which told a bound token which ids exist. Now both cost one indexed read of the row's
queue name (`Spool.peek`). So for a write by id (`retry`, `hold`, `bounce`) from such a token.
No timing is asserted here (it would be flaky): what is read is."""

from __future__ import annotations

from typing import Any

import pytest

from pigeon.message import Envelope, Recipient, SpoolId, format_id
from pigeon.queue.names import scheduled_queue
from pigeon.queue.rules import Selector
from tests.support.queue_world import World
from tests.unit.conftest import MakeWorld

ACME = frozenset({"acme"})
LATER = 3600.0  # due in an hour: left in the spool, not taken into memory


def _store(world: World, tenant: str | None, queue: str | None = None) -> SpoolId:
    (spool_id,) = world.spool.new_ids(1)
    envelope = Envelope("app@example.org", [Recipient("u@d1.test")], tenant=tenant)
    now = world.clock()
    world.spool.put(spool_id, queue or scheduled_queue("d1.test", tenant, ""), envelope, now, b"x", now + LATER)
    return spool_id


def _unread(world: World, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What reads a message whole (its envelope decoded) or its body: made to fail, and noted."""
    reads: list[str] = []

    def refused(name: str) -> Any:
        def read(*args: object) -> Any:
            reads.append(name)
            raise AssertionError(f"{name} read for another tenant's message")

        return read

    for name in ("get", "body", "stored_body", "scan"):
        monkeypatch.setattr(world.spool, name, refused(name))
    return reads


async def test_another_tenants_message_is_none_before_its_envelope_or_body_is_read(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world({"d1.test": "mx1.test"})
    globex = _store(world, "globex")
    untenanted = _store(world, None)  # (queue `d1.test`: its tenant is its envelope's, none)
    bulk = _store(world, "globex", queue="bulk")  # (a name without a tenant part: its envelope's)
    (absent,) = world.spool.new_ids(1)
    own = _store(world, "acme")
    assert world.admin.inspect(globex) is not None  # (the operator sees it)
    peeked: list[int] = []
    peek = world.spool.peek

    def counted(spool_id: int) -> Any:
        peeked.append(spool_id)
        return peek(spool_id)

    monkeypatch.setattr(world.spool, "peek", counted)
    reads = _unread(world, monkeypatch)
    for spool_id in (globex, untenanted, bulk, absent):
        assert world.admin.inspect(spool_id, ACME) is None
    assert reads == []
    # Each one its row's queue name read by id, the absent id too: the same look for each.
    assert peeked == [globex, untenanted, bulk, absent]
    monkeypatch.undo()
    shown = world.admin.inspect(own, ACME)
    assert shown is not None and shown["tenant"] == "acme"


async def test_another_tenants_message_in_memory_is_none_and_its_row_is_looked_up_as_an_absent_ids(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world({"d1.test": "mx1.test"})
    spool_id = world.inject(["a@d1.test"], tenant="globex")  # (taken into memory at once)
    assert world.active.get(spool_id) is not None
    peeked: list[int] = []
    peek = world.spool.peek
    monkeypatch.setattr(world.spool, "peek", lambda i: (peeked.append(i), peek(i))[1])
    reads = _unread(world, monkeypatch)
    assert world.admin.inspect(spool_id, ACME) is None
    assert (reads, peeked) == ([], [spool_id])


async def test_a_bound_tokens_write_by_id_answers_another_tenants_message_without_reading_it(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It read the row, found it `not_selected` (its tenant), rested, and was answered 0.09 ms
    # later than for an id of none; the answer said `not_found` all the same.
    world = make_world({"d1.test": "mx1.test"})
    globex, untenanted = _store(world, "globex"), _store(world, None)
    (absent,) = world.spool.new_ids(1)
    in_memory = world.inject(["a@d1.test"], tenant="globex")
    reads = _unread(world, monkeypatch)
    acme = Selector(tenant="acme")
    ids = [globex, untenanted, absent, in_memory]
    nothing = [{"id": format_id(spool_id), "result": "not_found"} for spool_id in ids]
    retried = await world.admin.retry(acme, "r1", messages=ids, bound_to=["acme"])
    held = await world.admin.hold(acme, messages=ids, reason="", operator="acme-admin", bound_to=["acme"])
    bounced = await world.admin.bounce(
        acme, reason="", operator="acme-admin", duration=None, rule_id="b1", messages=ids, bound_to=["acme"]
    )
    assert [retried["messages"], held["messages"], bounced["messages"]] == [nothing] * 3
    assert reads == []
    assert [op["looked_at"] for op in world.admin.operations()] == [0, 0, 0]
