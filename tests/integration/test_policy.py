"""Policy hooks (`[policy] module`): a real node over real sockets, a real sink on loopback, and a
policy module written by each test. Every hook point, hooks that fail, hang, or are async."""

from __future__ import annotations

import json
import os
import signal
import smtplib
import socket
import subprocess
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.attacks import worker_pids
from tests.support.process import PigeonProcess
from tests.support.rawsmtp import RawSmtp
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: hello\r\nX-Secret: 42\r\n\r\nHello.\r\n"


def _policy(root: Path, source: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "policy.py"
    path.write_text(textwrap.dedent(source))
    return path


def _node(root: Path, source: str, *, timeout: str = "2s", sync: str = "inline", **sections: Any) -> PigeonProcess:
    module = _policy(root, source)
    return PigeonProcess(root / "node", policy={"module": str(module), "timeout": timeout, "sync": sync}, **sections)


def _failures(pigeon: PigeonProcess, count: int = 1) -> list[dict[str, Any]]:
    return pigeon.wait_records("PolicyFailure", count)


def test_a_policy_package_beside_the_config_imports_its_own_modules(tmp_path: Path) -> None:
    """`module = "polpkg.main"` whose `from polpkg import util` failed without PYTHONPATH=<config dir>."""
    package = tmp_path / "node" / "polpkg"
    package.mkdir(parents=True)
    (package / "util.py").write_text('REFUSED = "127.0.0.2"\n')
    (package / "main.py").write_text(
        textwrap.dedent("""
            from pigeon.policy import Refuse
            from polpkg import util
            def on_connect(connection):
                if connection.peer_ip == util.REFUSED:
                    return Refuse(554, "refused by polpkg")
        """)
    )
    # Two workers: the supervisor checks the module, and each worker imports it again.
    pigeon = PigeonProcess(tmp_path / "node", node={"workers": 2}, policy={"module": "polpkg.main"})
    with pigeon, RawSmtp(pigeon.smtp_port, source="127.0.0.2") as client:
        assert client.reply() == (554, ["refused by polpkg"])


# --- the SMTP conversation ------------------------------------------------------------------
def test_on_connect_refuses_with_its_code_and_the_connection_closes(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Refuse
        def on_connect(connection):
            if connection.peer_ip == "127.0.0.2":
                return Refuse(554, "no mail from you", "5.7.1")
            if connection.peer_ip == "127.0.0.3":
                return Refuse(550, "not you either")
            if connection.peer_ip == "127.0.0.4":
                return Refuse(450, "later")
    """
    with _node(tmp_path, source) as pigeon:
        with RawSmtp(pigeon.smtp_port, source="127.0.0.2") as client:
            assert client.reply() == (554, ["no mail from you"])  # no enhanced code on a greeting (RFC 2034 3)
            assert client.closed_by_peer()
        # A greeting can only refuse with 554 or 421 (RFC 5321 3.1): others become the one of their class.
        for source_ip, code, text in (("127.0.0.3", 554, "not you either"), ("127.0.0.4", 421, "later")):
            with RawSmtp(pigeon.smtp_port, source=source_ip) as client:
                assert client.reply() == (code, [text])
                assert client.closed_by_peer()
        with RawSmtp(pigeon.smtp_port) as client:  # anyone else is greeted
            assert client.reply()[0] == 220
        rejection, *others = pigeon.wait_records("Rejection", 3)
        assert [r["response"]["code"] for r in others] == [554, 421]
        assert rejection["command"] == "CONNECT"
        assert rejection["peer"].startswith("127.0.0.2:")
        # What the client was told: a greeting carries no enhanced code, so neither does its record.
        assert rejection["response"] == {"code": 554, "text": "no mail from you"}


def test_a_greeting_refused_by_on_connect_is_the_one_answer_even_with_max_errors_1(tmp_path: Path) -> None:
    """The 554 greeting is not an error of the client's: it ends the session on its own, with no
    `421 ... too many errors` after it (which said the opposite: try again later)."""
    source = """
        from pigeon.policy import Refuse
        def on_connect(connection):
            if connection.peer_ip == "127.0.0.2":
                return Refuse(554, "no mail from you")
    """
    with _node(tmp_path, source, smtp={"max_errors": 1}) as pigeon:
        address = ("127.0.0.1", pigeon.smtp_port)
        with socket.create_connection(address, timeout=10, source_address=("127.0.0.2", 0)) as sock:
            said = b""
            while chunk := sock.recv(4096):  # all the server says, until it closes
                said += chunk
        assert said == b"554 no mail from you\r\n"
        pigeon.wait_records("Rejection")
        time.sleep(0.5)  # (a second record would be written by now)
        assert [(r["command"], r["response"]["code"]) for r in pigeon.records("Rejection")] == [("CONNECT", 554)]
        _, metrics = pigeon.http_get("/metrics")
    assert 'pigeon_rejections_total{code="554",command="CONNECT"} 1.0' in metrics.decode()
    assert 'code="421"' not in metrics.decode()


def test_mail_from_and_rcpt_to_are_refused_with_the_policys_codes(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Refuse
        def on_mail_from(mail):
            if mail.sender.startswith("spammer@"):
                return Refuse(550, f"{mail.sender} may not send (helo {mail.helo})", "5.7.26")
        def on_rcpt_to(rcpt):
            if rcpt.recipient.startswith("busy@"):
                return Refuse(450, f"{rcpt.recipient} busy; already {len(rcpt.accepted)} taken")
    """
    with _node(tmp_path, source) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        assert client.mail("spammer@example.org") == (
            550,
            b"5.7.26 spammer@example.org may not send (helo client.test)",
        )
        assert client.mail("sender@example.org")[0] == 250
        assert client.rcpt("ok@example.net")[0] == 250
        assert client.rcpt("busy@example.net") == (450, b"4.7.1 busy@example.net busy; already 1 taken")
        assert client.data(MESSAGE)[0] == 250
        (reception,) = pigeon.wait_records("Reception")
        assert reception["recipients"] == ["ok@example.net"]
        commands = [(r["command"], r["response"]["code"]) for r in pigeon.wait_records("Rejection", 2)]
        assert commands == [("MAIL", 550), ("RCPT", 450)]


def test_on_rcpt_to_is_told_each_accepted_mailbox_once_as_first_written(tmp_path: Path) -> None:
    """Found from outside: RCPT TO:<b1@dest.test> twice, then <b1@DEST.TEST>, were told to the
    next on_rcpt_to as three recipients, where on_message has one (the duplicate filter
    delivers it once) and HTTP refuses a repeat before the hook."""
    source = """
        from pigeon.policy import Refuse
        def on_rcpt_to(rcpt):
            if rcpt.recipient.startswith("echo@"):
                return Refuse(450, "taken=" + ",".join(rcpt.accepted))
        def on_message(message):
            return Refuse(450, "recipients=" + ",".join(message.recipients))
    """
    with _node(tmp_path, source) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        assert client.mail("sender@example.org")[0] == 250
        for recipient in ("b1@dest.test", "b1@dest.test", "b1@DEST.TEST", '"b1"@dest.test', "c@dest.test"):
            assert client.rcpt(recipient)[0] == 250
        assert client.rcpt("echo@dest.test") == (450, b"4.7.1 taken=b1@dest.test,c@dest.test")
        assert client.data(MESSAGE) == (450, b"4.7.1 recipients=b1@dest.test,c@dest.test")
        # A new transaction starts a new list.
        assert client.mail("sender@example.org")[0] == 250
        assert client.rcpt("c@dest.test")[0] == 250
        assert client.rcpt("echo@dest.test") == (450, b"4.7.1 taken=c@dest.test")


def test_on_message_sets_tenant_campaign_and_queue_seen_in_the_log_and_the_queue_listing(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Changes
        def on_message(message):
            if message.headers["Subject"] == "vip":
                return Changes(queue="vip-lane")
            return Changes(tenant="acme", campaign=message.headers.get("X-Kind", "none"))
    """
    sections = delivery_config("127.0.0.1:9", retry_interval="1h")  # nothing answers: they stay queued
    with _node(tmp_path, source, **sections) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.sendmail(
            "a@example.org", ["x@example.net"], b"From: a@example.org\r\nSubject: hi\r\nX-Kind: spring\r\n\r\nhi\r\n"
        )
        client.sendmail("a@example.org", ["y@example.net"], b"From: a@example.org\r\nSubject: vip\r\n\r\nhi\r\n")
        receptions = pigeon.wait_records("Reception", 2)
        assert [r["queue"] for r in receptions] == ["spring:acme@example.net", "vip-lane"]
        wait_until(lambda: len(pigeon.records("TransientFailure")) == 2)
        status, summary = _get(pigeon, "/api/v1/queues")
        assert status == 200
        assert {row["queue"]: row["messages"] for row in summary["scheduled"]} == {
            "spring:acme@example.net": 1,
            "vip-lane": 1,
        }


def test_of_two_tenant_and_campaign_fields_on_message_is_told_the_first(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Refuse
        def on_message(message):
            return Refuse(550, f"tenant {message.tenant} campaign {message.campaign}")
    """
    message = b"X-Tenant: one\r\nX-Campaign: c1\r\nFrom: a@example.org\r\nX-Tenant: two\r\nX-Campaign: c2\r\n\r\nhi\r\n"
    with _node(tmp_path, source) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        client.mail("a@example.org")
        client.rcpt("x@example.net")
        assert client.data(message) == (550, b"5.7.1 tenant one campaign c1")


def _get(pigeon: PigeonProcess, path: str) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{pigeon.http_port}{path}")
    request.add_header("Authorization", f"Bearer {pigeon.local_token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read())


def test_header_edits_reach_the_wire_and_the_stored_body_stays_as_received(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Changes
        def on_message(message):
            assert message.headers.get_all("x-secret") == ["42"]
            return Changes(
                add_headers=[("X-Policy", f"seen {message.size} bytes"), ("X-Second", "2")],
                remove_headers=["X-Secret"],
                tenant="acme",
            )
    """
    with ScriptedSink() as sink:
        sections = delivery_config(sink.endpoint)
        with _node(tmp_path, source, **sections) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("a@example.org", ["ok@example.net"], MESSAGE + b"X-Tenant: in the body\r\n")
            (received,) = sink.wait_for(1)
            lines = received.data.split(b"\r\n")
            # Below Pigeon's Received (the trace block stays on top), in the order given.
            assert lines[0].startswith(b"Received: from ")
            fields = [line for line in lines[1:] if not line.startswith((b"\t", b" "))]
            assert fields[0].startswith(b"X-Policy: seen ") and fields[1] == b"X-Second: 2"
            assert b"X-Secret" not in received.data
            assert received.data.endswith(b"Hello.\r\nX-Tenant: in the body\r\n")  # the body is not the header
            (delivery,) = pigeon.wait_records("Delivery")
            assert delivery["queue"] == "acme@example.net"


def test_removing_received_keeps_pigeons_own_and_removing_from_without_a_new_one_fails(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Changes
        def on_message(message):
            if message.headers["Subject"] == "no from":
                return Changes(remove_headers=["from"])
            return Changes(remove_headers=["Received"])
    """
    with ScriptedSink() as sink:
        sections = delivery_config(sink.endpoint)
        with _node(tmp_path, source, **sections) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                earlier = b"Received: from a (a [192.0.2.1])\r\n\tby b; Mon, 1 Jan 2024 00:00:00 +0000\r\n"
                client.sendmail("a@example.org", ["ok@example.net"], earlier + MESSAGE)
                client.mail("a@example.org")
                client.rcpt("ok@example.net")
                answer = client.data(b"From: <a@example.org>\r\nSubject: no from\r\n\r\nhi\r\n")
                assert answer == (451, b"4.3.0 policy error; try again later")
            (failure,) = pigeon.wait_records("PolicyFailure")
            assert "remove_headers takes From off and add_headers puts no From on" in failure["error"], failure
            (received,) = sink.wait_for(1)
            # Pigeon's own Received (its hop: a next hop's loop detection counts it) stays; the earlier one goes.
            assert received.data.startswith(b"Received: from ") and received.data.count(b"Received:") == 1
            assert b"192.0.2.1" not in received.data and b"\r\nFrom: <sender@example.org>\r\n" in received.data


def test_on_message_applies_to_bdat_and_can_refuse_it(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Changes, Refuse
        def on_message(message):
            if "refuse" in message.headers.get("Subject", ""):
                return Refuse(554, "content refused by policy", "5.7.1")
            return Changes(campaign="chunked")
    """
    with _node(tmp_path, source) as pigeon, RawSmtp(pigeon.smtp_port) as client:
        client.expect(220)
        client.expect(250, "EHLO client.test")
        for subject, answer in ((b"refuse me", 554), (b"take me", 250)):
            client.expect(250, "MAIL FROM:<a@example.org>")
            client.expect(250, "RCPT TO:<b@example.net>")
            first, second = b"From: a@example.org\r\nSubject: " + subject + b"\r\n", b"\r\nchunked body\r\n"
            client.send(f"BDAT {len(first)}\r\n".encode() + first)
            client.expect(250)
            client.send(f"BDAT {len(second)} LAST\r\n".encode() + second)
            assert client.reply()[0] == answer
        (reception,) = pigeon.wait_records("Reception")
        assert reception["queue"] == "chunked:@example.net"
        assert len(pigeon.spool_messages()) == 1


# --- routes and delivery --------------------------------------------------------------------
@pytest.mark.parametrize("named", ["relay.test", "Relay.Test."])
def test_route_set_on_message_and_reroute_before_delivery_send_mail_to_another_next_hop(
    tmp_path: Path, named: str
) -> None:
    """`Relay.Test.` is `relay.test` (as a rebind takes it): its [[route]], not the catch-all
    (an outside test saw Reroute("a.test.") leave by `*`, past the relay meant)."""
    source = f"""
        from pigeon.policy import Changes, Reroute
        def on_message(message):
            if message.recipients[0].endswith("@routed.test"):
                return Changes(route="{named}")
        def before_delivery(delivery):
            if delivery.recipients[0].endswith("@rerouted.test"):
                return Reroute("{named}")
    """
    with ScriptedSink() as elsewhere, ScriptedSink() as relay:
        sections = delivery_config(elsewhere.endpoint)
        sections["route"] = [
            {"domain": "relay.test", "next_hop": relay.endpoint, "tls": "disabled"},
            {"domain": "*", "next_hop": elsewhere.endpoint, "tls": "disabled"},
        ]
        with _node(tmp_path, source, **sections) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["ok@routed.test"], MESSAGE)
            client.sendmail("a@example.org", ["ok@rerouted.test"], MESSAGE)
            client.sendmail("a@example.org", ["ok@plain.test"], MESSAGE)
            received = relay.wait_for(2)
            assert sorted(r.recipients[0] for r in received) == ["ok@rerouted.test", "ok@routed.test"]
            assert [r.recipients for r in elsewhere.wait_for(1)] == [["ok@plain.test"]]
            deliveries = pigeon.wait_records("Delivery", 3)
            assert {d["recipient"]: (d["site"], d["attempt"]) for d in deliveries} == {
                "ok@routed.test": (relay.endpoint, 1),
                "ok@rerouted.test": (relay.endpoint, 1),  # a reroute is not an attempt
                "ok@plain.test": (elsewhere.endpoint, 1),
            }
            assert pigeon.records("TransientFailure") == []
            assert len(relay.after(1)) == 2  # rerouted once, not again and again


def test_a_hook_that_always_reroutes_to_its_own_domains_or_back_and_forth_sends_the_mail(tmp_path: Path) -> None:
    """`Reroute("")` (its own domains) of mail routed so is no reroute: it is sent, after one
    call. A hook that sends mail back and forth (a.test, b.test, a.test...) gets a few reroutes
    in a row, then the mail goes as routed then, with a WARNING: never a silent loop (an
    outside test counted 1,743 hook calls in 10 s for one message, never sent)."""
    source = """
        import sys
        from pigeon.policy import Reroute
        calls = {}
        def before_delivery(delivery):
            calls[delivery.id] = calls.get(delivery.id, 0) + 1
            print("before_delivery", delivery.id, calls[delivery.id], file=sys.stderr, flush=True)
            if delivery.recipients[0].startswith("own@"):
                return Reroute("")
            return Reroute("b.test" if delivery.routing_domain == "a.test" else "a.test")
    """
    with ScriptedSink() as sink, _node(tmp_path, source, **delivery_config(sink.endpoint)) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["own@example.net"], MESSAGE)
            client.sendmail("a@example.org", ["pingpong@example.net"], MESSAGE)
        received = sink.wait_for(2)
        assert sorted(r.recipients[0] for r in received) == ["own@example.net", "pingpong@example.net"]
        deliveries = {d["recipient"]: d for d in pigeon.wait_records("Delivery", 2)}
        assert deliveries["own@example.net"]["attempt"] == 1
        time.sleep(0.5)
        said = pigeon.stderr()
        calls = [line.split() for line in said.splitlines() if line.startswith("before_delivery ")]
        own, pingpong = deliveries["own@example.net"]["id"], deliveries["pingpong@example.net"]["id"]
        assert [int(n) for _, id_, n in calls if id_ == own] == [1]
        assert [int(n) for _, id_, n in calls if id_ == pingpong] == [1, 2, 3, 4, 5, 6]
        assert "after rerouting it 5 times in a row without an attempt: not carried out" in said
        assert len(sink.after(1.0)) == 2


def test_before_delivery_defers_with_its_delay_then_fails_for_good(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Defer, Fail
        def before_delivery(delivery):
            if delivery.recipients[0].startswith("fail@"):
                return Fail("not to this one")
            if delivery.attempt == 1:
                return Defer("warming up", delay=0.5)
    """
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint, retry_interval="1h", dsn=False)
        with _node(tmp_path, source, **config) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["ok@example.net"], MESSAGE)
            client.sendmail("a@example.org", ["fail@example.org"], MESSAGE)
            (transient,) = pigeon.wait_records("TransientFailure")
            assert transient["response"] == {"code": 451, "enhanced": "4.7.0", "text": "warming up"}
            assert transient["next_attempt"] - transient["timestamp"] < 1  # the policy's delay, not 1h
            (delivery,) = pigeon.wait_records("Delivery")
            assert (delivery["recipient"], delivery["attempt"]) == ("ok@example.net", 2)
            (bounce,) = pigeon.wait_records("Bounce")
            assert bounce["recipient"] == "fail@example.org"
            assert bounce["response"] == {"code": 550, "enhanced": "5.7.1", "text": "not to this one"}
            assert bounce["classification"] == "PolicyRelated"
            assert [r.recipients for r in sink.received] == [["ok@example.net"]]  # the failed one never left


def test_delivery_outcome_is_reclassified_both_ways(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Reclassify
        def on_delivery_outcome(outcome):
            statuses = {r.recipient: r.status for r in outcome.results}
            if outcome.delivery.attempt == 1 and statuses.get("permfail@example.net") == "permanent":
                return Reclassify(transient="all")
            if statuses.get("tempfail@example.org") == "transient":
                return Reclassify(permanent=["tempfail@example.org"], classification="GiveUp")
    """
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint, retry_interval="0.5s", dsn=False)
        with _node(tmp_path, source, **config) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["permfail@example.net"], MESSAGE)
            client.sendmail("a@example.org", ["tempfail@example.org"], MESSAGE)
            bounces = {r["recipient"]: r for r in pigeon.wait_records("Bounce", 2)}
            (transient,) = pigeon.records("TransientFailure")
            assert transient["recipient"] == "permfail@example.net"
            assert transient["response"]["code"] == 450 and transient["response"]["enhanced"] == "4.1.1"
            assert transient["response"]["text"] == "policy made it transient: 550 no such user here"
            assert transient["classification"] == "InvalidRecipient"  # the server's reply's, not "policy"'s
            assert bounces["permfail@example.net"]["attempt"] == 2  # tried again, then bounced as it said
            assert bounces["permfail@example.net"]["response"]["code"] == 550
            made = bounces["tempfail@example.org"]
            # 550, not 551 ("user not local"): the class changes, the enhanced code's detail stays.
            assert (made["attempt"], made["response"]["code"], made["classification"]) == (1, 550, "GiveUp")
            assert made["response"]["enhanced"] == "5.3.0"
            assert made["response"]["text"] == "policy made it permanent: 451 try again later"


def test_a_reclassification_that_contradicts_itself_is_the_hooks_failure_and_the_attempt_keeps_its_outcome(
    tmp_path: Path,
) -> None:
    source = """
        from pigeon.policy import Reclassify
        def on_delivery_outcome(outcome):
            first = outcome.results[0].recipient
            if first.startswith("permfail@"):
                return Reclassify(transient="all", permanent="all")
            if first.startswith("tempfail@"):
                return Reclassify(transient=[first.upper()], permanent=[first])
    """
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint, retry_interval="30s", dsn=False)
        with _node(tmp_path, source, **config) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["permfail@example.net"], MESSAGE)
            client.sendmail("a@example.org", ["tempfail@example.org"], MESSAGE)
            (bounce,) = pigeon.wait_records("Bounce")  # its own 550, neither made transient nor back
            assert (bounce["recipient"], bounce["attempt"]) == ("permfail@example.net", 1)
            assert (bounce["response"]["code"], bounce["response"]["text"]) == (550, "no such user here")
            (transient,) = pigeon.wait_records("TransientFailure")  # its own 451, not made a bounce
            assert transient["recipient"] == "tempfail@example.org"
            assert (transient["response"]["code"], transient["response"]["text"]) == (451, "try again later")
            failures = sorted(_failures(pigeon, 2), key=lambda f: f["error"])
            assert [(f["hook"], f["action"]) for f in failures] == [("on_delivery_outcome", "kept")] * 2
            assert 'makes "all" both transient and permanent' in failures[0]["error"]
            assert "makes 'tempfail@example.org' both transient and permanent" in failures[1]["error"]


# --- hooks that fail, hang, or are async ------------------------------------------------------
def test_a_failing_hook_answers_451_logs_its_traceback_and_the_worker_goes_on(tmp_path: Path) -> None:
    source = """
        def on_message(message):
            if message.headers["Subject"] == "boom":
                return 1 / 0
        def on_rcpt_to(rcpt):
            if rcpt.recipient.startswith("odd@"):
                return "not an answer"
    """
    with _node(tmp_path, source) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        client.mail("a@example.org")
        client.rcpt("b@example.net")
        assert client.data(b"From: a@example.org\r\nSubject: boom\r\n\r\nhi\r\n") == (
            451,
            b"4.3.0 policy error; try again later",
        )
        client.mail("a@example.org")
        assert client.rcpt("odd@example.net") == (451, b"4.3.0 policy error; try again later")
        assert client.rcpt("b@example.net")[0] == 250
        assert (
            client.data(b"From: a@example.org\r\nSubject: fine\r\n\r\nhi\r\n")[0] == 250
        )  # same connection, same worker
        failures = _failures(pigeon, 2)
        raised = next(f for f in failures if f["hook"] == "on_message")
        assert raised["error"] == "ZeroDivisionError: division by zero"
        assert "Traceback (most recent call last)" in raised["traceback"] and "1 / 0" in raised["traceback"]
        assert raised["action"] == "451 4.3.0" and raised["session"]
        wrong = next(f for f in failures if f["hook"] == "on_rcpt_to")
        assert "returned 'not an answer'" in wrong["error"]
        assert [m["recipients"] for m in pigeon.spool_messages()] == [["b@example.net"]]  # the refused one is gone
        # The id the failure names was never stored: the refusal of that message names it too,
        # so that grepping the log for it finds what the client was told.
        (refused,) = [r for r in pigeon.wait_records("Rejection", 2) if r["command"] == "DATA"]
        assert (refused["id"], refused["session"]) == (raised["id"], raised["session"])
        assert refused["response"]["code"] == 451
        assert "id" not in next(r for r in pigeon.records("Rejection") if r["command"] == "RCPT")
        (reception,) = pigeon.wait_records("Reception")
        assert reception["id"] != raised["id"]


def test_a_failing_on_connect_answers_421_and_its_records_say_421(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Refuse
        def on_connect(connection):
            if connection.peer_ip == "127.0.0.2":
                raise RuntimeError("blocklist is down")
            if connection.peer_ip == "127.0.0.3":
                return Refuse(250, "a refusal that is not one")
    """
    with _node(tmp_path, source) as pigeon:
        for source_ip in ("127.0.0.2", "127.0.0.3"):
            with RawSmtp(pigeon.smtp_port, source=source_ip) as client:
                # No enhanced code on the wire: none goes on a greeting (RFC 2034 3).
                assert client.reply() == (421, ["policy error; try again later"])
                assert client.closed_by_peer()
        failures = _failures(pigeon, 2)
        # ... nor in the records: what was sent (found from outside: they said "421 4.3.0").
        assert [(f["hook"], f["action"]) for f in failures] == [("on_connect", "421")] * 2
        assert (
            "a refusal's code is 400 to 599, its second digit 0 to 5 (RFC 5321 4.2.1), not 250" in failures[1]["error"]
        )
        rejections = pigeon.wait_records("Rejection", 2)
        assert [(r["command"], r["response"]["code"], r["response"].get("enhanced")) for r in rejections] == [
            ("CONNECT", 421, None)
        ] * 2
        assert [r["session"] for r in rejections] == [f["session"] for f in failures]
        assert pigeon.stderr().count("policy hook on_connect failed") == 2
        assert "; 451 4.3.0" not in pigeon.stderr()


def test_failing_delivery_hooks_defer_or_keep_the_outcome_and_lose_nothing(tmp_path: Path) -> None:
    source = """
        def before_delivery(delivery):
            if delivery.attempt == 1 and delivery.recipients[0].startswith("ok@"):
                raise RuntimeError("routing table is down")
        def on_delivery_outcome(outcome):
            raise KeyError("outcome hook bug")
    """
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint, retry_interval="0.5s", dsn=False)
        with _node(tmp_path, source, **config) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("a@example.org", ["ok@example.net"], MESSAGE)
            client.sendmail("a@example.org", ["permfail@example.org"], MESSAGE)
            (transient,) = pigeon.wait_records("TransientFailure")
            assert (transient["recipient"], transient["response"]["code"]) == ("ok@example.net", 451)
            assert transient["response"]["enhanced"] == "4.3.0"
            (delivery,) = pigeon.wait_records("Delivery")
            assert (delivery["recipient"], delivery["attempt"]) == ("ok@example.net", 2)
            (bounce,) = pigeon.wait_records("Bounce")  # the outcome hook's failure kept the 550
            assert bounce["recipient"] == "permfail@example.org" and bounce["classification"] == "InvalidRecipient"
            failures = _failures(pigeon, 3)
            assert {(f["hook"], f["action"]) for f in failures} == {
                ("before_delivery", "deferred"),
                ("on_delivery_outcome", "kept"),
            }
            assert all(f["id"] for f in failures)
            assert len(sink.after(1.5)) == 1  # delivered once, not twice
            wait_until(lambda: pigeon.spool_messages() == [])


def test_a_slow_async_hook_times_out_with_451(tmp_path: Path) -> None:
    source = """
        import asyncio
        async def on_mail_from(mail):
            if mail.sender.startswith("slow@"):
                await asyncio.sleep(30)
    """
    with _node(tmp_path, source, timeout="0.3s") as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        assert client.mail("slow@example.org") == (451, b"4.3.0 policy check timed out; try again later")
        assert client.mail("quick@example.org")[0] == 250
        (failure,) = _failures(pigeon)
        assert failure["hook"] == "on_mail_from" and failure["error"] == "timed out after 0.3s ([policy] timeout)"
        # Where it waited (found from outside: a timeout named no line of the hook's).
        trace = failure["traceback"]
        assert trace.startswith("The hook was waiting here") and "await asyncio.sleep(30)" in trace, trace
        assert "in on_mail_from" in trace, trace


def test_a_slow_plain_hook_on_threads_times_out_without_holding_up_the_worker(tmp_path: Path) -> None:
    source = """
        import time
        def on_rcpt_to(rcpt):
            if rcpt.recipient.startswith("slow@"):
                time.sleep(3)
    """
    with _node(tmp_path, source, timeout="0.3s", sync="thread") as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as slow, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as other:
            slow.ehlo("client.test")
            other.ehlo("client.test")
            slow.mail("a@example.org")
            slow.send(b"RCPT TO:<slow@example.net>\r\n")  # the answer comes after the timeout
            other.mail("a@example.org")
            assert other.rcpt("fast@example.net")[0] == 250  # meanwhile, the worker answers others
            assert slow.getreply() == (451, b"4.3.0 policy check timed out; try again later")
        (failure,) = _failures(pigeon)
        assert failure["hook"] == "on_rcpt_to"


def test_async_hooks_are_awaited_at_every_point(tmp_path: Path) -> None:
    source = """
        import asyncio
        from pigeon.policy import Changes, Refuse
        async def on_connect(connection):
            await asyncio.sleep(0.01)
        async def on_rcpt_to(rcpt):
            await asyncio.sleep(0.01)
            if rcpt.recipient.startswith("no@"):
                return Refuse(550, "async says no")
        async def on_message(message):
            await asyncio.sleep(0.01)
            return Changes(tenant=message.sender.split("@")[0])
    """
    with _node(tmp_path, source) as pigeon, smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        client.ehlo("client.test")
        client.mail("acme@example.org")
        assert client.rcpt("no@example.net") == (550, b"5.7.1 async says no")
        assert client.rcpt("yes@example.net")[0] == 250
        assert client.data(MESSAGE)[0] == 250
        (reception,) = pigeon.wait_records("Reception")
        assert reception["queue"] == "acme@example.net"
        recipients = [{"email": "no@example.net"}, {"email": "yes@example.net"}]
        body = {"envelope_sender": "acme@example.org", "recipients": recipients, "content": MESSAGE.decode()}
        status, answer = pigeon.http_post("/api/v1/inject", body, pigeon.local_token)  # awaited there too
        assert status == 200 and [r.get("error") for r in answer["recipients"]] == ["550 5.7.1 async says no", None]


# --- HTTP injection -------------------------------------------------------------------------
def test_http_injection_meets_the_same_on_message_hook(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Changes, Refuse
        def on_message(message):
            assert message.listener == "http" and message.protocol == "HTTP"
            if message.recipients[0].startswith("no@"):
                return Refuse(550, "not this recipient")
            if message.recipients[0].startswith("later@"):
                return Refuse(451, "not now")
            if message.recipients[0].startswith("boom@"):
                raise ValueError("broken policy")
            return Changes(campaign=message.metadata.get("campaign"), add_headers=[("X-Injected", "yes")])
    """
    with _node(tmp_path, source) as pigeon:
        token = pigeon.local_token

        def inject(*emails: str) -> tuple[int, Any]:
            recipients = [{"email": e, "metadata": {"campaign": "april"}} for e in emails]
            body = {
                "envelope_sender": "a@example.org",
                "recipients": recipients,
                # Rendered per recipient: a message each, each asked about (content the same for
                # all is one message, asked about once with all its recipients, as over SMTP).
                "content": "From: a@example.org\r\nSubject: x\r\n\r\nhi {{ email }}\r\n",
            }
            return pigeon.http_post("/api/v1/inject", body, token)

        status, answer = inject("no@example.net")
        assert status == 422
        assert answer["recipients"] == [{"email": "no@example.net", "error": "550 5.7.1 not this recipient"}]
        status, answer = inject("later@example.net")
        assert (status, answer["recipients"][0]["error"]) == (503, "451 4.7.1 not now")
        status, answer = inject("boom@example.net")
        assert (status, answer["recipients"][0]["error"]) == (503, "451 4.3.0 policy error; try again later")
        status, answer = inject("no@example.net", "yes@example.net")
        assert status == 200 and (answer["accepted"], answer["failed"]) == (1, 1)
        (reception,) = pigeon.wait_records("Reception")
        assert reception["queue"] == "april:@example.net"
        (stored,) = pigeon.spool_messages()
        assert stored["envelope"].headers_added == ["X-Injected: yes"]
        (failure,) = _failures(pigeon)
        assert failure["hook"] == "on_message" and "ValueError: broken policy" in failure["error"]
        # Each refused recipient is logged with the id its message was given (the response has
        # none for it), and the failure's id and request (session) lead to its refusal.
        rejections = pigeon.wait_records("Rejection", 4)
        assert sorted((r["command"], r["recipients"][0], r["response"]["code"]) for r in rejections) == [
            ("inject", "boom@example.net", 451),
            ("inject", "later@example.net", 451),
            ("inject", "no@example.net", 550),
            ("inject", "no@example.net", 550),
        ]
        (boom,) = [r for r in rejections if r["recipients"] == ["boom@example.net"]]
        assert (boom["id"], boom["session"]) == (failure["id"], failure["session"])
        assert len({r["id"] for r in rejections} | {reception["id"]}) == 5
        # ... and counted as SMTP's refusals are.
        assert pigeon.metric('pigeon_rejections_total{code="550",command="inject"}') == 2
        assert pigeon.metric('pigeon_rejections_total{code="451",command="inject"}') == 2


@pytest.mark.parametrize("sync", ["inline", "thread"])
def test_an_on_message_that_changes_the_metadata_fails_and_the_logs_keep_the_applications(
    tmp_path: Path, sync: str
) -> None:
    """A hook's `message.metadata["user"] = "EVIL"` was kept: the Reception and Delivery records
    said `meta: {"user": "EVIL"}`, past `[http] max_metadata_size` too."""
    source = """
        def on_message(message):
            assert dict(message.metadata) == {"user": "42"}
            if message.recipients[0].startswith("evil@"):
                message.metadata["user"] = "EVIL"
    """
    with ScriptedSink() as sink, _node(tmp_path, source, sync=sync, **delivery_config(sink.endpoint)) as pigeon:

        def inject(*emails: str) -> tuple[int, Any]:
            body = {
                "envelope_sender": "a@example.org",
                "recipients": [{"email": email, "metadata": {"user": "42"}} for email in emails],
                "content": "From: a@example.org\r\nSubject: x\r\n\r\nhi\r\n",
            }
            return pigeon.http_post("/api/v1/inject", body, pigeon.local_token)

        status, answer = inject("evil@example.net")
        assert (status, answer["recipients"][0]["error"]) == (503, "451 4.3.0 policy error; try again later")
        (failure,) = _failures(pigeon)
        assert failure["error"] == "TypeError: 'mappingproxy' object does not support item assignment"
        # Two messages of one metadata (content the same for all: one per domain) each get theirs.
        assert inject("fine@example.net", "fine@example.com")[0] == 200
        receptions = pigeon.wait_records("Reception", 2)
        deliveries = pigeon.wait_records("Delivery", 2)
        assert [r["meta"] for r in receptions + deliveries] == [{"user": "42"}] * 4


def test_mail_from_and_rcpt_to_hooks_hold_for_http_injection_and_pigeon_inject(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Refuse
        def on_mail_from(mail):
            if mail.sender.startswith("temp@"):
                return Refuse(451, "sender on hold", "4.3.2")
            if mail.sender.startswith("echo@"):
                return Refuse(550, f"{mail.listener} {mail.session} {mail.peer_ip} helo={mail.helo!r} "
                                   f"size={mail.size} utf8={mail.smtputf8} tls={mail.tls} auth={mail.auth_user}")
        def on_rcpt_to(rcpt):
            if rcpt.recipient.startswith("nope@"):
                return Refuse(550, "no such user", "5.1.1")
            if rcpt.recipient.startswith("boom@"):
                raise RuntimeError("directory is down")
            if rcpt.recipient.startswith("echo@"):
                return Refuse(550, f"{rcpt.listener} {rcpt.session} helo={rcpt.helo!r} tls={rcpt.tls} "
                                   f"auth={rcpt.auth_user} from={rcpt.sender} taken={','.join(rcpt.accepted)}")
    """
    with _node(tmp_path, source) as pigeon:
        token = pigeon.local_token

        def inject(sender: str, *emails: str) -> tuple[int, Any]:
            body = {
                "envelope_sender": sender,
                "recipients": [{"email": e} for e in emails],
                "content": MESSAGE.decode(),
            }
            return pigeon.http_post("/api/v1/inject", body, token)

        def errors(answer: Any) -> list[str | None]:
            return [r.get("error") for r in answer["recipients"]]

        # SMTP and HTTP are refused alike.
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("client.test")
            assert client.mail("temp@example.org") == (451, b"4.3.2 sender on hold")
            client.mail("a@example.org")
            assert client.rcpt("nope@example.net") == (550, b"5.1.1 no such user")
        status, answer = inject("a@example.org", "nope@example.net")
        assert (status, errors(answer)) == (422, ["550 5.1.1 no such user"])
        # A refused mailbox named again: still every recipient refused for good, the repeat as such.
        status, answer = inject("a@example.org", "nope@example.net", "nope@example.net")
        duplicate = "550 5.1.0 duplicate of recipient 0 of the request"
        assert (status, errors(answer)) == (422, ["550 5.1.1 no such user", duplicate])
        status, answer = inject("temp@example.org", "x@example.net", "y@example.net")
        assert (status, errors(answer)) == (503, ["451 4.3.2 sender on hold"] * 2)
        status, answer = inject("a@example.org", "ok@example.net", "nope@example.net", "echo@example.net")
        assert status == 200 and (answer["accepted"], answer["failed"]) == (1, 2)
        ok, nope, echo = answer["recipients"]
        assert "id" in ok and nope["error"] == "550 5.1.1 no such user"
        session = echo["error"].split()[3]
        assert session.startswith("http-")
        # What on_message is given for HTTP: no HELO, no TLS, the token's name; taken so far: ok@.
        assert (
            echo["error"]
            == f"550 5.7.1 http {session} helo='' tls=None auth=local from=a@example.org taken=ok@example.net"
        )
        status, answer = inject("echo@example.org", "ok@example.net")
        assert status == 422
        assert errors(answer)[0].startswith("550 5.7.1 http http-")
        assert errors(answer)[0].endswith(" 127.0.0.1 helo='' size=None utf8=False tls=None auth=local")
        # A hook that fails answers 451 4.3.0, as on SMTP, and leaves a PolicyFailure.
        status, answer = inject("a@example.org", "boom@example.net", "nope@example.net")
        assert (status, errors(answer)) == (503, ["451 4.3.0 policy error; try again later", "550 5.1.1 no such user"])
        (failure,) = _failures(pigeon)
        assert (failure["hook"], failure["action"]) == ("on_rcpt_to", "451 4.3.0")
        assert failure["session"].startswith("http-") and "directory is down" in failure["error"]
        # pigeon inject says the same, and exits as sendmail would.
        message = tmp_path / "message.eml"
        message.write_bytes(MESSAGE)
        config = str(pigeon.config_path)
        refused = _cli("inject", "-c", config, "--from", "a@example.org", "--to", "nope@example.net", str(message))
        assert refused.returncode == 1 and "refused: 550 5.1.1 no such user" in refused.stdout
        later = _cli("inject", "-c", config, "--from", "temp@example.org", "--to", "x@example.net", str(message))
        assert later.returncode == 75 and "refused: 451 4.3.2 sender on hold" in later.stdout
        # Only ok@ was stored; every refused recipient is a Rejection of the injection, counted.
        assert [m["recipients"] for m in pigeon.spool_messages()] == [["ok@example.net"]]
        injected = [r for r in pigeon.wait_records("Rejection", 14) if r["command"] == "inject"]
        assert sorted((r["recipients"][0], r["response"]["code"]) for r in injected) == [
            ("boom@example.net", 451),
            ("echo@example.net", 550),
            ("nope@example.net", 550),
            ("nope@example.net", 550),
            ("nope@example.net", 550),
            ("nope@example.net", 550),
            ("nope@example.net", 550),
            ("nope@example.net", 550),
            ("ok@example.net", 550),
            ("x@example.net", 451),
            ("x@example.net", 451),
            ("y@example.net", 451),
        ]
        assert all(r["session"].startswith("http-") and r["auth_user"] == "local" and "id" not in r for r in injected)
        assert pigeon.metric('pigeon_rejections_total{code="550",command="inject"}') == 8
        assert pigeon.metric('pigeon_rejections_total{code="451",command="inject"}') == 4


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run([*args], text=True, timeout=60)


# --- loading and reloading ------------------------------------------------------------------
def test_sighup_reloads_the_policy_module_and_a_broken_one_keeps_the_old(tmp_path: Path) -> None:
    module = _policy(tmp_path, "def on_mail_from(mail):\n    return None\n")
    with PigeonProcess(tmp_path / "node", policy={"module": str(module)}) as pigeon:
        module.write_text("from pigeon.policy import Refuse\ndef on_mail_from(mail):\n    return Refuse(550, 'v2')\n")
        _hangup(pigeon, "reloaded:")
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("client.test")
            assert client.mail("a@example.org") == (550, b"5.7.1 v2")
        assert _reloaded(pigeon)[-1].endswith(", policy hooks on_mail_from")
        module.write_text("def on_mail_from(mail) syntax error\n")
        _hangup(pigeon, "the policy module stays as it was")
        # Found from outside: the summary after it named no hooks, though the old ones still run.
        pigeon.wait_stderr("reloaded:", 2)
        summaries = _reloaded(pigeon)
        assert len(summaries) == 2, summaries
        assert summaries[-1].endswith(", policy hooks on_mail_from (the module as it was)"), summaries
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("client.test")
            assert client.mail("a@example.org") == (550, b"5.7.1 v2")


def test_a_reload_of_a_broken_module_says_file_line_and_why_on_one_line_and_the_traceback_readable(
    tmp_path: Path,
) -> None:
    """A SyntaxError was logged as `... line 4\\x0a    def broken(:\\x0a ...`, and an error raised at
    import as `RuntimeError: import-time boom`, with no file or line."""
    module = _policy(tmp_path, "def on_mail_from(mail):\n    return None\n")
    with PigeonProcess(tmp_path / "node", policy={"module": str(module)}) as pigeon:
        module.write_text("import os\n\n\ndef broken(:\n    pass\n")
        _hangup(pigeon, "the policy module stays as it was")
        (tmp_path / "helpers.py").write_text('import os\n\nraise RuntimeError("import-time boom")\n')
        module.write_text("import helpers\n")
        _hangup(pigeon, "cannot be loaded: ")
        pigeon.wait_stderr("reloaded:", 2)
        lines = pigeon.stderr().splitlines()
        failed = [line.partition("reload: the policy module stays as it was: ")[2] for line in lines]
        assert [line for line in failed if line] == [
            f"policy module {module} cannot be loaded: {module}:4: SyntaxError: invalid syntax: def broken(:",
            f"policy module {module} cannot be loaded: {tmp_path / 'helpers.py'}:3: RuntimeError: import-time boom",
        ]
        assert not any("\\x0a" in line for line in lines)
        # Each with its traceback, line by line, from the module on (not Pigeon's import of it).
        syntax = lines.index(next(line for line in lines if "SyntaxError: invalid" in line))
        assert lines[syntax + 1 : syntax + 5] == [
            f'  File "{module}", line 4',
            "    def broken(:",
            "               ^",
            "SyntaxError: invalid syntax",
        ]
        raised = lines.index(next(line for line in lines if "RuntimeError: import-time" in line))
        assert lines[raised + 1 : raised + 7] == [
            "Traceback (most recent call last):",
            f'  File "{module}", line 1, in <module>',
            "    import helpers",
            f'  File "{tmp_path / "helpers.py"}", line 3, in <module>',
            '    raise RuntimeError("import-time boom")',
            "RuntimeError: import-time boom",
        ]


def test_misspelt_hook_names_are_warned_about_once_at_start_and_once_at_a_reload(tmp_path: Path) -> None:
    source = """
        def on_mesage(message):
            pass
        def on_rcpt(rcpt):
            pass
    """
    warnings = ("on_mesage is not a hook name", "on_rcpt is not a hook name")
    for workers in (1, 2):  # one process, or a supervisor and its workers: all load the module
        with _node(tmp_path / str(workers), source, node={"workers": workers}) as pigeon:  # (AF_UNIX: short paths)
            for warning in warnings:
                pigeon.wait_stderr(warning)
            _hangup(pigeon, "reloaded:")
            pigeon.wait_stderr("reloaded:", workers)  # every worker has started, and reloaded
            for warning in warnings:
                assert pigeon.stderr().count(warning) == 2, pigeon.stderr()


def test_a_policy_section_added_at_a_reload_is_in_force_at_once_and_in_a_worker_started_again(
    tmp_path: Path,
) -> None:
    """Found from outside: `[policy] module = "pol.py"` added and a SIGHUP logged `reload: [policy]
    changed; it takes effect at the next restart (the module is reloaded)`, and no hook ran until
    a restart, where an edit of the module's code was in force at once."""
    refusing = "from pigeon.policy import Refuse\ndef on_mail_from(mail):\n    return Refuse(550, 'pol')\n"
    _policy(tmp_path / "node", refusing)
    with PigeonProcess(tmp_path / "node", node={"workers": 2}) as pigeon:  # (both workers: each reloads)
        assert pigeon.process is not None
        text = pigeon.config_path.read_text()
        pigeon.config_path.write_text(text + '\n[policy]\nmodule = "policy.py"\ntimeout = "3s"\n')
        _hangup(pigeon, "reloaded:")
        pigeon.wait_stderr("reloaded:", 2)
        assert _reloaded(pigeon)[-1].endswith(", policy hooks on_mail_from"), _reloaded(pigeon)
        assert "takes effect" not in pigeon.stderr()
        assert _mail_from_answers(pigeon) == {(550, b"5.7.1 pol")}
        # A worker started again runs the policy the node reloaded, as the others do.
        for pid in worker_pids(pigeon):
            os.kill(pid, signal.SIGKILL)
        pigeon.wait_stderr("reload: taking the configuration the node reloaded", 2, timeout=30)
        wait_until(lambda: len(worker_pids(pigeon)) == 2 and _mail_from_answers(pigeon) == {(550, b"5.7.1 pol")})
        assert "takes effect" not in pigeon.stderr()
        # Taken out again: no hook runs from the reload on.
        pigeon.config_path.write_text(text)
        _hangup(pigeon, "reloaded:")
        pigeon.wait_stderr("reloaded:", 4)
        assert {code for code, _ in _mail_from_answers(pigeon)} == {250}


def _mail_from_answers(pigeon: PigeonProcess, connections: int = 8) -> set[tuple[int, bytes]]:
    """What MAIL FROM is answered on `connections` connections (the workers share the port)."""
    answers = set()
    for _ in range(connections):
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("client.test")
            answers.add(client.mail("a@example.org"))
    return answers


def _reloaded(pigeon: PigeonProcess) -> list[str]:
    """The summaries of the reloads so far."""
    return [line for line in pigeon.stderr().splitlines() if "reloaded:" in line]


def _hangup(pigeon: PigeonProcess, outcome: str) -> None:
    assert pigeon.process is not None
    before = pigeon.stderr().count(outcome)
    pigeon.process.send_signal(signal.SIGHUP)
    pigeon.wait_stderr(outcome, before + 1)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_broken_policy_module_stops_the_start_with_its_reason_and_exit_2(tmp_path: Path, workers: int) -> None:
    # Exit 2, as for any other configuration error (1 is for the rest: a port in use, ...).
    module = _policy(tmp_path, "import no_such_module_anywhere\n")
    pigeon = PigeonProcess(tmp_path / "node", policy={"module": str(module)}, node={"workers": workers})
    try:
        pigeon.start(wait=False)
        assert pigeon.process is not None
        assert pigeon.process.wait(30) == 2
        assert "cannot start: policy module" in pigeon.stderr()
        assert "No module named 'no_such_module_anywhere'" in pigeon.stderr()
    finally:
        pigeon.kill()


def test_a_node_of_one_process_runs_its_policy_modules_code_once(tmp_path: Path) -> None:
    imports = tmp_path / "imports"
    source = f"""
        import os
        with open({str(imports)!r}, "a") as imports:
            imports.write(f"{{os.getpid()}}\\n")
        def on_message(message):
            return None
    """
    with _node(tmp_path, source) as pigeon:  # its module connects to a database, say: once
        assert pigeon.process is not None
        assert imports.read_text().split() == [str(pigeon.process.pid)]
        _hangup(pigeon, "reloaded:")  # a reload imports it again, as it says
        assert imports.read_text().split() == [str(pigeon.process.pid)] * 2


def test_a_shutdown_during_the_outcome_hook_reports_what_was_sent_and_it_is_not_sent_again(tmp_path: Path) -> None:
    source = """
        import asyncio
        async def on_delivery_outcome(outcome):
            await asyncio.sleep(60)
    """
    with ScriptedSink() as sink:
        config = delivery_config(sink.endpoint)
        pigeon = _node(tmp_path, source, timeout="120s", node={"shutdown_timeout": "1s"}, **config)
        with pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                client.sendmail("a@example.org", ["ok@example.net"], MESSAGE)
            sink.wait_for(1)  # sent; the hook now holds the outcome
            assert pigeon.stop() == 0  # the grace ends mid-hook: the attempt is reported as it was
        (delivery,) = pigeon.records("Delivery")
        assert delivery["recipient"] == "ok@example.net"
        assert pigeon.spool_messages() == []
        with pigeon:
            assert len(sink.after(2)) == 1  # nothing left to send again


def test_pigeons_own_dsns_do_not_go_through_on_message(tmp_path: Path) -> None:
    source = """
        from pigeon.policy import Refuse
        def on_message(message):
            if message.sender == "":
                return Refuse(550, "no bounces from outside")
    """
    with ScriptedSink() as sink, _node(tmp_path, source, **delivery_config(sink.endpoint)) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("client.test")
            client.mail("")
            client.rcpt("ok@example.net")
            assert client.data(MESSAGE) == (550, b"5.7.1 no bounces from outside")
            client.sendmail("ok@example.org", ["permfail@example.net"], MESSAGE)
        (dsn,) = sink.wait_for(1)
        assert (dsn.sender, dsn.recipients) == ("<>", ["ok@example.org"])
