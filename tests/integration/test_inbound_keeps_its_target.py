"""Mail of an `[[inbound]]` route goes to its application's target, whatever an operator's
rebind or a policy's `Reroute` asks: neither may send it out over SMTP (a broad rebind to a
relay would have sent applications' mail off the machine)."""

from __future__ import annotations

import json
import smtplib
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

MESSAGE = b"From: <customer@example.org>\r\nSubject: for the application\r\n\r\nHello.\r\n"
LEFT = "2 messages of [[inbound]] routes left as they are: they go to their target"


@pytest.fixture
def sinks() -> Iterator[tuple[ScriptedSink, ScriptedSink]]:
    """The default route's next hop, and the relay `zz.s2` is routed to."""
    with ScriptedSink() as default, ScriptedSink() as relay:
        yield default, relay


def _node(root: Path, sinks: tuple[ScriptedSink, ScriptedSink], **sections: Any) -> PigeonProcess:
    default, relay = sinks
    config: dict[str, Any] = delivery_config(default.endpoint)
    config["route"].insert(0, {"domain": "zz.s2", "next_hop": relay.endpoint, "tls": "disabled"})
    return PigeonProcess(
        root / "node",
        target=[{"name": "app", "kind": "maildir", "path": str(root / "Maildir")}],
        inbound=[{"domain": "in.example", "target": "app"}],
        **config,
        **sections,
    )


def _cli(pigeon: PigeonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    command = [args[0], "-c", str(pigeon.config_path), *args[1:]]
    return zygote.run(command, text=True, timeout=60, check=False)


def _maildir(root: Path) -> list[bytes]:
    new = root / "Maildir" / "new"
    return sorted(path.read_bytes() for path in new.iterdir()) if new.exists() else []


def test_a_rebind_leaves_the_mail_of_an_inbound_route_for_its_target_and_says_how_much_it_left(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink]
) -> None:
    default, relay = sinks
    with _node(tmp_path, sinks) as pigeon:
        held = _cli(pigeon, "suspend", "--queue", "inbound:app", "--json")
        assert held.returncode == 0, held.stderr
        rule = json.loads(held.stdout)["rule"]["id"]
        # The outbound mail waits in its site's ready queue: a rebind moves it to the relay.
        assert _cli(pigeon, "suspend", "--site", default.endpoint).returncode == 0
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("customer@example.org", ["rb1@in.example"], MESSAGE)
            client.sendmail("customer@example.org", ["rb2@in.example"], MESSAGE)
            client.sendmail("customer@example.org", ["out@out.example"], MESSAGE)
        pigeon.wait_records("Reception", 3)

        rebind = _cli(pigeon, "rebind", "--domain", "*", "--routing-domain", "zz.s2")
        assert rebind.returncode == 0, rebind.stderr
        assert rebind.stdout.strip() == f"rebound 1 message (0 once their attempt under way ends); {LEFT}"
        assert [r.recipients for r in relay.wait_for(1)] == [["out@out.example"]]
        logged = pigeon.wait_stderr("admin rebind by local of domain=*: 1 message ")
        assert f"1 message to queue=None route=zz.s2; {LEFT}" in logged

        # A rebind that names only inbound mail is no mistake: it rebinds none, and says why.
        body = {"queue": "inbound:*", "to_queue": "parked"}
        status, answer = pigeon.http_call("POST", "/api/v1/admin/rebind", body, pigeon.local_token)
        assert status == 200, answer
        assert (answer["rebound"], answer["after_attempt"], answer["inbound_left"]) == (0, 0, 2), answer

        assert _cli(pigeon, "resume", rule).returncode == 0
        deliveries = pigeon.wait_records("Delivery", 3)
    inbound = sorted((d["recipient"], d["site"]) for d in deliveries if d["queue"] == "inbound:app")
    assert inbound == [("rb1@in.example", "inbound:app"), ("rb2@in.example", "inbound:app")]
    assert len(_maildir(tmp_path)) == 2
    assert all(text.endswith(MESSAGE) for text in _maildir(tmp_path))
    assert [r.recipients for r in relay.received] == [["out@out.example"]]  # none of the application's
    assert default.received == []


