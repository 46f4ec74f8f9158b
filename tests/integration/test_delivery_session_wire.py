"""The client's I/O layer on a real socket: the writes a message costs, timeouts, servers that
turn us away, go quiet, hang up or break the protocol, and how each ends up as a reply.

The server is Pigeon's own server session on loopback (`session_peer.PeerServer`); each test
runs on asyncio's loop and on uvloop.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from pigeon.delivery.routes import Destination, Hop, TlsPolicy
from pigeon.delivery.session import ClientConnection, ClientOptions, ConnectFailed, ConnectionLost
from pigeon.listener.tls import ensure_self_signed, server_context
from pigeon.smtp import replies
from pigeon.smtp.client import Capabilities, Envelope, Recipient
from pigeon.smtp.replies import Reply
from pigeon.smtp.server import ServerConfig
from tests.integration.session_peer import PeerServer, no_dns, on_both_loops
from tests.support.sinks import HangUpSink

OPTIONS = ClientOptions(helo_name="client.test", connect_timeout=5.0, reply_timeout=5.0)
BODY = b"Subject: wire\r\n\r\nhello\r\n"
USER_UNKNOWN = Reply(550, "5.1.1", ("User unknown",))


def message(*recipients: str) -> Envelope:
    return Envelope("a@example.org", [Recipient(r) for r in recipients or ("b@example.net",)], BODY)


def server(**knobs: Any) -> PeerServer:
    config = {key: knobs.pop(key) for key in ("pipelining", "chunking", "max_messages_per_connection") if key in knobs}
    return PeerServer(ServerConfig(hostname="mx.test", **config), **knobs)


async def connect(peer: PeerServer, options: ClientOptions = OPTIONS) -> ClientConnection:
    return await ClientConnection.open(peer.destination(TlsPolicy.DISABLED), no_dns(), options)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.01)


# --- what a message costs ------------------------------------------------------------------------
@on_both_loops
async def test_each_message_is_one_write_with_pipelining_and_chunking() -> None:
    async with server() as peer:
        connection = await connect(peer)
        (session,) = peer.connections
        opening = session.reads
        for n in range(5):
            result, _ = await connection.send(message(f"r{n}@example.net", "s@example.net"))
            assert [reply.code for reply in result.replies] == [250, 250]
        assert session.reads - opening == 5
        assert connection.deliveries == 5
        await connection.quit()
        await settle()
        assert session.received.endswith(b"QUIT\r\n")
        assert session.closed


@on_both_loops
async def test_a_server_without_pipelining_gets_one_write_per_command() -> None:
    async with server(pipelining=False, chunking=False) as peer:
        connection = await connect(peer)
        opening = peer.connections[0].reads
        await connection.send(message())
        assert peer.connections[0].reads - opening == 4  # MAIL, RCPT, DATA, the content
        await connection.quit()


@on_both_loops
async def test_rset_after_an_unfinished_transaction_rides_in_the_next_messages_write() -> None:
    async with server(answers={"RCPT": [USER_UNKNOWN]}) as peer:
        connection = await connect(peer)
        result, _ = await connection.send(message())
        assert result.replies == [USER_UNKNOWN]
        assert connection.needs_reset
        (session,) = peer.connections
        reads, received = session.reads, len(session.received)
        result, _ = await connection.send(message())
        assert [reply.code for reply in result.replies] == [250]
        assert session.reads - reads == 1
        assert session.received[received:].startswith(b"RSET\r\nMAIL FROM:<a@example.org>")
        await connection.quit()


@on_both_loops
async def test_a_server_refusing_ehlo_is_greeted_with_helo() -> None:
    async with server(answers={"EHLO": [Reply(502, "5.5.1", ("No EHLO",))]}) as peer:
        connection = await connect(peer)
        assert connection.capabilities == Capabilities.helo_only()
        result, _ = await connection.send(message())
        assert [reply.code for reply in result.replies] == [250]
        assert peer.connections[0].received.startswith(
            b"EHLO client.test\r\nHELO client.test\r\nMAIL FROM:<a@example.org>\r\n"
        )
        await connection.quit()


# --- turned away --------------------------------------------------------------------------------
@on_both_loops
async def test_a_refusing_banner_fails_with_4_4_1_and_the_banner() -> None:
    async with server(banner=Reply(554, "5.3.2", ("mx.test no service here",))) as peer:
        with pytest.raises(ConnectFailed) as failed:
            await connect(peer)
        assert str(failed.value.reply) == f"451 4.4.1 [127.0.0.1]:{peer.port} greeted with: 554 mx.test no service here"


@on_both_loops
async def test_ehlo_and_helo_refused_fails_with_4_4_1() -> None:
    no = Reply(550, "5.7.1", ("Not you",))
    async with server(answers={"EHLO": [no], "HELO": [no]}) as peer:
        with pytest.raises(ConnectFailed) as failed:
            await connect(peer)
        assert str(failed.value.reply) == f"451 4.4.1 [127.0.0.1]:{peer.port} refused EHLO and HELO: 550 5.7.1 Not you"


# (Pigeon's server sends no enhanced code before EHLO: it goes in the text, as a server's would.)
RATE_LIMITED = Reply(421, None, ("4.7.0 rate limited, closing connection",))


@on_both_loops
async def test_a_421_banner_fails_with_the_servers_421_and_says_the_host_answered() -> None:
    async with server(banner=RATE_LIMITED) as peer:
        with pytest.raises(ConnectFailed) as failed:
            await connect(peer)
    reply = failed.value.reply
    assert (reply.code, reply.enhanced) == (421, "4.7.0")  # what the reactions and the log read
    assert str(reply) == f"421 4.7.0 rate limited, closing connection (greeting of [127.0.0.1]:{peer.port})"
    assert not failed.value.site_down  # a host took the connection: the site is not down


@on_both_loops
async def test_a_421_to_ehlo_fails_with_the_servers_421_and_no_helo() -> None:
    async with server(answers={"EHLO": [RATE_LIMITED]}) as peer:
        with pytest.raises(ConnectFailed) as failed:
            await connect(peer)
        await settle()
        received = bytes(peer.connections[0].received)
        assert received.startswith(b"EHLO client.test\r\n") and b"HELO" not in received  # (QUIT may be too late)
    reply = failed.value.reply
    assert str(reply) == f"421 4.7.0 rate limited, closing connection (answer of [127.0.0.1]:{peer.port} to EHLO)"
    assert not failed.value.site_down


@on_both_loops
async def test_nothing_listening_fails_with_4_4_1() -> None:
    async with server() as peer:
        port = peer.port
    with pytest.raises(ConnectFailed) as failed:
        await ClientConnection.open(peer.destination(), no_dns(), OPTIONS)
    reply = failed.value.reply
    assert (reply.code, reply.enhanced) == (451, "4.4.1")
    assert reply.text.startswith(f"cannot connect to [127.0.0.1]:{port}: ")


@pytest.mark.parametrize(("reset", "why"), [(True, "Connection reset by peer"),
                                            (False, "closed the connection before its greeting")])  # fmt: skip
@on_both_loops
async def test_a_host_that_ends_the_connection_before_a_word_took_no_connection(reset: bool, why: str) -> None:
    """However soon after the TCP handshake the reset (or close) comes, before the connection
    is made or after: a connection not taken, as a refused one (the site is down), never a
    connection lost."""
    with HangUpSink(reset=reset) as sink:
        hop = Hop(sink.host, sink.port)
        destination = Destination(sink.endpoint, (hop,), TlsPolicy.DISABLED, tls_verify=False)
        for _ in range(10):
            with pytest.raises(ConnectFailed) as failed:
                await ClientConnection.open(destination, no_dns(), OPTIONS)
            assert str(failed.value.reply) == f"451 4.4.1 cannot connect to [{sink.host}]:{sink.port}: {why}"
            assert failed.value.site_down and failed.value.peer is None
            await asyncio.sleep(0.01 * (_ % 3))  # (the reset's timing against ours varies)


# --- timeouts -----------------------------------------------------------------------------------
@on_both_loops
async def test_a_server_that_never_greets_times_out() -> None:
    options = ClientOptions(helo_name="client.test", reply_timeout=0.3)
    async with server(stall=0) as peer:
        started = time.monotonic()
        with pytest.raises(ConnectFailed) as failed:
            await connect(peer, options)
        assert 0.25 <= time.monotonic() - started < 2.0
        # (a server that never greets in the clear most often greets on TLS: port 465)
        assert str(failed.value.reply) == (
            f"451 4.4.2 timeout waiting for the greeting of [127.0.0.1]:{peer.port}; "
            'a port that starts with TLS (465) needs the route\'s tls = "implicit"'
        )


@on_both_loops
async def test_a_banner_dribbled_a_byte_at_a_time_still_times_out() -> None:
    """Bytes that never make a reply do not hold the connection open."""
    options = ClientOptions(helo_name="client.test", reply_timeout=0.4)
    async with server(dribble=0.05) as peer:
        started = time.monotonic()
        with pytest.raises(ConnectFailed) as failed:
            await connect(peer, options)
        assert time.monotonic() - started < 1.0
        assert "timeout waiting for" in failed.value.reply.text


@on_both_loops
async def test_the_reply_timeout_counts_from_each_reply_not_from_the_start_of_the_message() -> None:
    """RFC 5321 4.5.3.2 times each command: six slow replies may take longer than one timeout."""
    options = ClientOptions(helo_name="client.test", reply_timeout=0.5)
    async with server(pipelining=False, chunking=False) as peer:
        connection = await connect(peer, options)
        peer.delay = 0.15  # MAIL, RCPT x3, DATA, end of data: about 0.9 s in all
        started = time.monotonic()
        result, _ = await connection.send(message("b@example.net", "c@example.net", "d@example.net"))
        assert time.monotonic() - started > options.reply_timeout
        assert [reply.code for reply in result.replies] == [250, 250, 250]
        peer.delay = 0.0
        await connection.quit()


@on_both_loops
@pytest.mark.parametrize(("pipelining", "chunking"), [(True, True), (True, False), (False, True), (False, False)])
async def test_the_reply_to_the_end_of_data_may_take_data_done_timeout_not_reply_timeout(
    pipelining: bool, chunking: bool
) -> None:
    """RFC 5321 4.5.3.2.6: 10 minutes for the server to take the message, where other replies
    get 5. Answered within it, the message is delivered once, not timed out and sent again."""
    options = ClientOptions(helo_name="client.test", reply_timeout=0.3, data_done_timeout=2.0)
    async with server(pipelining=pipelining, chunking=chunking) as peer:
        connection = await connect(peer, options)
        peer.end_delay = 0.8
        started = time.monotonic()
        result, _ = await connection.send(message())
        assert time.monotonic() - started > 0.8
        assert [reply.code for reply in result.replies] == [250]
        peer.end_delay = 3.0  # past data_done_timeout: given up on, after it and not before
        started = time.monotonic()
        with pytest.raises(ConnectionLost) as lost:
            await connection.send(message())
        assert 2.0 <= time.monotonic() - started < 2.9
        # (With PIPELINING and CHUNKING the server answers the whole group after the content:
        # MAIL is the first command unanswered.)
        stage = " to answer MAIL FROM" if pipelining and chunking else ""
        assert str(lost.value.reply) == (
            f"451 4.4.2 timeout waiting for [127.0.0.1]:{peer.port}{stage}; "
            "no reply to the end of data: the message may be delivered twice"
        )


@on_both_loops
async def test_every_other_reply_still_has_reply_timeout() -> None:
    options = ClientOptions(helo_name="client.test", reply_timeout=0.3, data_done_timeout=5.0)
    async with server(pipelining=False, chunking=False) as peer:
        connection = await connect(peer, options)
        peer.delay = 0.6  # MAIL's reply, first
        started = time.monotonic()
        with pytest.raises(ConnectionLost) as lost:
            await connection.send(message())
        assert time.monotonic() - started < 0.6
        assert "timeout waiting for" in lost.value.reply.text


@on_both_loops
async def test_a_server_gone_quiet_mid_transaction_times_out_as_connection_lost() -> None:
    options = ClientOptions(helo_name="client.test", reply_timeout=0.3, data_done_timeout=0.3)
    async with server() as peer:
        connection = await connect(peer, options)
        peer.stall = 0  # no more answers
        with pytest.raises(ConnectionLost) as lost:
            await connection.send(message())
        # (The content went with MAIL, as BDAT ... LAST: the server may have taken it.)
        assert str(lost.value.reply) == (
            f"451 4.4.2 timeout waiting for [127.0.0.1]:{peer.port} to answer MAIL FROM; "
            "no reply to the end of data: the message may be delivered twice"
        )
        assert connection.broken and not connection.alive()
        started = time.monotonic()
        await connection.quit()  # no QUIT on a broken connection: nothing to wait for
        assert time.monotonic() - started < 0.1


@on_both_loops
async def test_a_send_cancelled_mid_transaction_leaves_a_connection_that_is_only_closed() -> None:
    """Shutdown cancels the delivery task: the connection must not be reused, nor say QUIT
    into a transaction whose replies are still coming."""
    async with server() as peer:
        connection = await connect(peer)
        peer.delay = 0.5
        task = asyncio.create_task(connection.send(message()))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not connection.alive()
        started = time.monotonic()
        await connection.quit()
        assert time.monotonic() - started < 0.1
        await asyncio.sleep(0.6)  # the late replies arrive on a closed connection: nothing breaks
        assert b"QUIT" not in peer.connections[0].received
        assert peer.connections[0].closed


@on_both_loops
async def test_a_send_cancelled_with_its_answer_read_but_not_taken_still_has_that_answer() -> None:
    """A stop that lands after the server's 250 was read off the wire, before the task woke to
    take it: the answer stands (a restart must not send again what the server took)."""
    async with server() as peer:
        connection = await connect(peer)
        wire = connection._wire
        task = asyncio.create_task(connection.send(message()))
        for _ in range(100_000):  # each turn runs ahead of the task's wake-up, queued behind it
            if wire.events or task.done():
                break
            await asyncio.sleep(0)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [reply.code for reply in connection.answered_before_cut() or []] == [250]
        assert connection.cut_short() is None
        assert not connection.alive()


# --- hang-ups and broken servers -------------------------------------------------------------------
@on_both_loops
async def test_a_421_while_idle_makes_the_connection_not_alive() -> None:
    async with server() as peer:
        connection = await connect(peer)
        await connection.send(message())
        assert connection.alive()
        peer.say(b"421 4.4.2 mx.test Error: timeout exceeded, closing connection\r\n", close=True)
        await settle()
        assert not connection.alive()
        with pytest.raises(ConnectionLost) as lost:
            await connection.send(message())
        assert (lost.value.reply.code, lost.value.reply.enhanced) == (451, "4.4.2")
        await connection.quit()


@on_both_loops
async def test_a_reply_to_no_command_breaks_the_connection_with_4_5_0() -> None:
    """Left unread, it would be taken for the next MAIL's reply, and every reply after shifted."""
    async with server() as peer:
        connection = await connect(peer)
        peer.say(b"250 2.0.0 surprise\r\n")
        await settle()
        assert not connection.alive()
        with pytest.raises(ConnectionLost) as lost:
            await connection.send(message())
        assert str(lost.value.reply) == (
            f"451 4.5.0 [127.0.0.1]:{peer.port} broke the protocol: a reply to no command: 250 2.0.0 surprise"
        )
        await settle()
        assert b"MAIL" not in peer.connections[0].received


