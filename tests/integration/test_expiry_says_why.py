"""What an expiry tells its sender, and what a deferral's record tells the operator, through
real nodes and sinks: an expiry's DSN reports the recipient's last failure as the server's
reply (`Remote-MTA`, `smtp;`) when a server gave it, and as Pigeon's own (`X-Pigeon;`) when
not; mail a shaping reaction's suspension held names that suspension when it expires, and
`pigeon inspect` names it while it holds; every deferral is classified (its record, `pigeon
logs --classification`, `/metrics`)."""

from __future__ import annotations

import json
import smtplib
from email.message import Message
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.process import PigeonProcess
from tests.support.sinks import AnswerSink, ScriptedSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: expiry\r\n\r\nHello.\r\n"
QUOTA = "452 4.2.2 mailbox full"
RATE_LIMITED = (
    "421 4.7.28 Our system has detected an unusual rate of unsolicited mail originating from your IP "
    "address. To protect our users from spam, mail sent from your IP address has been temporarily rate limited."
)


def _send(pigeon: PigeonProcess, recipients: list[str]) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        assert client.sendmail("sender@example.org", recipients, MESSAGE) == {}


def _status_blocks(dsn: Message) -> dict[str, Message]:
    """The per-recipient blocks of a DSN's delivery-status part, by recipient address."""
    blocks = dsn.get_payload()[1].get_payload()[1:]  # (the first is the per-message one)
    return {block["Final-Recipient"].split("; ")[1]: block for block in blocks}


def _with_dsn_sink(config: dict[str, object], dsn_sink: ScriptedSink) -> dict[str, object]:
    """`config` with the senders' domain's mail (the DSNs) going to `dsn_sink`."""
    routes = config["route"]
    assert isinstance(routes, list)
    config["route"] = [{"domain": "example.org", "next_hop": dsn_sink.endpoint, "tls": "disabled"}, *routes]
    return config


def test_an_expiry_dsn_reports_the_servers_last_reply_as_the_servers_and_its_deferrals_are_classified(
    tmp_path: Path,
) -> None:
    with ScriptedSink() as sink:
        sink.rcpt_reply = lambda address: QUOTA if address.startswith("full") else None
        config = delivery_config(sink.endpoint, max_age="4s")
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            _send(pigeon, ["full@example.net"])
            (expiration,) = pigeon.wait_records("Expiration", 1, timeout=30)
            assert expiration["response"]["text"].startswith("Message expired: not delivered within 4 seconds")
            (dsn,) = sink.wait_for(1, timeout=20)
            block = _status_blocks(dsn.email)["full@example.net"]
            # The remote status, as a parser reads it (Postfix's form for mail expired after deferrals) ...
            assert block["Diagnostic-Code"] == f"smtp; {QUOTA}"
            assert block["Remote-MTA"] == "dns; [127.0.0.1]"
            # ... under the expiry's own Status, and a text that says the message expired.
            assert (block["Action"], block["Status"]) == ("failed", "5.4.7")
            text = " ".join(dsn.email.get_payload()[0].get_payload(decode=True).decode().split())  # (unwrapped)
            assert "Message expired: not delivered within 4 seconds; last attempt: 452 4.2.2 mailbox full" in text

            transient = pigeon.records("TransientFailure")
            assert transient and {r["classification"] for r in transient} == {"QuotaIssues"}
            shown = pigeon.cli("logs", "--classification", "quotaissues")
            listed = [json.loads(line) for line in shown.splitlines()]
            assert listed and {r["type"] for r in listed} == {"TransientFailure"}
            assert pigeon.cli("logs", "--classification", "PolicyRelated") == ""
            name = 'pigeon_classified_recipients_total{classification="QuotaIssues",outcome="TransientFailure"}'
            assert pigeon.metric(name) == len(transient)


