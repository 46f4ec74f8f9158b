"""The message noun: ids and their shard, envelopes as spooled (older spools included)."""

from __future__ import annotations

import asyncio
import time
import typing
from pathlib import Path

import msgspec
import pytest

from pigeon.message import (
    ENVELOPE_DECODER,
    ENVELOPE_ENCODER,
    AfterAttempt,
    Envelope,
    IdGenerator,
    RebindAfterAttempt,
    Recipient,
    id_time,
    node_start,
    shard_of,
)
from pigeon.spool.sqlite import SqliteSpool


def test_an_id_says_which_shard_made_it() -> None:
    for shard in (0, 1, 7, 63):
        ids = IdGenerator(shard).next(), IdGenerator(shard, last=1 << 40).next()
        assert [shard_of(i) for i in ids] == [shard, shard]


def test_an_envelope_spooled_before_targets_existed_is_read_as_one_for_its_target() -> None:
    """The first build marked `[[inbound]]` mail with routing_domain "inbound:<target>"."""
    old = Envelope("a@example.org", [Recipient("support@app.example")], routing_domain="inbound:helpdesk")
    read = ENVELOPE_DECODER.decode(ENVELOPE_ENCODER.encode(old))
    assert (read.target, read.routing_domain) == ("helpdesk", None)


def test_a_rebound_envelope_keeps_its_routing_domain() -> None:
    envelope = Envelope("a@example.org", [Recipient("b@example.net")], routing_domain="relay.example")
    read = ENVELOPE_DECODER.decode(ENVELOPE_ENCODER.encode(envelope))
    assert (read.target, read.routing_domain) == (None, "relay.example")


def test_two_nodes_receiving_in_the_same_millisecond_give_different_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each node's shards count from 0 and know nothing of other nodes: in a cluster, two
    nodes receiving in the same millisecond on the same shard number gave the same id to
    different messages. Their names keep them apart, and each node's ids still increase."""
    monkeypatch.setattr(time, "time", lambda: 1_796_000_000.0005)  # one millisecond, frozen
    for shard in (0, 5):
        one = IdGenerator(shard, start=node_start("mx1.example.net"))
        other = IdGenerator(shard, start=node_start("mx2.example.net"))
        ids_one = [one.next() for _ in range(50)]
        ids_other = [other.next() for _ in range(50)]
        assert not set(ids_one) & set(ids_other)
        assert ids_one == sorted(set(ids_one)) and ids_other == sorted(set(ids_other))
        assert {shard_of(i) for i in ids_one + ids_other} == {shard}
        assert {int(id_time(i)) for i in ids_one + ids_other} == {1_796_000_000}


def test_a_node_keeps_its_part_of_the_sequence_across_restarts() -> None:
    assert node_start("mx1.example.net") == node_start("mx1.example.net") != node_start("mx2.example.net")


async def test_spools_of_two_nodes_hand_out_different_ids_in_the_same_millisecond(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "time", lambda: 1_796_000_000.0005)
    spools = [SqliteSpool(tmp_path / name / "shard-0", node=name) for name in ("a.example", "b.example")]
    for spool in spools:
        spool.open(asyncio.get_running_loop())
    try:
        first, second = (set(spool.new_ids(20)) for spool in spools)
        assert len(first) == len(second) == 20 and not first & second
    finally:
        for spool in spools:
            spool.close()


def test_an_envelope_marked_delay_warned_is_read_by_the_layout_before_the_mark() -> None:
    """Going back to the Pigeon before `delay_warned`: it reads a row a newer one marked (the
    mark is the last element, which it ignores), and a row without the mark reads as unwarned."""
    hints = typing.get_type_hints(Envelope)
    # (The layout before the mark: every field ahead of it; those added after it came later.)
    earlier = Envelope.__struct_fields__[: Envelope.__struct_fields__.index("delay_warned")]
    fields = [(f, hints[f], getattr(Envelope(sender="", recipients=[]), f))
              for f in earlier if f not in ("sender", "recipients")]  # fmt: skip
    before = msgspec.defstruct(
        "Before",
        [("sender", str), ("recipients", list[Recipient]), *fields],
        array_like=True,
        omit_defaults=True,
    )
    marked = Envelope("a@example.org", [Recipient("b@example.net")], original_sender="c@example.org", delay_warned=5.0)
    read = msgspec.msgpack.decode(ENVELOPE_ENCODER.encode(marked), type=before)
    assert (read.sender, read.original_sender) == ("a@example.org", "c@example.org")  # type: ignore[attr-defined]
    unmarked = msgspec.msgpack.encode(before("a@example.org", [Recipient("b@example.net")]))
    assert ENVELOPE_DECODER.decode(unmarked).delay_warned is None
    assert ENVELOPE_DECODER.decode(ENVELOPE_ENCODER.encode(marked)).delay_warned == 5.0


