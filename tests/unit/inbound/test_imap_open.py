"""Opening an IMAP session against a server that greets and then fails: it ends within its
command timeout, whatever the server does. A loopback server scripted per test, no Dovecot.

aioimaplib's `wait_hello_from_server` waited on a condition whose lock its welcome holds
until the server answers the CAPABILITY that follows the greeting; cancelling that wait (its
timeout) then waited for the lock. A server killed or restarted between its greeting and that
answer left the watcher in `ImapSession.open` for good: connected to nothing, retrying
nothing, logging nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from pigeon.inbound.imap import ImapError, ImapSession

_Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _server(behaviour: _Behaviour, host: str = "127.0.0.1") -> AsyncIterator[int]:
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await behaviour(reader, writer)
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(handle, host, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


async def _open(port: int, command_timeout: float, host: str = "127.0.0.1") -> ImapSession:
    return await ImapSession.open(host, port, tls="none", tls_context=None, username="app", secret="secret",
                                  auth="login", folder="INBOX", command_timeout=command_timeout)  # fmt: skip


async def _greets_then(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, then: str) -> None:
    writer.write(b"* OK IMAP4rev1 ready\r\n")
    await writer.drain()
    assert (await reader.readline()).endswith(b" CAPABILITY\r\n")
    if then == "silent":
        await asyncio.sleep(3600)
    elif then == "reset":
        writer.transport.abort()
    else:
        writer.close()


@pytest.mark.parametrize(
    ("then", "error", "text"),
    [
        ("silent", TimeoutError, r"greeted, then gave no answer to CAPABILITY within 0\.5s"),
        ("closes", ImapError, "closed the connection before it was ready"),
        ("reset", ImapError, "closed the connection before it was ready"),
    ],
)
async def test_a_server_that_greets_and_then_fails_ends_the_open_within_the_timeout(
    then: str, error: type[Exception], text: str
) -> None:
    async def behaviour(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _greets_then(reader, writer, then)

    async for port in _server(behaviour):
        started = time.monotonic()
        with pytest.raises(error, match=text):
            # The guard is the test's: without the fix the open outlived any timeout of its own.
            await asyncio.wait_for(_open(port, command_timeout=0.5), 5)
        assert time.monotonic() - started < 2


async def test_a_greeting_that_refuses_the_client_ends_the_open_at_once() -> None:
    async def behaviour(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"* BYE Too many connections\r\n")
        await writer.drain()
        await asyncio.sleep(3600)

    async for port in _server(behaviour):
        started = time.monotonic()
        with pytest.raises(ImapError, match="Too many connections"):
            await asyncio.wait_for(_open(port, command_timeout=5), 10)
        assert time.monotonic() - started < 2


async def test_a_server_that_never_greets_still_times_out() -> None:
    async def behaviour(_reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    async for port in _server(behaviour):
        with pytest.raises(ImapError, match=r"no IMAP greeting within 0\.5s"):
            await asyncio.wait_for(_open(port, command_timeout=0.5), 5)


async def test_a_server_that_stops_answering_at_login_is_named_in_the_timeout() -> None:
    # A bare "TimeoutError" (what CI's log said of a restarted Dovecot) did not say which step
    # the server left waiting.
    async for port in _server(_silent_at_login):
        with pytest.raises(TimeoutError, match=rf"login as app: no answer from 127\.0\.0\.1:{port} within 0\.5s"):
            await asyncio.wait_for(_open(port, command_timeout=0.5), 5)


async def _silent_at_login(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"* OK IMAP4rev1 ready\r\n")
    await writer.drain()
    tag = (await reader.readline()).split()[0]
    writer.write(b"* CAPABILITY IMAP4rev1\r\n" + tag + b" OK done\r\n")
    await writer.drain()
    await reader.readline()  # LOGIN, never answered
    await asyncio.sleep(3600)


async def _greets_then_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _greets_then(reader, writer, "silent")


async def _never_greets(_reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)


@pytest.mark.parametrize(
    ("behaviour", "error", "text"),
    [
        (_silent_at_login, TimeoutError, "login as app: no answer from {server} within"),
        (_greets_then_silent, TimeoutError, "{server} greeted, then gave no answer to CAPABILITY"),
        (_never_greets, ImapError, "connected to {server}, but no IMAP greeting"),
    ],
)
async def test_an_ipv6_server_is_named_with_its_address_in_brackets(
    behaviour: _Behaviour, error: type[Exception], text: str
) -> None:
    # Found from outside: the texts (in the log and /healthz's reason) said "::1:993", where
    # the port cannot be told from the address; Pigeon writes "[::1]:993" everywhere else.
    async for port in _server(behaviour, "::1"):
        with pytest.raises(error) as raised:
            await asyncio.wait_for(_open(port, command_timeout=0.5, host="::1"), 5)
        assert text.format(server=f"[::1]:{port}") in str(raised.value)
        assert f" ::1:{port}" not in str(raised.value)
