"""An unreadable spool entry is set aside in quarantine and logged, never silently dropped."""

from __future__ import annotations

import smtplib
import sqlite3
from pathlib import Path

from tests.support.process import PigeonProcess


def test_corrupt_entry_is_quarantined_and_logged_after_the_start(tmp_path: Path) -> None:
    root = tmp_path / "node"
    with PigeonProcess(root) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        for n in range(3):
            client.sendmail("sender@example.org", [f"user{n}@example.net"], b"Subject: x\r\n\r\nbody\r\n")
    db = root / "spool" / "shard-0" / "spool.db"
    conn = sqlite3.connect(db)
    victim = conn.execute("SELECT id FROM message ORDER BY id LIMIT 1").fetchone()[0]
    conn.execute("UPDATE message SET envelope = x'c1c1c1' WHERE id = ?", (victim,))
    conn.commit()
    conn.close()
    with PigeonProcess(root) as pigeon:
        # Set aside by the check that runs once the node serves.
        (record,) = pigeon.wait_records("Quarantine")
        assert record["id"] == f"{victim:016x}"
        assert "envelope does not decode" in record["reason"]
        pigeon.wait_stderr(" 1 quarantined")
        assert len(pigeon.spool_messages()) == 2
        assert pigeon.metric("pigeon_spool_quarantined_total") == 1
        assert pigeon.metric("pigeon_spool_messages") == 2
    conn = sqlite3.connect(db)
    (kept,) = conn.execute("SELECT id, reason, envelope FROM quarantine").fetchall()
    assert kept[0] == victim
    assert kept[2] == b"\xc1\xc1\xc1"  # kept for an operator, as it was
