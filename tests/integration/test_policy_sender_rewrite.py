"""`Changes(sender=...)`: on_message rewrites the envelope sender, as Postfix's
`sender_canonical_maps` does. Found from outside, migrating from Postfix: mail from
olduser@corp.test left as `MAIL FROM:<olduser@corp.test>` where Postfix sent newuser's, and no
answer of a hook could change it. A real node over real sockets, real sinks on loopback, and the
README's own example module."""

from __future__ import annotations

import json
import smtplib
from pathlib import Path
from typing import Any

from tests.support.process import PigeonProcess
from tests.support.readme import readme_python
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

MESSAGE = b"From: Old User <olduser@corp.test>\r\nSubject: hello\r\n\r\nHello.\r\n"


def _node(root: Path, source: str, outside: ScriptedSink, corp: ScriptedSink | None = None) -> PigeonProcess:
    """A node whose policy module is `source`; corp.test's mail goes to `corp`, the rest to `outside`."""
    root.mkdir(parents=True, exist_ok=True)
    module = root / "policy.py"
    module.write_text(source)
    sections = delivery_config(outside.endpoint)
    if corp is not None:
        sections["route"].insert(0, {"domain": "corp.test", "next_hop": corp.endpoint, "tls": "disabled"})
    return PigeonProcess(root / "node", policy={"module": str(module)}, **sections)


def _canonical() -> str:
    """The README's example, as pasted."""
    return readme_python("# sender_canonical.py")


def test_a_sender_the_policy_maps_leaves_as_the_new_sender_and_its_bounce_goes_there(tmp_path: Path) -> None:
    with ScriptedSink() as outside, ScriptedSink() as corp, _node(tmp_path, _canonical(), outside, corp) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("olduser@corp.test", ["ok@example.net", "permfail@example.net"], MESSAGE)
            client.sendmail("someone@corp.test", ["ok@example.net"], MESSAGE)  # not in the map: as it came
        delivered = outside.wait_for(2)
        assert sorted(m.sender for m in delivered) == ["newuser@corp.test", "someone@corp.test"]
        # The From header is the message's own: only the envelope changes.
        assert all(b"\r\nFrom: Old User <olduser@corp.test>\r\n" in m.data for m in delivered)
        # permfail's 550 comes back to the new sender, at its own domain's host.
        (dsn,) = corp.wait_for(1)
        assert (dsn.sender, dsn.recipients) == ("<>", ["newuser@corp.test"])
        assert b"permfail@example.net" in dsn.data
        receptions = [r for r in pigeon.wait_records("Reception", 3) if r["protocol"] != "LOCAL"]
        rewritten = next(r for r in receptions if r["recipients"] == ["ok@example.net", "permfail@example.net"])
        assert (rewritten["sender"], rewritten["original_sender"]) == ("newuser@corp.test", "olduser@corp.test")
        kept = next(r for r in receptions if r is not rewritten)
        assert kept["sender"] == "someone@corp.test" and "original_sender" not in kept
        (bounce,) = pigeon.wait_records("Bounce")
        assert bounce["sender"] == "newuser@corp.test"
        # `pigeon logs --sender` finds the mail by the sender its client gave too: its reception,
        # and its later records, which name the new sender alone (someone's mail not at all).
        wait_until(lambda: any(r["id"] == rewritten["id"] for r in pigeon.records("Delivery")))
        found = [json.loads(line) for line in pigeon.cli("logs", "--sender", "olduser@corp.test").splitlines()]
        assert found[0]["type"] == "Reception", found
        assert sorted((r["type"], r["id"], r.get("recipient")) for r in found[1:]) == [
            ("Bounce", rewritten["id"], "permfail@example.net"),
            ("Delivery", rewritten["id"], "ok@example.net"),
        ], found
        assert all(r["sender"] == "newuser@corp.test" for r in found)
        # Followed whatever else is asked: its delivery alone.
        found = [
            json.loads(line)
            for line in pigeon.cli("logs", "--sender", "OldUser@corp.test", "--type", "delivery").splitlines()
        ]
        assert [(r["type"], r["id"]) for r in found] == [("Delivery", rewritten["id"])], found


def test_inspect_shows_the_new_sender_and_the_original(tmp_path: Path) -> None:
    with ScriptedSink() as outside, _node(tmp_path, _canonical(), outside) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("OldUser@corp.test", ["tempfail@example.net"], MESSAGE)  # waits in the queue
        (reception,) = pigeon.wait_records("Reception")
        pigeon.wait_records("TransientFailure")
        shown = json.loads(pigeon.cli("inspect", reception["id"], "--json"))
        assert (shown["sender"], shown["original_sender"]) == ("newuser@corp.test", "OldUser@corp.test")
        assert "\noriginal_sender OldUser@corp.test\n" in pigeon.cli("inspect", reception["id"])


