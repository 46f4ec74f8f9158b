"""Every IMAP handoff has its InboundDelivery record across kill -9, also when the log disk is
full: found from outside, a node killed with the log disk full lost every record of the
messages it had handed over and acknowledged (they were in its memory only), and the next
start said nothing. The records the log cannot take are kept in the spool's outbox before the
acknowledgement now, and the next start logs them, each once.

Against a private Dovecot, with the log on a small tmpfs (root, as CI is)."""

from __future__ import annotations

import collections
import json
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from tests.support.apps import customer_mail, imap_mailbox
from tests.support.disks import fill, tmpfs
from tests.support.process import PigeonProcess
from tests.support.services import Dovecot
from tests.support.sinks import wait_until

_COUNT = 20


@pytest.fixture
def log_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs for the log only (the spool stays on the real disk). Needs root."""
    with tmpfs(tmp_path / "logdisk", "1m") as mount_point:
        yield mount_point


def _outbox_rows(node: PigeonProcess) -> int:
    total = 0
    for db in node.spool_path.glob("shard-*/spool.db"):
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            total += conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
    return total


def _log_lines(directory: Path) -> list[dict[str, object]]:
    """Every line of every segment, as `zcat | jq` reads them: each must be a JSON record."""
    lines: list[dict[str, object]] = []
    for path in sorted(directory.iterdir()):
        command = ["zcat"] if path.name.endswith(".gz") else ["cat"]
        content = subprocess.run([*command, str(path)], capture_output=True, check=True).stdout
        assert not content or content.endswith(b"\n"), path.name
        lines += [json.loads(line) for line in content.splitlines()]
    return lines


@pytest.mark.root
def test_kill_9_with_the_log_disk_full_loses_no_inbound_delivery_record(
    tmp_path: Path, dovecot: Dovecot, log_disk: Path
) -> None:
    directory = log_disk / "log"
    box = imap_mailbox(dovecot, "audit", poll_interval="1s")
    target = {"name": "audit", "kind": "log", "path": str(tmp_path / "handed.jsonl")}
    node = PigeonProcess(tmp_path / "node", log={"path": str(directory)}, target=[target], mailbox=[box])
    try:
        node.start()
        filler = fill(log_disk)
        dovecot.append("app", [customer_mail(i) for i in range(_COUNT)])
        wait_until(lambda: not dovecot.unseen("app") and dovecot.count("app") == _COUNT, 30)  # all acknowledged
        node.kill()  # kill -9, the log disk still full
        filler.unlink()

        node.start()
        wait_until(lambda: _outbox_rows(node) == 0, 15)
        assert node.stop() == 0
    finally:
        node.kill()
    handed = [json.loads(line)["dedupe_key"] for line in (tmp_path / "handed.jsonl").read_bytes().splitlines()]
    assert len(handed) == _COUNT
    records = [r for r in _log_lines(directory) if r["type"] == "InboundDelivery"]
    assert collections.Counter(r["dedupe_key"] for r in records) == collections.Counter(handed)  # each once
    started = node.stderr()
    assert "records kept in the outbox were not logged before a crash (or kill -9); logging them now" in started
    # While the disk was full, kept in the outbox: said so, not that the records may be lost.
    assert "may not be durable" not in node.stderr_path.read_text()  # (both runs)