@on_both_loops
async def test_a_server_saying_421_mid_transaction_ends_it_with_its_421_and_the_connection_too() -> None:
    async with server(max_messages_per_connection=1) as peer:
        connection = await connect(peer)
        await connection.send(message())
        result, _ = await connection.send(message())  # 421 to MAIL, then the server closes
        # Its own words (which the reactions read), not "closed the connection".
        assert [(r.code, r.enhanced) for r in result.replies] == [(421, "4.7.0")]
        assert not connection.alive()


@on_both_loops
@pytest.mark.parametrize("accepted", [0, 1])
async def test_a_421_to_rcpt_after_bdat_last_went_out_is_the_servers_no_not_a_message_delivered_twice(
    accepted: int,
) -> None:
    """With PIPELINING and CHUNKING, BDAT LAST and the message go with MAIL and every RCPT. A
    421 to a RCPT (the first, or the second after a 250) comes before the reply to BDAT, and
    the server closes: it never took the message. The transaction ends with the server's 421
    for every recipient (which `try_next_mx` may take elsewhere at once), not ConnectionLost
    saying the message may be delivered twice."""
    busy = Reply(421, "4.3.2", ("going away",))
    answers = {"RCPT": [*[Reply(250, "2.1.5", ("ok",))] * accepted, busy]}
    async with server(answers=answers) as peer:
        connection = await connect(peer)
        result, _ = await connection.send(message("b@example.net", "c@example.net"))
        quoted = Reply(421, "4.3.2", (f"going away (answer of [127.0.0.1]:{peer.port} to RCPT TO)",))
        assert result.replies == [quoted, quoted]
        assert not connection.alive()
        (session,) = peer.connections
        assert b"BDAT" in session.received  # the content had gone out ahead of the 421
        assert session.peer.message_ends() == []  # and the server never took it


