"""Resource exhaustion: each attack gets a clear answer, the worker's memory stays bounded,
and a well-behaved client is served while the attack goes on.

Memory is the worker's VmRSS (tests/support/attacks.py). Bounds are on the growth over the
idle worker, measured before the attack, so they do not depend on the libraries' footprint.
The full-size runs (10,000 connections, a long slowloris) are marked slow; the default run
has the same cases scaled down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.attacks import (
    GOOD_CLIENT,
    RssPeak,
    connect,
    drip,
    last_replies,
    nested_multipart,
    open_crowd,
    post_without_token,
    raised_open_files,
    read_reply,
    send_message,
    sources,
    worker_pids,
    worker_rss_mib,
)
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp

TOKEN = "inject-token-0123456789"
# The attackers (127.0.0.1, 127.1.x.y) may not relay; the well-behaved client may.
ONLY_GOOD_RELAYS = {"relay_networks": [f"{GOOD_CLIENT}/32"]}


@pytest.fixture
def pigeon(tmp_path: Path) -> Iterator[PigeonProcess]:
    with raised_open_files(25_000), PigeonProcess(tmp_path / "node", smtp=ONLY_GOOD_RELAYS) as node:
        yield node


def _idle_crowd_from_one_address(pigeon: PigeonProcess, count: int) -> None:
    async def attack() -> None:
        crowd = await open_crowd(pigeon.smtp_port, count, ["127.0.0.1"])
        try:
            assert crowd.count(220) == 50, "[smtp] max_connections_per_client"
            assert crowd.count(421) == count - 50
            assert await send_message(pigeon.smtp_port) == (250, "2.0.0 Ok: queued as " + _last_id(pigeon))
        finally:
            crowd.close()

    assert _growth_mib(pigeon, attack) < 40


def _growth_mib(pigeon: PigeonProcess, attack: Callable[[], Coroutine[Any, Any, None]]) -> float:
    """How far the worker's RSS rose above its idle size while `attack` ran."""
    before = worker_rss_mib(pigeon)
    with RssPeak(pigeon) as rss:
        asyncio.run(attack())
    return rss.peak_mib - before


def _last_id(pigeon: PigeonProcess) -> str:
    (message,) = pigeon.spool_messages()
    return message["id"]


def test_idle_connections_from_one_address_get_421_past_the_per_client_limit(pigeon: PigeonProcess) -> None:
    _idle_crowd_from_one_address(pigeon, 1000)


@pytest.mark.slow
def test_ten_thousand_idle_connections_from_one_address_leave_the_node_serving(pigeon: PigeonProcess) -> None:
    _idle_crowd_from_one_address(pigeon, 10_000)


def _idle_crowd_from_many_addresses(pigeon: PigeonProcess, count: int, max_connections: int) -> None:
    async def attack() -> None:
        crowd = await open_crowd(pigeon.smtp_port, count, sources(count))
        try:
            # Every newcomer is let in: the connection silent the longest makes room for it.
            assert crowd.count(220) == count
            assert await send_message(pigeon.smtp_port) == (250, "2.0.0 Ok: queued as " + _last_id(pigeon))
            evicted = await last_replies(crowd, within=1.0)
            assert sum(1 for code in evicted if code == 421) >= count - max_connections
        finally:
            crowd.close()

    assert _growth_mib(pigeon, attack) < 60


def test_idle_connections_from_many_addresses_make_room_for_a_new_client(tmp_path: Path) -> None:
    smtp = {**ONLY_GOOD_RELAYS, "max_connections": 300}
    with raised_open_files(25_000), PigeonProcess(tmp_path / "node", smtp=smtp) as pigeon:
        _idle_crowd_from_many_addresses(pigeon, 1000, 300)


@pytest.mark.slow
def test_ten_thousand_idle_connections_from_many_addresses_leave_the_node_serving(pigeon: PigeonProcess) -> None:
    _idle_crowd_from_many_addresses(pigeon, 10_000, 2000)


def _slowloris(pigeon: PigeonProcess, count: int, timeout: float) -> None:
    async def attack() -> None:
        crowd = await open_crowd(pigeon.smtp_port, count, sources(count))
        try:
            assert crowd.count(220) == count
            dripping = asyncio.create_task(drip(crowd, b"EHLO slowloris.test\r\n", 1.0, timeout + 2))
            await asyncio.sleep(0.5)
            assert (await send_message(pigeon.smtp_port))[0] == 250
            codes = await last_replies(crowd, within=timeout + 3)
            await dripping
            assert codes == [421] * count  # 421 4.4.2 timeout, not one left hanging
        finally:
            crowd.close()

    assert _growth_mib(pigeon, attack) < 40
    rejections = pigeon.wait_records("Rejection", count)
    assert [r["response"]["enhanced"] for r in rejections] == ["4.4.2"] * count


def test_slowloris_clients_are_timed_out_with_421_while_others_are_served(tmp_path: Path) -> None:
    smtp = {**ONLY_GOOD_RELAYS, "command_timeout": "2s"}
    with raised_open_files(25_000), PigeonProcess(tmp_path / "node", smtp=smtp) as pigeon:
        _slowloris(pigeon, 200, 2.0)


