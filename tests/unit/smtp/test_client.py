"""The sans-IO client against the sans-IO server, back to back: no sockets, every byte visible.

`Pair` wires a `Transaction` to a real `ServerSession`. Each client write goes to the
server in one `receive_data()`; the server's decisions are answered as a test asks (accept
by default, "queued as" at the end of a message); whatever the server writes goes through a
`ReplyReader` and back to the transaction, until the transaction is done. The tests then
look at what a user would see: the client's writes, the server's replies and events, the
content the server stored, and the per-recipient result.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.smtp import replies
from pigeon.smtp.client import (
    Capabilities,
    ClientProtocolError,
    Envelope,
    Recipient,
    ReplyReader,
    Result,
    Transaction,
    refusal_before_sending,
    smtputf8_refused_apart,
)
from pigeon.smtp.events import (
    BodyType,
    Closing,
    Data,
    DataChunk,
    Decision,
    Event,
    MailFrom,
    MessageEnd,
    Notify,
    RcptTo,
    Rejected,
    Ret,
    _NeedData,
)
from pigeon.smtp.replies import Reply
from pigeon.smtp.server import ServerConfig, ServerSession

E = TypeVar("E")
HOSTNAME = "mx.test"
SENDER = "sender@example.org"
BODY = b"Subject: hi\r\n\r\nhello\r\n"

USER_UNKNOWN = Reply(550, "5.1.1", ("User unknown",))
SENDER_BLOCKED = Reply(550, "5.7.1", ("Sender blocked",))
TRY_LATER = Reply(451, "4.3.0", ("Local error, try again later",))

# How a transaction may run: the keyword arguments of `Transaction` for each way.
MODES = {
    "pipelining+chunking": {},
    "pipelining+data": {"chunking": False},
    "lockstep+chunking": {"pipelining": False},
    "lockstep+data": {"pipelining": False, "chunking": False},
}
DATA_MODES = ["pipelining+data", "lockstep+data"]
BDAT_MODES = ["pipelining+chunking", "lockstep+chunking"]
PIPELINED_MODES = ["pipelining+chunking", "pipelining+data"]


def queued(n: int) -> Reply:
    """The reply `Pair` gives to the n-th accepted message (1-based)."""
    return replies.queued([f"{n:016x}"])


def envelope(*recipients: str | Recipient, body: bytes = BODY, **fields: object) -> Envelope:
    rcpts = [r if isinstance(r, Recipient) else Recipient(r) for r in recipients]
    return Envelope(SENDER, rcpts, body, **fields)  # type: ignore[arg-type]


@dataclass
class Exchange:
    """One transaction as it went over the wire."""

    writes: list[bytes]  # each client write, in order
    server_writes: list[bytes]  # each server write, in order
    result: Result


@dataclass
class Pair:
    """A ServerSession after EHLO, and the client's view of it."""

    server: ServerSession
    capabilities: Capabilities
    reader: ReplyReader = field(default_factory=ReplyReader)
    refuse_mail: deque[Reply] = field(default_factory=deque)  # answers to the next MAILs
    refuse_rcpt: dict[str, Reply] = field(default_factory=dict)  # recipient -> refusal
    refuse_data: deque[Reply] = field(default_factory=deque)  # answers to the next DATA commands
    end_replies: deque[Reply] = field(default_factory=deque)  # answers to the next ends of message
    events: list[Event] = field(default_factory=list)
    messages: list[bytes] = field(default_factory=list)  # content of every accepted message
    _chunks: list[bytes] = field(default_factory=list)

    @classmethod
    def connect(cls, config: ServerConfig | None = None) -> Pair:
        server = ServerSession(config or ServerConfig(hostname=HOSTNAME))
        server.greet()
        reader = ReplyReader()
        (banner,) = reader.feed(server.data_to_send())
        assert banner.code == 220
        pair = cls(server, Capabilities(), reader)
        (ehlo,) = reader.feed(pair.to_server(b"EHLO client.test\r\n"))
        assert ehlo.code == 250
        pair.capabilities = Capabilities.from_ehlo(ehlo)
        return pair

    def to_server(self, data: bytes) -> bytes:
        """Feed one client write to the server, answer its decisions, return what it wrote."""
        self.server.receive_data(data)
        while True:
            event = self.server.next_event()
            if isinstance(event, _NeedData):
                break
            self.events.append(event)
            if isinstance(event, Closing):
                break
            if isinstance(event, DataChunk):
                self._chunks.append(event.data)
            elif isinstance(event, MailFrom) and self.refuse_mail:
                self.server.respond(self.refuse_mail.popleft())
            elif isinstance(event, RcptTo) and event.recipient in self.refuse_rcpt:
                self.server.respond(self.refuse_rcpt[event.recipient])
            elif isinstance(event, MessageEnd):
                reply = self.end_replies.popleft() if self.end_replies else queued(len(self.messages) + 1)
                if reply.is_positive:
                    self.messages.append(b"".join(self._chunks))
                self._chunks.clear()
                self.server.respond(reply)
            elif isinstance(event, Data) and self.refuse_data:
                self.server.respond(self.refuse_data.popleft())
            elif isinstance(event, Decision):
                self.server.accept()
        return self.server.data_to_send()

    def run(self, env: Envelope, **options: bool) -> Exchange:
        """Run one transaction to its end; fail if client and server fall out of step."""
        transaction = Transaction(env, self.capabilities, **options)
        first = transaction.start()
        writes, server_writes = [first], []
        outgoing = [first]
        while not transaction.done:
            answer = b"".join(self.to_server(data) for data in outgoing)
            assert answer, "the client waits for a reply the server will never send"
            server_writes.append(answer)
            outgoing = []
            for reply in self.reader.feed(answer):
                out = transaction.on_reply(reply)  # raises ClientProtocolError on a reply too many
                if out:
                    outgoing.append(out)
            writes += outgoing
        assert outgoing == [], "the client wrote after its last reply"
        assert self.server.buffered == 0, "the server holds bytes it has not answered"
        return Exchange(writes, server_writes, transaction.result())

    def of_type(self, kind: type[E]) -> list[E]:
        return [event for event in self.events if isinstance(event, kind)]


