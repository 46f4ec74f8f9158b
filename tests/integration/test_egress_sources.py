"""Egress sources and pools through a real node: the sink sees each source's address and EHLO
name in the pool's proportions, a queue's pool and the policy hook's choose the pool, and a
source's own `[[shaping]]` limits hold for its connections alone."""

from __future__ import annotations

import collections
import contextlib
import json
import smtplib
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, peak_connections, wait_until

SOURCES = [
    {"name": "ip-2", "bind": "127.0.0.2", "ehlo": "ip2.example"},
    {"name": "ip-3", "bind": "127.0.0.3", "ehlo": "ip3.example"},
]
EHLO = {"127.0.0.2": "ip2.example", "127.0.0.3": "ip3.example"}


def _queues(pigeon: PigeonProcess) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{pigeon.http_port}/api/v1/queues")
    request.add_header("Authorization", f"Bearer {pigeon.local_token}")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def _inject(pigeon: PigeonProcess, recipients: list[str], **request: Any) -> None:
    body = {
        "envelope_sender": "news@example.org",
        "recipients": [{"email": r} for r in recipients],
        # A message of its own per recipient (raw content alike for all would be stored, and
        # delivered, once per domain, as SMTP mail is).
        "content": "From: news@example.org\nSubject: pools for {{ email }}\n\nHello.\n",
        **request,
    }
    status, answer = pigeon.http_post("/api/v1/inject", body, pigeon.local_token)
    assert (status, answer["accepted"]) == (200, len(recipients)), answer


def test_a_three_to_one_pool_sends_from_each_address_and_ehlo_name_in_that_proportion(tmp_path: Path) -> None:
    count = 4000
    config = delivery_config("", pool="main")
    with ScriptedSink() as sink:
        config["route"][0]["next_hop"] = sink.endpoint
        before = len(sink.connections)  # the sink's own check that it listens
        pool = {"name": "main", "sources": [{"source": "ip-2", "weight": 3}, {"source": "ip-3", "weight": 1}]}
        with PigeonProcess(tmp_path / "node", tables={"source": SOURCES, "pool": [pool]}, **config) as pigeon:
            recipients = [f"ok{i}@d{i % 7}.example" for i in range(count)]
            for start in range(0, count, 500):  # one message per recipient
                _inject(pigeon, recipients[start : start + 500])
            received = sink.wait_for(count, timeout=60)
            deliveries = pigeon.wait_records("Delivery", count, timeout=20)
        arrivals = list(sink.arrivals)
        connections = sink.connections[before:]

    # Nothing lost, nothing twice.
    delivered = [r for message in received for r in message.recipients]
    assert sorted(delivered) == sorted(recipients)
    assert len(deliveries) == count
    # Each address said its own EHLO name, on every connection and for every message.
    assert {c.peer for c in connections} == {"127.0.0.2", "127.0.0.3"}
    assert all(c.helo in ("", EHLO[c.peer]) for c in connections)  # "": closed before a message
    assert all(a.helo == EHLO[a.peer] for a in arrivals)
    by_address = collections.Counter(a.peer for a in arrivals)
    ratio = by_address["127.0.0.2"] / by_address["127.0.0.3"]
    assert 3 * 0.95 <= ratio <= 3 * 1.05, by_address
    # The records name the source, and agree with the sink.
    by_source = collections.Counter(r["source"] for r in deliveries)
    assert by_source == {"ip-2": by_address["127.0.0.2"], "ip-3": by_address["127.0.0.3"]}


POLICY = """
    from pigeon.policy import Changes

    def on_message(message):
        pool = message.headers.get("X-Egress-Pool")
        return Changes(egress_pool=pool) if pool else None

    def before_delivery(delivery):
        with open(__file__ + ".seen", "a") as seen:
            seen.write(f"{delivery.recipients[0]} {delivery.source}\\n")
"""


def _send(pigeon: PigeonProcess, recipient: str, tenant: str, pool: str | None = None) -> None:
    header = f"X-Egress-Pool: {pool}\r\n" if pool else ""
    data = f"From: <a@example.org>\r\nX-Tenant: {tenant}\r\n{header}Subject: pool\r\n\r\nHi.\r\n".encode()
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        assert client.sendmail("a@example.org", [recipient], data) == {}