def test_a_reroute_before_delivery_of_inbound_mail_is_not_carried_out_and_the_log_says_so(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink]
) -> None:
    _, relay = sinks
    source = """
        from pigeon.policy import Reroute
        def before_delivery(delivery):
            return Reroute("zz.s2")
    """
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(source))
    with _node(tmp_path, sinks, policy={"module": str(module)}) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("customer@example.org", ["bd1@in.example"], MESSAGE)
            client.sendmail("customer@example.org", ["out@out.example"], MESSAGE)
        deliveries = pigeon.wait_records("Delivery", 2)
        (inbound,) = [d for d in deliveries if d["recipient"] == "bd1@in.example"]
        logged = pigeon.wait_stderr("before_delivery answered Reroute('zz.s2') for message")
        wait_until(lambda: len(_maildir(tmp_path)) == 1)
        assert [r.recipients for r in relay.wait_for(1)] == [["out@out.example"]]  # outbound mail is rerouted
        assert pigeon.records("PolicyFailure") == []
    assert (inbound["site"], inbound["queue"], inbound["attempt"]) == ("inbound:app", "inbound:app", 1)
    assert f"message {inbound['id']} of the [[inbound]] route's queue inbound:app: not carried out" in logged
    assert [r.recipients for r in relay.received] == [["out@out.example"]]


@pytest.mark.parametrize("asked", ["route='zz.s2'", "route='zz.s2', queue='bulk'"])
def test_an_on_message_route_or_queue_for_inbound_mail_is_not_applied_and_the_log_says_so_once_per_message(
    tmp_path: Path, sinks: tuple[ScriptedSink, ScriptedSink], asked: str
) -> None:
    # Found from outside: Changes(route=) of inbound mail was left aside without a word, and the
    # policy's author waited for the mail at the route's hosts (or in the queue it named).
    _, relay = sinks
    source = """
        from pigeon.policy import Changes
        def on_message(message):
            return Changes(ASKED)
    """
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(source).replace("ASKED", asked))
    with _node(tmp_path, sinks, policy={"module": str(module)}) as pigeon:
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("customer@example.org", ["om1@in.example"], MESSAGE)
            # One message with an inbound and an outbound recipient: only the inbound part is said.
            client.sendmail("customer@example.org", ["om2@in.example", "out@out.example"], MESSAGE)
        deliveries = pigeon.wait_records("Delivery", 3)
        wait_until(lambda: len(_maildir(tmp_path)) == 2)
        assert [r.recipients for r in relay.wait_for(1)] == [["out@out.example"]]  # outbound mail is changed
        logged = pigeon.stderr()
        assert pigeon.records("PolicyFailure") == []
    (outbound,) = [d for d in deliveries if d["recipient"] == "out@out.example"]
    assert outbound["queue"] == ("bulk" if "queue=" in asked else "out.example")  # the rest of the message takes it
    inbound = sorted((d["recipient"], d["site"], d["id"]) for d in deliveries if d["queue"] == "inbound:app")
    assert [(recipient, site) for recipient, site, _ in inbound] == [
        ("om1@in.example", "inbound:app"),
        ("om2@in.example", "inbound:app"),
    ]
    warnings = [line for line in logged.splitlines() if "on_message answered Changes(" in line]
    assert len(warnings) == 2, logged
    for _, _, spool_id in inbound:
        said = f"on_message answered Changes({asked}) for message {spool_id} of the [[inbound]] route's queue"
        assert sum(said in line for line in warnings) == 1, warnings
    assert all("WARNING" in line and "not applied; inbound mail keeps its target app" in line for line in warnings)
    assert [r.recipients for r in relay.received] == [["out@out.example"]]  # none of the application's