# --- the shape of a transaction on the wire -------------------------------------------------
def test_pipelining_with_chunking_sends_envelope_and_content_in_one_write() -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", "c@example.net"))
    assert exchange.writes == [
        b"MAIL FROM:<sender@example.org> SIZE=22\r\n"
        b"RCPT TO:<b@example.net>\r\n"
        b"RCPT TO:<c@example.net>\r\n"
        b"BDAT 22 LAST\r\n" + BODY
    ]
    assert exchange.server_writes == [
        b"250 2.1.0 Sender ok\r\n"
        b"250 2.1.5 Recipient ok\r\n"
        b"250 2.1.5 Recipient ok\r\n"
        b"250 2.0.0 Ok: queued as 0000000000000001\r\n"
    ]
    assert exchange.result.replies == [queued(1), queued(1)]
    assert pair.messages == [BODY]
    assert pair.of_type(MessageEnd) == [MessageEnd(22, chunked=True)]


def test_pipelining_without_chunking_sends_envelope_and_data_then_content_after_354() -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", "c@example.net"), chunking=False)
    assert exchange.writes == [
        b"MAIL FROM:<sender@example.org> SIZE=22\r\nRCPT TO:<b@example.net>\r\nRCPT TO:<c@example.net>\r\nDATA\r\n",
        BODY + b".\r\n",
    ]
    assert exchange.server_writes == [
        b"250 2.1.0 Sender ok\r\n250 2.1.5 Recipient ok\r\n250 2.1.5 Recipient ok\r\n"
        b"354 End data with <CR><LF>.<CR><LF>\r\n",
        b"250 2.0.0 Ok: queued as 0000000000000001\r\n",
    ]
    assert exchange.result.replies == [queued(1), queued(1)]
    assert pair.messages == [BODY]
    assert pair.of_type(MessageEnd) == [MessageEnd(22, chunked=False)]


def test_without_pipelining_each_command_waits_for_its_reply() -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", "c@example.net"), pipelining=False, chunking=False)
    assert exchange.writes == [
        b"MAIL FROM:<sender@example.org> SIZE=22\r\n",
        b"RCPT TO:<b@example.net>\r\n",
        b"RCPT TO:<c@example.net>\r\n",
        b"DATA\r\n",
        BODY + b".\r\n",
    ]
    assert len(exchange.server_writes) == 5
    assert exchange.result.replies == [queued(1), queued(1)]
    assert pair.messages == [BODY]


def test_without_pipelining_bdat_carries_the_content_after_the_last_rcpt_reply() -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net"), pipelining=False)
    assert exchange.writes == [
        b"MAIL FROM:<sender@example.org> SIZE=22\r\n",
        b"RCPT TO:<b@example.net>\r\n",
        b"BDAT 22 LAST\r\n" + BODY,
    ]
    assert exchange.result.replies == [queued(1)]
    assert pair.messages == [BODY]


def test_server_without_pipelining_or_chunking_gets_lockstep_data() -> None:
    pair = Pair.connect(ServerConfig(hostname=HOSTNAME, pipelining=False, chunking=False))
    assert "PIPELINING" not in pair.capabilities
    assert "CHUNKING" not in pair.capabilities
    exchange = pair.run(envelope("b@example.net", "c@example.net"))  # asks for both: gets neither
    assert exchange.writes == [
        b"MAIL FROM:<sender@example.org> SIZE=22\r\n",
        b"RCPT TO:<b@example.net>\r\n",
        b"RCPT TO:<c@example.net>\r\n",
        b"DATA\r\n",
        BODY + b".\r\n",
    ]
    assert exchange.result.replies == [queued(1), queued(1)]
    assert pair.messages == [BODY]
    assert pair.of_type(Rejected) == []


def test_server_with_pipelining_but_without_chunking_gets_one_write_then_data() -> None:
    pair = Pair.connect(ServerConfig(hostname=HOSTNAME, chunking=False))
    exchange = pair.run(envelope("b@example.net"))
    assert exchange.writes == [
        b"MAIL FROM:<sender@example.org> SIZE=22\r\nRCPT TO:<b@example.net>\r\nDATA\r\n",
        BODY + b".\r\n",
    ]
    assert pair.messages == [BODY]


# --- per-recipient outcomes ---------------------------------------------------------------
@pytest.mark.parametrize("mode", list(MODES))
def test_refused_recipients_keep_their_refusal_and_the_others_get_the_end_of_data_reply(mode: str) -> None:
    pair = Pair.connect()
    pair.refuse_rcpt["c@example.net"] = USER_UNKNOWN
    exchange = pair.run(envelope("b@example.net", "c@example.net", "d@example.net"), **MODES[mode])
    assert exchange.result.replies == [queued(1), USER_UNKNOWN, queued(1)]
    assert exchange.result.data_reply == queued(1)
    assert not exchange.result.needs_reset
    assert pair.messages == [BODY]
    assert [event.recipient for event in pair.of_type(RcptTo)] == ["b@example.net", "c@example.net", "d@example.net"]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(
    ("refusal", "read_as"),
    [
        (Reply(552, "5.5.3", ("Too many recipients",)), (452, "4.5.3")),
        (Reply(552, None, ("too many recipients",)), (452, None)),
        (Reply(552, "5.2.2", ("Mailbox full",)), (452, "4.2.2")),
    ],
)
def test_a_552_to_rcpt_is_read_as_452_so_the_recipient_is_deferred_not_bounced(
    mode: str, refusal: Reply, read_as: tuple[int, str | None]
) -> None:
    # RFC 5321 4.5.3.1.10: RFC 821 wrongly gave 552 for too many recipients.
    pair = Pair.connect()
    pair.refuse_rcpt["c@example.net"] = refusal
    exchange = pair.run(envelope("b@example.net", "c@example.net"), **MODES[mode])
    first, second = exchange.result.replies
    assert first == queued(1)
    assert (second.code, second.enhanced) == read_as
    assert refusal.lines[0] in second.text and "552" in second.text  # the log still shows what was said


@pytest.mark.parametrize("mode", list(MODES))
def test_refused_mail_is_every_recipients_reply_and_the_session_stays_in_step(mode: str) -> None:
    pair = Pair.connect()
    pair.refuse_mail.append(SENDER_BLOCKED)
    exchange = pair.run(envelope("b@example.net", "c@example.net"), **MODES[mode])
    assert exchange.result.replies == [SENDER_BLOCKED, SENDER_BLOCKED]
    assert exchange.result.mail_reply == SENDER_BLOCKED
    assert exchange.result.data_reply is None
    assert not exchange.result.needs_reset  # the server opened no transaction
    assert pair.messages == []
    if mode in PIPELINED_MODES:
        # The whole group went; the server refused the rest of it, and the client awaited those replies.
        assert len(exchange.writes) == 1
        assert [reply.code for reply in ReplyReader().feed(b"".join(exchange.server_writes))] == [550, 503, 503, 503]
    else:
        assert exchange.writes == [b"MAIL FROM:<sender@example.org> SIZE=22\r\n"]

    # The same connection carries the next message: no reply was left over or missing.
    again = pair.run(envelope("b@example.net"), **MODES[mode])
    assert again.result.replies == [queued(1)]
    assert pair.messages == [BODY]