@contextlib.contextmanager
def _pooled_node(tmp_path: Path, sink: ScriptedSink, policy: str) -> Iterator[PigeonProcess]:
    """A node relaying to `sink` from pools two (ip-2, [delivery]'s) and three (ip-3, [[queue]]
    `*acme@*`'s), with the policy module `policy`."""
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(policy))
    pools = [{"name": "two", "sources": ["ip-2"]}, {"name": "three", "sources": ["ip-3"]}]
    config = delivery_config(sink.endpoint, pool="two")
    tables = {"source": SOURCES, "pool": pools, "queue": [{"name": "*acme@*", "pool": "three"}]}
    with PigeonProcess(tmp_path / "node", tables=tables, policy={"module": str(module)}, **config) as pigeon:
        yield pigeon


def test_a_queue_pool_chooses_the_source_and_the_policy_hooks_pool_wins(tmp_path: Path) -> None:
    with ScriptedSink() as sink, _pooled_node(tmp_path, sink, POLICY) as pigeon:
        _send(pigeon, "default@example.net", "other")  # no pool of its own: [delivery] pool
        _send(pigeon, "queue@example.net", "acme")  # its [[queue]]'s pool
        _send(pigeon, "hook@example.net", "acme", pool="two")  # the hook's pool wins
        _send(pigeon, "typo@example.net", "acme", pool="tow")  # no such pool: waits
        sink.wait_for(3)
        failure = pigeon.wait_records("TransientFailure")[0]
        deliveries = pigeon.wait_records("Delivery", 3)
        messages = pigeon.spool_messages()
    peers = {
        a.recipients[0]: (arrival.peer, arrival.helo) for a, arrival in zip(sink.received, sink.arrivals, strict=True)
    }
    seen = (tmp_path / "policy.py.seen").read_text().splitlines()
    assert sorted(seen) == ["default@example.net ip-2", "hook@example.net ip-2", "queue@example.net ip-3"]
    assert peers == {
        "default@example.net": ("127.0.0.2", "ip2.example"),
        "queue@example.net": ("127.0.0.3", "ip3.example"),
        "hook@example.net": ("127.0.0.2", "ip2.example"),
    }
    assert {r["recipient"]: r["source"] for r in deliveries} == {
        "default@example.net": "ip-2",
        "queue@example.net": "ip-3",
        "hook@example.net": "ip-2",
    }
    assert failure["recipient"] == "typo@example.net"
    assert failure["response"] == {
        "code": 451,
        "enhanced": "4.3.5",
        "text": "egress pool 'tow' is not configured ([[pool]])",
    }
    assert "source" not in failure  # it never left
    assert [m["recipients"] for m in messages] == [["typo@example.net"]]  # kept, to be tried again


