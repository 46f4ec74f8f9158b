"""swaks, an independent SMTP client: plain, pipelined, STARTTLS, AUTH, and relay control."""

from __future__ import annotations

from pathlib import Path

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.tools import swaks


def test_swaks_message_is_queued(pigeon: PigeonProcess) -> None:
    result = swaks(pigeon.smtp_port, "--to", "user@example.net", "--from", "me@example.org", "--h-X-Tenant", "t1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "250 2.0.0 Ok: queued as" in result.stdout
    (stored,) = pigeon.spool_messages()
    assert stored["queue"] == "t1@example.net"
    assert stored["recipients"] == ["user@example.net"]


def test_swaks_pipelined_transaction_gets_replies_in_order(pigeon: PigeonProcess) -> None:
    result = swaks(pigeon.smtp_port, "--pipeline", "--to", "a@example.net,b@example.net", "--from", "me@example.org")
    assert result.returncode == 0, result.stdout
    replies = [line.split("  ", 1)[1] for line in result.stdout.splitlines() if line.startswith("<-  ")]
    start = replies.index("250 2.1.0 Sender ok")
    assert replies[start : start + 4] == [
        "250 2.1.0 Sender ok",
        "250 2.1.5 Recipient ok",
        "250 2.1.5 Recipient ok",
        "354 End data with <CR><LF>.<CR><LF>",
    ]
    assert len(pigeon.spool_messages()) == 1


def test_starttls_upgrades_and_the_message_records_esmtps(pigeon: PigeonProcess) -> None:
    result = swaks(pigeon.smtp_port, "--tls", "--to", "user@example.net", "--from", "me@example.org")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "<~  250 2.0.0 Ok: queued as" in result.stdout  # swaks marks replies read over TLS with ~
    (stored,) = pigeon.spool_messages()
    assert b" with ESMTPS id " in stored["data"]
    assert b"(using TLSv1." in stored["data"]
    (record,) = pigeon.wait_records("Reception")
    assert record["protocol"] == "ESMTPS"
    assert record["tls"].startswith("TLSv1.")


def _users_file(root: Path) -> Path:
    users = root / "users"
    root.mkdir(parents=True, exist_ok=True)
    zygote.run(
        ["passwd", "-c", str(users), "alice", "--stdin"],
        input="wonderland\n",
        text=True,
        check=True,
    )
    return users


def test_relay_is_denied_to_unauthenticated_clients_outside_relay_networks(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", smtp={"relay_networks": ["192.0.2.0/24"]}) as pigeon:
        result = swaks(pigeon.smtp_port, "--to", "user@example.net", "--from", "me@example.org")
        assert "550 5.7.1 Relay access denied" in result.stdout
        assert pigeon.spool_messages() == []
        (rejection,) = pigeon.wait_records("Rejection")
        assert rejection["command"] == "RCPT"
        assert rejection["response"] == {"code": 550, "enhanced": "5.7.1", "text": "Relay access denied"}


def test_authenticated_client_may_relay_after_starttls(tmp_path: Path) -> None:
    root = tmp_path / "node"
    users = _users_file(root)
    with PigeonProcess(root, smtp={"relay_networks": ["192.0.2.0/24"], "auth_users": str(users)}) as pigeon:
        plain = swaks(
            pigeon.smtp_port,
            "--to",
            "user@example.net",
            "--auth",
            "PLAIN",
            "--auth-user",
            "alice",
            "--auth-password",
            "wonderland",
        )
        assert "AUTH" not in plain.stdout.split("EHLO", 1)[1].split("MAIL", 1)[0].replace("--auth", "")
        for mechanism in ("PLAIN", "LOGIN"):
            result = swaks(
                pigeon.smtp_port,
                "--tls",
                "--to",
                "user@example.net",
                "--from",
                "alice@example.org",
                "--auth",
                mechanism,
                "--auth-user",
                "alice",
                "--auth-password",
                "wonderland",
            )
            assert "235 2.7.0 Authentication successful" in result.stdout, result.stdout
            assert "250 2.0.0 Ok: queued as" in result.stdout
        wrong = swaks(
            pigeon.smtp_port,
            "--tls",
            "--to",
            "user@example.net",
            "--auth",
            "PLAIN",
            "--auth-user",
            "alice",
            "--auth-password",
            "queen",
        )
        assert "535 5.7.8" in wrong.stdout
        stored = pigeon.spool_messages()
        assert len(stored) == 2
        assert all(m["envelope"].auth_user == "alice" for m in stored)
        assert all(b" with ESMTPSA id " in m["data"] for m in stored)
