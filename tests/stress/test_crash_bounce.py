"""kill -9 while bouncing: every bounced message gives its sender exactly one DSN, and every
recipient exactly one terminal record, across the crash and a restart with fewer workers
(whose shards are then adopted, and bounce there)."""

from __future__ import annotations

import collections
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until
from tests.support.tools import SMTP_SOURCE, require

QUEUED = re.compile(r"<<< 250 (?:2\.0\.0 )?Ok: queued as ([0-9a-f]{16})")
DSN_ID = re.compile(rb"Received: by relay\.pigeon\.test \(Pigeon\) id ([0-9a-f]{16})")
REPORTS_ON = re.compile(rb"X-Pigeon-Queue-ID: ([0-9a-f]{16})")


@pytest.mark.timeout(600)
def test_kill_9_while_bouncing_gives_each_bounced_message_one_dsn(tmp_path: Path) -> None:
    sent, kill_after = 1500, 300
    sink = ScriptedSink()
    # Every recipient smtp-source makes ("no@", "2no@", "3no@") is refused; the sender's
    # mailbox takes the DSNs.
    sink.rcpt_reply = lambda address: "550 5.1.1 no such user here" if "no@" in address else None
    config = delivery_config(sink.endpoint, connection_limit=8)
    config["smtp"] = {"hostname": "relay.pigeon.test"}
    config["log"] = {"level": "info"}
    relay = PigeonProcess(tmp_path / "relay", node={"workers": 2}, **config).start()
    transcript = tmp_path / "smtp-source.log"
    try:
        with open(transcript, "wb") as out:
            source = subprocess.Popen(
                [require(SMTP_SOURCE), "-v", "-s", "20", "-l", "1024", "-m", str(sent), "-r", "3",
                 "-f", "a@src.test", "-t", "no@sink.test", f"127.0.0.1:{relay.smtp_port}"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_until(lambda: len(relay.records("Bounce")) >= kill_after, timeout=120)
        relay.kill()
        source.wait(60)
        acknowledged = set(QUEUED.findall(transcript.read_text(errors="replace")))

        relay = PigeonProcess(tmp_path / "relay", node={"workers": 1}, **config).start()
        wait_until(lambda: relay.spool_messages() == [], timeout=180)
        relay.stop()
        records = relay.records()
    finally:
        relay.kill()
        sink.stop()

    reports: dict[str, set[bytes]] = collections.defaultdict(set)  # bounced message -> its DSNs
    for received in sink.received:
        if received.sender in ("", "<>"):
            dsn, about = DSN_ID.search(received.data), REPORTS_ON.search(received.data)
            assert dsn and about, received.data[:400]
            reports[about.group(1).decode()].add(dsn.group(1))
    twice = {message: len(dsns) for message, dsns in reports.items() if len(dsns) > 1}
    assert not twice, f"{len(twice)} bounced messages gave their sender more than one DSN: {twice}"
    assert acknowledged <= set(reports), f"{len(acknowledged - set(reports))} bounced messages gave no DSN"
    terminal = collections.Counter(
        (r["id"], r["recipient"]) for r in records if r["type"] in ("Delivery", "Bounce", "Expiration", "AdminBounce")
    )
    # smtp-source's recipients: no@, 2no@, 3no@
    addresses = ("no@sink.test", "2no@sink.test", "3no@sink.test")
    not_once = {(m, a): terminal[(m, a)] for m in acknowledged for a in addresses if terminal[(m, a)] != 1}
    assert not not_once, f"{len(not_once)} recipients without exactly one terminal record: {list(not_once)[:5]}"