def _inspect(pigeon: PigeonProcess, spool_id: str, *options: str) -> str:
    shown = zygote.run(
        ["inspect", "-c", str(pigeon.config_path), spool_id, *options],
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_inspect_shows_the_pool_a_message_leaves_from_and_what_named_it(tmp_path: Path) -> None:
    """The README's example: a [[queue]] names the pool of tenant acme's mail. Its message, kept
    for a retry by a site that is down, shows that pool, as one whose policy hook named a pool
    shows that one, and one with neither shows none (the implicit source)."""
    module = tmp_path / "policy.py"
    module.write_text(textwrap.dedent(POLICY))
    pools = [{"name": "outbound", "sources": ["ip-2", "ip-3"]}, {"name": "two", "sources": ["ip-2"]}]
    config = delivery_config("", retry_interval="1h")
    with ScriptedSink() as sink:
        sink.rcpt_reply = lambda address: "421 4.3.2 down for maintenance"
        config["route"][0]["next_hop"] = sink.endpoint
        tables = {"source": SOURCES, "pool": pools, "queue": [{"name": "*acme@*", "pool": "outbound"}]}
        with PigeonProcess(tmp_path / "node", tables=tables, policy={"module": str(module)}, **config) as pigeon:
            _send(pigeon, "queue@example.net", "acme")
            _send(pigeon, "hook@example.net", "acme", pool="two")
            _send(pigeon, "none@example.net", "other")
            pigeon.wait_records("TransientFailure", 3)
            ids = {m["recipients"][0]: m["id"] for m in pigeon.spool_messages()}
            shown = {recipient: _inspect(pigeon, spool_id) for recipient, spool_id in ids.items()}
            answers = {
                recipient: json.loads(_inspect(pigeon, spool_id, "--json")) for recipient, spool_id in ids.items()
            }
    pools_shown = {
        r: [line for line in text.splitlines() if line.startswith("egress_pool")] for r, text in shown.items()
    }
    assert pools_shown == {
        "queue@example.net": ["egress_pool    outbound (its [[queue]]'s pool)"],
        "hook@example.net": ["egress_pool    two (named by the policy hook)"],
        "none@example.net": [],
    }, shown
    assert {r: (a["egress_pool"], a["egress_pool_from"]) for r, a in answers.items()} == {
        "queue@example.net": ("outbound", "queue"),
        "hook@example.net": ("two", "policy"),
        "none@example.net": (None, None),
    }


POOL_SEEN = """
    from pigeon.policy import Changes

    def on_message(message):
        pool = message.headers.get("X-Egress-Pool")
        return Changes(egress_pool=pool) if pool else None

    def _note(hook, delivery):
        with open(__file__ + ".seen", "a") as seen:
            seen.write(f"{hook} {delivery.recipients[0]} {delivery.egress_pool} {delivery.egress_pool_from} "
                       f"{delivery.source}\\n")

    def before_delivery(delivery):
        _note("before", delivery)

    def on_delivery_outcome(outcome):
        _note("outcome", outcome.delivery)
"""


def test_before_delivery_sees_the_pool_the_mail_leaves_from_whoever_named_it(tmp_path: Path) -> None:
    """A hook is told the pool the scheduler chose and `pigeon inspect` shows, and what named
    it: not only a pool `on_message` named, but its [[queue]]'s and [delivery] pool too."""
    with ScriptedSink() as sink, _pooled_node(tmp_path, sink, POOL_SEEN) as pigeon:
        _send(pigeon, "default@example.net", "other")  # [delivery] pool
        _send(pigeon, "queue@example.net", "acme")  # its [[queue]]'s pool
        _send(pigeon, "hook@example.net", "acme", pool="two")  # on_message's pool wins
        sink.wait_for(3)
        pigeon.wait_records("Delivery", 3)
    seen = (tmp_path / "policy.py.seen").read_text().splitlines()
    assert sorted(seen) == [
        "before default@example.net two delivery ip-2",
        "before hook@example.net two policy ip-2",
        "before queue@example.net three queue ip-3",
        "outcome default@example.net two delivery ip-2",
        "outcome hook@example.net two policy ip-2",
        "outcome queue@example.net three queue ip-3",
    ]


def test_a_sources_own_shaping_block_limits_its_connections_alone(tmp_path: Path) -> None:
    pool = {"name": "both", "sources": ["ip-2", "ip-3"]}
    shaping = [
        {"domain": "*", "source": "ip-3", "connection_limit": 1},  # first, but only for ip-3
        {"domain": "*", "connection_limit": 4},
    ]
    config = delivery_config("", pool="both")
    with ScriptedSink(slow=0.05) as sink:
        config["route"][0]["next_hop"] = sink.endpoint
        tables = {"source": SOURCES, "pool": [pool], "shaping": shaping}
        with PigeonProcess(tmp_path / "node", tables=tables, **config) as pigeon:
            _inject(pigeon, [f"slow@d{i}.example" for i in range(60)])
            # ip-3's one connection leaves a backlog: its ready queue is listed with its source.
            ready = wait_until(lambda: [q for q in _queues(pigeon)["ready"] if q["source"] == "ip-3"])
            # (the route's tls = "disabled" is part of the ready queue's name: see Destination.security)
            assert ready[0]["path"] == f"ip-3->{sink.endpoint} (tls disabled)" and ready[0]["site"] == sink.endpoint
            assert ready[0]["connections"] == 1
            sink.wait_for(60)
    connections = list(sink.connections)
    assert peak_connections([c for c in connections if c.peer == "127.0.0.3"]) == 1
    assert 1 < peak_connections([c for c in connections if c.peer == "127.0.0.2"]) <= 4
    assert collections.Counter(a.peer for a in sink.arrivals) == {"127.0.0.2": 30, "127.0.0.3": 30}


def test_a_source_reaches_only_addresses_of_its_own_family(tmp_path: Path) -> None:
    config = delivery_config("", pool="six", retry_interval="1h")
    with ScriptedSink() as sink:
        config["route"][0]["next_hop"] = sink.endpoint  # an IPv4 address only
        tables = {"source": [{"name": "v6", "bind": "::1"}], "pool": [{"name": "six", "sources": ["v6"]}]}
        with PigeonProcess(tmp_path / "node", tables=tables, **config) as pigeon:
            _inject(pigeon, ["ok@example.net"])
            (failure,) = pigeon.wait_records("TransientFailure")
    assert failure["source"] == "v6"
    text = "127.0.0.1 has no IPv6 address to reach from ::1"
    assert failure["response"] == {"code": 451, "enhanced": "4.4.1", "text": text}
    assert sink.received == []