@pytest.mark.parametrize("mode", list(MODES))
def test_every_recipient_refused_sends_no_message_and_asks_for_a_reset(mode: str) -> None:
    pair = Pair.connect()
    pair.refuse_rcpt["b@example.net"] = USER_UNKNOWN
    pair.refuse_rcpt["c@example.net"] = Reply(450, "4.2.1", ("Mailbox busy",))
    exchange = pair.run(envelope("b@example.net", "c@example.net"), **MODES[mode])
    assert exchange.result.replies == [USER_UNKNOWN, Reply(450, "4.2.1", ("Mailbox busy",))]
    assert exchange.result.needs_reset  # MAIL was accepted: the server still holds the transaction
    assert pair.messages == []
    assert pair.of_type(MessageEnd) == []
    assert pair.of_type(DataChunk) == []
    if mode in DATA_MODES:
        assert not any(BODY in write for write in exchange.writes)  # the content never left

    pair.refuse_rcpt.clear()
    again = pair.run(envelope("b@example.net"), reset_first=True, **MODES[mode])
    assert again.writes[0].startswith(b"RSET\r\n")
    assert again.result.replies == [queued(1)]
    assert pair.messages == [BODY]


def test_without_a_reset_the_next_mail_after_an_unfinished_transaction_is_refused() -> None:
    """Why `needs_reset` matters: the server still has the first transaction open."""
    pair = Pair.connect()
    pair.refuse_rcpt["b@example.net"] = USER_UNKNOWN
    assert pair.run(envelope("b@example.net"), chunking=False).result.needs_reset
    again = pair.run(envelope("c@example.net"), chunking=False)
    assert again.result.mail_reply == replies.NESTED_MAIL
    assert again.result.replies == [replies.NESTED_MAIL]


def test_without_pipelining_rset_waits_for_its_reply_before_mail() -> None:
    pair = Pair.connect(ServerConfig(hostname=HOSTNAME, pipelining=False, chunking=False))
    pair.refuse_rcpt["b@example.net"] = USER_UNKNOWN
    assert pair.run(envelope("b@example.net")).result.needs_reset
    pair.refuse_rcpt.clear()
    exchange = pair.run(envelope("b@example.net"), reset_first=True)
    assert exchange.result.replies == [queued(1)]
    assert exchange.writes[:2] == [b"RSET\r\n", b"MAIL FROM:<sender@example.org> SIZE=22\r\n"]


@pytest.mark.parametrize("mode", list(MODES))
def test_a_transient_reply_at_end_of_data_goes_to_the_accepted_recipients(mode: str) -> None:
    pair = Pair.connect()
    pair.refuse_rcpt["c@example.net"] = USER_UNKNOWN
    pair.end_replies.append(TRY_LATER)
    exchange = pair.run(envelope("b@example.net", "c@example.net", "d@example.net"), **MODES[mode])
    assert exchange.result.replies == [TRY_LATER, USER_UNKNOWN, TRY_LATER]
    assert exchange.result.data_reply == TRY_LATER
    assert pair.messages == []

    again = pair.run(envelope("b@example.net"), reset_first=exchange.result.needs_reset, **MODES[mode])
    assert again.result.replies == [queued(1)]
    assert pair.messages == [BODY]


@pytest.mark.parametrize("mode", list(MODES))
def test_a_refused_end_of_data_needs_a_reset_only_after_bdat(mode: str) -> None:
    """RFC 5321 4.1.1.4: the reply to the end of DATA ends the transaction, whatever it says.
    RFC 3030 promises no such thing of a refused BDAT, so the client resets after one."""
    pair = Pair.connect()
    pair.end_replies.append(Reply(554, "5.7.1", ("Spam",)))
    exchange = pair.run(envelope("b@example.net"), **MODES[mode])
    assert exchange.result.replies == [Reply(554, "5.7.1", ("Spam",))]
    assert exchange.result.needs_reset == (mode in BDAT_MODES)

    again = pair.run(envelope("b@example.net"), reset_first=exchange.result.needs_reset, **MODES[mode])
    assert again.result.replies == [queued(1)]
    assert pair.of_type(Rejected) == []  # without RSET after DATA, the server was ready all the same


@pytest.mark.parametrize("mode", DATA_MODES)
def test_a_refused_data_command_is_the_reply_of_the_accepted_recipients_and_no_content_is_sent(mode: str) -> None:
    refusal = Reply(554, "5.7.0", ("No data today",))
    pair = Pair.connect()
    pair.refuse_data.append(refusal)
    exchange = pair.run(envelope("b@example.net", "c@example.net"), **MODES[mode])
    assert exchange.result.replies == [refusal, refusal]
    assert exchange.result.needs_reset
    assert not any(BODY in write for write in exchange.writes)

    again = pair.run(envelope("b@example.net"), reset_first=True, **MODES[mode])
    assert again.result.replies == [queued(1)]


def test_a_reply_after_the_transaction_is_done_is_a_protocol_error() -> None:
    transaction = Transaction(envelope("b@example.net"), Capabilities(frozenset({"PIPELINING", "CHUNKING"})))
    transaction.start()
    for reply in (replies.SENDER_OK, replies.RECIPIENT_OK, queued(1)):
        assert not transaction.done
        assert transaction.on_reply(reply) == b""
    assert transaction.done
    with pytest.raises(ClientProtocolError):
        transaction.on_reply(replies.OK)


def test_a_354_with_no_accepted_recipient_is_answered_with_an_empty_end_of_data() -> None:
    """A server that says 354 although it refused every RCPT: end the data at once, deliver nothing."""
    transaction = Transaction(envelope("b@example.net"), Capabilities(frozenset({"PIPELINING"})))
    assert transaction.start().endswith(b"DATA\r\n")
    assert transaction.on_reply(replies.SENDER_OK) == b""
    assert transaction.on_reply(USER_UNKNOWN) == b""
    assert transaction.on_reply(replies.START_DATA) == b".\r\n"
    assert transaction.on_reply(replies.NO_VALID_RECIPIENTS) == b""
    assert transaction.done
    result = transaction.result()
    assert result.replies == [USER_UNKNOWN]
    assert result.data_reply is None
    assert result.needs_reset


