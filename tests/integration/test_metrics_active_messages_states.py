"""`pigeon_active_messages{state}` has a sample for every state a message in memory can be in,
0 when none: a gauge with no series gives an alert "no data", not 0. Found from outside: with
332 deferred messages in the spool (none in memory), /metrics had its HELP and TYPE lines alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import wait_until
from tests.support.tools import smtp_source

STATES = ("scheduled", "ready", "in_flight", "settling")


def active_messages(pigeon: PigeonProcess) -> dict[str, float]:
    status, body = pigeon.http_get("/metrics")
    assert status == 200
    text = body.decode()
    assert "# TYPE pigeon_active_messages gauge" in text
    return {
        state: float(value)
        for state, value in re.findall(r'^pigeon_active_messages\{state="([^"]+)"\} (\S+)$', text, re.MULTILINE)
    }


def spool_messages(pigeon: PigeonProcess) -> float:
    _, body = pigeon.http_get("/metrics")
    return float(re.findall(r"^pigeon_spool_messages (\S+)$", body.decode(), re.MULTILINE)[0])


@pytest.mark.parametrize(("workers", "delivery"), [(1, True), (2, True), (1, False)])
def test_every_state_has_a_sample_zero_when_no_message_is_in_it(tmp_path: Path, workers: int, delivery: bool) -> None:
    with PigeonProcess(tmp_path / "node", node={"workers": workers}, delivery={"enabled": delivery}) as pigeon:
        assert active_messages(pigeon) == dict.fromkeys(STATES, 0.0)


def test_deferred_mail_is_in_the_spool_not_in_memory_and_every_state_says_zero(tmp_path: Path) -> None:
    # The tester's node: mail deferred (here: its MX not found, the DNS server does not answer)
    # waits in the spool for its next attempt, counted by pigeon_spool_messages alone.
    with PigeonProcess(tmp_path / "node", delivery={"enabled": True}) as pigeon:
        sent = smtp_source(pigeon.smtp_port, "-m", "2", "-f", "a@src.test", "-t", "r@x.test")
        assert sent.returncode == 0, sent.stderr
        wait_until(lambda: b'"TransientFailure"' in b"".join(p.read_bytes() for p in pigeon.root.glob("log/*.jsonl")))
        wait_until(lambda: active_messages(pigeon) == dict.fromkeys(STATES, 0.0), timeout=10)
        assert spool_messages(pigeon) == 2
