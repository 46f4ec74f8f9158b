"""The daemon's log (its stderr) never carries a control or bidirectional character that someone
else chose: a remote server's reply matched by a `[[reaction]]`, an admin's reason and selector
reach it escaped, as `pigeon` shows them, whatever line logs them."""

from __future__ import annotations

import smtplib
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

ADMIN = "admin-token-0123456789"
REPLY = "451 4.7.1 later \x1b]0;title\x07\u202e gnp.exe"


def test_the_daemon_log_shows_others_control_and_bidi_characters_escaped(tmp_path: Path) -> None:
    reaction = {"id": "later", "match": r"^451 4\.7\.1 later", "action": "suspend", "duration": "1h"}
    with (
        ScriptedSink(smtputf8=True) as sink,  # (to send the U+202E at all)
        PigeonProcess(
            tmp_path / "node",
            log={"level": "info"},
            http={"token": [{"name": "ops", "token": ADMIN, "scopes": ["admin", "read"]}]},
            reaction=[reaction],
            **delivery_config(sink.endpoint, retry_interval="1h"),
        ) as pigeon,
    ):
        sink.rcpt_reply = lambda address: REPLY
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["b@example.net"], b"Subject: x\r\n\r\nhi\r\n")
        effect = pigeon.wait_stderr("shaping effect ")
        body = {"queue": "q*", "reason": "evil \x1b]0;T\x07\u202e\nFORGED line"}
        status, answer = pigeon.http_call("POST", "/api/v1/admin/suspend", body, ADMIN)
        assert status == 200, answer
        log = pigeon.wait_stderr("admin suspend by ")
    assert r"451 4.7.1 later \x1b]0;title\x07\u202e gnp.exe" in effect
    assert r"(evil \x1b]0;T\x07\u202e\x0aFORGED line)" in log
    assert not [line for line in log.splitlines() if not line.isprintable()]
    assert not [line for line in log.splitlines() if line.startswith("FORGED")]
