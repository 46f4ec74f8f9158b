"""What the I/O layer times: `receiving_content` is true while the client owes a message's
content (bounded as a whole: command_timeout plus a minimum data rate), and `commands` counts
the command lines read (each bounded by command_timeout on its own)."""

from __future__ import annotations

from .harness import Peer, config, open_transaction


def _in_transaction() -> Peer:
    peer = Peer.start(config())
    open_transaction(peer)
    return peer


def test_data_content_is_owed_from_354_to_the_final_dot() -> None:
    peer = _in_transaction()
    assert not peer.session.receiving_content
    assert peer.send("DATA\r\n").startswith("354")
    assert peer.session.receiving_content
    peer.send("X-Slow: 1\r\n")
    assert peer.session.receiving_content
    peer.send("\r\nbody\r\n.\r\n")
    assert not peer.session.receiving_content


def test_a_bdat_sequence_is_owed_from_the_first_chunk_to_the_end_of_the_last() -> None:
    """Between chunks too: a trickle of one-byte chunks is one slow message, not progress."""
    peer = _in_transaction()
    peer.send("BDAT 10\r\nhello")
    assert peer.session.receiving_content
    peer.send("world")
    assert peer.session.receiving_content  # chunk done, 250 sent, the next BDAT still owed
    peer.send("BDAT 1\r\nx")
    assert peer.session.receiving_content
    peer.send("BDAT 2 LAST\r\n\r\n")
    assert not peer.session.receiving_content


def test_a_refused_bdat_chunk_is_still_owed_while_it_is_discarded() -> None:
    peer = Peer.start(config())
    peer.send("EHLO client.test\r\n")
    assert peer.send("BDAT 100 LAST\r\n").startswith("503")
    assert peer.session.receiving_content
    peer.send("x" * 100)
    assert not peer.session.receiving_content


def test_rset_between_chunks_ends_the_content() -> None:
    peer = _in_transaction()
    peer.send("BDAT 3\r\nabc")
    peer.send("RSET\r\n")
    assert not peer.session.receiving_content


def test_every_command_line_is_counted_answered_or_not_and_content_is_not() -> None:
    peer = Peer.start(config())
    peer.send("EHLO client.test\r\nNOOP\r\nBOGUS\r\n")
    assert peer.session.commands == 3
    peer.send("NO")
    assert peer.session.commands == 3  # half a line is not a command yet
    peer.send("OP\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n")
    assert peer.session.commands == 7
    peer.send("Subject: hi\r\n\r\nline\r\n.\r\n")
    assert peer.session.commands == 7