@on_both_loops
async def test_quit_without_a_221_ends_when_the_server_hangs_up() -> None:
    async with server() as peer:
        connection = await connect(peer)
        peer.stall = 0  # the server reads QUIT and closes without a word
        started = time.monotonic()
        await connection.quit()
        assert connection.broken
        assert time.monotonic() - started < 1.0
        assert peer.connections[0].received.endswith(b"QUIT\r\n")


@on_both_loops
async def test_quit_answered_closes_at_once() -> None:
    async with server() as peer:
        connection = await connect(peer)
        started = time.monotonic()
        await connection.quit()
        assert time.monotonic() - started < 1.0
        await settle()
        assert peer.connections[0].closed
        assert peer.connections[0].sent.endswith(replies.closing("mx.test").encode())


class ClosesAtSecondMail:
    """A raw lock-step server that takes a message a connection: the second MAIL on one ends it,
    unanswered, with a FIN or (`reset`) a TCP reset, as an idle timeout met just then would."""

    def __init__(self, *, reset: bool) -> None:
        self.reset = reset
        self.connections = 0
        self.taken: list[bytes] = []

    async def __aenter__(self) -> ClosesAtSecondMail:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.write(b"220 mx.test\r\n")
        mails = 0
        while line := await reader.readline():
            command = line.upper()
            if command.startswith(b"MAIL"):
                mails += 1
                if mails == 2:
                    if self.reset:
                        writer.get_extra_info("socket").setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                    writer.close()
                    return
            if command.startswith(b"DATA"):
                writer.write(b"354 go on\r\n")
                self.taken.append(await reader.readuntil(b"\r\n.\r\n"))
                writer.write(b"250 2.0.0 taken\r\n")
            elif command.startswith(b"QUIT"):
                writer.write(b"221 bye\r\n")
                break
            else:
                writer.write(b"250 mx.test\r\n")
        writer.close()


