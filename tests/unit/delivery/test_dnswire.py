"""The plain DNS question of `pigeon.delivery.dnswire`, against a server on loopback that
answers what each test makes it answer (a forged id, a truncated answer...)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from dnslib import QTYPE, RR, TXT, A, DNSRecord

from pigeon.delivery import dnswire

Answering = Callable[[DNSRecord], list[bytes]]
Server = Callable[[Answering], tuple[str, int]]


@pytest.fixture
def server() -> Iterator[Server]:
    """Starts a UDP server whose answers to each query are `answering(query)`'s datagrams."""
    sockets: list[socket.socket] = []

    def start(answering: Answering) -> tuple[str, int]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)

        def serve() -> None:
            while True:
                try:
                    data, peer = sock.recvfrom(4096)
                except OSError:
                    return
                for datagram in answering(DNSRecord.parse(data)):
                    sock.sendto(datagram, peer)

        threading.Thread(target=serve, daemon=True).start()
        return sock.getsockname()

    yield start
    for sock in sockets:
        sock.close()


def _answer(query: DNSRecord, address: str, *, ident: int | None = None) -> bytes:
    reply = query.reply()
    reply.add_answer(RR(query.q.qname, QTYPE.A, rdata=A(address), ttl=300))
    if ident is not None:
        reply.header.id = ident
    return bytes(reply.pack())


async def test_an_answer_with_another_id_is_ignored_and_ours_is_waited_for(
    server: Server,
) -> None:
    """A forged answer (its id guessed wrong) must not be taken for the server's."""
    endpoint = server(lambda q: [_answer(q, "192.0.2.66", ident=(q.header.id + 1) % 65536), _answer(q, "192.0.2.1")])
    answer = await dnswire.ask(endpoint, "host.example", "A")
    assert answer is not None
    assert answer.records == ["192.0.2.1"]


async def test_an_answer_to_another_question_is_ignored(server: Server) -> None:
    def answering(query: DNSRecord) -> list[bytes]:
        other = DNSRecord.question("elsewhere.example", "A")
        other.header.id = query.header.id
        return [_answer(other, "192.0.2.66"), _answer(query, "192.0.2.1")]

    answer = await dnswire.ask(server(answering), "host.example", "A")
    assert answer is not None
    assert answer.records == ["192.0.2.1"]


async def test_a_truncated_answer_says_so_for_the_caller_to_ask_over_tcp(server: Server) -> None:
    def answering(query: DNSRecord) -> list[bytes]:
        reply = query.reply()
        reply.header.tc = 1
        return [bytes(reply.pack())]

    answer = await dnswire.ask(server(answering), "host.example", "A")
    assert answer is not None
    assert answer.truncated
    assert answer.records == []


async def test_no_answer_is_a_timeout(server: Server) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await dnswire.ask(server(lambda q: []), "host.example", "A")


def test_a_name_that_is_not_plain_is_left_to_dnspython() -> None:
    assert dnswire.question("host.example", dnswire.A) is not None
    assert dnswire.question("h\\.ost.example", dnswire.A) is None
    assert dnswire.question("hôte.example", dnswire.A) is None
    assert dnswire.question("a..example", dnswire.A) is None


async def test_a_txt_record_in_several_strings_is_one_text(server: Server) -> None:
    """RFC 8461 3.1 (as RFC 7208 3.3): a TXT record longer than 255 octets comes in strings, joined."""

    def answering(query: DNSRecord) -> list[bytes]:
        reply = query.reply()
        reply.add_answer(RR(query.q.qname, QTYPE.TXT, rdata=TXT([b"v=STSv1; ", b"id=2024;"]), ttl=300))
        reply.add_answer(RR(query.q.qname, QTYPE.TXT, rdata=TXT([b"v=spf1 -all"]), ttl=60))
        return [bytes(reply.pack())]

    answer = await dnswire.ask(server(answering), "_mta-sts.example.net", "TXT")
    assert answer is not None
    assert answer.records == ["v=STSv1; id=2024;", "v=spf1 -all"]
    assert answer.ttl == 60
