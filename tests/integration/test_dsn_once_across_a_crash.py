"""A bounce's DSN and the bounce itself are one commit: a crash just after the DSN is stored
cannot bring the recipient back to be tried, bounced and reported again. Likewise a delay
warning's DSN and the mark that the sender was warned: the retries after such a crash warn
nobody again.

The node runs in this process on real sockets, spool and logs. The crash is made where it
hurts: every spool connection goes through `_Disk`, which lets the transaction that stores
a DSN (a message from the null sender) reach the disk, and no transaction after it, as if
the process had been killed at that moment. The node is then stopped (nothing it writes
lands) and started again on the same spool.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from pigeon.config.load import load
from pigeon.logs.reader import read_records
from pigeon.message import ENVELOPE_DECODER, Envelope, Recipient
from pigeon.node.node import Node
from pigeon.spool.shards import shard_directory
from pigeon.spool.spool import NewMessage
from pigeon.spool.sqlite import SqliteSpool
from tests.support.process import free_port, to_toml
from tests.support.sinks import ScriptedSink

MESSAGE = b"From: <sender@example.org>\r\nSubject: bounce me\r\n\r\nHello.\r\n"
DSN_ID = re.compile(rb"Received: by mx\.pigeon\.test \(Pigeon\) id ([0-9a-f]{16})")


class _Disk:
    """Spool connections of this process; once `armed`, the first transaction that stores a
    message from the null sender (a DSN) is the last one to reach the disk."""

    def __init__(self) -> None:
        self.armed = False
        self.dead = False

    def wrap(self, connect: Callable[[SqliteSpool], sqlite3.Connection]) -> Callable[[SqliteSpool], Any]:
        def connected(spool: SqliteSpool) -> Any:
            return _Connection(connect(spool), self)

        return connected


class _Connection:
    def __init__(self, conn: sqlite3.Connection, disk: _Disk) -> None:
        self._conn = conn
        self._disk = disk
        self._dsn = False  # this transaction stores a DSN

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "COMMIT" and self._disk.dead:
            self._conn.execute("ROLLBACK")
            raise sqlite3.OperationalError("disk I/O error (the test's crash: nothing reaches the disk)")
        cursor = self._conn.execute(sql, *args)
        if sql == "COMMIT" and self._dsn:
            self._disk.dead = self._disk.armed
        if sql in ("COMMIT", "ROLLBACK"):
            self._dsn = False
        return cursor

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        rows = list(rows)
        if sql.startswith("INSERT INTO message") and any(ENVELOPE_DECODER.decode(r[6]).sender == "" for r in rows):
            self._dsn = True
        return self._conn.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)  # the rest, as SQLite's own


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> _Disk:
    disk = _Disk()
    monkeypatch.setattr(SqliteSpool, "_connect", disk.wrap(SqliteSpool._connect))
    return disk


@pytest.fixture
async def sink() -> AsyncIterator[ScriptedSink]:
    sink = ScriptedSink()  # permfail@: 550 at RCPT; the sender's mailbox takes its DSNs
    yield sink
    sink.stop()


def _config(root: Path, sink: ScriptedSink, **delivery: str) -> Path:
    config = {
        "node": {"name": "crash", "workers": 1},
        "smtp": {"listen": [f"127.0.0.1:{free_port()}"], "hostname": "mx.pigeon.test"},
        "http": {"listen": f"127.0.0.1:{free_port()}"},
        "spool": {"path": "spool"},
        "log": {"path": "log"},
        "delivery": {"enabled": True, "idle_timeout": "1s", **delivery},
        "dns": {"nameservers": ["127.0.0.1:9"], "timeout": "1s"},
        "route": [{"domain": "*", "next_hop": sink.endpoint, "tls": "disabled"}],
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "pigeon.toml").write_text(to_toml(config))
    return root / "pigeon.toml"


async def _spool_message(directory: Path, shard: int, recipients: list[str], age: float = 0.0) -> None:
    """A message waiting in shard `shard` (as a run with more workers would have left it),
    which arrived `age` seconds ago."""
    spool = SqliteSpool(directory, shard=shard)
    spool.open(asyncio.get_running_loop())
    try:
        [message_id] = spool.new_ids(1)
        writer = spool.body_writer(message_id)
        writer.write(MESSAGE)
        envelope = Envelope("sender@example.org", [Recipient(r) for r in recipients])
        now = time.time()
        await spool.store(writer.finish(), [NewMessage(message_id, "d1.test", envelope, now - age, now)])
    finally:
        spool.close()


async def _until(predicate: Callable[[], Any], within: float = 20.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not met within {within}s")


@pytest.mark.parametrize("shard", [0, 1], ids=["own-shard", "adopted-shard"])
async def test_a_crash_just_after_a_dsn_is_stored_leaves_the_sender_one_dsn_and_each_recipient_one_bounce(
    tmp_path: Path, sink: ScriptedSink, disk: _Disk, shard: int
) -> None:
    recipients = ["permfail@d1.test"]
    # Shard 1 is one a run with two workers left: this single worker adopts it.
    await _spool_message(shard_directory(tmp_path / "spool", shard), shard, recipients)
    path = _config(tmp_path, sink)
    disk.armed = True
    node = Node(load(path))
    await node.start()
    try:
        await _until(lambda: disk.dead)
        await asyncio.sleep(1.5)  # what the node would do next, had it lived (none of it lands)
    finally:
        await node.stop()

    disk.armed = disk.dead = False
    node = Node(load(path))
    await node.start()
    try:
        await _until(lambda: any(r.sender in ("", "<>") for r in sink.received))
        await _until(lambda: node.spool.count + sum(s.count for s in node.adopted) == 0)
        await asyncio.sleep(1.0)  # a retry of the bounced recipients would come at once
    finally:
        await node.stop()

    dsns = {m.group(1) for r in sink.received if r.sender in ("", "<>") and (m := DSN_ID.search(r.data))}
    assert len(dsns) == 1, f"the sender got {len(dsns)} DSNs for one bounce: {sorted(dsns)}"
    [report] = {r.data for r in sink.received if r.sender in ("", "<>")}
    assert all(f"<{address}>".encode() in report for address in recipients)
    records = read_records(tmp_path / "log")
    ends = ("Delivery", "Bounce", "Expiration", "AdminBounce")
    terminal = [(r["type"], r["recipient"]) for r in records if r["type"] in ends and r["recipient"] in recipients]
    assert sorted(terminal) == [("Bounce", address) for address in recipients]


async def test_a_crash_just_after_a_delay_warning_is_stored_leaves_the_sender_that_one_warning(
    tmp_path: Path, sink: ScriptedSink, disk: _Disk
) -> None:
    # Past `delay_warning` from its first deferral: the first warns, and is the crash.
    await _spool_message(shard_directory(tmp_path / "spool", 0), 0, ["tempfail@d1.test"], age=10.0)
    path = _config(tmp_path, sink, delay_warning="2s", retry_interval="1s", max_retry_interval="1s")
    disk.armed = True
    node = Node(load(path))
    await node.start()
    try:
        await _until(lambda: disk.dead)
        await asyncio.sleep(1.5)  # what the node would do next, had it lived (none of it lands)
    finally:
        await node.stop()

    disk.armed = disk.dead = False
    node = Node(load(path))
    await node.start()
    try:
        await _until(lambda: any(r.sender in ("", "<>") for r in sink.received))
        deferrals = lambda: [r for r in read_records(tmp_path / "log") if r["type"] == "TransientFailure"]  # noqa: E731
        await _until(lambda: len(deferrals()) >= 3, within=30)  # retried, again and again
    finally:
        await node.stop()

    dsns = {m.group(1) for r in sink.received if r.sender in ("", "<>") and (m := DSN_ID.search(r.data))}
    assert len(dsns) == 1, f"the sender was warned {len(dsns)} times: {sorted(dsns)}"
    assert all(b"Action: delayed" in r.data for r in sink.received if r.sender in ("", "<>"))
    # The deferral the warning went with was committed (and logged) before the crash; none since warned.
    assert len([r for r in deferrals() if r.get("delay_notified")]) == 1