@on_both_loops
@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_a_reused_connection_ended_at_mail_sends_the_transaction_again_on_a_new_one(reset: bool) -> None:
    async with ClosesAtSecondMail(reset=reset) as peer:
        destination = Destination(
            f"127.0.0.1:{peer.port}", (Hop("127.0.0.1", peer.port),), TlsPolicy.DISABLED, tls_verify=False
        )
        connection = await ClientConnection.open(destination, no_dns(), OPTIONS)
        for n in range(3):
            result, _ = await connection.send(message(f"r{n}@example.net"))
            assert [str(reply) for reply in result.replies] == ["250 2.0.0 taken"]
        assert connection.alive() and peer.connections == 3 and len(peer.taken) == 3
        await connection.quit()


@on_both_loops
async def test_a_reused_connection_ended_at_mail_with_no_new_one_to_be_had_is_the_usual_break() -> None:
    async with ClosesAtSecondMail(reset=False) as peer:
        destination = Destination(
            f"127.0.0.1:{peer.port}", (Hop("127.0.0.1", peer.port),), TlsPolicy.DISABLED, tls_verify=False
        )
        connection = await ClientConnection.open(destination, no_dns(), OPTIONS)
        await connection.send(message())
        peer.server.close()  # (no new connection: refused)
        await peer.server.wait_closed()
        with pytest.raises(ConnectionLost) as lost:
            await connection.send(message())
        reply = lost.value.reply
        assert (reply.code, reply.enhanced) == (451, "4.4.2")
        assert "; connecting again failed: 451 4.4.1 cannot connect to" in reply.text
        assert lost.value.unanswered(1) == frozenset({0}) and peer.connections == 1
        assert not connection.alive()


