"""Mail that opportunistic TLS sent on its fallback after a STARTTLS handshake that failed (in
the clear, or on TLS it could not verify) says so in its records: `tls_failed` names what the
handshake said. Mail sent in the clear to a server that offers no STARTTLS has no such field.

Found from outside: both read `tls: null`, so that an auditor could not tell a server without
TLS from a handshake broken on the path (a downgrade) but by a WARNING rate-limited per host.
"""

from __future__ import annotations

import contextlib
import smtplib
import socket
from contextlib import ExitStack
from pathlib import Path

from pigeon.listener.tls import ensure_self_signed
from pigeon.tls import server_context
from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, ScriptedSink, _SocketSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: fallback\r\n\r\nHello.\r\n"


def test_records_of_mail_sent_after_a_failed_handshake_name_the_failure(tmp_path: Path) -> None:
    certificate, key = ensure_self_signed(tmp_path / "certs", "127.0.0.1")
    with ExitStack() as stack:
        broken_tls = stack.enter_context(AnswerSink(extensions=("STARTTLS",)))
        deferring = stack.enter_context(AnswerSink({"MAIL": "451 4.3.0 try again later"}, extensions=("STARTTLS",)))
        no_tls = stack.enter_context(AnswerSink())
        unverified = stack.enter_context(ScriptedSink(tls=server_context(certificate, key)))
        config = delivery_config("unused", retry_interval="1h", idle_timeout="60s")
        config["route"] = [
            {"domain": "broken-tls.example", "next_hop": broken_tls.endpoint, "tls": "opportunistic"},
            {"domain": "deferring.example", "next_hop": deferring.endpoint, "tls": "opportunistic"},
            {"domain": "no-tls.example", "next_hop": no_tls.endpoint, "tls": "opportunistic"},
            {
                "domain": "unverified.example",
                "next_hop": unverified.endpoint,
                "tls": "opportunistic",
                "tls_verify": True,
            },
        ]
        pigeon = stack.enter_context(PigeonProcess(tmp_path / "node", **config))
        names = ("broken-tls", "deferring", "no-tls", "unverified")
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("sender@example.org", [f"a@{name}.example" for name in names], MESSAGE)
        wait_until(lambda: len(pigeon.records("Delivery")) == 3, timeout=20)
        (deferred,) = pigeon.wait_records("TransientFailure")
        # Another message to the host broken-tls.example fell back on: the connection in the
        # clear is reused, and what it carries says so too.
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("sender@example.org", ["b@broken-tls.example"], MESSAGE)
        delivered = wait_until(lambda: len(found := pigeon.records("Delivery")) == 4 and found, timeout=20)
    by_recipient = {record["recipient"]: record for record in [*delivered, deferred]}

    clear = f"TLS handshake with [127.0.0.1]:{broken_tls.port} failed: "
    for recipient in ("a@broken-tls.example", "b@broken-tls.example"):
        record = by_recipient[recipient]
        assert record["type"] == "Delivery" and record.get("tls") is None, record
        assert record.get("tls_failed", "").startswith(clear), record
    assert len(broken_tls.sessions) == 2  # the failed handshake, and the clear that carried both

    record = by_recipient["a@deferring.example"]
    assert record["type"] == "TransientFailure" and record["response"]["code"] == 451, record
    assert record.get("tls") is None, record
    assert record.get("tls_failed", "").startswith(f"TLS handshake with [127.0.0.1]:{deferring.port} failed: "), record

    record = by_recipient["a@no-tls.example"]
    assert record["type"] == "Delivery" and record.get("tls") is None, record
    assert "tls_failed" not in record, record  # never offered: no handshake failed

    record = by_recipient["a@unverified.example"]
    assert record["type"] == "Delivery", record
    assert record.get("tls", "").endswith(", certificate not verified"), record
    assert f"TLS handshake with [127.0.0.1]:{unverified.port} failed: " in record.get("tls_failed", ""), record
    assert "certificate verify failed" in record["tls_failed"], record


class _BrokenThenBusy(_SocketSink):
    """Offers STARTTLS on the first connection and breaks its handshake (plaintext for a server
    hello); turns every later one away with a 421 banner."""

    def __init__(self) -> None:
        self.connections = 0
        super().__init__("127.0.0.1", "broken-then-busy")

    def _accepted(self) -> None:
        self.connections += 1

    def _serve(self, connection: socket.socket) -> None:
        connection.settimeout(10)
        with connection, contextlib.suppress(OSError):
            if self.connections > 1:
                connection.sendall(b"421 4.3.2 busy, closing connection\r\n")
                return
            connection.sendall(b"220 broken.test ESMTP\r\n")
            connection.recv(1024)  # EHLO
            connection.sendall(b"250-broken.test\r\n250 STARTTLS\r\n")
            connection.recv(1024)  # STARTTLS
            connection.sendall(b"220 2.0.0 go ahead\r\n")
            connection.recv(65536)  # the client's hello
            connection.sendall(b"this is not a TLS server hello\r\n")


def test_a_fallback_connection_turned_away_names_the_failed_handshake_in_its_record(tmp_path: Path) -> None:
    with _BrokenThenBusy() as sink:
        config = delivery_config("unused", retry_interval="1h")
        config["route"] = [{"domain": "*", "next_hop": sink.endpoint, "tls": "opportunistic"}]
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("sender@example.org", ["a@busy.example"], MESSAGE)
            (record,) = pigeon.wait_records("TransientFailure", timeout=20)
    assert record["response"]["code"] == 421, record  # the clear connection's banner
    assert record["peer"] == f"[127.0.0.1]:{sink.port}" and record.get("tls") is None, record
    assert record.get("tls_failed", "").startswith(f"TLS handshake with [127.0.0.1]:{sink.port} failed: "), record
