"""Relaying to real peers: what arrives, what is logged, what stays in the spool."""

from __future__ import annotations

import re
import shutil
import smtplib
import threading
from pathlib import Path

from pigeon.listener.tls import ensure_self_signed
from pigeon.tls import server_context
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, SmtpSink, delivery_config, wait_until

MESSAGE = (
    b"From: <sender@example.org>\r\nSubject: relay\r\nX-Tenant: acme\r\nX-Campaign: spring\r\n\r\nHello.\r\n.dot\r\n"
)


def _send(
    pigeon: PigeonProcess, recipients: list[str], data: bytes = MESSAGE, sender: str = "sender@example.org"
) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        assert client.sendmail(sender, recipients, data) == {}


def _terminal(pigeon: PigeonProcess) -> list[dict[str, object]]:
    return [r for r in pigeon.records() if r["type"] in ("Delivery", "Bounce", "Expiration")]


def test_message_is_relayed_with_its_routing_headers_removed(tmp_path: Path) -> None:
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        _send(pigeon, ["ok@example.net", "ok2@example.net"])
        (received,) = sink.wait_for(1)
        assert received.sender == "sender@example.org"
        assert received.recipients == ["ok@example.net", "ok2@example.net"]  # one transaction for both
        assert b"X-Tenant" not in received.data and b"X-Campaign" not in received.data
        assert received.data.startswith(b"Received: from ")
        assert received.data.endswith(b"Subject: relay\r\n\r\nHello.\r\n.dot\r\n")
        records = wait_until(lambda: len(_terminal(pigeon)) == 2 and _terminal(pigeon))
        assert {r["type"] for r in records} == {"Delivery"}
        assert {r["recipient"] for r in records} == {"ok@example.net", "ok2@example.net"}
        for record in records:
            assert record["queue"] == "spring:acme@example.net"
            assert record["site"] == sink.endpoint
            assert record["attempt"] == 1
            assert record["response"]["code"] == 250
            assert re.fullmatch("[0-9a-f]{16}", record["seq"])  # as `id`: exact in jq and JavaScript
        wait_until(lambda: pigeon.spool_messages() == [])
        assert pigeon.metric("pigeon_spool_messages") == 0


def test_routing_headers_never_leave_whatever_their_form_and_the_obsolete_form_still_names_the_queue(
    tmp_path: Path,
) -> None:
    # Empty, blank, or with blanks before the colon (RFC 5322's obsolete syntax).
    forms = {
        "a@example.net": b"X-Tenant:\r\nX-Campaign:   \r\n",
        "b@example.net": b"X-Tenant : acme\r\nX-Campaign\t: spring\r\n",
    }
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        for recipient, fields in forms.items():
            _send(pigeon, [recipient], b"From: <sender@example.org>\r\n" + fields + b"Subject: s\r\n\r\nbody\r\n")
        received = sink.wait_for(2)
        for message in received:
            assert b"x-tenant" not in message.data.lower() and b"x-campaign" not in message.data.lower()
            assert message.data.endswith(b"From: <sender@example.org>\r\nSubject: s\r\n\r\nbody\r\n")
        records = wait_until(lambda: len(_terminal(pigeon)) == 2 and _terminal(pigeon))
        assert {r["recipient"]: r["queue"] for r in records} == {
            "a@example.net": "example.net",
            "b@example.net": "spring:acme@example.net",
        }