def test_http_injection_and_pigeon_inject_are_rewritten_too(tmp_path: Path) -> None:
    with ScriptedSink() as outside, _node(tmp_path, _canonical(), outside) as pigeon:
        body = {
            "envelope_sender": "olduser@corp.test",
            "recipients": [{"email": "ok@example.net"}],
            "content": MESSAGE.decode(),
        }
        status, answer = pigeon.http_post("/api/v1/inject", body, pigeon.local_token)
        assert (status, answer["accepted"]) == (200, 1), answer
        pigeon.cli("inject", "--from", "olduser@corp.test", "--to", "ok@example.org", "--subject", "s", "--text", "t")
        delivered = outside.wait_for(2)
        assert [m.sender for m in delivered] == ["newuser@corp.test", "newuser@corp.test"]
        receptions = pigeon.wait_records("Reception", 2)
        assert {(r["protocol"], r["sender"], r["original_sender"]) for r in receptions} == {
            ("HTTP", "newuser@corp.test", "olduser@corp.test")
        }


BAD_SENDER = """\
from pigeon.policy import Changes

def on_message(message):
    if message.headers["Subject"] == "bad":
        return Changes(sender="not an address")
    if message.headers["Subject"] == "null":
        return Changes(sender="")
    return Changes(sender="newuser@corp.test")
"""


def test_a_sender_that_is_no_address_answers_451_and_loses_nothing_already_accepted(tmp_path: Path) -> None:
    with ScriptedSink() as outside, _node(tmp_path, BAD_SENDER, outside) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.ehlo("client.test")
            client.mail("olduser@corp.test")
            client.rcpt("ok@example.net")
            assert client.data(MESSAGE)[0] == 250
            client.mail("olduser@corp.test")
            client.rcpt("ok@example.net")
            bad = b"From: olduser@corp.test\r\nSubject: bad\r\n\r\nx\r\n"
            assert client.data(bad) == (451, b"4.3.0 policy error; try again later")
            client.mail("olduser@corp.test")
            client.rcpt("ok@example.net")
            assert client.data(b"From: olduser@corp.test\r\nSubject: null\r\n\r\nx\r\n")[0] == 250
        (failure,) = pigeon.wait_records("PolicyFailure")
        assert failure["hook"] == "on_message" and failure["action"] == "451 4.3.0"
        assert "sender 'not an address': Not a valid mailbox address" in failure["error"], failure
        (refused,) = [r for r in pigeon.wait_records("Rejection") if r["command"] == "DATA"]
        assert refused["id"] == failure["id"]
        # The messages taken before and after it go out: the first as newuser's, the last as <>.
        delivered = outside.wait_for(2)
        assert sorted(m.sender for m in delivered) == ["<>", "newuser@corp.test"]
        assert len(pigeon.wait_records("Reception", 2)) == 2


def test_an_http_injection_whose_new_sender_is_no_address_is_refused_for_now(tmp_path: Path) -> None:
    with ScriptedSink() as outside, _node(tmp_path, BAD_SENDER, outside) as pigeon:
        body: dict[str, Any] = {
            "envelope_sender": "olduser@corp.test",
            "recipients": [{"email": "ok@example.net"}],
            "content": "From: olduser@corp.test\r\nSubject: bad\r\n\r\nx\r\n",
        }
        status, answer = pigeon.http_post("/api/v1/inject", body, pigeon.local_token)
        assert (status, answer["recipients"][0]["error"]) == (503, "451 4.3.0 policy error; try again later")
        (failure,) = pigeon.wait_records("PolicyFailure")
        assert "Not a valid mailbox address" in failure["error"]
        assert pigeon.spool_messages() == []


UTF8_SENDER = """\
from pigeon.policy import Changes

def on_message(message):
    return Changes(sender="jörg@corp.test")
"""


def test_a_sender_beyond_ascii_makes_the_message_an_smtputf8_one(tmp_path: Path) -> None:
    with ScriptedSink(smtputf8=True) as outside, _node(tmp_path, UTF8_SENDER, outside) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("olduser@corp.test", ["tempfail@example.net", "ok@example.net"], MESSAGE)
        (delivered,) = outside.wait_for(1)
        assert delivered.sender == "jörg@corp.test" and "SMTPUTF8" in delivered.mail_options
        (stored,) = wait_until(lambda: pigeon.spool_messages() or None)  # tempfail's, waiting
        assert stored["envelope"].smtputf8 and stored["envelope"].sender == "jörg@corp.test"
