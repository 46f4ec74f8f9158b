"""A server without UIDPLUS can only EXPUNGE the whole folder: deleting what was handed over
(or a move without MOVE) also removes every message a mail client marked \\Deleted and did not
expunge. The mailbox says so once, at its first connection. In-process, against a private
Dovecot whose UIDPLUS the session is made not to see."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from pigeon.config.load import load
from pigeon.inbound.imap import ImapSession
from pigeon.logs.writer import LogWriter
from pigeon.metrics import Metrics
from pigeon.node.inbound import Inbound
from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, webhook_target
from tests.support.process import to_toml
from tests.support.services import Dovecot

SAID = "offers no UIDPLUS: removing the messages handed over (or set aside) takes a plain EXPUNGE"


async def _hand_over(tmp_path: Path, dovecot: Dovecot, count: int, **options: Any) -> None:
    """Watch the mailbox until `count` messages were handed over and removed from it."""
    with WebhookApp() as app:
        await asyncio.to_thread(tmp_path.mkdir)
        config_path = tmp_path / "pigeon.toml"
        config = {
            "spool": {"path": str(tmp_path / "spool")},
            "target": [webhook_target(app)],
            "mailbox": [imap_mailbox(dovecot, "hook", poll_interval="1s", **options)],
        }
        config_path.write_text(to_toml(config))
        inbound = Inbound(load(config_path), LogWriter(tmp_path / "log"), Metrics(), watch=True)
        await inbound.start()
        try:
            assert await asyncio.to_thread(app.wait_distinct, count, 20) == count
            for _ in range(100):
                if not await asyncio.to_thread(dovecot.count, "app"):
                    break
                await asyncio.sleep(0.1)
        finally:
            await inbound.stop(1.0)


async def test_a_server_without_uidplus_is_said_once_to_expunge_others_deleted_messages_too(
    tmp_path: Path, dovecot: Dovecot, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    dovecot.append("app", [customer_mail(i) for i in range(2)])
    await _hand_over(tmp_path / "with", dovecot, 2, after_delivery="delete")
    assert SAID not in caplog.text  # Dovecot offers UIDPLUS: nothing to say
    has = ImapSession.has
    monkeypatch.setattr(ImapSession, "has", lambda self, capability: capability != "UIDPLUS" and has(self, capability))
    dovecot.append("app", [customer_mail(i, tag="n") for i in range(2)])
    await _hand_over(tmp_path / "without", dovecot, 2, after_delivery="delete")
    assert caplog.text.count(SAID) == 1
    assert "mailbox support: 127.0.0.1:" in caplog.text and "not expunged yet" in caplog.text
