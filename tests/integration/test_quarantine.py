"""An unreadable spool entry is set aside in quarantine and logged, never silently dropped."""

from __future__ import annotations

import json
import shlex
import smtplib
import sqlite3
import subprocess
from pathlib import Path

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config


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


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run([*args], text=True, timeout=60)


def test_quarantine_lists_each_entry_with_its_reason_and_saves_what_can_be_sent_again(tmp_path: Path) -> None:
    """`pigeon quarantine` reads the spool beside a running node: a message whose queue name
    broke (envelope and body intact) is saved with the `pigeon inject` command that sends it
    again, and sending it delivers it; one whose segment lost its body is listed, not saved."""
    root = tmp_path / "node"
    big = b"Subject: big\r\n\r\n" + (b"x" * 76 + b"\r\n") * 400  # 31 KB: a body in a segment
    with PigeonProcess(root) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail(
            "sender@example.org",
            ["saved@example.net"],
            b"From: sender@example.org\r\nSubject: rescue me\r\n\r\nbody\r\n",
        )
        client.sendmail("sender@example.org", ["lost@example.net"], big)
        client.sendmail("sender@example.org", ["kept@example.net"], b"Subject: fine\r\n\r\nbody\r\n")
    shard = root / "spool" / "shard-0"
    conn = sqlite3.connect(shard / "spool.db")
    (saved_id,) = conn.execute("SELECT id FROM message WHERE size < 20000 ORDER BY id LIMIT 1").fetchone()
    conn.execute("UPDATE message SET queue = CAST(x'ff' AS TEXT) WHERE id = ?", (saved_id,))
    (lost_id, segment) = conn.execute(
        "SELECT m.id, b.segment FROM message m JOIN body b ON b.id = m.body WHERE m.size > 20000"
    ).fetchone()
    conn.commit()
    conn.close()
    with (shard / "segments" / f"{segment:016x}").open("r+b") as file:
        file.truncate(100)
    rescued = tmp_path / "rescued"
    with ScriptedSink() as sink, PigeonProcess(root, **delivery_config(sink.endpoint)) as pigeon:
        pigeon.wait_stderr(" 2 quarantined")
        config = str(pigeon.config_path)
        listed = _cli("quarantine", "-c", config)
        assert listed.returncode == 0, listed.stderr
        assert f"{saved_id:016x}" in listed.stdout and "queue name is not UTF-8" in listed.stdout
        assert f"{lost_id:016x}" in listed.stdout and "ends before body" in listed.stdout
        assert "2 quarantined entries" in listed.stdout
        as_json = _cli("quarantine", "-c", config, "--json")
        entries = {entry["id"]: entry for entry in map(json.loads, as_json.stdout.splitlines())}
        assert entries[f"{saved_id:016x}"]["recipients"] == ["saved@example.net"]
        assert entries[f"{lost_id:016x}"]["body_bytes"] is None
        saving = _cli("quarantine", "-c", config, "--save", str(rescued))
        assert saving.returncode == 0, saving.stderr
        assert sorted(p.name for p in rescued.iterdir()) == [f"{saved_id:016x}.eml", f"{saved_id:016x}.json"]
        assert "not saved" in saving.stdout
        command = next(line for line in saving.stdout.splitlines() if line.strip().startswith("pigeon inject"))
        assert " --to=saved@example.net " in command  # (one word: an address may start with "-")
        sent = _cli(*shlex.split(command)[1:])  # as printed: it names the node's config
        assert sent.returncode == 0, sent.stderr
        delivered = {m.recipients[0]: m.email for m in sink.wait_for(2)}
        assert delivered["saved@example.net"]["Subject"] == "rescue me"
        assert "kept@example.net" in delivered
        # Sent again: the entry is removed beside the running node, and is gone from the list.
        removed = _cli("quarantine", "-c", config, "--remove", f"{saved_id:016x}")
        assert (removed.returncode, removed.stdout) == (0, f"removed {saved_id:016x}\n"), removed.stderr
        again = _cli("quarantine", "-c", config, "--remove", f"{saved_id:016x}")
        assert again.returncode == 1 and "no quarantined entry" in again.stderr
        listed = _cli("quarantine", "-c", config)
        assert f"{saved_id:016x}" not in listed.stdout and "1 quarantined entry" in listed.stdout
        bad = _cli("quarantine", "-c", config, "--remove", "12")
        assert bad.returncode == 2 and "16 hex digits" in bad.stderr
    with PigeonProcess(root) as pigeon:  # the next start frees the removed entry's body
        pigeon.wait_stderr(" 0 quarantined")
    conn = sqlite3.connect(shard / "spool.db")
    bodies = {row[0] for row in conn.execute("SELECT id FROM body")}
    kept = {row[0] for row in conn.execute("SELECT body FROM message UNION SELECT body FROM quarantine")}
    conn.close()
    assert bodies == kept, "a body nothing refers to was kept"
    not_a_directory = tmp_path / "a-file"
    not_a_directory.write_text("")
    refused = _cli("quarantine", "--spool", str(root / "spool"), "--save", str(not_a_directory))
    assert refused.returncode == 1 and "cannot save into" in refused.stderr and "Traceback" not in refused.stderr
    empty = _cli("quarantine", "--spool", str(tmp_path))
    assert empty.returncode == 1 and "holds no spool" in empty.stderr
