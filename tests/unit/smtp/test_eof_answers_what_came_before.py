"""The peer's EOF (receive_data(b"")) says it sends no more, not that it is gone: whatever came
before it is worked through and answered, a decision still open included, and only then does
the session close. A message whose end never came is still no message."""

from __future__ import annotations

from pigeon.smtp import replies
from pigeon.smtp.events import NEED_DATA, Closing, MessageEnd, TransactionReset
from pigeon.smtp.server import ServerSession

from .harness import QUEUE_ID, QUEUED, Peer, config

WHOLE = b"EHLO client.test\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\nHi.\r\n.\r\nQUIT\r\n"


def test_a_whole_transaction_then_eof_is_answered_to_its_221_then_closed() -> None:
    peer = Peer.start()
    peer.session.receive_data(WHOLE)
    out = peer.close()
    assert out.endswith("354 End data with <CR><LF>.<CR><LF>\r\n" + QUEUED + "221 2.0.0 mx.test closing connection\r\n")
    assert len(peer.message_ends()) == 1
    assert peer.closing() == Closing(replies.closing("mx.test"))


def test_an_eof_while_the_end_of_the_message_is_being_decided_waits_for_that_decision() -> None:
    # As the I/O layer has it: the EOF comes while the message is being stored.
    session = ServerSession(config())
    session.greet()
    session.receive_data(WHOLE)
    while not isinstance(event := session.next_event(), MessageEnd):
        assert event is not NEED_DATA
        if event is session.pending:
            session.accept()
    session.data_to_send()
    session.receive_data(b"")
    session.respond(replies.queued([QUEUE_ID]))
    assert session.next_event() == Closing(replies.closing("mx.test"))
    assert session.data_to_send() == (QUEUED + "221 2.0.0 mx.test closing connection\r\n").encode()


def test_commands_then_eof_without_quit_are_answered_then_the_session_closes() -> None:
    peer = Peer.start()
    peer.session.receive_data(b"EHLO client.test\r\nNOOP\r\nNOO")  # the last line never ends
    out = peer.close()
    assert out.endswith("250 DSN\r\n250 2.0.0 Ok\r\n")
    assert peer.closing() == Closing(None)


def test_an_eof_in_the_middle_of_a_message_stores_nothing() -> None:
    peer = Peer.start()
    peer.session.receive_data(WHOLE.split(b".\r\n")[0])  # up to the content, no final dot
    assert peer.close().endswith("354 End data with <CR><LF>.<CR><LF>\r\n")
    assert peer.message_ends() == []
    assert peer.events[-2:] == [TransactionReset(), Closing(None)]
