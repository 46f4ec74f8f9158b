"""`pigeon logs --id <a bounced message>` tells the story of the DSN Pigeon wrote about it too:
its `Reception` (`reports_on` that id) and its delivery, so the operator sees whether the
sender was told, without looking up the DSN's id by hand.

Found from outside, migrating from Postfix (whose `postcat`/log lines name the bounce's queue
id beside the original's): the link existed only in the DSN's own `Reception` record."""

from __future__ import annotations

import json
import smtplib
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until


def test_logs_by_the_id_of_a_bounced_message_show_its_dsn_received_and_delivered(tmp_path: Path) -> None:
    with ScriptedSink() as sink, PigeonProcess(tmp_path / "node", **delivery_config(sink.endpoint)) as pigeon:
        sink.rcpt_reply = lambda address: "550 5.1.1 no such user" if address == "gone@example.net" else None
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("sender@example.org", ["gone@example.net"], b"Subject: hi\r\n\r\nHello.\r\n")
        (bounce,) = pigeon.wait_records("Bounce")
        dsn_delivery = wait_until(lambda: next(iter(pigeon.records("Delivery")), None))
        # An unrelated message's story stays out.
        with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
            client.sendmail("other@example.org", ["here@example.net"], b"Subject: other\r\n\r\nHello.\r\n")
        wait_until(lambda: len(pigeon.records("Delivery")) == 2)
        shown = [json.loads(line) for line in pigeon.cli("logs", "--id", bounce["id"]).splitlines()]
    dsn_id = dsn_delivery["id"]
    # (The Bounce and the DSN's Reception are one commit: written in either order.)
    assert sorted((r["type"], r["id"]) for r in shown) == sorted(
        [("Reception", bounce["id"]), ("Bounce", bounce["id"]), ("Reception", dsn_id), ("Delivery", dsn_id)]
    )
    (dsn,) = [r for r in shown if r["type"] == "Reception" and r["id"] == dsn_id]
    assert (dsn["reports_on"], dsn["sender"], dsn["recipients"]) == (bounce["id"], "", ["sender@example.org"])