@pytest.mark.slow
def test_two_thousand_slowloris_clients_are_timed_out_with_421(tmp_path: Path) -> None:
    smtp = {**ONLY_GOOD_RELAYS, "command_timeout": "20s", "max_connections": 2100}
    with raised_open_files(25_000), PigeonProcess(tmp_path / "node", smtp=smtp) as pigeon:
        _slowloris(pigeon, 2000, 20.0)


def test_megabyte_command_line_gets_500_and_memory_stays_flat(pigeon: PigeonProcess) -> None:
    before = worker_rss_mib(pigeon)
    with RssPeak(pigeon) as rss, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO attacker.test")
        for _ in range(5):
            code, text = client.command(b"MAIL FROM:<" + b"a" * (1 << 20) + b"@example.org>")
            assert (code, text[0][:5]) == (500, "5.5.2")
        assert asyncio.run(send_message(pigeon.smtp_port))[0] == 250
    assert rss.peak_mib - before < 10


def test_megabyte_header_line_gets_554_and_memory_stays_flat(pigeon: PigeonProcess) -> None:
    before = worker_rss_mib(pigeon)
    with RssPeak(pigeon) as rss, RawSmtp(pigeon.smtp_port, source=GOOD_CLIENT) as client:
        client.expect(220)
        client.expect(250, "EHLO attacker.test")
        for _ in range(5):
            client.expect(250, "MAIL FROM:<a@example.org>")
            client.expect(250, "RCPT TO:<b@example.net>")
            client.expect(354, "DATA")
            client.send(b"Subject: " + b"x" * (1 << 20) + b"\r\n\r\nbody\r\n")
            code, text = client.command(b".")
            assert (code, text[0][:5]) == (554, "5.6.0")
        assert asyncio.run(send_message(pigeon.smtp_port))[0] == 250
    assert rss.peak_mib - before < 10
    assert pigeon.spool_messages()[0]["sender"] == "good@example.org"


def test_recipients_past_the_limit_get_452_and_a_client_that_never_stops_gets_421(
    pigeon: PigeonProcess,
) -> None:
    """RFC 5321 4.5.3.1.10: the client sends the rest in another transaction. A pipelining
    client learns of the limit only once it has sent its batch, so as many 452s again as the
    limit (1000) cost nothing and its message goes through (Postfix's
    smtpd_recipient_overshoot_limit). Each one after that is a junk command: a client that
    keeps the transaction open with them is told 421 once max_junk_commands (100) are spent,
    with memory bounded all along."""
    before = worker_rss_mib(pigeon)

    async def transaction() -> list[int]:
        reader, writer = await connect(pigeon.smtp_port, GOOD_CLIENT)
        await read_reply(reader)
        writer.write(b"EHLO many.test\r\nMAIL FROM:<a@example.org>\r\n")
        rcpts = b"".join(b"RCPT TO:<r%d@example.net>\r\n" % n for n in range(2000))
        writer.write(rcpts + b"DATA\r\n")
        codes = [(await read_reply(reader))[0] for _ in range(2 + 2000 + 1)]
        writer.write(b"Subject: many\r\n\r\nhello\r\n.\r\n")
        codes.append((await read_reply(reader))[0])
        writer.close()
        return codes

    with RssPeak(pigeon) as rss:
        codes = asyncio.run(transaction())
        assert codes == [250, 250] + [250] * 1000 + [452] * 1000 + [354, 250]
        with RawSmtp(pigeon.smtp_port, source=GOOD_CLIENT) as client:
            client.expect(220)
            client.expect(250, "EHLO endless.test")
            client.expect(250, "MAIL FROM:<a@example.org>")
            codes = []
            for start in range(0, 10_000, 100):  # 10,000 recipients, 100 at a time
                client.send(b"".join(b"RCPT TO:<r%d@example.net>\r\n" % n for n in range(start, start + 100)))
                while len(codes) < start + 100 and codes[-1:] != [421]:
                    codes.append(client.reply()[0])
                if codes[-1] == 421:
                    break
            assert codes == [250] * 1000 + [452] * 1100 + [421]
            assert client.closed_by_peer()
    (message,) = pigeon.spool_messages()
    assert len(message["recipients"]) == 1000
    assert rss.peak_mib - before < 30


def test_hundred_level_mime_nesting_through_injection_is_stored_as_it_is(tmp_path: Path) -> None:
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    with PigeonProcess(tmp_path / "node", smtp=ONLY_GOOD_RELAYS, http={"token": tokens}) as pigeon:
        before = worker_rss_mib(pigeon)
        raw = nested_multipart(100)
        request = {"envelope_sender": "app@example.org", "recipients": [{"email": "ann@example.net"}]}
        with RssPeak(pigeon) as rss:
            status, answer = pigeon.http_post("/api/v1/inject", {**request, "content": raw, "template": False}, TOKEN)
            assert (status, answer["accepted"]) == (200, 1)
            assert asyncio.run(send_message(pigeon.smtp_port))[0] == 250
        assert rss.peak_mib - before < 10
        stored = {m["sender"]: m["data"] for m in pigeon.spool_messages()}
        assert stored["app@example.org"].count(b"Content-Type: multipart/mixed") == 100