def test_recipients_without_a_final_reply_when_the_connection_ends_get_a_transient_reply() -> None:
    transaction = Transaction(envelope("b@example.net", "c@example.net"), Capabilities(frozenset({"PIPELINING"})))
    transaction.start()
    transaction.on_reply(replies.SENDER_OK)
    transaction.on_reply(replies.RECIPIENT_OK)
    assert not transaction.done
    first, second = transaction.result().replies  # the connection broke here
    assert (first.code, first.enhanced) == (451, "4.4.0")
    assert "end of data" in first.text
    assert (second.code, second.enhanced) == (451, "4.4.0")
    assert "RCPT" in second.text


def test_the_null_sender_goes_as_an_empty_reverse_path() -> None:
    pair = Pair.connect()
    exchange = pair.run(Envelope("", [Recipient("b@example.net")], BODY))
    assert exchange.writes[0].startswith(b"MAIL FROM:<> SIZE=22\r\n")
    assert [mail.sender for mail in pair.of_type(MailFrom)] == [""]
    assert exchange.result.replies == [queued(1)]


# --- ESMTP parameters -----------------------------------------------------------------------
def test_dsn_parameters_arrive_on_the_servers_events() -> None:
    pair = Pair.connect()
    env = envelope(
        Recipient("b@example.net", notify=("SUCCESS", "FAILURE"), orcpt="rfc822;b+tag=x@example.net"),
        Recipient("c@example.net", notify=("NEVER",)),
        Recipient("d@example.net", orcpt="utf-8;rené@example.net"),
        ret="FULL",
        envid="batch 7+x=y",
    )
    exchange = pair.run(env)
    assert exchange.writes[0].split(b"\r\n")[:4] == [
        b"MAIL FROM:<sender@example.org> SIZE=22 RET=FULL ENVID=batch+207+2Bx+3Dy",
        b"RCPT TO:<b@example.net> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;b+2Btag+3Dx@example.net",
        b"RCPT TO:<c@example.net> NOTIFY=NEVER",
        b"RCPT TO:<d@example.net> ORCPT=utf-8;ren\\x{E9}@example.net",  # no SMTPUTF8 here: ASCII only
    ]
    (mail,) = pair.of_type(MailFrom)
    assert (mail.ret, mail.envid) == (Ret.FULL, "batch 7+x=y")
    assert [(r.recipient, r.notify, r.orcpt) for r in pair.of_type(RcptTo)] == [
        ("b@example.net", frozenset({Notify.SUCCESS, Notify.FAILURE}), "rfc822;b+tag=x@example.net"),
        ("c@example.net", frozenset({Notify.NEVER}), None),
        ("d@example.net", None, "utf-8;ren\\x{E9}@example.net"),
    ]
    assert exchange.result.replies == [queued(1)] * 3


def test_a_utf8_original_recipient_leaves_in_ascii_escapes_even_for_a_utf8_message() -> None:
    """The \\x{HEX} form is valid in and out of SMTPUTF8 (RFC 6533 3.3): astral characters too."""
    pair = Pair.connect(ServerConfig(hostname=HOSTNAME, smtputf8=True))
    env = envelope(Recipient("d@example.net", orcpt="utf-8;jörg😀@bücher.example"), smtputf8=True)
    exchange = pair.run(env)
    assert b"RCPT TO:<d@example.net> ORCPT=utf-8;j\\x{F6}rg\\x{1F600}@b\\x{FC}cher.example" in exchange.writes[0]
    assert exchange.result.replies == [queued(1)]


def test_dsn_parameters_are_not_sent_to_a_server_without_dsn() -> None:
    pair = Pair.connect(ServerConfig(hostname=HOSTNAME, dsn=False))
    assert "DSN" not in pair.capabilities
    env = envelope(
        Recipient("b@example.net", notify=("SUCCESS",), orcpt="rfc822;b@example.net"), ret="HDRS", envid="e1"
    )
    exchange = pair.run(env)
    assert exchange.writes[0].split(b"\r\n")[:2] == [
        b"MAIL FROM:<sender@example.org> SIZE=22",
        b"RCPT TO:<b@example.net>",
    ]
    (mail,) = pair.of_type(MailFrom)
    assert (mail.ret, mail.envid) == (None, None)
    assert exchange.result.replies == [queued(1)]
    assert pair.of_type(Rejected) == []


def test_an_envid_the_server_decoded_survives_being_relayed() -> None:
    # "+HH" are octets: "ENVID=a+2Bb+3Dc+20d" arrives as "a+b=c d"; relaying must not change it.
    # (One that is not printable ASCII once decoded is refused at MAIL: RFC 3461 4.4.)
    inbound = Pair.connect()
    inbound.to_server(b"MAIL FROM:<a@example.org> ENVID=a+2Bb+3Dc+20d\r\n")
    (received,) = inbound.of_type(MailFrom)
    assert received.envid == "a+b=c d"

    outbound = Pair.connect()
    outbound.run(envelope("b@example.net", envid=received.envid))
    (relayed,) = outbound.of_type(MailFrom)
    assert relayed.envid == received.envid


def test_size_8bitmime_and_smtputf8_parameters_are_sent_and_understood() -> None:
    body = "Subject: café\r\n\r\nnaïve résumé\r\n".encode()
    pair = Pair.connect()
    env = Envelope("josé@exämple.org", [Recipient("renée@example.net")], body, eight_bit=True, smtputf8=True)
    assert refusal_before_sending(env, pair.capabilities) is None
    exchange = pair.run(env)
    assert exchange.writes[0].startswith(
        f"MAIL FROM:<josé@exämple.org> SIZE={len(body)} BODY=8BITMIME SMTPUTF8\r\n".encode()
    )
    (mail,) = pair.of_type(MailFrom)
    assert (mail.sender, mail.size, mail.body, mail.smtputf8) == (
        "josé@exämple.org",
        len(body),
        BodyType.EIGHT_BIT_MIME,
        True,
    )
    assert [r.recipient for r in pair.of_type(RcptTo)] == ["renée@example.net"]
    assert exchange.result.replies == [queued(1)]
    assert pair.messages == [body]