def test_an_envelope_marked_after_attempt_is_read_by_the_layout_before_the_mark() -> None:
    """Going back to the Pigeon before `after_attempt`: it reads a row a newer one marked (the
    mark is the last element, which it ignores: it attempts the message again), and a row
    without the mark reads as unmarked."""
    hints = typing.get_type_hints(Envelope)
    earlier = Envelope.__struct_fields__[: Envelope.__struct_fields__.index("after_attempt")]
    fields = [(f, hints[f], getattr(Envelope(sender="", recipients=[]), f))
              for f in earlier if f not in ("sender", "recipients")]  # fmt: skip
    before = msgspec.defstruct(
        "Before",
        [("sender", str), ("recipients", list[Recipient]), *fields],
        array_like=True,
        omit_defaults=True,
    )
    mark = AfterAttempt("hold", "a loop?", "ops")
    marked = Envelope("a@example.org", [Recipient("b@example.net")], hold_operator="ops", after_attempt=mark)
    read = msgspec.msgpack.decode(ENVELOPE_ENCODER.encode(marked), type=before)
    assert (read.sender, read.hold_operator) == ("a@example.org", "ops")  # type: ignore[attr-defined]
    unmarked = msgspec.msgpack.encode(before("a@example.org", [Recipient("b@example.net")]))
    assert ENVELOPE_DECODER.decode(unmarked).after_attempt is None
    assert ENVELOPE_DECODER.decode(ENVELOPE_ENCODER.encode(marked)).after_attempt == mark


def test_an_envelope_with_a_rebind_after_attempt_is_read_by_the_layout_before_it() -> None:
    """A row stored before `rebind_after_attempt` (a hold's mark and `hold_bound_to` its last
    elements) loads as one with no rebind to apply; going back, the Pigeon before it reads a
    row a newer one marked, that last element ignored."""
    hints = typing.get_type_hints(Envelope)
    earlier = Envelope.__struct_fields__[: Envelope.__struct_fields__.index("rebind_after_attempt")]
    fields = [(f, hints[f], getattr(Envelope(sender="", recipients=[]), f))
              for f in earlier if f not in ("sender", "recipients")]  # fmt: skip
    before = msgspec.defstruct(
        "Before",
        [("sender", str), ("recipients", list[Recipient]), *fields],
        array_like=True,
        omit_defaults=True,
    )
    held = AfterAttempt("hold", "a loop?", "acme-ops", ["acme"])
    old = msgspec.msgpack.encode(before("a@example.org", [Recipient("b@example.net")], after_attempt=held))
    read = ENVELOPE_DECODER.decode(old)
    assert (read.after_attempt, read.rebind_after_attempt) == (held, None)
    mark = RebindAfterAttempt("parked", "", "ops", "op-1")  # ("": by its recipients' domain again)
    marked = Envelope("a@example.org", [Recipient("b@example.net")], after_attempt=held, rebind_after_attempt=mark)
    back = msgspec.msgpack.decode(ENVELOPE_ENCODER.encode(marked), type=before)
    assert back.after_attempt == held  # type: ignore[attr-defined]
    again = ENVELOPE_DECODER.decode(ENVELOPE_ENCODER.encode(marked))
    assert (again.after_attempt, again.rebind_after_attempt) == (held, mark)
    only_a_route = RebindAfterAttempt(None, "relay.test")
    assert (
        ENVELOPE_DECODER.decode(
            ENVELOPE_ENCODER.encode(Envelope("", [], rebind_after_attempt=only_a_route))
        ).rebind_after_attempt
        == only_a_route
    )
