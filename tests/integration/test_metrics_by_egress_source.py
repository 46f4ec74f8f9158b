"""/metrics through a real node breaks delivery down by egress source: each `[[source]]`'s
recipient outcomes and connections (the implicit source under its `[delivery] source` name),
so that an address being warmed up can be watched; and a site down from a `[[source]]` is
labelled with its site and source apart, as the other metrics name a site."""

from __future__ import annotations

import smtplib
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import ScriptedSink, delivery_config, wait_until

SOURCES = [
    {"name": "ip-2", "bind": "127.0.0.2", "ehlo": "ip2.example"},
    {"name": "ip-3", "bind": "127.0.0.3", "ehlo": "ip3.example"},
]
POOLS = [{"name": "p2", "sources": ["ip-2"]}, {"name": "p3", "sources": ["ip-3"]}]
QUEUES = [{"name": "*acme@*", "pool": "p3"}, {"name": "*beta@*", "pool": "p2"}]


def _send(pigeon: PigeonProcess, recipient: str, tenant: str) -> None:
    data = f"From: <a@example.org>\r\nX-Tenant: {tenant}\r\nSubject: sources\r\n\r\nHi.\r\n".encode()
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        assert client.sendmail("a@example.org", [recipient], data) == {}


def _samples(pigeon: PigeonProcess, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    status, body = pigeon.http_get("/metrics")
    assert status == 200
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == name
    }


def test_outcomes_connections_and_dead_sites_are_shown_per_egress_source(tmp_path: Path) -> None:
    dead = f"127.0.0.4:{free_port()}"  # nothing listens there: every connection is refused
    with ScriptedSink() as sink:
        # Connections stay open a while once idle: the gauge is read while they are.
        config = delivery_config(sink.endpoint, retry_interval="1h", idle_timeout="60s")
        config["route"].insert(0, {"domain": "dead.test", "next_hop": dead, "tls": "disabled"})
        tables = {"source": SOURCES, "pool": POOLS, "queue": QUEUES}
        with PigeonProcess(tmp_path / "node", tables=tables, **config) as pigeon:
            # Each message that shares a source with the one before goes once that one is
            # settled, so it takes the idle connection: a message sent while the last was still
            # on its way would open a second one, and the gauge's count would be timing's.
            _send(pigeon, "ok@live.test", "acme")  # from ip-3
            pigeon.wait_records("Delivery", 1)
            _send(pigeon, "permfail@live.test", "acme")  # bounced, from ip-3
            pigeon.wait_records("Bounce", 1)
            pigeon.wait_records("Delivery", 2)  # the bounce's DSN to a@example.org
            _send(pigeon, "ok@live.test", "beta")  # from ip-2
            _send(pigeon, "ok@live.test", "other")  # no pool: the implicit source, as the DSN
            _send(pigeon, "r@dead.test", "acme")  # its site down from ip-3
            pigeon.wait_records("Delivery", 4)
            pigeon.wait_records("TransientFailure", 1)

            outcomes = wait_until(lambda: _samples(pigeon, "pigeon_source_recipients_total"))
            by_source = {(dict(k)["outcome"], dict(k)["source"]): v for k, v in outcomes.items() if v}
            assert by_source == {
                ("Delivery", "ip-3"): 1,
                ("Bounce", "ip-3"): 1,
                ("Delivery", "ip-2"): 1,
                ("Delivery", "default"): 2,  # "other"'s, and the DSN (Pigeon's own mail has no pool)
                ("TransientFailure", "ip-3"): 1,
            }
            connections = _samples(pigeon, "pigeon_source_outbound_connections")
            assert {dict(k)["source"]: v for k, v in connections.items()} == {"ip-2": 1, "ip-3": 1, "default": 1}
            waiting = _samples(pigeon, "pigeon_source_ready_queue_messages")
            assert {dict(k)["source"] for k in waiting} == {"ip-2", "ip-3", "default"}
            down = _samples(pigeon, "pigeon_site_down")
            assert down == {(("site", dead), ("source", "ip-3"), ("worker", "0")): 1.0}
