"""Delivery against peers that behave in particular ways: another Pigeon (CHUNKING, STARTTLS,
DSN), a server that hangs up mid-DATA, one that is slow to answer."""

from __future__ import annotations

import email
import email.policy
import smtplib
import time
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until


def _terminal(pigeon: PigeonProcess) -> list[dict[str, object]]:
    return [r for r in pigeon.records() if r["type"] in ("Delivery", "Bounce", "Expiration")]


def test_pigeon_to_pigeon_over_starttls_passes_the_body_and_dsn_parameters_intact(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "sink") as sink:
        config = delivery_config(f"127.0.0.1:{sink.smtp_port}")
        config["route"][0]["tls"] = "opportunistic"
        with PigeonProcess(tmp_path / "relay", **config) as relay:
            body = b"Subject: chunked\r\n\r\n" + b"line\r\n.leading dot\r\n" * 500
            with smtplib.SMTP("127.0.0.1", relay.smtp_port) as client:
                client.ehlo("client.test")
                client.mail("a@example.org", ["RET=HDRS", "ENVID=env-1"])
                client.rcpt("b@example.net", ["NOTIFY=FAILURE", "ORCPT=rfc822;orig@example.net"])
                assert client.data(body)[0] == 250
            (record,) = wait_until(lambda: _terminal(relay))
            assert record["type"] == "Delivery"
            assert record["tls"].startswith("TLSv1.")  # opportunistic TLS with the sink's self-signed cert
            (arrived,) = wait_until(lambda: sink.spool_messages())
            assert arrived["data"].endswith(body)
            assert arrived["data"].count(b"Received: from ") == 2
            envelope = arrived["envelope"]
            assert (envelope.ret, envelope.envid) == ("HDRS", "env-1")
            assert envelope.recipients[0].notify == ["FAILURE"]
            assert envelope.recipients[0].orcpt == "rfc822;orig@example.net"
            (reception,) = sink.wait_records("Reception")
            assert reception["protocol"] == "ESMTPS"


def test_hangup_in_the_middle_of_data_is_a_transient_failure(tmp_path: Path) -> None:
    with (
        ScriptedSink() as sink,
        PigeonProcess(
            tmp_path / "node", **delivery_config(sink.endpoint, max_age="3s", dsn=False, chunking=False)
        ) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["hangup@example.net"], b"Subject: x\r\n\r\nhi\r\n")
        failures = wait_until(lambda: pigeon.records("TransientFailure"))
        assert failures[0]["response"]["enhanced"] == "4.4.2"
        (record,) = wait_until(lambda: _terminal(pigeon), timeout=20)
        assert record["type"] == "Expiration"
        assert "closed the connection" in record["response"]["text"]


def test_a_slow_server_runs_into_the_reply_timeout(tmp_path: Path) -> None:
    with (
        ScriptedSink(slow=3.0) as sink,
        PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, reply_timeout="1s", dsn=False)) as pigeon,
    ):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["slow@example.net"], b"Subject: x\r\n\r\nhi\r\n")
        (failure, *_) = wait_until(lambda: pigeon.records("TransientFailure"))
        assert failure["response"]["text"].startswith("timeout waiting for")


def test_a_server_slow_to_take_the_message_has_data_done_timeout_not_reply_timeout(tmp_path: Path) -> None:
    """RFC 5321 4.5.3.2.6: the reply to the end of data may take longer than other replies.
    One that comes within `data_done_timeout` delivers the message once; one that does not
    is timed out then, as any other reply after `reply_timeout`."""
    config = delivery_config("", reply_timeout="1s", data_done_timeout="3s", retry_interval="1h", dsn=False)
    with ScriptedSink(slow=2.0) as sink:
        config["route"][0]["next_hop"] = sink.endpoint
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("a@example.org", ["slowend@example.net"], b"Subject: 1\r\n\r\nhi\r\n")
            (record,) = wait_until(lambda: _terminal(pigeon))
            assert (record["type"], record["attempt"]) == ("Delivery", 1)
            sink.slow = 5.0
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("a@example.org", ["slowend-2@example.net"], b"Subject: 2\r\n\r\nhi\r\n")
            sent = time.time()
            (failure,) = pigeon.wait_records("TransientFailure", timeout=15)
            assert failure["response"]["text"].startswith("timeout waiting for")
            assert 2.9 <= failure["timestamp"] - sent < 4.5
            assert len(sink.received) == 1  # (the second arrives once the sink wakes, taken too late)


