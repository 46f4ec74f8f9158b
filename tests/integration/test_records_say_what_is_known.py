"""Event log records through a real node say what is known of their message without parsing:
its tenant and campaign apart from its queue, an injected recipient's refusal what the request
named, a DSN's reception the message it reports on, and an operator's rebind of a message."""

from __future__ import annotations

import smtplib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until


@pytest.fixture
def node(tmp_path: Path) -> Iterator[PigeonProcess]:
    with (
        ScriptedSink() as sink,
        PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, retry_interval="1h")) as pigeon,
    ):
        yield pigeon


def _send(pigeon: PigeonProcess, recipient: str, headers: str = "") -> None:
    data = f"From: <a@example.org>\r\n{headers}Subject: records\r\n\r\nHi.\r\n".encode()
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        assert client.sendmail("a@example.org", [recipient], data) == {}


def _of(records: list[dict[str, Any]], recipient: str) -> dict[str, Any]:
    (record,) = [r for r in records if recipient in r.get("recipients", [r.get("recipient")])]
    return record


def test_receptions_and_attempts_name_the_tenant_and_campaign_apart_from_the_queue(node: PigeonProcess) -> None:
    _send(node, "ok@live.test", "X-Tenant: acme\r\nX-Campaign: spring\r\n")
    _send(node, "plain@live.test")
    receptions = node.wait_records("Reception", 2)
    deliveries = node.wait_records("Delivery", 2)
    for record in (_of(receptions, "ok@live.test"), _of(deliveries, "ok@live.test")):
        assert (record["queue"], record["tenant"], record["campaign"]) == ("spring:acme@live.test", "acme", "spring")
    for record in (_of(receptions, "plain@live.test"), _of(deliveries, "plain@live.test")):
        assert record["queue"] == "live.test" and "tenant" not in record and "campaign" not in record


def test_an_injected_recipient_refused_names_the_tenant_campaign_and_metadata_of_its_message(
    node: PigeonProcess,
) -> None:
    request = {
        "envelope_sender": "news@example.org",
        "tenant": "acme",
        "campaign": "spring",
        "recipients": [
            {"email": "ann@live.test", "substitutions": {"code": "A1"}},
            {"email": "bob@live.test", "metadata": {"user": "42"}},  # no `code`: refused
        ],
        "content": {"from": {"email": "news@example.org"}, "subject": "Your code", "text": "Code: {{ code }}\n"},
    }
    status, answer = node.http_post("/api/v1/inject", request, node.local_token)
    assert (status, answer["accepted"], answer["failed"]) == (200, 1, 1), answer
    (refused,) = [r for r in node.wait_records("Rejection") if r["command"] == "inject"]
    assert refused["recipients"] == ["bob@live.test"]
    assert refused["response"]["code"] == 554
    assert (refused["tenant"], refused["campaign"], refused["meta"]) == ("acme", "spring", {"user": "42"})


def test_a_dsn_reception_names_the_message_it_reports_on(node: PigeonProcess) -> None:
    _send(node, "permfail@live.test")
    (bounce,) = node.wait_records("Bounce")
    dsn = wait_until(lambda: [r for r in node.records("Reception") if r["protocol"] == "LOCAL"])
    assert [r["reports_on"] for r in dsn] == [bounce["id"]]
    (original,) = [r for r in node.records("Reception") if r["protocol"] != "LOCAL"]
    assert "reports_on" not in original


def test_a_rebind_writes_a_record_for_each_message_it_moves(node: PigeonProcess) -> None:
    _send(node, "tempfail@live.test", "X-Tenant: acme\r\nX-Campaign: ca\r\n")
    _send(node, "tempfail@other.test", "X-Tenant: acme\r\nX-Campaign: ca\r\n")
    node.wait_records("TransientFailure", 2)  # both wait an hour in the spool
    body = {"domain": "live.test", "to_queue": "cb:acme@live.test", "routing_domain": "relay.test"}
    status, answer = node.http_call("POST", "/api/v1/admin/rebind", body, node.local_token)
    assert (status, answer["rebound"]) == (200, 1), answer
    (rebind,) = node.wait_records("Rebind")
    (reception,) = [r for r in node.records("Reception") if r["recipients"] == ["tempfail@live.test"]]
    assert rebind["id"] == reception["id"]
    assert (rebind["queue"], rebind["from_queue"], rebind["route"]) == (
        "cb:acme@live.test",
        "ca:acme@live.test",
        "relay.test",
    )
    assert (rebind["tenant"], rebind["campaign"], rebind["recipients"]) == ("acme", "cb", ["tempfail@live.test"])
    assert rebind["operator"] == "local" and rebind["operation"] == answer["operation"]
    # Tried at once from its new queue: its attempt's record is of the queue and campaign it is in now.
    retried = wait_until(lambda: [r for r in node.records("TransientFailure") if r["queue"] == "cb:acme@live.test"])
    assert retried[0]["campaign"] == "cb"