def test_a_7bit_ascii_message_sends_neither_body_nor_smtputf8() -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net"))
    assert exchange.writes[0].startswith(b"MAIL FROM:<sender@example.org> SIZE=22\r\n")
    (mail,) = pair.of_type(MailFrom)
    assert (mail.body, mail.smtputf8) == (None, False)


def test_size_is_not_sent_to_a_server_that_does_not_announce_it() -> None:
    peer = Capabilities(frozenset({"PIPELINING", "8BITMIME"}), size=None)
    transaction = Transaction(envelope("b@example.net", eight_bit=True), peer)
    assert transaction.start().startswith(b"MAIL FROM:<sender@example.org> BODY=8BITMIME\r\n")


def test_size_is_sent_to_a_server_that_announces_it_without_a_limit() -> None:
    peer = Capabilities(frozenset({"SIZE"}), size=0)
    transaction = Transaction(envelope("b@example.net"), peer)
    assert transaction.start() == b"MAIL FROM:<sender@example.org> SIZE=22\r\n"


# --- content round trip ---------------------------------------------------------------------
ROUND_TRIP_BODIES = {
    "plain": BODY,
    "dot lines": b"Subject: dots\r\n\r\n.\r\n..\r\n.hidden\r\nend.\r\n. \r\n",
    "starts with a dot": b".Subject: odd\r\n\r\nx\r\n",
    "dot then end": b"Subject: x\r\n\r\nlast line\r\n.\r\n",
    "crlf dot inside a line": b"Subject: x\r\n\r\na.\r\nb\r\n.\r\n.\r\n",
    "8-bit": "Subject: ü\r\n\r\n.ñ\r\n".encode(),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(ROUND_TRIP_BODIES))
def test_delivered_content_equals_the_original_body(mode: str, name: str) -> None:
    body = ROUND_TRIP_BODIES[name]
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", body=body), **MODES[mode])
    assert exchange.result.replies == [queued(1)]
    assert pair.messages == [body]


def test_data_content_is_dot_stuffed_on_the_wire() -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", body=b".a\r\nb\r\n.\r\n..c\r\n"), chunking=False)
    assert exchange.writes[-1] == b"..a\r\nb\r\n..\r\n...c\r\n.\r\n"


@pytest.mark.parametrize("mode", list(MODES))
def test_bare_line_endings_from_the_spool_leave_as_crlf_and_end_nothing(mode: str) -> None:
    body = b"Subject: x\r\n\nfirst\n.\nMAIL FROM:<evil@attacker.test>\r\nbare\r.\rend\r"
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", body=body), **MODES[mode])
    assert exchange.result.replies == [queued(1)]
    wire = b"".join(exchange.writes)
    assert wire.count(b"\n") == wire.count(b"\r\n") == wire.count(b"\r")
    assert wire.count(b"MAIL FROM:") == 2  # ours, and the line of content
    # The server, strict about bare endings, takes every line as it was meant.
    assert pair.messages == [b"Subject: x\r\n\r\nfirst\r\n.\r\nMAIL FROM:<evil@attacker.test>\r\nbare\r\n.\r\nend\r\n"]


def test_bdat_content_is_sent_as_is() -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", body=b".a\r\n.\r\n"))
    assert exchange.writes[-1].endswith(b"BDAT 7 LAST\r\n.a\r\n.\r\n")


@pytest.mark.parametrize("mode", DATA_MODES)
def test_data_ends_a_body_without_a_final_crlf_with_one(mode: str) -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", body=b"Subject: x\r\n\r\nno newline"), **MODES[mode])
    assert exchange.writes[-1] == b"Subject: x\r\n\r\nno newline\r\n.\r\n"
    assert pair.messages == [b"Subject: x\r\n\r\nno newline\r\n"]


@pytest.mark.parametrize("mode", BDAT_MODES)
def test_bdat_ends_a_body_without_a_final_crlf_with_one_as_data_does(mode: str) -> None:
    # The same bytes arrive whichever way they go, so a DKIM signature holds either way.
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", body=b"Subject: x\r\n\r\nno newline"), **MODES[mode])
    assert exchange.writes[-1].endswith(b"BDAT 26 LAST\r\nSubject: x\r\n\r\nno newline\r\n")
    assert pair.messages == [b"Subject: x\r\n\r\nno newline\r\n"]


@pytest.mark.parametrize("mode", BDAT_MODES)
def test_bdat_delivers_an_empty_body_as_empty(mode: str) -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", body=b""), **MODES[mode])
    assert exchange.writes[-1].endswith(b"BDAT 0 LAST\r\n")
    assert exchange.result.replies == [queued(1)]
    assert pair.messages == [b""]


@pytest.mark.parametrize("mode", DATA_MODES)
def test_data_delivers_an_empty_body_as_empty(mode: str) -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", body=b""), **MODES[mode])
    assert exchange.result.replies == [queued(1)]
    assert pair.messages == [b""]


_LINE_PIECES = st.sampled_from([b".", b"..", b"a", b"Z", b" ", b"\t", b":", b"\xc3\xa9", b"x.y", b"-"])
_LINES = st.lists(st.lists(_LINE_PIECES, max_size=12).map(b"".join), min_size=1, max_size=12)
CRLF_BODIES = _LINES.map(lambda lines: b"".join(line + b"\r\n" for line in lines))


@settings(max_examples=150, deadline=None)
@given(body=CRLF_BODIES, mode=st.sampled_from(DATA_MODES))
def test_any_crlf_body_survives_data_unchanged(body: bytes, mode: str) -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", body=body), **MODES[mode])
    assert exchange.result.replies == [queued(1)]
    assert pair.messages == [body]


@settings(max_examples=150, deadline=None)
@given(body=CRLF_BODIES, mode=st.sampled_from(BDAT_MODES))
def test_any_crlf_body_survives_bdat_unchanged(body: bytes, mode: str) -> None:
    pair = Pair.connect()
    exchange = pair.run(envelope("b@example.net", body=body), **MODES[mode])
    assert exchange.result.replies == [queued(1)]
    assert pair.messages == [body]


# --- refusal before sending -------------------------------------------------------------------
FULL_PEER = Capabilities(frozenset({"SMTPUTF8", "8BITMIME", "SIZE"}), size=100)


def test_a_message_needing_smtputf8_cannot_go_to_a_server_without_it() -> None:
    peer = Capabilities(frozenset({"8BITMIME", "SIZE"}), size=100)
    refusal = refusal_before_sending(envelope("renée@example.net", smtputf8=True), peer)
    assert refusal is not None
    assert (refusal.code, refusal.enhanced) == (554, "5.6.7")
    assert refusal.text == "Message needs SMTPUTF8 (internationalised addresses); the receiving server lacks it"


