"""A running standing bounce (`pigeon bounce --duration`) wins over a suspension of the same
mail (`pigeon suspend`), whichever was made first, on a node of one worker or two: new mail is
bounced on arrival (`AdminBounce`), never held by the suspension and delivered once the bounce
is cancelled and the suspension resumed. Before, a suspension made first held new mail as
suspended (`queue summary`), and a resume while the bounce ran said "1 message due now"."""

from __future__ import annotations

import json
import smtplib
from pathlib import Path

import pytest

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

DOMAIN = "bs.test"
MESSAGE = b"Subject: hi\r\n\r\nhello\r\n"


def _rules(pigeon: PigeonProcess, first: str) -> str:
    """A suspension and a standing bounce of DOMAIN, `first` made first: the suspension's id."""
    for kind in (first, "bounce" if first == "suspend" else "suspend"):
        if kind == "suspend":
            said = pigeon.cli("suspend", "--domain", DOMAIN)
        else:
            said = pigeon.cli("bounce", "--domain", DOMAIN, "--duration", "1h")
            assert "new mail too until" in said, said
    listed = json.loads(pigeon.cli("suspend", "--list", "--json"))
    [rule] = listed["rules"]
    return str(rule["id"])


def _send(pigeon: PigeonProcess, workers: int) -> list[str]:
    """Mail for DOMAIN, a connection each, until each worker's shard took some (the kernel
    spreads the connections): the ids the node answered with."""
    ids: list[str] = []
    while len(ids) < 3 or (workers > 1 and {int(i, 16) & 63 for i in ids} != set(range(workers))):
        assert len(ids) < 40, ids
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port, timeout=10) as client:
            client.ehlo("client.test")
            client.mail("me@example.org")
            client.rcpt(f"new@{DOMAIN}")
            code, text = client.data(MESSAGE)
            assert code == 250, text
            ids += text.decode().split("queued as ")[1].split()
    return ids


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("first", ["suspend", "bounce"])
def test_new_mail_a_standing_bounce_covers_is_bounced_on_arrival_whichever_rule_came_first(
    tmp_path: Path, first: str, workers: int
) -> None:
    with ScriptedSink() as sink:
        node = PigeonProcess(tmp_path / "node", node={"workers": workers}, **delivery_config(sink.endpoint))
        with node as pigeon:
            suspension = _rules(pigeon, first)
            ids = _send(pigeon, workers)

            bounced = wait_until(lambda: len(records := pigeon.records("AdminBounce")) == len(ids) and records)
            assert sorted(r["id"] for r in bounced) == sorted(ids)
            assert {(r["recipient"], r["attempt"], r["response"]["code"]) for r in bounced} == {
                (f"new@{DOMAIN}", 0, 550)
            }
            assert pigeon.spool_messages() == []
            summary = pigeon.cli("queue", "summary")
            assert DOMAIN not in summary, summary  # nothing of it queued, none of it suspended

            # Resumed while the bounce runs: nothing it held is left to go out.
            resumed = pigeon.cli("resume", suspension)
            assert resumed.startswith("resumed: 0 messages due now"), resumed
            [bounce] = json.loads(pigeon.cli("bounce", "--list", "--json"))["rules"]
            pigeon.cli("bounce", "--cancel", bounce["id"])
            assert sink.after(1.5) == []  # nothing reached the sink, no DSN either (an operator's bounce)
            assert len(pigeon.records("AdminBounce")) == len(ids)
            ends = [r for r in pigeon.records() if r["type"] in ("Delivery", "Bounce", "Expiration", "AdminBounce")]
            assert sorted(r["id"] for r in ends) == sorted(ids)  # one terminal record each
