"""An address nobody takes at a domain Pigeon receives inbound mail for is unknown there
(550 5.1.1), not a relay attempt (550 5.7.1): the sender learns the address is wrong, not
that it is knocking at the wrong server. A relay client is still relayed."""

from __future__ import annotations

import smtplib
from pathlib import Path

from tests.support.process import PigeonProcess

UNKNOWN = (550, b"5.1.1 No such recipient here")
RELAY_DENIED = (550, b"5.7.1 Relay access denied")


def test_an_unknown_address_at_an_inbound_domain_is_refused_as_unknown_and_relayed_for_relay_clients(
    tmp_path: Path,
) -> None:
    node = PigeonProcess(
        tmp_path / "p",
        smtp={"relay_networks": ["127.0.0.2/32"]},  # 127.0.0.1 is outside, 127.0.0.2 a relay client
        target=[{"name": "app", "kind": "maildir", "path": str(tmp_path / "Maildir")}],
        inbound=[
            {"recipient": "reply+*@App.Example", "target": "app"},
            {"recipient": "support@*.glob.example", "target": "app"},  # names no domain as it is
            {"domain": "hook.example", "target": "app"},
        ],
    )
    with node, smtplib.SMTP("127.0.0.1", node.smtp_port) as outside:
        outside.ehlo("outside.test")
        assert outside.mail("customer@example.com")[0] == 250
        assert outside.rcpt("<reply+1@app.example>")[0] == 250
        assert outside.rcpt("<anyone@hook.example>")[0] == 250
        assert outside.rcpt("<other@app.example>") == UNKNOWN
        assert outside.rcpt("<Other@APP.example>") == UNKNOWN
        assert outside.rcpt("<someone@elsewhere.example>") == RELAY_DENIED
        assert outside.rcpt("<other@eu.glob.example>") == RELAY_DENIED
        assert outside.rcpt("<other@sub.app.example>") == RELAY_DENIED
        with smtplib.SMTP("127.0.0.1", node.smtp_port, source_address=("127.0.0.2", 0)) as relay:
            relay.ehlo("inside.test")
            assert relay.mail("app@example.org")[0] == 250
            assert relay.rcpt("<other@app.example>")[0] == 250  # relayed, as before
        rejections = node.wait_records("Rejection", 5)
    assert [r["response"]["enhanced"] for r in rejections] == ["5.1.1", "5.1.1", "5.7.1", "5.7.1", "5.7.1"]