def test_deeply_nested_json_in_an_injection_gets_400_naming_the_nesting(tmp_path: Path) -> None:
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    with PigeonProcess(tmp_path / "node", http={"token": tokens}) as pigeon:
        deep = "[" * 100_000 + "]" * 100_000
        raw = (
            '{"envelope_sender": "app@example.org", "content": "x", "recipients":'
            ' [{"email": "ann@example.net", "substitutions": {"k": ' + deep + "}}]}"
        ).encode()
        status, answer = pigeon.http_post("/api/v1/inject", None, TOKEN, raw=raw)
        assert status == 400
        assert "nested too deeply" in answer["error"]
        assert asyncio.run(send_message(pigeon.smtp_port))[0] == 250


def test_sixty_four_mebibyte_api_body_without_a_token_gets_401_unread(pigeon: PigeonProcess) -> None:
    before = worker_rss_mib(pigeon)
    with RssPeak(pigeon) as rss:

        async def attack() -> list[int]:
            uploads = [asyncio.to_thread(post_without_token, pigeon.http_port, 64 << 20) for _ in range(4)]
            good = asyncio.create_task(send_message(pigeon.smtp_port))
            answers = await asyncio.gather(*uploads)
            assert (await good)[0] == 250
            return answers

        started = time.monotonic()
        answers = asyncio.run(attack())
    assert answers == [401] * 4
    assert rss.peak_mib - before < 20
    assert time.monotonic() - started < 20
    assert len(worker_pids(pigeon)) == 1
    assert urllib.request.urlopen(f"http://127.0.0.1:{pigeon.http_port}/healthz", timeout=5).status == 200


def test_node_raises_an_inherited_low_open_file_limit_to_take_many_connections(tmp_path: Path) -> None:
    """Started from a shell whose soft limit is 256 (1024 is the usual default, below
    max_connections), the node still greets 600 clients."""
    node = PigeonProcess(tmp_path / "node", smtp=ONLY_GOOD_RELAYS)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # 256, or just above what this test process holds open already (the tests before it in this
    # process may have left some): still far below the 600 the node must take.
    low = max(256, len(os.listdir("/proc/self/fd")) + 64)
    assert low < 600
    with contextlib.ExitStack() as running:
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
        try:
            running.enter_context(node)  # started once, stopped on the way out
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        running.enter_context(raised_open_files(25_000))

        async def crowd_greetings() -> list[int]:
            crowd = await open_crowd(node.smtp_port, 600, sources(600), greeting_timeout=3.0)
            crowd.close()
            return crowd.greetings

        assert asyncio.run(crowd_greetings()) == [220] * 600


def _stalled_before_the_dot(pigeon: PigeonProcess, count: int, body: bytes) -> tuple[float, list[int]]:
    """`count` clients each send `body` and stall before the final dot; then all finish. The
    worker's RSS growth meanwhile, and the reply each got to its dot."""

    async def attack() -> list[int]:
        crowd = await open_crowd(pigeon.smtp_port, count, sources(4))
        try:
            assert crowd.count(220) == count
            for writer in crowd.writers:
                writer.write(b"EHLO stall.test\r\nMAIL FROM:<s@example.org>\r\nRCPT TO:<r@example.net>\r\nDATA\r\n")
            for reader in crowd.readers:
                for code in (250, 250, 250, 354):
                    assert (await read_reply(reader))[0] == code
            for writer in crowd.writers:
                writer.write(body)
            await asyncio.gather(*(writer.drain() for writer in crowd.writers))
            await asyncio.sleep(2)  # the worker reads it all, and holds it while they stall
            for writer in crowd.writers:
                writer.write(b".\r\n")
            return [(await read_reply(reader))[0] for reader in crowd.readers]
        finally:
            crowd.close()

    before = worker_rss_mib(pigeon)
    with RssPeak(pigeon) as rss:
        replies = asyncio.run(attack())
    return rss.peak_mib - before, replies


def test_bodies_of_clients_stalled_before_their_dot_go_to_files_past_inline_total(tmp_path: Path) -> None:
    body = b"Subject: stalled\r\n\r\n" + b"".join(b"%07d %s\r\n" % (n, b"s" * 70) for n in range(3000))  # 234 KiB
    spool = {"inline_total": "4MiB"}  # under inline_limit (256 KiB) each: without it, 160 of them in memory
    with raised_open_files(25_000), PigeonProcess(tmp_path / "node", spool=spool) as pigeon:
        growth, replies = _stalled_before_the_dot(pigeon, 160, body)
        assert replies == [250] * 160
        stored = pigeon.spool_messages()
    assert growth < 20, f"the worker grew by {growth:.0f} MiB holding 160 stalled bodies of 234 KiB (37 MiB)"
    assert len(stored) == 160
    assert all(message["data"].endswith(body) for message in stored)  # whole, after its Received field
