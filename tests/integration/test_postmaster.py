"""RFC 5321 4.5.1: <postmaster> without a domain is taken from anyone, for the configured address."""

from __future__ import annotations

import smtplib
import time
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config

OUTSIDE = {"relay_networks": ["192.0.2.0/24"]}  # the test client is not a relay client


@pytest.mark.parametrize("spelling", ["postmaster", "PostMaster", "POSTMASTER"])
def test_postmaster_is_accepted_from_outside_relay_networks_and_reaches_the_configured_address(
    tmp_path: Path, spelling: str
) -> None:
    with (
        ScriptedSink() as sink,
        PigeonProcess(
            tmp_path / "node", smtp={**OUTSIDE, "postmaster": "ops@example.net"}, **delivery_config(sink.endpoint)
        ) as pigeon,
        smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client,
    ):
        client.ehlo("outside.test")
        assert client.mail("someone@example.org")[0] == 250
        assert client.rcpt(f"<{spelling}>")[0] == 250
        # Only that name: any other recipient is still relaying, and still refused.
        assert client.rcpt("<ops@example.net>") == (550, b"5.7.1 Relay access denied")
        code, _ = client.data(b"Subject: your server bounced my mail\r\n\r\nplease look\r\n")
        assert code == 250
        (received,) = sink.wait_for(1)
        assert received.recipients == ["ops@example.net"]
        assert received.email["Subject"] == "your server bounced my mail"
        (reception,) = pigeon.wait_records("Reception")
        assert reception["recipients"] == ["ops@example.net"]


def test_postmaster_goes_to_postmaster_at_the_hostname_by_default(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp=OUTSIDE) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            assert client.sendmail("", ["Postmaster"], b"Subject: hi\r\n\r\nhello\r\n") == {}
        (stored,) = pigeon.spool_messages()
        assert stored["recipients"] == ["postmaster@mx.pigeon.test"]


def test_postmaster_at_our_hostname_is_taken_from_anyone_too(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={**OUTSIDE, "postmaster": "ops@example.net"}) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("outside.test")
            assert client.mail("someone@example.org")[0] == 250
            assert client.rcpt("<PostMaster@MX.Pigeon.Test>")[0] == 250
            assert client.rcpt('<"postmaster"@mx.pigeon.test>')[0] == 250  # quoting is only syntax
            assert client.rcpt('<"Postmaster">')[0] == 250
            assert client.rcpt("<postmaster@elsewhere.test>") == (550, b"5.7.1 Relay access denied")
            assert client.data(b"Subject: hi\r\n\r\nhello\r\n")[0] == 250
        (stored,) = pigeon.spool_messages()
        assert stored["recipients"] == ["ops@example.net"]  # one mailbox named thrice: once


def test_postmaster_mail_from_anyone_that_fails_sends_no_dsn_to_the_sender_it_names(tmp_path: Path) -> None:
    """Anyone may write any sender: a DSN, with the whole message under RET=FULL, would be
    backscatter to a victim of their choice."""
    with (
        ScriptedSink() as sink,
        PigeonProcess(
            tmp_path / "node", smtp={**OUTSIDE, "postmaster": "permfail@example.net"}, **delivery_config(sink.endpoint)
        ) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("outside.test")
            assert client.mail("victim@example.org", ["RET=FULL"])[0] == 250
            assert client.rcpt("<postmaster>", ["NOTIFY=FAILURE"])[0] == 250
            assert client.data(b"Subject: spam for the victim\r\n\r\nbuy now\r\n")[0] == 250
        (bounce,) = pigeon.wait_records("Bounce")
        assert bounce["recipient"] == "permfail@example.net"
        time.sleep(2)  # a DSN would be stored with the bounce and sent at once
        assert not [r for r in sink.received if "victim@example.org" in r.recipients]
        assert not pigeon.spool_messages()


def test_an_injection_and_pigeon_inject_take_postmaster_as_smtp_does_one_copy_per_mailbox(tmp_path: Path) -> None:
    token = "postmaster-token-0123456789"
    http = {"token": [{"name": "app", "token": token, "scopes": ["inject"]}]}
    with PigeonProcess(tmp_path / "node", smtp={"postmaster": "ops@example.net"}, http=http) as pigeon:
        given = ["postmaster", "PostMaster@MX.Pigeon.Test", "POSTMASTER", '"postmaster"@mx.pigeon.test']
        request = {
            "envelope_sender": "app@example.org",
            "recipients": [{"email": address} for address in given],
            "content": {"from": {"email": "app@example.org"}, "subject": "http", "text": "hello"},
        }
        status, answer = pigeon.http_post("/api/v1/inject", request, token)
        assert (status, answer["accepted"]) == (200, 1), answer
        results = answer["recipients"]
        assert [r["email"] for r in results] == given  # each as the client named it
        repeat = "550 5.1.0 duplicate of recipient 0 of the request"
        assert [(r.get("error"), r.get("duplicate_of")) for r in results[1:]] == [(repeat, 0)] * 3
        pigeon.cli("inject", "--token", token, "--from", "app@example.org", "--to", "postmaster", "--subject", "cli",
                   "--text", "hello")  # fmt: skip
        stored = pigeon.spool_messages()
        assert [m["recipients"] for m in stored] == [["ops@example.net"]] * 2, stored