@pytest.mark.parametrize("asked", [True, False], ids=["smtputf8-asked", "not-asked"])
def test_utf8_only_in_a_header_field_goes_with_8bitmime_to_a_server_without_smtputf8_asked_or_not(
    asked: bool,
) -> None:
    # One rule at every door: the SMTP door (asked or not), HTTP and `pigeon inject` gave the
    # same message different fates (delivered; bounced 5.6.7). Only an address needs SMTPUTF8.
    env = envelope("b@example.net", body="Subject: Grüße\r\n\r\nhello\r\n".encode(), eight_bit=True, smtputf8=asked)
    assert not env.needs_smtputf8
    assert refusal_before_sending(env, NO_UTF8_PEER) is None
    mail = Transaction(env, NO_UTF8_PEER).start()
    assert b"BODY=8BITMIME" in mail
    assert b"SMTPUTF8" not in mail


@pytest.mark.parametrize("asked", [True, False], ids=["smtputf8-asked", "not-asked"])
def test_utf8_in_a_header_field_asks_for_smtputf8_where_it_is_offered_asked_or_not(asked: bool) -> None:
    env = envelope("b@example.net", body="Subject: Grüße\r\n\r\nhello\r\n".encode(), eight_bit=True, smtputf8=asked)
    mail = Transaction(env, FULL_PEER).start()
    assert b" SMTPUTF8" in mail and b"BODY=8BITMIME" in mail


@pytest.mark.parametrize("asked", [True, False], ids=["smtputf8-asked", "not-asked"])
def test_utf8_in_a_header_field_to_a_server_with_neither_extension_is_refused_for_want_of_8bitmime(
    asked: bool,
) -> None:
    env = envelope("b@example.net", body="Subject: Grüße\r\n\r\nhello\r\n".encode(), eight_bit=True, smtputf8=asked)
    refusal = refusal_before_sending(env, Capabilities(frozenset({"SIZE"}), size=1000))
    assert refusal is not None
    assert (refusal.code, refusal.enhanced) == (554, "5.6.3")


NO_UTF8_PEER = Capabilities(frozenset({"8BITMIME", "SIZE"}), size=1000)


@pytest.mark.parametrize(
    "body",
    [
        BODY,  # ASCII through and through
        "Subject: hi\r\n\r\nGrüße, naïve body\r\n".encode(),  # UTF-8 in the body only: 8BITMIME's
        "\r\nno header section; Grüße\r\n\r\nSubject: ü\r\n".encode(),
    ],
)
def test_smtputf8_asked_for_with_ascii_addresses_and_header_goes_to_a_server_without_it(body: bytes) -> None:
    env = envelope("b@example.net", body=body, eight_bit=not body.isascii(), smtputf8=True)
    assert not env.needs_smtputf8
    assert refusal_before_sending(env, NO_UTF8_PEER) is None
    mail = Transaction(env, NO_UTF8_PEER).start()
    assert b"SMTPUTF8" not in mail
    assert (b"BODY=8BITMIME" in mail) == (not body.isascii())


@pytest.mark.parametrize(
    "env",
    [
        Envelope("josé@example.org", [Recipient("b@example.net")], BODY, smtputf8=True),
        envelope("renée@example.net", smtputf8=True),
        # A non-ASCII address cannot go without SMTPUTF8 even where nobody asked for it.
        Envelope("josé@example.org", [Recipient("b@example.net")], BODY),
    ],
)
def test_a_non_ascii_address_needs_smtputf8(env: Envelope) -> None:
    assert env.needs_smtputf8
    refusal = refusal_before_sending(env, NO_UTF8_PEER)
    assert refusal is not None and refusal.enhanced == "5.6.7"
    assert b" SMTPUTF8" in Transaction(env, FULL_PEER).start()


def test_at_a_server_without_smtputf8_only_the_recipients_whose_address_needs_it_are_refused() -> None:
    # RCPT is per recipient: josé and renée have no form without SMTPUTF8; bob, and carol of
    # an IDN domain (its A-label), do, and go in a transaction without it.
    pair = Pair.connect(ServerConfig(hostname=HOSTNAME, smtputf8=False))
    env = envelope("bob@example.net", "josé@example.net", "carol@bücher.example", "renée@example.net", smtputf8=True)
    assert smtputf8_refused_apart(env, pair.capabilities) == [1, 3]
    rest = env.only([0, 2])
    assert refusal_before_sending(rest, pair.capabilities) is None
    exchange = pair.run(rest)
    assert exchange.result.replies == [queued(1)] * 2
    (mail,) = pair.of_type(MailFrom)
    assert (mail.sender, mail.smtputf8) == (SENDER, False)
    assert [rcpt.recipient for rcpt in pair.of_type(RcptTo)] == ["bob@example.net", "carol@xn--bcher-kva.example"]
    assert pair.messages == [BODY]


@pytest.mark.parametrize(
    "env",
    [
        envelope("bob@example.net", "carol@bücher.example", smtputf8=True),  # no address needs it
        Envelope("josé@example.org", [Recipient("b@example.net"), Recipient("renée@example.net")], BODY),
        envelope("josé@example.net", "renée@example.net"),  # every recipient needs it
    ],
    ids=["none-needs-it", "the-sender-needs-it", "every-recipient-needs-it"],
)
def test_no_recipient_is_refused_apart_when_the_whole_message_goes_or_is_refused(env: Envelope) -> None:
    assert smtputf8_refused_apart(env, NO_UTF8_PEER) == []
    assert smtputf8_refused_apart(env, FULL_PEER) == []
    whole = refusal_before_sending(env, NO_UTF8_PEER)
    assert (whole is None) == (not env.needs_smtputf8)
    assert whole is None or (whole.code, whole.enhanced) == (554, "5.6.7")


def test_a_raw_utf8_header_sent_without_smtputf8_goes_on_as_it_came() -> None:
    # A legacy client's 8-bit Subject, without SMTPUTF8: it passed as 8BITMIME, and still does.
    env = envelope("b@example.net", body="Subject: Grüße\r\n\r\nhi\r\n".encode(), eight_bit=True)
    assert not env.needs_smtputf8
    assert refusal_before_sending(env, NO_UTF8_PEER) is None
    # A folded continuation line is header too: where offered, SMTPUTF8 says what it is.
    folded = envelope("b@example.net", body="Subject: hi\r\nX-Long: x\r\n to ü\r\n\r\nhi\r\n".encode(), eight_bit=True)
    assert b" SMTPUTF8" in Transaction(folded, FULL_PEER).start()


