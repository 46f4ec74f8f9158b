"""Delay warnings (`[delivery] delay_warning`, Postfix's `delay_warning_time`), through real
nodes and sinks: a message still being retried that long after it arrived gets its sender one
"delayed" DSN (RFC 3464 `Action: delayed`), however many retries follow, a restart (`kill -9`)
among them; then its delivery or its failure is reported as it would be without it. A NOTIFY
without DELAY gets none, and with the setting off (the default) nobody does, NOTIFY=DELAY or not.

The next hop defers with 451 while `State.defer` says so; the senders' domain has a sink of
its own, which receives the DSNs and nothing else."""

from __future__ import annotations

import email.utils
import smtplib
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: delayed\r\nX-Secret: the body stays home\r\n\r\nThe body.\r\n"
GREYLISTED = "451 4.7.1 greylisted, try again later"


class State:
    defer = True


def _config(sink: ScriptedSink, dsn_sink: ScriptedSink, **delivery: Any) -> dict[str, Any]:
    """Deliveries to `sink`, which defers while `state.defer`; the DSNs (to example.org) to `dsn_sink`."""
    config = delivery_config(sink.endpoint, **delivery)
    config["route"] = [{"domain": "example.org", "next_hop": dsn_sink.endpoint, "tls": "disabled"}, *config["route"]]
    return config


def _deferring(sink: ScriptedSink) -> State:
    state = State()
    sink.rcpt_reply = lambda address: GREYLISTED if state.defer else None
    return state


def _send(pigeon: PigeonProcess, recipients: list[str], notify: str | None = None) -> str:
    """Sends MESSAGE (to one domain); its spool id."""
    options = [f"NOTIFY={notify}"] if notify else []
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo()
        assert client.sendmail("sender@example.org", recipients, MESSAGE, rcpt_options=options) == {}
    return str(pigeon.wait_records("Reception", 1)[0]["id"])


def _status_blocks(dsn: Message) -> list[Message]:
    """The per-recipient blocks of a DSN's delivery-status part."""
    return list(dsn.get_payload()[1].get_payload()[1:])  # (the first is the per-message one)


def _deferrals_after(pigeon: PigeonProcess, count: int) -> None:
    """Waits for `count` more deferrals than there are now."""
    before = len(pigeon.records("TransientFailure"))
    pigeon.wait_records("TransientFailure", before + count, timeout=30)


@pytest.mark.parametrize("notify", [None, "DELAY", "FAILURE,DELAY"])
def test_a_message_deferred_past_delay_warning_gets_one_delayed_dsn_however_many_retries_follow(
    tmp_path: Path, notify: str | None
) -> None:
    with ScriptedSink() as sink, ScriptedSink() as dsn_sink:
        state = _deferring(sink)
        config = _config(sink, dsn_sink, delay_warning="2s", max_age="1h")
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            message_id = _send(pigeon, ["late@example.net", "later@example.net"], notify)
            (dsn,) = dsn_sink.wait_for(1, timeout=30)
            _deferrals_after(pigeon, 6)  # three more attempts, two recipients each
            state.defer = False
            pigeon.wait_records("Delivery", 3, timeout=30)  # the two recipients', and the DSN's
            assert len(dsn_sink.received) == 1, "warned more than once"

            assert dsn.sender in ("", "<>") and dsn.recipients == ["sender@example.org"]
            report = dsn.email
            assert report["Subject"] == "Delayed Mail (still being retried)"
            assert report.get_content_type() == "multipart/report"
            blocks = _status_blocks(report)
            assert {b["Final-Recipient"] for b in blocks} == {"rfc822; late@example.net", "rfc822; later@example.net"}
            arrival = email.utils.parsedate_to_datetime(report.get_payload()[1].get_payload()[0]["Arrival-Date"])
            for block in blocks:
                assert (block["Action"], block["Status"]) == ("delayed", "4.7.1")
                assert block["Diagnostic-Code"] == f"smtp; {GREYLISTED}"
                assert block["Remote-MTA"] == "dns; [127.0.0.1]"
                until = email.utils.parsedate_to_datetime(block["Will-Retry-Until"])
                assert 3599 <= (until - arrival).total_seconds() <= 3601  # arrival + max_age
            text = report.get_payload()[0].get_payload(decode=True).decode()
            assert "THIS IS A WARNING ONLY" in text and "It will be tried again until" in text
            assert "<late@example.net>: greylisted, try again later" in text
            returned = report.get_payload()[2]
            assert returned.get_content_type() == "text/rfc822-headers"  # headers only
            assert b"The body." not in dsn.data

            # The DSN's Reception says which message it reports on; one deferral says it told.
            receptions = [r for r in pigeon.records("Reception") if r.get("reports_on") == message_id]
            assert len(receptions) == 1 and receptions[0]["sender"] == ""
            told = [r for r in pigeon.records("TransientFailure") if r.get("delay_notified")]
            assert sorted(r["recipient"] for r in told) == ["late@example.net", "later@example.net"]
            assert len({r["attempt"] for r in told}) == 1


