"""The WARNING of a handoff accepted after another node took its claim over names that node as
"node NAME (token ...)", or says "another node" when it is not known any more: never "node
another node"."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from pigeon.inbound.arbitration import UNKNOWN_TAKER, Claim, Standing
from pigeon.inbound.mailbox import MailboxWatcher
from pigeon.inbound.message import InboundMessage
from tests.support.apps import customer_mail


def _warned(taken_by: str, caplog: pytest.LogCaptureFixture) -> str:
    claim = Claim(key="k", uid=6432, standing=Standing.DONE, taken_by=taken_by)
    message = InboundMessage.of(customer_mail(1), "imap:hookbox", 1.0)
    # Only what the WARNING names of its watcher: a whole one needs an IMAP server and an arbiter.
    watcher = SimpleNamespace(config=SimpleNamespace(name="hookbox"), identity="app@imap:993/INBOX",
                              target=SimpleNamespace(name="hook"))  # fmt: skip
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pigeon.inbound.mailbox"):
        MailboxWatcher._warn_taken_over(watcher, claim, message)  # type: ignore[arg-type]
    (record,) = caplog.records
    return record.getMessage()


def test_a_takeover_by_a_node_no_longer_known_is_said_as_another_node(caplog: pytest.LogCaptureFixture) -> None:
    said = _warned(UNKNOWN_TAKER, caplog)
    assert "was accepted by hook after another node took its claim over" in said, said
    assert "node another node" not in said


def test_a_takeover_by_a_known_node_names_it(caplog: pytest.LogCaptureFixture) -> None:
    said = _warned("mx-b (token h1b2)", caplog)
    assert "was accepted by hook after node mx-b (token h1b2) took its claim over" in said, said
    assert "UID 6432" in said and "mailbox hookbox" in said