def test_an_expiry_after_refused_connections_reports_pigeons_own_words(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there: each connection is refused
    with ScriptedSink() as dsn_sink:
        config = _with_dsn_sink(delivery_config(dead, max_age="4s"), dsn_sink)
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            _send(pigeon, ["nobody@example.net"])
            (dsn,) = dsn_sink.wait_for(1, timeout=30)
            block = _status_blocks(dsn.email)["nobody@example.net"]
            assert block["Diagnostic-Code"].startswith("X-Pigeon; 554 5.4.7 Message expired"), block
            assert "cannot connect to" in block["Diagnostic-Code"]
            assert block["Remote-MTA"] is None and block["Status"] == "5.4.7"
            assert {r["classification"] for r in pigeon.records("TransientFailure")} == {"BadConnection"}


def test_mail_a_reactions_suspension_holds_expires_naming_it_and_inspect_names_it_meanwhile(tmp_path: Path) -> None:
    with ScriptedSink() as sink, ScriptedSink() as dsn_sink:
        sink.rcpt_reply = lambda address: RATE_LIMITED if address.startswith("first") else None
        config = _with_dsn_sink(delivery_config(sink.endpoint, max_age="5s"), dsn_sink)
        reaction = {"id": "sink-rate-limited", "match": r"^421 4\.7\.28", "site": "127.0.0.1:*",
                    "action": "suspend", "duration": "1h"}  # fmt: skip
        with PigeonProcess(tmp_path / "node", reaction=[reaction], **config) as pigeon:
            _send(pigeon, ["first@example.net"])
            (transient,) = pigeon.wait_records("TransientFailure", 1, timeout=20)
            assert transient["classification"] == "PolicyRelated"  # a rate limit, not the words "spam"
            _send(pigeon, ["second@example.net"])  # waits in the held ready queue, never tried
            second = wait_until(
                lambda: [r for r in pigeon.records("Reception") if "second@example.net" in r["recipients"]]
            )
            message_id = second[0]["id"]

            def held() -> str | None:
                status, answer = pigeon.http_call("GET", f"/api/v1/messages/{message_id}", token=pigeon.local_token)
                return answer.get("held_by_effect") if status == 200 else None

            holding = wait_until(held, timeout=10)
            assert holding.startswith(f"shaping reaction sink-rate-limited (suspend site:{sink.endpoint} until ")
            # (the 421, with the command it answered: it ended the connection mid-transaction)
            answered = f"{RATE_LIMITED} (answer of [{sink.endpoint.replace(':', ']:')} to RCPT TO)"
            assert holding.endswith(f"after {answered}")

            expirations = wait_until(lambda: len(pigeon.records("Expiration")) == 2 and pigeon.records("Expiration"),
                                     timeout=30)  # fmt: skip
            said = {r["recipient"]: r["response"]["text"] for r in expirations}
            for recipient in ("first@example.net", "second@example.net"):
                assert f"; last held by {holding}" in said[recipient], said
            assert said["first@example.net"].endswith(f"; last attempt: {answered}")
            assert "last attempt" not in said["second@example.net"]
            assert [r["attempt"] for r in expirations if r["recipient"] == "second@example.net"] == [0]

            blocks: dict[str, Message] = {}
            for dsn in dsn_sink.wait_for(2, timeout=20):
                blocks.update(_status_blocks(dsn.email))
            assert blocks["first@example.net"]["Diagnostic-Code"] == f"smtp; {RATE_LIMITED}"
            assert blocks["second@example.net"]["Diagnostic-Code"].startswith("X-Pigeon; 554 5.4.7 Message expired")
            assert "last held by shaping reaction sink-rate-limited" in blocks["second@example.net"]["Diagnostic-Code"]


_WAITING = {"retry_interval": "1h", "max_age": "3s"}  # (expires waiting for its retry: no attempt ends it)


@pytest.mark.parametrize(
    ("answers", "delays", "settings", "said"),
    [
        ({"RCPT": ""}, {}, _WAITING, "closed the connection after RCPT TO"),
        ({}, {"RCPT": 3.0}, {**_WAITING, "reply_timeout": "1s"}, "timeout waiting for"),
        ({}, {"RCPT": 4.0}, {"max_age": "2s", "reply_timeout": "3s"}, "timeout waiting for"),
    ],
    ids=["closed-at-rcpt", "no-answer-to-rcpt", "no-answer-past-max-age"],
)
def test_an_expiry_after_a_server_that_greeted_failed_the_connection_names_that_server(
    tmp_path: Path, answers: dict[str, str], delays: dict[str, float], settings: dict[str, str], said: str
) -> None:
    """Found from outside: the server greeted, then closed the connection at each RCPT (or never
    answered it) until `max_age`; the delay warning named it (`Remote-MTA`), the expiry's DSN
    did not, though its last failure (in Pigeon's words, `X-Pigeon;`) was at that server. The
    message expires waiting for its next retry (its row says where it last failed), or at the
    end of an attempt that outlived `max_age`."""
    with AnswerSink(answers, delays=delays) as sink, ScriptedSink() as dsn_sink:
        config = _with_dsn_sink(delivery_config(sink.endpoint, **settings), dsn_sink)
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            _send(pigeon, ["lost@example.net"])
            (dsn,) = dsn_sink.wait_for(1, timeout=30)
            block = _status_blocks(dsn.email)["lost@example.net"]
            assert block["Diagnostic-Code"].startswith("X-Pigeon; 554 5.4.7 Message expired"), str(block)
            assert said in block["Diagnostic-Code"] and "RCPT TO" in block["Diagnostic-Code"], str(block)
            assert block["Remote-MTA"] == "dns; [127.0.0.1]", str(block)
            assert (block["Action"], block["Status"]) == ("failed", "5.4.7")
            assert len(pigeon.records("TransientFailure")) == (1 if "retry_interval" in settings else 0)