def test_a_warned_message_that_then_expires_gets_its_failure_dsn_as_usual(tmp_path: Path) -> None:
    with ScriptedSink() as sink, ScriptedSink() as dsn_sink:
        _deferring(sink)
        config = _config(sink, dsn_sink, delay_warning="2s", max_age="6s")
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            _send(pigeon, ["late@example.net"])
            pigeon.wait_records("Expiration", 1, timeout=30)
            delayed, failed = dsn_sink.wait_for(2, timeout=20)
            assert delayed.email["Subject"] == "Delayed Mail (still being retried)"
            assert failed.email["Subject"] == "Undelivered Mail Returned to Sender"
            assert [b["Action"] for b in _status_blocks(failed.email)] == ["failed"]
            assert [b["Status"] for b in _status_blocks(failed.email)] == ["5.4.7"]
            wait_until(lambda: len(pigeon.records("Delivery")) == 2)  # both DSNs left
            assert len(dsn_sink.received) == 2


@pytest.mark.parametrize(
    ("notify", "delay_warning"),
    [("FAILURE", "2s"), ("NEVER", "2s"), ("DELAY", None), (None, None), ("DELAY", "0")],
    ids=["notify-failure", "notify-never", "notify-delay-warning-off", "warning-off", "warning-zero"],
)
def test_no_delayed_dsn_without_delay_in_notify_or_with_delay_warning_off(
    tmp_path: Path, notify: str | None, delay_warning: str | None
) -> None:
    with ScriptedSink() as sink, ScriptedSink() as dsn_sink:
        state = _deferring(sink)
        settings: dict[str, Any] = {"max_age": "1h"}
        if delay_warning is not None:
            settings["delay_warning"] = delay_warning
        config = _config(sink, dsn_sink, **settings)
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            _send(pigeon, ["late@example.net"], notify)
            # Past 2 s after its arrival, deferred again and again.
            wait_until(lambda: [r for r in pigeon.records("TransientFailure") if r["timestamp"] - r["created"] > 3])
            _deferrals_after(pigeon, 1)
            state.defer = False
            pigeon.wait_records("Delivery", 1, timeout=30)
            assert dsn_sink.received == []
            assert not any(r.get("delay_notified") for r in pigeon.records("TransientFailure"))


def test_a_queue_may_have_its_own_delay_warning(tmp_path: Path) -> None:
    with ScriptedSink() as sink, ScriptedSink() as dsn_sink:
        _deferring(sink)
        config = _config(sink, dsn_sink, delay_warning="2s", max_age="1h")
        queues = [{"name": "quiet.example", "delay_warning": "0"}]
        with PigeonProcess(tmp_path / "node", queue=queues, **config) as pigeon:
            _send(pigeon, ["late@quiet.example"])
            _send(pigeon, ["late@example.net"])
            (dsn,) = dsn_sink.wait_for(1, timeout=30)
            assert [b["Final-Recipient"] for b in _status_blocks(dsn.email)] == ["rfc822; late@example.net"]
            _deferrals_after(pigeon, 6)
            assert len(dsn_sink.received) == 1
            told = {r["recipient"] for r in pigeon.records("TransientFailure") if r.get("delay_notified")}
            assert told == {"late@example.net"}


def test_a_warned_message_is_not_warned_again_after_kill_9(tmp_path: Path) -> None:
    with ScriptedSink() as sink, ScriptedSink() as dsn_sink:
        state = _deferring(sink)
        config = _config(sink, dsn_sink, delay_warning="2s", max_age="1h")
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            _send(pigeon, ["late@example.net"])
            dsn_sink.wait_for(1, timeout=30)
            wait_until(lambda: pigeon.records("Delivery"))  # (the DSN left: it is not sent again)
            pigeon.kill()
            pigeon.start()
            _deferrals_after(pigeon, 3)
            state.defer = False
            wait_until(lambda: len(pigeon.records("Delivery")) == 2, timeout=30)
            assert len(dsn_sink.received) == 1
