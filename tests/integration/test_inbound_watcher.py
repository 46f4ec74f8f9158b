"""A mailbox watcher outlives what should never happen: a cancellation it did not ask for, or a
bug that ends it. Either is logged and costs a reconnect or a restart, never the mailbox (a
watcher that ended silently would leave its mail unfetched for good). In-process, against a
private Dovecot."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pigeon.config.load import load
from pigeon.inbound.imap import ImapSession
from pigeon.inbound.mailbox import MailboxWatcher
from pigeon.logs.writer import LogWriter
from pigeon.metrics import Metrics
from pigeon.node.inbound import Inbound
from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, webhook_target
from tests.support.process import to_toml
from tests.support.services import Dovecot


async def _watching(tmp_path: Path, dovecot: Dovecot, app: WebhookApp, **options: Any) -> AsyncIterator[Inbound]:
    config_path = tmp_path / "pigeon.toml"
    config: dict[str, Any] = {
        "spool": {"path": str(tmp_path / "spool")},
        "target": [webhook_target(app)],
        "mailbox": [imap_mailbox(dovecot, "hook", poll_interval="1s", **options)],
    }
    config_path.write_text(to_toml(config))
    inbound = Inbound(load(config_path), LogWriter(tmp_path / "log"), Metrics(), watch=True)
    await inbound.start()
    try:
        yield inbound
    finally:
        await inbound.stop(1.0)


async def _delivered(app: WebhookApp, count: int, seconds: float) -> int:
    return await asyncio.to_thread(app.wait_distinct, count, seconds)


async def test_a_stray_cancellation_in_a_session_costs_a_reconnect_not_the_mailbox(
    tmp_path: Path, dovecot: Dovecot, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(3)])
    opened = ImapSession.open
    calls = 0

    async def open_once_cancelled(*args: Any, **kwargs: Any) -> ImapSession:
        nonlocal calls
        calls += 1
        if calls == 1:  # as a library that cancels a command of its own and lets it out
            raise asyncio.CancelledError()
        return await opened(*args, **kwargs)

    monkeypatch.setattr(ImapSession, "open", open_once_cancelled)
    with WebhookApp() as app:
        async for _ in _watching(tmp_path, dovecot, app):
            assert await _delivered(app, 3, 20) == 3
    assert calls >= 2
    assert "a stray cancellation ended the session; reconnecting" in caplog.text


async def test_a_watcher_that_ends_by_a_bug_is_logged_and_started_again(
    tmp_path: Path, dovecot: Dovecot, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dovecot.append("app", [customer_mail(i) for i in range(3)])
    run = MailboxWatcher.run
    calls = 0

    async def run_once_broken(self: MailboxWatcher) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        await run(self)

    monkeypatch.setattr(MailboxWatcher, "run", run_once_broken)
    caplog.set_level(logging.INFO)
    with WebhookApp() as app:
        async for inbound in _watching(tmp_path, dovecot, app):
            assert await _delivered(app, 3, 20) == 3
            assert len(inbound._tasks) == 1
    assert "mailbox support: its watcher ended unexpectedly; starting it again" in caplog.text
    assert "RuntimeError: a bug" in caplog.text


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def test_a_server_that_dies_between_its_greeting_and_its_capabilities_costs_a_reconnect(
    tmp_path: Path, dovecot: Dovecot
) -> None:
    """The first connection (through a loopback relay) gets Dovecot's greeting, then is reset
    when the watcher asks for CAPABILITY: a server killed just after greeting. The watcher
    used to wait for that answer for good (see `imap._greeting`)."""
    dovecot.append("app", [customer_mail(i) for i in range(3)])
    connections = 0
    relays: set[asyncio.Future[Any]] = set()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", dovecot.port)
        if connections == 1:
            writer.write(await upstream_reader.readline())  # "* OK [CAPABILITY ...] Dovecot ready."
            assert (await reader.readline()).endswith(b" CAPABILITY\r\n")
            writer.transport.abort()
            upstream_writer.transport.abort()
            return
        pipes = asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        relays.add(pipes)
        await pipes

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        with WebhookApp() as app:
            port = server.sockets[0].getsockname()[1]
            async for _ in _watching(tmp_path, dovecot, app, port=port, timeout="2s"):
                assert await _delivered(app, 3, 15) == 3
        assert connections >= 2
    finally:
        server.close()
        for pipes in relays:
            pipes.cancel()