def test_a_routing_header_however_far_down_the_header_section_names_the_queue_and_never_leaves(
    tmp_path: Path,
) -> None:
    # Over 64 KiB of other fields above them (the part of the header section the policy's
    # Headers see): the routing headers below still name the queue, folded or in the obsolete
    # form, and come off; an empty one names nothing and comes off too.
    filler = b"".join(b"X-Filler-%03d: " % n + b"a" * 900 + b"\r\n" for n in range(80))
    forms = {
        "a@example.net": b"X-Tenant: acme\r\nX-Campaign :\r\n spring\r\n",
        "b@example.net": b"X-Tenant:\r\n",
    }
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        for recipient, fields in forms.items():
            _send(
                pigeon, [recipient], b"From: <sender@example.org>\r\n" + filler + fields + b"Subject: s\r\n\r\nbody\r\n"
            )
        received = sink.wait_for(2)
        for message in received:
            assert b"x-tenant" not in message.data.lower() and b"x-campaign" not in message.data.lower()
            assert message.data.endswith(b"X-Filler-079: " + b"a" * 900 + b"\r\nSubject: s\r\n\r\nbody\r\n")
        records = wait_until(lambda: len(_terminal(pigeon)) == 2 and _terminal(pigeon))
        assert {r["recipient"]: r["queue"] for r in records} == {
            "a@example.net": "spring:acme@example.net",
            "b@example.net": "example.net",
        }


def test_each_recipient_gets_its_own_outcome(tmp_path: Path) -> None:
    config = delivery_config("", max_age="4s", dsn=False)
    with ScriptedSink() as sink:
        config["route"][0]["next_hop"] = sink.endpoint
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            _send(pigeon, ["ok@example.net", "permfail@example.net", "tempfail@example.net", "quota@example.net"])
            records = wait_until(lambda: len(_terminal(pigeon)) == 4 and _terminal(pigeon), timeout=30)
            outcome = {r["recipient"]: (r["type"], r["response"]["code"]) for r in records}
            assert outcome == {
                "ok@example.net": ("Delivery", 250),
                "permfail@example.net": ("Bounce", 550),
                # A 552 to RCPT is read as 452 (RFC 5321 4.5.3.1.10): a full mailbox may empty.
                "quota@example.net": ("Expiration", 554),
                "tempfail@example.net": ("Expiration", 554),
            }
            bounces = {r["recipient"]: r["classification"] for r in records if r["type"] == "Bounce"}
            assert bounces == {"permfail@example.net": "InvalidRecipient"}
            transient = pigeon.records("TransientFailure")
            for recipient in ("tempfail@example.net", "quota@example.net"):
                tries = [r for r in transient if r["recipient"] == recipient]
                assert [r["attempt"] for r in tries] == list(range(1, len(tries) + 1)) and tries
            assert {r["recipient"] for r in transient} == {"tempfail@example.net", "quota@example.net"}
            assert {r["response"]["code"] for r in transient if r["recipient"] == "quota@example.net"} == {452}
            # the recipient that went through is not sent again on retries
            assert sink.rcpt_log.count("ok@example.net") == 1
            wait_until(lambda: pigeon.spool_messages() == [])


def test_each_expired_recipient_and_its_dsn_name_its_own_last_reply_across_a_restart(tmp_path: Path) -> None:
    """Two recipients of one message, deferred with different replies, expire at a start of
    the node after their attempt: each `Expiration` and each DSN block names the reply that
    recipient got (kept in the spool, with the server that gave it), not the one the last
    recipient got."""
    replies = {"t451x@example.net": "451 4.2.1 try later", "q452x@example.net": "452 4.2.2 mailbox full"}
    with ScriptedSink() as sink:
        sink.rcpt_reply = replies.get
        pigeon = PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, max_age="5s", retry_interval="1h"))
        with pigeon:
            _send(pigeon, list(replies))
            pigeon.wait_records("TransientFailure", 2)
        with pigeon:  # started again: the row, read back from the spool, expires in this run
            records = wait_until(lambda: len(pigeon.records("Expiration")) == 2 and pigeon.records("Expiration"))
            said = {r["recipient"]: r["response"]["text"] for r in records}
            assert said == {
                address: f"Message expired: not delivered within 5 seconds; last attempt: {reply}"
                for address, reply in replies.items()
            }
            (dsn,) = sink.wait_for(1)
            blocks = dsn.email.get_payload()[1].get_payload()[1:]  # (the first is the per-message one)
            diagnostics = {block["Final-Recipient"].split("; ")[1]: block["Diagnostic-Code"] for block in blocks}
            assert diagnostics == {address: f"smtp; {reply}" for address, reply in replies.items()}
            assert {block["Remote-MTA"] for block in blocks} == {"dns; [127.0.0.1]"}
            assert {block["Status"] for block in blocks} == {"5.4.7"}


