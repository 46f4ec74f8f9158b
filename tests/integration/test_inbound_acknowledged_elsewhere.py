"""A message another node acknowledged (flagged \\Seen) just after our search found it, with no
claim to say it was handed over (as after Redis lost its done marks), is not handed over again:
its flags, read with the body, keep it from the application. In-process, against a private
Dovecot: the search is made to run just before the other node's acknowledgement."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pigeon.config.load import load
from pigeon.inbound.imap import ImapSession
from pigeon.logs.writer import LogWriter
from pigeon.metrics import Metrics
from pigeon.node.inbound import Inbound
from tests.support.apps import customer_mail, imap_mailbox
from tests.support.process import to_toml
from tests.support.services import Dovecot
from tests.support.sinks import wait_until


def _flag_seen(dovecot: Dovecot, uids: list[int]) -> None:
    """What another node's acknowledgement does."""
    imap = dovecot.connect("app")
    try:
        imap.select("INBOX")
        imap.uid("STORE", ",".join(str(uid) for uid in uids), "+FLAGS", "(\\Seen)")
    finally:
        imap.logout()


async def test_a_message_acknowledged_elsewhere_after_our_search_found_it_is_not_handed_over(
    tmp_path: Path, dovecot: Dovecot, monkeypatch: pytest.MonkeyPatch
) -> None:
    uids = dovecot.append("app", [customer_mail(i) for i in range(8)])
    searched = ImapSession.search
    acknowledged: list[int] = []

    async def search_just_before_another_node_acknowledges(self: ImapSession, criteria: str) -> list[int]:
        found = await searched(self, criteria)
        if not acknowledged and (taken := [uid for uid in uids[::2] if uid in found]):
            acknowledged.extend(taken)
            await asyncio.to_thread(_flag_seen, dovecot, taken)
        return found

    monkeypatch.setattr(ImapSession, "search", search_just_before_another_node_acknowledges)
    handed_over = tmp_path / "inbound.jsonl"
    config_path = tmp_path / "pigeon.toml"
    config_path.write_text(
        to_toml(
            {
                "spool": {"path": str(tmp_path / "spool")},
                "target": [{"name": "audit", "kind": "log", "path": str(handed_over)}],
                "mailbox": [imap_mailbox(dovecot, "audit")],
            }
        )
    )
    inbound = Inbound(load(config_path), LogWriter(tmp_path / "log"), Metrics(), watch=True)
    await inbound.start()
    try:
        await asyncio.to_thread(
            wait_until, lambda: handed_over.exists() and len(handed_over.read_bytes().splitlines()) >= 4, 20
        )
        await asyncio.sleep(1)  # a round or two more
    finally:
        await inbound.stop(1.0)
    assert len(acknowledged) == 4
    lines = [json.loads(line) for line in handed_over.read_bytes().splitlines()]
    assert sorted(line["raw"].encode() for line in lines) == sorted(customer_mail(i) for i in range(1, 8, 2))
