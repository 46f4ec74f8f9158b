"""kill -9 while relaying: every accepted message is delivered, duplicates are bounded by what
was in flight, and every recipient ends with exactly one terminal record."""

from __future__ import annotations

import collections
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import delivery_config, wait_until
from tests.support.tools import SMTP_SOURCE, require

QUEUED = re.compile(r"<<< 250 (?:2\.0\.0 )?Ok: queued as ([0-9a-f]{16})")
RELAY_ID = re.compile(rb"by relay\.pigeon\.test \(Pigeon\) with E?SMTP id ([0-9a-f]{16})")


# Its waits add up to more than the default per-test timeout on a slow machine.
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("sent", "kill_after", "size"),
    # Killed relaying (8 deliveries in flight) with a backlog the restart must deliver, while
    # smtp-source still sends; -m slow: three times the backlog, 20,000 sent. 40 KiB bodies
    # are in segments, which the restart reads them back from.
    [(5000, 1000, 2048), (1500, 400, 40960), pytest.param(20_000, 3000, 2048, marks=pytest.mark.slow)],
)
def test_kill_9_while_relaying_loses_nothing_and_logs_each_recipient_once(
    tmp_path: Path, sent: int, kill_after: int, size: int
) -> None:
    sink = PigeonProcess(tmp_path / "sink", log={"level": "info"}).start()
    relay_config = delivery_config(f"127.0.0.1:{sink.smtp_port}", connection_limit=8)
    relay_config["smtp"] = {"hostname": "relay.pigeon.test"}
    relay_config["log"] = {"level": "info"}
    relay_config["spool"] = {"segment_size": "2MiB"}
    relay = PigeonProcess(tmp_path / "relay", **relay_config).start()
    transcript = tmp_path / "smtp-source.log"
    try:
        with open(transcript, "wb") as out:
            source = subprocess.Popen(
                [require(SMTP_SOURCE), "-v", "-s", "20", "-l", str(size), "-m", str(sent),
                 "-f", "a@src.test", "-t", "r@sink.test", f"127.0.0.1:{relay.smtp_port}"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_until(lambda: len(QUEUED.findall(transcript.read_text(errors="replace"))) >= kill_after, timeout=120)
        wait_until(lambda: relay.records("Delivery"), timeout=30)  # it is relaying, not just accepting
        relay.kill()
        source.wait(60)
        acknowledged = set(QUEUED.findall(transcript.read_text(errors="replace")))

        relay = PigeonProcess(tmp_path / "relay", **relay_config).start()
        wait_until(lambda: relay.spool_messages() == [], timeout=120)
        relay.stop()
        relay_records = relay.records()
        # Everything delivered, the space is given back: at most the segment that was being
        # appended to at the stop is left (segment_size is 2 MiB; 60 MB went through).
        left = [p.stat().st_size for p in relay.spool_path.glob("shard-*/segments/*")]
        assert len(left) <= 1 and sum(left) <= 3 * 1024 * 1024, left
    finally:
        relay.kill()
        sink.stop()
        sink.kill()

    arrivals = collections.Counter()
    for message in sink.spool_messages():
        match = RELAY_ID.search(message["data"])
        assert match, message["data"][:300]
        arrivals[match.group(1).decode()] += 1
    lost = acknowledged - set(arrivals)
    assert not lost, f"{len(lost)} acknowledged messages never arrived"
    duplicates = sum(n - 1 for n in arrivals.values())
    assert duplicates <= 8 * 2, f"{duplicates} duplicates; at most the messages in flight at the kill"

    received = {r["id"] for r in relay_records if r["type"] == "Reception"}
    assert acknowledged <= received
    terminal = collections.Counter(
        (r["id"], r["recipient"]) for r in relay_records if r["type"] in ("Delivery", "Bounce", "Expiration")
    )
    assert set(terminal) == {(spool_id, "r@sink.test") for spool_id in received}
    assert set(terminal.values()) == {1}, "a recipient has more than one terminal record"
    final = ("Delivery", "Bounce", "Expiration")
    outcomes = collections.Counter(r["type"] for r in relay_records if r["type"] in final)
    assert set(outcomes) == {"Delivery"}, f"the sink takes everything, yet: {outcomes}"
