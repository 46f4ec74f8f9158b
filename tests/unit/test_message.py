"""The message noun: ids and their shard, envelopes as spooled (older spools included)."""

from __future__ import annotations

from pigeon.message import ENVELOPE_DECODER, ENVELOPE_ENCODER, Envelope, IdGenerator, Recipient, shard_of


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
