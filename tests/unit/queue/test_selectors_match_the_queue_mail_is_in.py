"""An admin selector's `tenant`, `campaign` and `domain` name the parts of the queue a message
is in now (`campaign:tenant@domain`, as KumoMTA's do): mail an operator rebound, or a policy
put, into campaign cb's queue is held by a suspension of campaign cb and left alone by a bounce
of the campaign it came from. Mail never moved is matched as it always was, and mail in a queue
named without a domain part (`bulk`, `parking`) by its envelope and recipients."""

from __future__ import annotations

import fnmatch
import itertools

import pytest

from pigeon.message import Envelope, Message, Recipient
from pigeon.queue.names import queue_name, queue_parts, scheduled_queue
from pigeon.queue.rules import Selector
from pigeon.queue.state import RebindMark


def _message(
    queue: str, recipient: str = "a@d06.test", tenant: str | None = "tv1", campaign: str | None = "ca"
) -> Message:
    envelope = Envelope(sender="s@example.org", recipients=[Recipient(recipient)], tenant=tenant, campaign=campaign)
    return Message(1, queue, envelope, 0.0, 10, 1)


def _received(recipient: str, tenant: str | None, campaign: str | None) -> Message:
    """A message as the intake stores it: in the queue its tenant, campaign and domain make."""
    message = _message("", recipient, tenant, campaign)
    message.queue = scheduled_queue(message.envelope.recipients[0].domain, tenant, campaign)
    return message


def _matched_by_envelope(selector: Selector, message: Message) -> bool:
    """How selectors matched before: the envelope's tenant and campaign, the first recipient's domain."""
    envelope = message.envelope
    return (
        (selector.queue is None or fnmatch.fnmatchcase(message.queue, selector.queue))
        and (selector.tenant is None or fnmatch.fnmatchcase(envelope.tenant or "", selector.tenant))
        and (selector.campaign is None or fnmatch.fnmatchcase(envelope.campaign or "", selector.campaign))
        and (selector.domain is None or fnmatch.fnmatchcase(envelope.recipients[0].domain, selector.domain))
    )


def test_mail_rebound_to_another_campaign_is_that_campaigns_to_hold_and_no_longer_the_old_ones() -> None:
    moved = _message("cb:tv1@d06.test")  # its envelope still says campaign ca
    assert Selector(campaign="cb").matches(moved)
    assert Selector(tenant="tv1", campaign="cb").matches(moved)
    assert Selector(campaign="c?", domain="d06.test").matches(moved)
    assert not Selector(campaign="ca").matches(moved)
    assert not Selector(tenant="tv1", campaign="ca").matches(moved)


def test_mail_rebound_to_another_tenant_and_domain_is_matched_by_that_tenant_and_domain() -> None:
    moved = _message("tu1@parked1.test")  # no campaign in its new queue
    assert Selector(domain="parked1.test").matches(moved)
    assert Selector(domain="*.test", tenant="tu1").matches(moved)
    for old in (Selector(domain="d06.test"), Selector(tenant="tv1"), Selector(campaign="ca"), Selector(campaign="c*")):
        assert not old.matches(moved), old
    campaign_only = _message("cb:@parked1.test")
    assert Selector(campaign="cb", domain="parked1.test").matches(campaign_only)
    assert not Selector(tenant="tv1").matches(campaign_only)
    assert not Selector(tenant="t*").matches(campaign_only)  # no tenant, as mail of `cb:@x` never had one


def test_a_selector_names_a_moved_mails_idn_domain_by_either_spelling() -> None:
    for queue in ("tu1@xn--bcher-kva.example", "tu1@bücher.example"):  # (the second: a spool of before)
        moved = _message(queue)
        assert Selector(domain="bücher.example").matches(moved), queue
        assert Selector(domain="xn--bcher-kva.example").matches(moved), queue
        assert Selector(domain="XN--BCHER-KVA.example").matches(moved), queue


@pytest.mark.parametrize(
    "queue", ["bulk", "parking", "d06.test", "spring:bulk", "@d06.test", "a:b:c@x.test", "a@b@x.test"]
)
def test_mail_in_a_queue_named_without_a_tenant_campaign_and_domain_is_matched_by_its_envelope(queue: str) -> None:
    # A policy's Changes(queue="bulk") or `rebind --to-queue parking`: `suspend --domain
    # d06.test` still holds that mail, and its tenant and campaign are the envelope's.
    message = _message(queue)
    assert Selector(domain="d06.test").matches(message)
    assert Selector(tenant="tv1", campaign="ca").matches(message)
    assert not Selector(domain="x.test").matches(message)
    assert not Selector(campaign="cb").matches(message)