# --- a server that stops reading mid-content -------------------------------------------------------
class StopsReading:
    """A raw server (no Pigeon code) that answers a lock-step transaction up to 354, then
    reads nothing until `resume` is set; then everything until the connection ends."""

    def __init__(self, context: ssl.SSLContext | None = None, *, chunk_every: float | None = None) -> None:
        self.context = context  # offer STARTTLS with it
        self.chunk_every = chunk_every  # read a chunk this often, answering 250 at the end, instead
        self.resume = asyncio.Event()
        self.content = bytearray()
        self.ended_by: str = ""
        self.done = asyncio.Event()

    async def __aenter__(self) -> StopsReading:
        listening = socket.socket()
        if self.chunk_every is not None:
            # A small window, as far from the client's send buffer as a remote server is: what
            # has left the client is read soon after, not megabytes of loopback buffer later.
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        listening.bind(("127.0.0.1", 0))
        self.server = await asyncio.start_server(self._serve, sock=listening)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 mx.test\r\n")
        while (line := await reader.readline()) and not line.upper().startswith(b"DATA"):
            command = line.upper()
            if command.startswith(b"STARTTLS") and self.context is not None:
                writer.write(b"220 go ahead\r\n")
                await writer.start_tls(self.context)
                self.context = None  # (not offered again)
            elif command.startswith(b"EHLO"):
                writer.write(b"250-mx.test\r\n" + (b"250-STARTTLS\r\n" if self.context else b"") + b"250 SIZE 0\r\n")
            else:
                writer.write(b"250 ok\r\n")
        writer.write(b"354 go on\r\n")
        if self.chunk_every is not None:  # a slow but steady reader: 64 KiB a step
            while not self.content.endswith(b"\r\n.\r\n"):
                await asyncio.sleep(self.chunk_every)
                self.content += await reader.read(1 << 16)
            writer.write(b"250 2.0.0 taken\r\n")
            await reader.read()  # (QUIT, or the end)
            self.done.set()
            writer.close()
            return
        await self.resume.wait()
        try:
            while chunk := await reader.read(1 << 20):
                self.content += chunk
            self.ended_by = "close"
        except ConnectionResetError:
            self.ended_by = "reset"
        self.done.set()
        writer.close()