def test_sigterm_finishes_deliveries_and_keeps_the_rest_for_the_next_start(tmp_path: Path) -> None:
    with ScriptedSink(slow=0.5) as sink:
        config = delivery_config(sink.endpoint, connection_limit=1)
        pigeon = PigeonProcess(tmp_path / "node", **config).start()
        try:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                for n in range(10):
                    client.sendmail("a@example.org", ["slow@example.net"], f"Subject: {n}\r\n\r\nhi\r\n".encode())
            wait_until(lambda: sink.rcpt_log)
            assert pigeon.stop() == 0
        finally:
            pigeon.kill()
        delivered = len(_terminal(pigeon))
        assert 1 <= delivered < 10
        assert len(sink.received) == delivered  # the transaction in flight finished, and was recorded
        assert len(pigeon.spool_messages()) == 10 - delivered  # the rest waits in the spool
        with PigeonProcess(tmp_path / "node", **config) as again:
            wait_until(lambda: len(_terminal(again)) == 10, timeout=30)
            sink.wait_for(10)
        subjects = sorted(int(m.email["Subject"]) for m in sink.received)
        assert subjects == list(range(10))  # each message once: none lost, none sent again


def test_notify_success_to_a_peer_without_dsn_gets_a_relayed_report_and_to_one_with_dsn_none(tmp_path: Path) -> None:
    # RFC 3461 5.2.2: a relay to a server that does not take the DSN parameters reports the
    # success itself ("relayed"); one that does passes NOTIFY on and leaves the report to it.
    body = b"Subject: report me\r\nMessage-ID: <m1@example.org>\r\n\r\n" + b"body line\r\n" * 50

    def send(port: int) -> None:
        with smtplib.SMTP("127.0.0.1", port) as client:
            client.ehlo("client.test")
            client.mail("a@example.org", ["ENVID=env-7", "RET=FULL"])
            client.rcpt("ok@example.net", ["NOTIFY=SUCCESS", "ORCPT=rfc822;orig@example.net"])
            client.rcpt("ok2@example.net", ["NOTIFY=FAILURE"])
            assert client.data(body)[0] == 250

    with ScriptedSink() as sink, PigeonProcess(tmp_path / "relay", **delivery_config(sink.endpoint)) as relay:
        send(relay.smtp_port)
        (report,) = wait_until(lambda: [m for m in sink.received if m.recipients == ["a@example.org"]])
        assert report.sender in ("", "<>")  # the null sender
        parsed = email.message_from_bytes(report.data, policy=email.policy.default)
        assert parsed["Subject"] == "Successful Mail Delivery Report"
        notification, status, returned = parsed.iter_parts()
        assert "relayed" in notification.get_content()
        (per_message, per_recipient) = [dict(block.items()) for block in status.get_payload()]
        assert per_message["Original-Envelope-Id"] == "env-7"
        assert (per_recipient["Final-Recipient"], per_recipient["Action"]) == ("rfc822; ok@example.net", "relayed")
        assert (per_recipient["Status"], per_recipient["Original-Recipient"]) == ("2.0.0", "rfc822; orig@example.net")
        assert returned.get_content_type() == "text/rfc822-headers"  # a success returns the headers only
        assert b"body line" not in report.data
    # Pigeon to Pigeon: the next hop offers DSN and takes NOTIFY: no report from the relay.
    with PigeonProcess(tmp_path / "sink", delivery={"enabled": False}) as pigeon_sink:
        config = delivery_config(f"127.0.0.1:{pigeon_sink.smtp_port}")
        with PigeonProcess(tmp_path / "relay2", **config) as relay:
            send(relay.smtp_port)
            wait_until(lambda: len(relay.records("Delivery")) == 2)
            arrived = wait_until(lambda: pigeon_sink.spool_messages())
            notify = sorted(r.notify for m in arrived for r in m["envelope"].recipients)
            assert notify == [["FAILURE"], ["SUCCESS"]]
            time.sleep(1)
            assert len(pigeon_sink.spool_messages()) == len(arrived)  # no report came after them