def test_a_raw_latin1_header_goes_with_8bitmime_and_without_smtputf8_even_where_offered() -> None:
    # Not UTF-8: SMTPUTF8 would have the next hop read caf\xe9 as UTF-8 (RFC 6532 3).
    for head in (b"Subject: caf\xe9\r\n", "Subject: café\r\n".encode() + b"X-Old: \xe9\r\n"):
        env = envelope("b@example.net", body=head + b"\r\nhi\r\n", eight_bit=True)
        mail = Transaction(env, FULL_PEER).start()
        assert b"SMTPUTF8" not in mail
        assert b"BODY=8BITMIME" in mail
    # Asked for, it still goes: the client's word is passed on.
    asked = envelope("b@example.net", body=b"Subject: caf\xe9\r\n\r\nhi\r\n", eight_bit=True, smtputf8=True)
    assert b" SMTPUTF8" in Transaction(asked, FULL_PEER).start()


def test_smtputf8_asked_for_still_goes_to_a_server_that_offers_it() -> None:
    assert b" SMTPUTF8" in Transaction(envelope("b@example.net", smtputf8=True), FULL_PEER).start()


def test_a_pigeon_server_without_smtputf8_is_seen_not_to_offer_it_and_the_message_is_refused() -> None:
    pair = Pair.connect(ServerConfig(hostname=HOSTNAME, smtputf8=False))
    assert "SMTPUTF8" not in pair.capabilities
    env = Envelope("josé@example.org", [Recipient("b@example.net")], BODY, smtputf8=True)
    refusal = refusal_before_sending(env, pair.capabilities)
    assert refusal is not None
    assert (refusal.code, refusal.enhanced) == (554, "5.6.7")


def test_a_message_over_a_pigeon_servers_size_limit_is_refused_before_sending() -> None:
    pair = Pair.connect(ServerConfig(hostname=HOSTNAME, max_message_size=21))
    refusal = refusal_before_sending(envelope("b@example.net"), pair.capabilities)
    assert refusal is not None
    assert (refusal.code, refusal.enhanced) == (552, "5.3.4")
    # Sent anyway, the server would refuse it at MAIL with the same code.
    assert pair.run(envelope("b@example.net")).result.replies[0].code == 552


def test_a_message_over_the_servers_size_cannot_go() -> None:
    peer = Capabilities(frozenset({"SMTPUTF8", "8BITMIME", "SIZE"}), size=21)
    refusal = refusal_before_sending(envelope("b@example.net"), peer)  # 22 octets
    assert refusal is not None
    assert (refusal.code, refusal.enhanced) == (552, "5.3.4")
    assert "22" in refusal.text
    assert "21" in refusal.text


def test_an_8bit_message_cannot_go_to_a_server_without_8bitmime() -> None:
    peer = Capabilities(frozenset({"SMTPUTF8", "SIZE"}), size=100)
    refusal = refusal_before_sending(envelope("b@example.net", eight_bit=True), peer)
    assert refusal is not None
    assert (refusal.code, refusal.enhanced) == (554, "5.6.3")


@pytest.mark.parametrize(
    "env",
    [
        envelope("b@example.net", eight_bit=True, smtputf8=True),
        envelope("b@example.net", body=b"x" * 98 + b"\r\n"),  # exactly the limit
    ],
)
def test_a_message_the_server_can_take_is_not_refused(env: Envelope) -> None:
    assert refusal_before_sending(env, FULL_PEER) is None


def test_any_size_goes_to_a_server_without_a_size_limit() -> None:
    for size in (None, 0):
        peer = Capabilities(frozenset({"SIZE"}), size=size)
        assert refusal_before_sending(envelope("b@example.net", body=b"x" * 5000), peer) is None


def test_a_7bit_ascii_message_goes_to_a_bare_esmtp_server() -> None:
    assert refusal_before_sending(envelope("b@example.net"), Capabilities()) is None


# --- ReplyReader -------------------------------------------------------------------------------
MULTI_LINE = b"250-2.0.0 first line\r\n250-2.0.0 second line\r\n250 2.0.0 last line\r\n"


def test_multi_line_reply_is_one_reply_with_every_line_stripped_of_the_enhanced_code() -> None:
    assert ReplyReader().feed(MULTI_LINE) == [Reply(250, "2.0.0", ("first line", "second line", "last line"))]


@pytest.mark.parametrize("cut", range(1, len(MULTI_LINE)))
def test_a_reply_split_at_any_byte_gives_the_same_reply(cut: int) -> None:
    reader = ReplyReader()
    first = reader.feed(MULTI_LINE[:cut])
    second = reader.feed(MULTI_LINE[cut:])
    assert first == []
    assert second == [Reply(250, "2.0.0", ("first line", "second line", "last line"))]


def test_a_reply_fed_one_byte_at_a_time_gives_the_same_replies() -> None:
    data = MULTI_LINE + b"354 go ahead\r\n550 5.1.1 no\r\n"
    reader = ReplyReader()
    got = [reply for i in range(len(data)) for reply in reader.feed(data[i : i + 1])]
    assert got == [
        Reply(250, "2.0.0", ("first line", "second line", "last line")),
        Reply(354, None, ("go ahead",)),
        Reply(550, "5.1.1", ("no",)),
    ]


def test_several_replies_in_one_read_come_out_in_order() -> None:
    got = ReplyReader().feed(b"250 2.1.0 ok\r\n550 5.1.1 User unknown\r\n354 End data\r\n")
    assert got == [Reply(250, "2.1.0", ("ok",)), USER_UNKNOWN, Reply(354, None, ("End data",))]


def test_a_reply_without_enhanced_codes_keeps_its_text() -> None:
    got = ReplyReader().feed(b"250-mx.test greets you\r\n250-PIPELINING\r\n250 SIZE 1000\r\n")
    assert got == [Reply(250, None, ("mx.test greets you", "PIPELINING", "SIZE 1000"))]


def test_an_enhanced_code_of_another_class_than_the_reply_is_text() -> None:
    assert ReplyReader().feed(b"250 5.1.1 odd\r\n") == [Reply(250, None, ("5.1.1 odd",))]


