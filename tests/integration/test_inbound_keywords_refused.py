"""A server that takes no keywords (Dovecot told `mail_max_keyword_length = 4`, answering
`NO [CANNOT] Keyword length too long` to a STORE of `$PigeonDone`): Pigeon's marks are
refused, and still every message reaches the application once and is acknowledged as
configured. In-process, against a private Dovecot."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from pigeon.config.load import load
from pigeon.logs.writer import LogWriter
from pigeon.metrics import Metrics
from pigeon.node.inbound import Inbound
from tests.support.apps import WebhookApp, customer_mail, imap_mailbox, webhook_target
from tests.support.process import to_toml
from tests.support.services import Dovecot

NO_KEYWORDS = "mail_max_keyword_length = 4\n"


@pytest.fixture
def dovecot_without_keywords(tmp_path: Path) -> Iterator[Dovecot]:
    with Dovecot(tmp_path / "dovecot", settings=NO_KEYWORDS) as server:
        yield server


@asynccontextmanager
async def _watching(tmp_path: Path, dovecot: Dovecot, app: WebhookApp, **options: Any) -> AsyncIterator[None]:
    config_path = tmp_path / "pigeon.toml"
    config = {
        "spool": {"path": str(tmp_path / "spool")},
        "target": [webhook_target(app)],
        "mailbox": [imap_mailbox(dovecot, "hook", poll_interval="1s", **options)],
    }
    config_path.write_text(to_toml(config))
    log = LogWriter(tmp_path / "log")
    log.open()
    inbound = Inbound(load(config_path), log, Metrics(), watch=True)
    await inbound.start()
    try:
        yield
    finally:
        await inbound.stop(1.0)
        log.close()


async def _until(check: Any, seconds: float) -> bool:
    for _ in range(int(seconds * 10)):
        if await asyncio.to_thread(check):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_deleting_without_keywords_hands_each_message_over_once_and_removes_it(
    tmp_path: Path, dovecot_without_keywords: Dovecot, caplog: pytest.LogCaptureFixture
) -> None:
    dovecot = dovecot_without_keywords
    caplog.set_level(logging.INFO)
    dovecot.append("app", [customer_mail(i) for i in range(5)])
    with WebhookApp() as app:
        async with _watching(tmp_path, dovecot, app, after_delivery="delete"):
            assert await asyncio.to_thread(app.wait_distinct, 5, 20) == 5
            assert await _until(lambda: dovecot.count("app") == 0, 10), dovecot.uids("app")
            dovecot.append("app", [customer_mail(i, tag="later") for i in range(3)])
            assert await asyncio.to_thread(app.wait_distinct, 8, 20) == 8
            assert await _until(lambda: dovecot.count("app") == 0, 10), dovecot.uids("app")
            await asyncio.sleep(2.5)  # two more rounds: nothing comes again
    assert sorted(app.accepted.values()) == [1] * 8, app.accepted
    # The node's own mark was refused too: said, and given up, not retried every batch.
    assert "Keyword length too long" in caplog.text
    assert "may not be durable" not in caplog.text


async def test_a_refused_move_and_a_refused_mark_hand_nothing_over_twice_and_move_once_the_folder_is_back(
    tmp_path: Path, dovecot_without_keywords: Dovecot, caplog: pytest.LogCaptureFixture
) -> None:
    dovecot = dovecot_without_keywords
    caplog.set_level(logging.INFO)
    with WebhookApp() as app:
        async with _watching(tmp_path, dovecot, app, after_delivery="move", move_to="Done"):
            dovecot.append("app", [customer_mail(0)])
            assert await asyncio.to_thread(app.wait_distinct, 1, 20) == 1
            assert await _until(lambda: dovecot.count("app", "Done") == 1, 10)
            # The destination goes away under the running session: the move is refused
            # (TRYCREATE), and so is the done keyword that would keep them from the next search.
            client = dovecot.connect("app")
            try:
                assert client.delete("Done")[0] == "OK"
            finally:
                client.logout()
            dovecot.append("app", [customer_mail(i, tag="refused") for i in range(3)])
            assert await asyncio.to_thread(app.wait_distinct, 4, 20) == 4
            await asyncio.sleep(3.5)  # three rounds that find them in INBOX again
            assert sorted(app.accepted.values()) == [1] * 4, app.accepted
            assert dovecot.count("app") == 3
            assert "cannot acknowledge UIDs" in caplog.text
            client = dovecot.connect("app")
            try:
                assert client.create("Done")[0] == "OK"
            finally:
                client.logout()
            assert await _until(lambda: dovecot.count("app") == 0, 15), dovecot.uids("app")
            assert dovecot.count("app", "Done") == 3
    assert sorted(app.accepted.values()) == [1] * 4, app.accepted
    assert "may not be durable" not in caplog.text