def test_bounce_sends_a_dsn_to_the_sender_and_never_to_the_null_sender(tmp_path: Path) -> None:
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        _send(pigeon, ["permfail@example.net"], sender="ok@example.org")
        (dsn,) = sink.wait_for(1)
        assert dsn.sender == "<>"  # aiosmtpd shows the null sender so
        assert dsn.recipients == ["ok@example.org"]
        report = dsn.email
        assert report.get_content_type() == "multipart/report"
        assert report.get_param("report-type") == "delivery-status"
        status = report.get_payload()[1]
        assert status.get_content_type() == "message/delivery-status"
        text = status.as_string()
        assert "Final-Recipient: rfc822; permfail@example.net" in text
        assert "Action: failed" in text
        assert "Status: 5.1.1" in text
        # A bounce of a message from <> (the DSN itself, here) produces no further DSN.
        _send(pigeon, ["permfail@example.net"], sender="")
        wait_until(lambda: [r for r in pigeon.records("Bounce") if r["sender"] == ""])
        assert len(sink.after(3)) == 1  # a DSN would have followed within moments


def test_smtp_sink_soft_and_hard_errors(tmp_path: Path) -> None:
    with (
        SmtpSink("-r", "RCPT") as soft,
        PigeonProcess(tmp_path / "soft", **delivery_config(soft.endpoint, max_age="3s", dsn=False)) as pigeon,
    ):
        _send(pigeon, ["a@example.net"])
        (record,) = wait_until(lambda: _terminal(pigeon), timeout=20)
        assert record["type"] == "Expiration"
        assert len(pigeon.records("TransientFailure")) >= 2
    with (
        SmtpSink("-f", "DATA") as hard,
        PigeonProcess(tmp_path / "hard", **delivery_config(hard.endpoint, dsn=False)) as pigeon,
    ):
        _send(pigeon, ["a@example.net"])
        (record,) = wait_until(lambda: _terminal(pigeon))
        assert record["type"] == "Bounce"
        assert record["response"]["code"] >= 500
        assert "said_by" not in record  # the server's own reply: the record's default


def test_smtp_sink_hanging_up_without_a_reply_is_a_transient_failure(tmp_path: Path) -> None:
    # smtp-sink -q: drop the connection, unanswered, once the end of data (".") arrives.
    with (
        SmtpSink("-q", ".") as rude,
        PigeonProcess(tmp_path / "node", **delivery_config(rude.endpoint, max_age="3s", dsn=False)) as pigeon,
    ):
        _send(pigeon, ["a@example.net"])
        (record,) = wait_until(lambda: _terminal(pigeon), timeout=20)
        assert record["type"] == "Expiration"
        failures = pigeon.records("TransientFailure")
        assert len(failures) >= 2
        assert {(f["response"]["code"], f["response"]["enhanced"]) for f in failures} == {(451, "4.4.2")}
        assert all("closed the connection" in f["response"]["text"] for f in failures), failures[0]


def test_dead_sink_defers_then_delivers_once_it_comes_up(tmp_path: Path) -> None:
    sink_port_holder = SmtpSink()
    endpoint = sink_port_holder.endpoint
    sink_port_holder.stop()  # nothing listens there now
    with PigeonProcess(tmp_path / "node", **delivery_config(endpoint)) as pigeon:
        _send(pigeon, ["a@example.net"])
        wait_until(lambda: pigeon.records("TransientFailure"))
        failure = pigeon.records("TransientFailure")[0]
        assert failure["response"]["enhanced"] == "4.4.1"
        host, port = endpoint.split(":")
        with SmtpSink(host=host, port=int(port)):
            (record,) = wait_until(lambda: _terminal(pigeon), timeout=20)
            assert record["type"] == "Delivery"


