"""A host that answered and would not do before any transaction (a 421 to EHLO, no STARTTLS
where TLS is required, a certificate that does not verify) is named in the TransientFailure
record's `peer`, as a delivery's would be; a failed handshake that is tried again in the
clear says so in the log, naming the site and the TLS error.

Found from outside: such records had no `peer`, though the README says a TransientFailure
carries the Delivery fields, and the fall back to the clear left no trace.
"""

from __future__ import annotations

import smtplib
from contextlib import ExitStack
from pathlib import Path

from pigeon.listener.tls import ensure_self_signed
from pigeon.tls import server_context
from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, ScriptedSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: peers\r\n\r\nHello.\r\n"


def test_failures_before_the_transaction_name_the_host_and_the_clear_is_announced(tmp_path: Path) -> None:
    certificate, key = ensure_self_signed(tmp_path / "certs", "127.0.0.1")
    with ExitStack() as stack:
        turned_away = stack.enter_context(AnswerSink({"EHLO": "421 4.7.0 busy, closing connection"}))
        no_tls = stack.enter_context(AnswerSink())
        unverified = stack.enter_context(ScriptedSink(tls=server_context(certificate, key)))
        broken_tls = stack.enter_context(AnswerSink(extensions=("STARTTLS",)))
        config = delivery_config("unused", retry_interval="1h")
        config["route"] = [
            {"domain": "turned-away.example", "next_hop": turned_away.endpoint, "tls": "disabled"},
            {"domain": "no-tls.example", "next_hop": no_tls.endpoint, "tls": "required"},
            {"domain": "unverified.example", "next_hop": unverified.endpoint, "tls": "required", "tls_verify": True},
            {"domain": "broken-tls.example", "next_hop": broken_tls.endpoint, "tls": "opportunistic"},
        ]
        pigeon = stack.enter_context(PigeonProcess(tmp_path / "node", **config))
        names = ("turned-away", "no-tls", "unverified", "broken-tls")
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("sender@example.org", [f"a@{name}.example" for name in names], MESSAGE)
        failures = wait_until(lambda: len(found := pigeon.records("TransientFailure")) == 3 and found)
        by_recipient = {record["recipient"]: record for record in failures}
        for name, sink in (("turned-away", turned_away), ("no-tls", no_tls), ("unverified", unverified)):
            record = by_recipient[f"a@{name}.example"]
            assert record["peer"] == f"[127.0.0.1]:{sink.port}", record
            assert record.get("tls") is None, record  # (never on TLS)
        assert by_recipient["a@turned-away.example"]["response"]["code"] == 421
        (delivered,) = pigeon.wait_records("Delivery")
        assert delivered["recipient"] == "a@broken-tls.example" and delivered.get("tls") is None
        said = pigeon.stderr()
    (warning,) = [line for line in said.splitlines() if "trying again in the clear" in line]
    assert " WARNING pigeon.delivery.session: " in warning
    assert f"{broken_tls.endpoint}: 451 4.7.5 TLS handshake with [127.0.0.1]:{broken_tls.port} failed: " in warning
