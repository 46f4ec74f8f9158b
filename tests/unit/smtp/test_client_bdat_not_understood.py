"""A BDAT the server does not know (500, 502, 504), though it offers CHUNKING, is no verdict on
the message: its recipients get a 4xx that says so, and the session closes the connection.

Found from outside: a server that offered CHUNKING and answered `BDAT` with `500 5.5.1 BDAT
broken` had the mail bounced (`Bounce ... 500 BDAT broken ProtocolErrors`, a DSN sent), so a
middlebox that mangles BDAT made mail undeliverable for good. RFC 5321 4.2.4: 500, 502 and 504
say the command was not understood or not implemented, nothing of the content; the I/O layer
(`pigeon.delivery.session`) sends the message again with DATA on a new connection. A refusal
of the content after BDAT LAST (554, 552, 550) stays the recipients' reply, as before.
"""

from __future__ import annotations

import pytest

from pigeon.smtp.client import BDAT_NOT_UNDERSTOOD, Capabilities, Envelope, Recipient, Transaction, bdat_not_understood
from pigeon.smtp.client_session import Closed, Deliver, Phase, TransactionDone
from pigeon.smtp.replies import Reply
from tests.unit.smtp.test_client_session import greeted

BODY = b"Subject: x\r\n\r\nhi\r\n"
PEER = Capabilities(frozenset({"PIPELINING", "CHUNKING"}))
MODES = {"pipelining": True, "lockstep": False}


def envelope() -> Envelope:
    return Envelope("a@example.org", [Recipient("b@example.net"), Recipient("c@example.net")], BODY)


def answered(bdat: Reply, *, pipelining: bool) -> Transaction:
    """A transaction whose MAIL and first RCPT were taken, the second RCPT refused 550, and
    its BDAT answered `bdat`."""
    transaction = Transaction(envelope(), PEER, pipelining=pipelining)
    assert transaction.start().endswith(b"BDAT %d LAST\r\n" % len(BODY) + BODY) == pipelining
    answers = [Reply(250, "2.1.0", ("ok",)), Reply(250, "2.1.5", ("ok",)), Reply(550, "5.1.1", ("no such user",)), bdat]
    for answer in answers:
        out = transaction.on_reply(answer)
        if not pipelining and answer is answers[-2]:
            assert out.startswith(b"BDAT ")
    assert transaction.done
    return transaction


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("code", sorted(BDAT_NOT_UNDERSTOOD))
def test_bdat_not_understood_is_a_transient_failure_of_the_accepted_recipients(code: int, mode: str) -> None:
    bdat = Reply(code, "5.5.1", ("BDAT broken",))
    result = answered(bdat, pipelining=MODES[mode]).result()
    assert result.bdat_not_understood == bdat
    (first, second) = result.replies
    assert first == bdat_not_understood(bdat) == result.data_reply
    assert first.code == 451 and first.enhanced == "4.5.1"
    assert str(first) == (
        f"451 4.5.1 answered BDAT with {code} 5.5.1 BDAT broken (not understood, though CHUNKING is offered): "
        "to go again with DATA"
    )
    assert second == Reply(550, "5.1.1", ("no such user",))  # its own refusal stands


def test_bdat_not_understood_without_an_enhanced_code_gets_4_5_1() -> None:
    result = answered(Reply(502, None, ("Command not implemented",)), pipelining=True).result()
    assert result.replies[0].enhanced == "4.5.1"


@pytest.mark.parametrize("code", [554, 552, 550, 501, 503])
def test_a_refusal_of_the_content_after_bdat_last_stays_the_recipients_reply(code: int) -> None:
    refusal = Reply(code, "5.6.0", ("content refused",))
    result = answered(refusal, pipelining=True).result()
    assert result.bdat_not_understood is None
    assert result.replies == [refusal, Reply(550, "5.1.1", ("no such user",))]


def test_a_500_to_the_final_dot_of_data_is_the_servers_verdict() -> None:
    transaction = Transaction(envelope(), PEER, chunking=False)
    transaction.start()
    for answer in (Reply(250, None, ("ok",)), Reply(250, None, ("ok",)), Reply(250, None, ("ok",))):
        transaction.on_reply(answer)
    transaction.on_reply(Reply(354, None, ("go",)))
    transaction.on_reply(Reply(500, "5.5.1", ("what?",)))
    assert transaction.result().bdat_not_understood is None
    assert transaction.result().replies == [Reply(500, "5.5.1", ("what?",))] * 2


def test_the_session_closes_the_connection_after_bdat_not_understood_and_hears_no_more() -> None:
    script = greeted()
    script.send(Deliver(envelope()))
    events = script.server(
        b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n250 2.1.5 ok\r\n500 5.5.1 BDAT broken\r\n"
        # The chunk's lines, read as commands by a server that does not know BDAT:
        b"500 5.5.1 Subject: x ?\r\n500 5.5.1 ?\r\n"
    )
    assert [type(event) for event in events] == [TransactionDone, Closed]
    done = events[0]
    assert isinstance(done, TransactionDone)
    assert done.result.replies == [bdat_not_understood(Reply(500, "5.5.1", ("BDAT broken",)))] * 2
    assert events[1] == Closed(None)
    assert script.last_write() == b"QUIT\r\n"  # goodbye, no reply awaited
    assert script.session.phase is Phase.CLOSED
    assert not script.session.end_of_data_unanswered()  # the server took nothing: no "twice"
    assert script.server(b"500 5.5.1 hi ?\r\n") == []  # what else it says is not read


def test_a_session_without_chunking_sends_data_to_a_server_offering_it() -> None:
    script = greeted(chunking=False)
    out = script.send(Deliver(envelope()))
    assert b"BDAT" not in out and out.endswith(b"DATA\r\n")
