"""README: "Optional fields are omitted when empty." Records of SMTP and HTTP receptions,
refusals at both doors, deliveries, a bounce and the DSN it sends carry no empty field, but the
null sender ("sender": "" is the sender Pigeon's DSNs have)."""

from __future__ import annotations

import smtplib
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

TOKEN = "inject-token-0123456789"
_EMPTY = ("", None, [], {})


def test_records_leave_out_optional_fields_that_are_empty(tmp_path: Path) -> None:
    # Found from outside: every HTTP Reception had "helo":"" and every DSN's Reception (protocol
    # LOCAL) had "peer":"".
    tokens = [{"name": "app", "token": TOKEN, "scopes": ["inject"]}]
    with (
        ScriptedSink() as sink,
        PigeonProcess(tmp_path / "node", http={"token": tokens}, **delivery_config(sink.endpoint)) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("client.test")
            client.sendmail("me@example.org", ["ok@example.net", "permfail@example.net"], b"Subject: x\r\n\r\nhi\r\n")
            client.mail("me@example.org")
            assert client.rcpt("no address")[0] == 501
        content = {"from": {"email": "app@example.org"}, "subject": "s", "text": "t"}
        request = {"envelope_sender": "app@example.org", "recipients": [{"email": "ann@example.net"}]}
        assert pigeon.http_post("/api/v1/inject", {**request, "content": content}, TOKEN)[0] == 200
        assert pigeon.http_post("/api/v1/inject", {**request, "bogus": 1}, TOKEN)[0] == 400
        # ok@, ann@ and the DSN of permfail@'s bounce to me@example.org
        wait_until(lambda: len(pigeon.records("Delivery")) == 3)
        records = pigeon.records()

    by_protocol = {r["protocol"]: r for r in records if r["type"] == "Reception"}
    assert set(by_protocol) == {"ESMTP", "HTTP", "LOCAL"}
    assert "helo" not in by_protocol["HTTP"] and by_protocol["HTTP"]["peer"].startswith("127.0.0.1:")
    assert "peer" not in by_protocol["LOCAL"] and by_protocol["LOCAL"]["sender"] == ""
    assert {r["type"] for r in records} >= {"Reception", "Rejection", "Delivery", "Bounce"}
    empty = [(r["type"], name) for r in records for name, value in r.items() if value in _EMPTY and name != "sender"]
    assert empty == []