@on_both_loops
@pytest.mark.parametrize("tls", [False, True])
async def test_a_server_that_stops_reading_mid_content_never_gets_the_end_after_we_give_up(
    tls: bool, tmp_path: Path
) -> None:
    """A message larger than every buffer on the way, to a server that stops reading after
    354: the transaction times out without "may be delivered twice" (its end never left),
    and the connection is reset, not closed politely: a close would hold the socket and the
    rest of the message until the server read again, for good if it never did, and a server
    that did read again would get the whole message, end and all, after we had given it up
    to try again (delivered twice)."""
    options = ClientOptions(helo_name="client.test", reply_timeout=0.5, data_done_timeout=0.5)
    body = b"Subject: big\r\n\r\n" + (b"y" * 998 + b"\r\n") * 32_000  # 32 MB
    context = server_context(*ensure_self_signed(tmp_path, "mx.test")) if tls else None
    async with StopsReading(context) as peer:
        policy = TlsPolicy.REQUIRED if tls else TlsPolicy.DISABLED
        destination = Destination(f"127.0.0.1:{peer.port}", (Hop("127.0.0.1", peer.port),), policy, tls_verify=False)
        connection = await ClientConnection.open(destination, no_dns(), options)
        with pytest.raises(ConnectionLost) as lost:
            await connection.send(Envelope("a@example.org", [Recipient("b@example.net")], body))
        assert str(lost.value.reply) == (
            f"451 4.4.2 timeout waiting for [127.0.0.1]:{peer.port} to take the message's content"
        )
        assert (connection.tls is not None) is tls
        await connection.quit()
        peer.resume.set()
        await asyncio.wait_for(peer.done.wait(), 10)
        assert peer.ended_by == "reset"
        assert not peer.content.endswith(b"\r\n.\r\n")
        assert len(peer.content) < len(body)


@on_both_loops
async def test_a_large_message_to_a_slow_but_steady_reader_is_delivered_past_data_done_timeout() -> None:
    """RFC 5321 4.5.3.2.5 times each block of data: a server that keeps taking the content
    makes progress, as a reply does. An 8 MB message read at 2.5 MB/s takes three times
    `data_done_timeout` to go, and is delivered once, not timed out at every attempt."""
    options = ClientOptions(helo_name="client.test", reply_timeout=0.5, data_done_timeout=1.0)
    body = b"Subject: big\r\n\r\n" + (b"y" * 998 + b"\r\n") * 8_000
    async with StopsReading(chunk_every=0.025) as peer:
        destination = Destination(
            f"127.0.0.1:{peer.port}", (Hop("127.0.0.1", peer.port),), TlsPolicy.DISABLED, tls_verify=False
        )
        connection = await ClientConnection.open(destination, no_dns(), options)
        started = time.monotonic()
        result, _ = await connection.send(Envelope("a@example.org", [Recipient("b@example.net")], body))
        assert [str(reply) for reply in result.replies] == ["250 2.0.0 taken"]
        assert time.monotonic() - started > 3.0  # (it did take that long)
        await connection.quit()
        await asyncio.wait_for(peer.done.wait(), 10)
        assert len(peer.content) > len(body)  # all of it, dot-stuffed and ended