def test_more_mail_than_the_active_set_holds_is_all_delivered_once(tmp_path: Path) -> None:
    # Three messages in memory at a time: the rest wait in the spool and are read as room frees.
    config = delivery_config("", max_active=3)
    with ScriptedSink() as sink:
        config["route"][0]["next_hop"] = sink.endpoint
        with PigeonProcess(tmp_path / "node", **config) as pigeon:

            def send_ten(first: int) -> None:
                with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                    for n in range(first, first + 10):
                        client.sendmail("sender@example.org", [f"ok{n}@example.net"], MESSAGE)

            threads = [threading.Thread(target=send_ten, args=(n * 10,)) for n in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            records = wait_until(lambda: len(_terminal(pigeon)) >= 40 and _terminal(pigeon), timeout=30)
            assert sorted(r["recipient"] for r in records) == sorted(f"ok{n}@example.net" for n in range(40))
            assert {r["type"] for r in records} == {"Delivery"}
            received = sorted(r for m in sink.received for r in m.recipients)
            assert received == sorted(f"ok{n}@example.net" for n in range(40))
            wait_until(lambda: pigeon.spool_messages() == [])
            assert len(_terminal(pigeon)) == 40
            assert len([r for m in sink.received for r in m.recipients]) == 40


def test_metrics_count_outcomes_by_site_and_queue_and_show_what_waits(tmp_path: Path) -> None:
    with (
        ScriptedSink() as sink,
        PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint, retry_interval="1h")) as pigeon,
    ):
        _send(pigeon, ["ok@example.net", "ok2@example.net"])
        _send(pigeon, ["tempfail@example.com"])
        wait_until(lambda: len(pigeon.records("Delivery")) == 2 and pigeon.records("TransientFailure"))
        _, body = pigeon.http_get("/metrics")
        samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
                   if line.startswith("pigeon_")}  # fmt: skip
        site = sink.endpoint
        assert samples[f'pigeon_site_recipients_total{{outcome="Delivery",site="{site}"}}'] == 2
        assert samples[f'pigeon_site_recipients_total{{outcome="TransientFailure",site="{site}"}}'] == 1
        assert samples['pigeon_queue_recipients_total{outcome="Delivery",queue="spring:acme@example.net"}'] == 2
        assert samples['pigeon_recipients_total{outcome="Delivery"}'] == 2
        assert samples[f'pigeon_ready_queue_messages{{site="{site}"}}'] == 0  # the deferred one waits in the spool
        assert 'pigeon_recipients_total{outcome="AdminBounce"}' in samples
        assert samples["pigeon_scheduler_lag_seconds_count"] >= 2  # each message made ready once so far


def test_a_field_only_named_like_a_routing_header_is_left_alone(tmp_path: Path) -> None:
    # "X-Campaign-Id" is not X-Campaign, and a Subject may mention x-tenant: neither is a
    # routing header to take off (which would send signing down the edit-first path).
    with PigeonProcess(tmp_path / "node", delivery={"enabled": False}) as pigeon:
        _send(pigeon, ["a@example.net"], b"X-Campaign-Id: 7\r\nSubject: x-tenant: migration\r\n\r\nbody\r\n")
        _send(pigeon, ["b@example.net"], b"X-Tenant:\r\nSubject: s\r\n\r\nbody\r\n")
        stored = {m["recipients"][0]: m["envelope"].headers_removed for m in pigeon.spool_messages()}
        assert stored == {"a@example.net": None, "b@example.net": ["x-campaign", "x-tenant"]}