def test_a_reply_with_empty_text_has_one_empty_line() -> None:
    assert ReplyReader().feed(b"250 \r\n") == [Reply(250, None, ("",))]
    assert ReplyReader().feed(b"250\r\n") == [Reply(250, None, ("",))]


def test_a_bare_lf_ends_a_reply_line_too() -> None:
    assert ReplyReader().feed(b"250 ok\n") == [Reply(250, None, ("ok",))]


@pytest.mark.parametrize(
    "line", [b"199 strange\r\n", b"999 huh\r\n", b"000 x\r\n", b"600 x\r\n", b"199-a\r\n199 b\r\n"]
)
def test_a_code_outside_200_to_599_is_a_protocol_error_not_a_reply(line: bytes) -> None:
    """Found from outside: "999 huh" to RCPT was read as a 554 of Pigeon's own making, and the
    recipient bounced with it. No class says what such a reply means."""
    with pytest.raises(ClientProtocolError, match="no valid code"):
        ReplyReader().feed(line)


@pytest.mark.parametrize(
    "line",
    [
        b"hello\r\n",
        b"25\r\n",
        b"2x0 ok\r\n",
        b"2500 ok\r\n",
        b"250_ok\r\n",
        b"\r\n",
        pytest.param("²50 ok\r\n".encode()),
        pytest.param("٢٥٠ ok\r\n".encode()),
        pytest.param(b"250 a\rb\r\n"),
    ],
)
def test_a_malformed_reply_line_is_a_protocol_error(line: bytes) -> None:
    with pytest.raises(ClientProtocolError):
        ReplyReader().feed(line)


@pytest.mark.parametrize("data", [b"250-first\r\n550 second\r\n", b"550-first\r\n450 second\r\n"])
def test_a_class_change_inside_a_multi_line_reply_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ClientProtocolError, match="class changed"):
        ReplyReader().feed(data)


def test_a_code_change_within_its_class_inside_a_multi_line_reply_is_read_with_the_last_lines_code() -> None:
    """Found from outside: `550-5.1.1 ... / 551 5.1.1 ...` to one RCPT was a protocol error, and
    every recipient of the message, those already accepted or refused included, was deferred
    until it expired. Postfix reads the last line's code."""
    got = ReplyReader().feed(b"550-5.1.1 first line\r\n551 5.1.1 second line\r\n250 2.0.0 ok\r\n")
    assert got == [Reply(551, "5.1.1", ("first line", "second line")), Reply(250, "2.0.0", ("ok",))]


def test_a_reply_that_never_ends_is_a_protocol_error_before_it_fills_memory() -> None:
    reader = ReplyReader()
    assert reader.feed(b"250-more\r\n" * 999) == []
    with pytest.raises(ClientProtocolError, match="more than 1000 lines"):
        reader.feed(b"250-more\r\n")


def test_a_long_reply_that_ends_is_read_whole() -> None:
    reply = ReplyReader().feed(b"250-more\r\n" * 998 + b"250 end\r\n")
    assert len(reply) == 1 and len(reply[0].lines) == 999


def test_a_reply_seen_before_is_read_the_same_way_again() -> None:
    """Single-line replies are remembered by their bytes; a remembered one is the same reply."""
    data = b"250 2.1.0 Sender ok\r\n250-first\r\n250 2.1.0 Sender ok\r\n"
    first, second = ReplyReader().feed(data), ReplyReader().feed(data)
    assert first == second == [Reply(250, "2.1.0", ("Sender ok",)), Reply(250, None, ("first", "2.1.0 Sender ok"))]


# --- Capabilities ----------------------------------------------------------------------------
def test_capabilities_from_the_servers_ehlo_reply() -> None:
    pair = Pair.connect(ServerConfig(hostname=HOSTNAME, max_message_size=1000))
    caps = pair.capabilities
    assert caps.keywords == {"PIPELINING", "SIZE", "8BITMIME", "SMTPUTF8", "ENHANCEDSTATUSCODES", "CHUNKING", "DSN"}
    assert caps.size == 1000
    assert caps.auth == ()
    assert caps.esmtp


def test_capabilities_keywords_are_upper_cased_and_the_greeting_line_is_not_one() -> None:
    reply = Reply(250, None, ("mx.test greets client SIZE", "pipelining", "8bitmime", "x-custom arg", ""))
    caps = Capabilities.from_ehlo(reply)
    assert caps.keywords == {"PIPELINING", "8BITMIME", "X-CUSTOM"}
    assert "PIPELINING" in caps
    assert "MX.TEST" not in caps
    assert caps.size is None


@pytest.mark.parametrize(
    ("line", "size"),
    [("SIZE 35882577", 35882577), ("SIZE", 0), ("SIZE 0", 0), ("size unlimited", 0)],
)
def test_capabilities_size_with_and_without_a_number(line: str, size: int) -> None:
    caps = Capabilities.from_ehlo(Reply(250, None, ("mx.test", line)))
    assert "SIZE" in caps
    assert caps.size == size


def test_capabilities_auth_lists_the_mechanisms_upper_cased() -> None:
    caps = Capabilities.from_ehlo(Reply(250, None, ("mx.test", "AUTH plain LOGIN cram-md5", "STARTTLS")))
    assert caps.auth == ("PLAIN", "LOGIN", "CRAM-MD5")
    assert caps.keywords == {"AUTH", "STARTTLS"}


def test_capabilities_of_a_helo_only_server() -> None:
    caps = Capabilities.helo_only()
    assert not caps.esmtp
    assert caps.keywords == frozenset()
    assert caps.size is None


def test_pair_reads_the_auth_offer_of_the_server() -> None:
    config = ServerConfig(hostname=HOSTNAME, auth_mechanisms=("PLAIN", "LOGIN"), auth_requires_tls=False)
    assert Pair.connect(config).capabilities.auth == ("PLAIN", "LOGIN")


def test_a_utf8_original_recipient_received_with_escapes_is_relayed_with_them_unchanged() -> None:
    """An ORCPT taken over SMTP is kept as the client sent it, escapes and all: relayed, a
    `\\x{E9}` stays one, not `\\x{5C}x{E9}` (an escaped backslash, another address)."""
    pair = Pair.connect()
    exchange = pair.run(envelope(Recipient("d@example.net", orcpt="utf-8;ren\\x{E9}\\x{2B}é@example.net")))
    assert b"RCPT TO:<d@example.net> ORCPT=utf-8;ren\\x{E9}\\x{2B}\\x{E9}@example.net\r\n" in exchange.writes[0]
    assert exchange.result.replies == [queued(1)]