def test_inbound_routes_mail_is_matched_by_its_envelope_whatever_its_target_is_called() -> None:
    message = _message("inbound:app@host.test", tenant=None, campaign=None)
    assert Selector(domain="d06.test").matches(message)
    assert not Selector(campaign="inbound").matches(message)
    assert not Selector(domain="host.test").matches(message)


RECIPIENTS = ["a@d06.test", "a@D06.Test", "a@bücher.example", "a@XN--BCHER-KVA.example", "a@straße.de", "postmaster"]
PARTS = [None, "tv1", "Tv1", "c*"]
SELECTORS = [
    Selector(domain="d06.test"),
    Selector(domain="D06.TEST."),
    Selector(domain="bücher.example"),
    Selector(domain="xn--bcher-kva.*"),
    Selector(domain="straße.de"),
    Selector(domain="*"),
    Selector(tenant="tv1"),
    Selector(tenant="Tv1"),
    Selector(tenant="*"),
    Selector(campaign="c[*]"),
    Selector(campaign="tv?"),
    Selector(tenant="tv1", campaign="tv1", domain="d06.test"),
    Selector(queue="*@d06.test", tenant="*"),
]


def test_mail_never_moved_is_matched_exactly_as_before() -> None:
    # Its queue is made of its tenant, campaign and recipients' domain (an A-label, in lower
    # case): matching the queue's parts says the same as matching those, case and IDN alike.
    for recipient, tenant, campaign in itertools.product(RECIPIENTS, PARTS, PARTS):
        message = _received(recipient, tenant, campaign)
        for selector in SELECTORS:
            expected = _matched_by_envelope(selector, message)
            assert selector.matches(message) is expected, (message.queue, message.envelope, selector)


def test_scheduled_queue_names_read_back_as_their_parts() -> None:
    assert queue_parts("cb:tv1@d06.test") == ("tv1", "cb", "d06.test")
    assert queue_parts("tv1@d06.test") == ("tv1", "", "d06.test")
    assert queue_parts("cb:@d06.test") == ("", "cb", "d06.test")
    assert queue_parts("tv1@Bücher.Example") == ("tv1", "", "xn--bcher-kva.example")
    for named in ("d06.test", "bulk", "spring:bulk", "@x", ":@x", ":t@x", "a:b:c@x", "a@b@x", "x@", "inbound:a@b"):
        assert queue_parts(named) is None, named
    for domain, tenant, campaign in itertools.product(("d06.test", "xn--bcher-kva.example"), PARTS, PARTS):
        name = scheduled_queue(domain, tenant, campaign)
        parts = queue_parts(name)
        if tenant or campaign:
            assert parts == (tenant or "", campaign or "", domain), name
        else:
            assert parts is None, name  # a bare domain: matched by the envelope, which says the same


def test_a_rebind_to_a_campaign_tenant_domain_queue_gives_the_mail_that_tenant_and_campaign() -> None:
    envelope = _message("ca:tv1@d06.test").envelope
    moved = RebindMark("cb:tv1@d06.test", None).envelope(envelope)
    assert (moved.tenant, moved.campaign, moved.routing_domain) == ("tv1", "cb", None)
    moved = RebindMark("tu1@parked1.test", "relay.test").envelope(envelope)
    assert (moved.tenant, moved.campaign, moved.routing_domain) == ("tu1", None, "relay.test")
    moved = RebindMark("cb:@parked1.test", None).envelope(envelope)
    assert (moved.tenant, moved.campaign) == (None, "cb")
    # A name that says no tenant or campaign leaves the mail's as they were.
    for named in ("parking", "parked1.test", "@parked1.test"):
        assert RebindMark(named, None).envelope(envelope) is envelope
    assert RebindMark(None, "").envelope(envelope).tenant == "tv1"
    inbound = Envelope(sender="s@x", recipients=[Recipient("a@d06.test")], tenant="tv1", target="app")
    assert RebindMark("cb:tv1@d06.test", "relay.test").envelope(inbound) is inbound


def test_a_queue_name_given_with_a_u_label_domain_is_the_queue_of_its_a_label() -> None:
    # As `[[queue]] name = "slow@bücher.example"` reads it, and as mail to bücher.example is queued.
    assert queue_name("slow@Bücher.Example.") == "slow@xn--bcher-kva.example"
    assert queue_name("cb:tv1@D06.test") == "cb:tv1@d06.test"
    assert queue_name("bulk") == "bulk"