def test_a_route_verifying_against_its_own_ca_file_delivers_over_tls_and_one_without_waits(tmp_path: Path) -> None:
    # A smart host whose certificate (naming 127.0.0.1) comes from a private CA. The route for
    # private.example trusts that CA (ca_file, relative to the config file); public.example,
    # same next hop, verifies against the system's CAs: its mail must wait, never ride the
    # connection verified for the other.
    certificate, key = ensure_self_signed(tmp_path / "smarthost", "127.0.0.1")
    node = tmp_path / "node"
    node.mkdir()
    shutil.copy(certificate, node / "smarthost-ca.pem")
    with ScriptedSink(tls=server_context(certificate, key)) as sink:
        verified = {"next_hop": sink.endpoint, "tls": "required", "tls_verify": True}
        routes = [
            {"domain": "private.example", **verified, "ca_file": "smarthost-ca.pem"},
            {"domain": "public.example", **verified},
        ]
        with PigeonProcess(node, delivery={"enabled": True, "retry_interval": "1s"}, route=routes) as pigeon:
            _send(pigeon, ["a@private.example", "b@public.example"])
            (received,) = sink.wait_for(1)
            assert received.recipients == ["a@private.example"] and received.tls
            failure = pigeon.wait_records("TransientFailure")[0]
            assert failure["recipient"] == "b@public.example"
            assert failure["response"]["enhanced"] == "4.7.5"
            assert sink.after(1.5) == [received]  # retried, still refused: never delivered


def test_a_delivery_record_says_whether_the_servers_certificate_was_verified(tmp_path: Path) -> None:
    # Found from outside: a delivery on the unverified fallback (opportunistic TLS whose
    # certificate does not verify) logged the same `tls` text as a verified one.
    certificate, key = ensure_self_signed(tmp_path / "smarthost", "127.0.0.1")
    node = tmp_path / "node"
    node.mkdir()
    shutil.copy(certificate, node / "smarthost-ca.pem")
    with ScriptedSink(tls=server_context(certificate, key)) as sink:
        routes = [
            {
                "domain": "private.example",
                "next_hop": sink.endpoint,
                "tls": "required",
                "tls_verify": True,
                "ca_file": "smarthost-ca.pem",
            },
            {"domain": "public.example", "next_hop": sink.endpoint, "tls": "opportunistic", "tls_verify": True},
        ]
        with PigeonProcess(node, delivery={"enabled": True, "retry_interval": "1s"}, route=routes) as pigeon:
            _send(pigeon, ["a@private.example", "b@public.example"])
            sink.wait_for(2)
            records = wait_until(lambda: len(_terminal(pigeon)) == 2 and _terminal(pigeon))
            tls = {r["recipient"]: r["tls"] for r in records}
            assert re.fullmatch(
                r"TLSv1\.[23] with cipher \S+ \(\d+/\d+ bits\), certificate verified", tls["a@private.example"]
            )
            assert re.fullmatch(
                r"TLSv1\.[23] with cipher \S+ \(\d+/\d+ bits\), certificate not verified", tls["b@public.example"]
            )
            assert "trying again on TLS without verifying the certificate" in pigeon.stderr()


def test_every_bounce_names_its_class_and_rfc_5321_standard_texts_have_one(tmp_path: Path) -> None:
    # Found from outside: a Bounce of an unclassified reply had no "classification" at all (its
    # default was left out of the record), and the standard "550 Requested action not taken:
    # mailbox unavailable" matched no rule.
    replies = {
        "gone@example.net": "550 Requested action not taken: mailbox unavailable",
        "syntax@example.net": "553 Requested action not taken: mailbox name not allowed",
        "moved@example.net": "551 User not local; please try <moved@example.com>",
        "odd@example.net": "554 Transaction failed",
    }
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        sink.rcpt_reply = replies.get
        _send(pigeon, list(replies), sender="")  # the null sender: no DSN to wait for
        wait_until(lambda: len(pigeon.records("Bounce")) == len(replies))
        classes = {r["recipient"]: r.get("classification") for r in pigeon.records("Bounce")}
    assert classes == {
        "gone@example.net": "InvalidRecipient",
        "syntax@example.net": "InvalidRecipient",
        "moved@example.net": "InvalidRecipient",
        "odd@example.net": "Uncategorized",
    }
