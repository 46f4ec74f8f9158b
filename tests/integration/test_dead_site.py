"""A site whose host takes no connection is down as a whole: its mail is deferred with
`451 4.4.1 not tried: <site> is down` without spending attempts, the API and /metrics say
so, other sites keep flowing, and once the host is back its mail goes within about the site
interval."""

from __future__ import annotations

import os
import smtplib
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_reload import _hangup
from tests.support import zygote
from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess, free_port, to_toml
from tests.support.sinks import HangUpSink, ScriptedSink, delivery_config, wait_until

MESSAGE = b"From: <sender@example.org>\r\nSubject: dead site\r\n\r\nHello.\r\n"


def _send(pigeon: PigeonProcess, recipient: str) -> None:
    with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
        assert client.sendmail("sender@example.org", [recipient], MESSAGE) == {}


def _ready_rows(pigeon: PigeonProcess) -> dict[str, dict[str, Any]]:
    status, summary = pigeon.http_call("GET", "/api/v1/queues", token=pigeon.local_token)
    assert status == 200, summary
    return {row["site"]: row for row in summary["ready"]}


def _site_down_metric(pigeon: PigeonProcess, site: str) -> float | None:
    _, body = pigeon.http_get("/metrics")
    for line in body.decode().splitlines():
        if line.startswith("pigeon_site_down{") and f'site="{site}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def _attempts(pigeon: PigeonProcess) -> list[int]:
    (db,) = pigeon.spool_path.glob("shard-*/spool.db")
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return [attempts for (attempts,) in conn.execute("SELECT attempts FROM message ORDER BY id")]


def test_a_dead_site_is_backed_off_as_a_whole_and_its_mail_flows_once_it_is_back(tmp_path: Path) -> None:
    dead_port = free_port()
    dead = f"127.0.0.2:{dead_port}"  # nothing listens there: every connection is refused
    with ScriptedSink() as live:
        # Each message's own retry is an hour away: only the site's probe can bring mail back soon.
        config = delivery_config(live.endpoint, retry_interval="1h")  # (sites probed after 1 s, then 2 s)
        config["route"].insert(0, {"domain": "dead.test", "next_hop": dead, "tls": "disabled"})
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            for n in range(3):
                _send(pigeon, f"r{n}@dead.test")
            failures = pigeon.wait_records("TransientFailure", 3)
            texts = sorted(f["response"]["text"] for f in failures[:3])
            assert texts[0].startswith(f"cannot connect to [127.0.0.2]:{dead_port}")
            assert texts[1:] == [f"not tried: {dead} is down"] * 2
            assert {(f["response"]["code"], f["response"]["enhanced"]) for f in failures} == {(451, "4.4.1")}
            pigeon.wait_stderr(f"site {dead} is down")

            # Other sites keep flowing meanwhile.
            _send(pigeon, "ok@live.test")
            (received,) = live.wait_for(1, timeout=10)
            assert received.recipients == ["ok@live.test"]

            assert _ready_rows(pigeon)[dead]["down"] is True
            assert _site_down_metric(pigeon, dead) == 1.0
            command = ["top", "--once", "-c", str(pigeon.config_path)]
            wide = {**os.environ, "COLUMNS": "160"}  # (the frame is cut at the terminal's width)
            top = zygote.run(command, text=True, timeout=60, env=wide)
            (row,) = [line for line in top.stdout.splitlines() if dead in line and "->" in line]
            assert row.rstrip().endswith("site down"), top.stdout

            # Several probes fail: still no attempt spent, nothing bounced or expired.
            time.sleep(4)
            assert _attempts(pigeon) == [0, 0, 0]
            assert {f["attempt"] for f in pigeon.records("TransientFailure")} == {0}
            assert pigeon.records("Bounce") == [] and pigeon.records("Expiration") == []
            assert pigeon.wait_stderr(f"site {dead} is still down")
            # What each message last met is the connection error, not "not tried" (which would
            # be all an expiry's DSN could tell the sender); a failed probe's record says it too.
            for message in pigeon.spool_messages():
                status, shown = pigeon.http_call("GET", f"/api/v1/messages/{message['id']}", token=pigeon.local_token)
                assert status == 200 and shown["last_response"].startswith(
                    f"451 4.4.1 cannot connect to [127.0.0.2]:{dead_port}"
                ), shown
            refused = [f for f in pigeon.records("TransientFailure") if "cannot connect" in f["response"]["text"]]
            assert len(refused) >= 2  # the failure that took it down, and the probes'

            with ScriptedSink(host="127.0.0.2", port=dead_port) as revived:
                back = time.monotonic()
                arrived = revived.wait_for(3, timeout=10)
                # Within the site interval's ceiling (2 s), a scheduler tick and some slack.
                assert time.monotonic() - back < 4.5
                assert sorted(r for m in arrived for r in m.recipients) == [f"r{n}@dead.test" for n in range(3)]
                pigeon.wait_stderr(f"site {dead} is up again")
                assert wait_until(lambda: dead not in _ready_rows(pigeon) or not _ready_rows(pigeon)[dead]["down"])
                assert _site_down_metric(pigeon, dead) == 0.0
                deliveries = pigeon.wait_records("Delivery", 4)
                assert {d["attempt"] for d in deliveries if d["site"] == dead} == {1}
                assert wait_until(lambda: pigeon.spool_messages() == [])


def test_a_site_one_source_cannot_reach_is_down_for_that_source_alone(tmp_path: Path) -> None:
    """Found from outside: with an IPv4 and an IPv6 `[[source]]`, the IPv6 one's refused
    connections took the site down for both, and the IPv4 source's mail, which it had just
    delivered there, waited for probes made with the IPv6 source's mail (`not tried: ... is
    down`), each failing, towards `max_site_retry_interval`."""
    port = free_port()
    zone = Zone({"mx.dual.test": [("A", "127.0.0.1"), ("AAAA", "::1")]})  # (nothing listens on ::1)
    sources = [{"name": "v4", "bind": "127.0.0.2"}, {"name": "v6", "bind": "::1"}]
    pools = [{"name": "p4", "sources": ["v4"]}, {"name": "p6", "sources": ["v6"]}]
    queues = [{"name": "a4-*", "pool": "p4"}, {"name": "a6-*", "pool": "p6"}]
    with DnsServer(zone) as dns, ScriptedSink(port=port) as sink:
        probes = {"site_retry_interval": "30s", "max_site_retry_interval": "30s"}
        config = delivery_config(f"mx.dual.test:{port}", retry_interval="1h", **probes)
        config["route"][0]["domain"] = "*-dual.test"
        tables = {"source": sources, "pool": pools, "queue": queues}
        with PigeonProcess(tmp_path / "node", dns={"nameservers": [dns.endpoint]}, tables=tables, **config) as pigeon:
            _send(pigeon, "x@a6-dual.test")
            [failure] = pigeon.wait_records("TransientFailure", 1)
            assert failure["response"]["text"].startswith("cannot connect to mx.dual.test [::1]"), failure
            pigeon.wait_stderr("is down")
            _send(pigeon, "y@a4-dual.test")
            (received,) = sink.wait_for(1, timeout=10)
            failures = pigeon.records("TransientFailure")
    assert received.recipients == ["y@a4-dual.test"]
    assert [f["recipient"] for f in failures] == ["x@a6-dual.test"]


def test_pool_mail_is_given_a_source_that_finds_the_site_up_while_another_finds_it_down(tmp_path: Path) -> None:
    """Found from outside: in a pool of an IPv6 and an IPv4 source, mail given the IPv6 one
    (down for it) waited for that path's probes, and was given it again at each probe, while
    the IPv4 source delivered at once."""
    port = free_port()
    zone = Zone({"mx.dual.test": [("A", "127.0.0.1"), ("AAAA", "::1")]})  # (nothing listens on ::1)
    sources = [{"name": "v6", "bind": "::1"}, {"name": "v4", "bind": "127.0.0.2"}]
    tables = {"source": sources, "pool": [{"name": "both", "sources": ["v6", "v4"]}]}
    with DnsServer(zone) as dns, ScriptedSink(port=port) as sink:
        probes = {"site_retry_interval": "30s", "max_site_retry_interval": "30s"}
        config = delivery_config(f"mx.dual.test:{port}", retry_interval="1h", pool="both", **probes)
        with PigeonProcess(tmp_path / "node", dns={"nameservers": [dns.endpoint]}, tables=tables, **config) as pigeon:
            _send(pigeon, "first@one.test")  # (the pool's first pick: v6, refused)
            [failure] = pigeon.wait_records("TransientFailure", 1)
            assert failure["source"] == "v6", failure
            pigeon.wait_stderr("is down")
            for n in range(6):
                _send(pigeon, f"r{n}@one.test")
            received = sink.wait_for(6, timeout=10)
            failures = pigeon.records("TransientFailure")
    assert sorted(r for m in received for r in m.recipients) == [f"r{n}@one.test" for n in range(6)]
    assert [f["recipient"] for f in failures] == ["first@one.test"]  # none given v6 and deferred


def test_a_site_is_not_down_while_a_host_was_left_untried_for_a_dns_lookup_that_failed(tmp_path: Path) -> None:
    """Found from outside: the first MX host refused the connection and the lookup of the
    second timed out; the site was taken down (`is down`, `attempt` 0), and the reason named
    only the lookup. The second host was never tried: nothing says the site is down, so the
    attempt counts, and its reason names both what the first host did and why the second was
    not tried. A host the DNS says has no address (NXDOMAIN) proves nothing either way: the
    site whose other hosts refuse the connection is down."""
    port = free_port()  # nothing listens there on 127.78.0.9: refused
    zone = Zone(
        {
            "dd.test": [("MX", 10, "mxdown.test"), ("MX", 20, "mxslow.test")],
            "gone.test": [("MX", 10, "mxdown.test"), ("MX", 20, "mxgone.test")],
            "mxdown.test": [("A", "127.78.0.9")],
        },
        delays={"mxslow.test": (5.0, 5.0)},  # (past [dns] timeout: no answer in time)
    )
    settings = {"enabled": True, "smtp_port": port, "retry_interval": "1h", "dsn": False, "tls": "disabled"}
    with (
        DnsServer(zone) as dns,
        PigeonProcess(
            tmp_path / "node",
            delivery=settings,
            dns={"nameservers": [dns.endpoint], "timeout": "1s"},
            mta_sts={"enabled": False},
        ) as pigeon,
    ):
        _send(pigeon, "x@dd.test")
        [failure] = pigeon.wait_records("TransientFailure", 1)
        refused = f"cannot connect to mxdown.test [127.78.0.9]:{port}: Connection refused"
        unresolved = "mxslow.test not tried: DNS lookup of AAAA mxslow.test failed: timed out after 1s"
        assert failure["attempt"] == 1, failure
        assert (failure["response"]["code"], failure["response"]["enhanced"]) == (451, "4.4.1"), failure
        assert failure["response"]["text"] == f"{refused}; {unresolved}", failure
        assert _attempts(pigeon) == [1]
        [message] = pigeon.spool_messages()
        status, shown = pigeon.http_call("GET", f"/api/v1/messages/{message['id']}", token=pigeon.local_token)
        assert status == 200 and shown["last_response"] == f"451 4.4.1 {refused}; {unresolved}", shown

        _send(pigeon, "y@gone.test")
        pigeon.wait_stderr(f"site mxdown.test,mxgone.test:{port} is down")
        [_, down] = pigeon.wait_records("TransientFailure", 2)
        assert down["attempt"] == 0, down
        gone = "mxgone.test not tried: domain mxgone.test does not exist (NXDOMAIN)"
        assert down["response"]["text"] == f"{refused}; {gone}", down
        assert "mxdown.test,mxslow.test" not in pigeon.stderr()  # (that site never went down)


@pytest.mark.parametrize("max_active", [10_000, 2], ids=["in-memory-room", "max-active-2"])
def test_a_reload_that_routes_a_dead_sites_mail_elsewhere_sends_what_waited_for_its_probe_at_once(
    tmp_path: Path, max_active: int
) -> None:
    """Found from outside: mail deferred `not tried: <site> is down` went on waiting for the old
    site's probe (a minute, then more) after a SIGHUP had routed its domain to a host that
    works, and the old site's empty ready queue stayed listed as down; only `pigeon retry`
    sent it. What waits for the dead site's probe goes at the reload (read from the spool rows,
    more of them than `max_active` too); what a real attempt deferred keeps its own retry
    (`pigeon retry --domain` brings it), and the old row goes."""
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    with ScriptedSink() as first, ScriptedSink() as sink:
        first.rcpt_reply = lambda address: "451 4.2.0 try later" if address.startswith("tried") else None
        # The site's probe is a minute away, each message's own retry an hour.
        config = delivery_config(
            first.endpoint,
            retry_interval="1h",
            site_retry_interval="1m",
            max_site_retry_interval="10m",
            max_active=max_active,
        )
        config["route"] = [
            {"domain": "defer.test", "next_hop": dead, "tls": "disabled"},
            {"domain": "tried.test", "next_hop": first.endpoint, "tls": "disabled"},
        ]
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            _send(pigeon, "w@defer.test")
            pigeon.wait_stderr(f"site {dead} is down")
            waiting = ["w@defer.test"] + [f"v{n}@defer.test" for n in range(3)]
            for recipient in waiting[1:]:
                _send(pigeon, recipient)  # comes while it is down: deferred "not tried"
            _send(pigeon, "tried@tried.test")  # tried, and deferred by its host: its own retry, 1h
            failures = pigeon.wait_records("TransientFailure", 5)
            assert {f["recipient"]: f["attempt"] for f in failures} == {
                **dict.fromkeys(waiting, 0),
                "tried@tried.test": 1,
            }
            assert _ready_rows(pigeon)[dead]["down"] is True

            for route in pigeon.config["route"]:
                route["next_hop"] = sink.endpoint
            pigeon.config_path.write_text(to_toml(pigeon.config))
            reloaded = time.monotonic()
            _hangup(pigeon, "reloaded:")
            arrived = sink.wait_for(4, timeout=15)
            assert time.monotonic() - reloaded < 15  # not at the old site's probe, a minute on
            assert sorted(r for m in arrived for r in m.recipients) == sorted(waiting)
            deliveries = pigeon.wait_records("Delivery", 4)
            assert {(d["recipient"], d["site"], d["attempt"]) for d in deliveries} == {
                (recipient, sink.endpoint, 1) for recipient in waiting
            }
            pigeon.wait_stderr("waited for the probe of a site down made due now")
            # The old site's queue, empty and no route's any more, is not listed as down for ever.
            assert wait_until(lambda: dead not in _ready_rows(pigeon), timeout=10)

            # The message a real attempt deferred keeps its own schedule ...
            time.sleep(1)
            assert [r for m in sink.received for r in m.recipients if r.startswith("tried")] == []
            assert _attempts(pigeon) == [1]
            # ... and `pigeon retry --domain` brings it now.
            pigeon.cli("retry", "--domain", "tried.test")
            sink.wait_for(5, timeout=10)
            assert wait_until(lambda: pigeon.spool_messages() == [])


_REROUTE_RETRY = "retry after a reload changed the routes"


def _reroute_retries(pigeon: PigeonProcess) -> list[dict[str, Any]]:
    status, progress = pigeon.http_call("GET", "/api/v1/admin/operations", token=pigeon.local_token)
    assert status == 200, progress
    return [row for row in progress["operations"] if row["kind"] == _REROUTE_RETRY]


def test_a_reload_that_changes_no_route_makes_no_retry_of_a_dead_sites_mail(tmp_path: Path) -> None:
    """Found from outside: with mail waiting for a down site's probe, every SIGHUP, even one
    that changed nothing, logged `admin retry after a reload changed the routes: N messages
    looked at, 0 acted on` and added that operation to `pigeon queue operations`. Only a
    reload whose [[route]]s differ looks again at what waits; one that changed a route still
    sends that mail at once, and the listing keeps its columns under that long kind."""
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    with ScriptedSink() as sink:
        config = delivery_config(
            sink.endpoint, retry_interval="1h", site_retry_interval="1m", max_site_retry_interval="10m"
        )
        config["route"] = [{"domain": "defer.test", "next_hop": dead, "tls": "disabled"}]
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            _send(pigeon, "w@defer.test")
            pigeon.wait_stderr(f"site {dead} is down")
            _send(pigeon, "v@defer.test")  # deferred "not tried", to the site's probe a minute on
            pigeon.wait_records("TransientFailure", 2)

            _hangup(pigeon, "reloaded:")  # the same configuration
            _hangup(pigeon, "reloaded:")
            time.sleep(0.5)  # (a walk would have been started with the reload, and ended by now)
            assert _reroute_retries(pigeon) == []
            assert "admin retry after a reload" not in pigeon.stderr()
            assert [r for m in sink.received for r in m.recipients] == []

            pigeon.config["route"][0]["next_hop"] = sink.endpoint
            pigeon.config_path.write_text(to_toml(pigeon.config))
            _hangup(pigeon, "reloaded:")
            arrived = sink.wait_for(2, timeout=15)  # not at the old site's probe, a minute on
            assert sorted(r for m in arrived for r in m.recipients) == ["v@defer.test", "w@defer.test"]
            assert wait_until(lambda: [row["acted_on"] for row in _reroute_retries(pigeon)] == [2])
            pigeon.wait_stderr(f"admin {_REROUTE_RETRY}: 2 messages looked at, 2 acted on")

            header, *rows = pigeon.cli("queue", "operations").splitlines()
            (row,) = [line for line in rows if _REROUTE_RETRY in line]
            assert row.index(_REROUTE_RETRY) == header.index("kind")
            # The counts stand under their headings, and the state under its own.
            for heading, value in (("looked at", "2"), ("acted on", "2"), ("waited", "0")):
                end = header.index(heading) + len(heading)
                assert row[end - len(value) : end] == value and row[end - len(value) - 1] == " ", (header, row)
            assert row.index("done") == header.index("state"), (header, row)


def test_a_site_whose_every_host_refuses_is_down_with_a_reason_naming_each_host_tried(tmp_path: Path) -> None:
    """Found from outside: with every MX host refusing the connection, the site went down with
    a reason naming only the last host tried, as if the others had not been. The reason names
    each address tried and what it did, in the order tried; of many, the first three, then how
    many more and what they did."""
    port = free_port()  # nothing listens there on 127.79.0.x: each connection is refused
    many = [f"mx{n}.many.test" for n in range(5)]
    zone = Zone(
        {
            "two.test": [("MX", 10, "mx.down.test"), ("MX", 20, "mxa.two.test")],
            "mx.down.test": [("A", "127.79.0.11")],
            "mxa.two.test": [("A", "127.79.0.12")],
            "many.test": [("MX", 10 * (n + 1), host) for n, host in enumerate(many)],
            **{host: [("A", f"127.79.0.{20 + n}")] for n, host in enumerate(many)},
        }
    )
    settings = {"enabled": True, "smtp_port": port, "retry_interval": "1h", "dsn": False, "tls": "disabled"}
    with (
        DnsServer(zone) as dns,
        PigeonProcess(
            tmp_path / "node", delivery=settings, dns={"nameservers": [dns.endpoint]}, mta_sts={"enabled": False}
        ) as pigeon,
    ):
        _send(pigeon, "x@two.test")
        pigeon.wait_stderr(f"site mx.down.test,mxa.two.test:{port} is down")
        [failure] = pigeon.wait_records("TransientFailure", 1)
        said = (
            f"cannot connect to mx.down.test [127.79.0.11]:{port}: Connection refused; "
            f"nor to mxa.two.test [127.79.0.12]:{port}: Connection refused"
        )
        assert (failure["attempt"], failure["response"]["code"], failure["response"]["text"]) == (0, 451, said)
        [message] = pigeon.spool_messages()
        status, shown = pigeon.http_call("GET", f"/api/v1/messages/{message['id']}", token=pigeon.local_token)
        assert status == 200 and shown["last_response"] == f"451 4.4.1 {said}", shown

        _send(pigeon, "y@many.test")
        [_, down] = pigeon.wait_records("TransientFailure", 2)
        named = "; nor to ".join(f"{host} [127.79.0.{20 + n}]:{port}: Connection refused" for n, host in
                                 enumerate(many[:3]))  # fmt: skip
        assert down["response"]["text"] == f"cannot connect to {named}; nor to 2 more: Connection refused", down
        assert down["attempt"] == 0, down


def test_a_host_a_source_cannot_reach_is_named_after_the_hosts_that_refused(tmp_path: Path) -> None:
    """With every host that was tried refusing the connection, one that has no address of the
    source's family is named after them, as a host left untried for its lookup is (it was the
    whole reason before, whatever the hosts tried had done)."""
    port = free_port()  # nothing listens there on 127.79.0.x: each connection is refused
    zone = Zone(
        {
            "three.test": [("MX", 10, "mxa.three.test"), ("MX", 20, "mxb.three.test"), ("MX", 30, "mx6.three.test")],
            "mxa.three.test": [("A", "127.79.0.31")],
            "mxb.three.test": [("A", "127.79.0.32")],
            "mx6.three.test": [("AAAA", "::1")],
        }
    )
    settings = {"enabled": True, "smtp_port": port, "retry_interval": "1h", "dsn": False, "tls": "disabled",
                "pool": "four"}  # fmt: skip
    tables = {"source": [{"name": "v4", "bind": "127.0.0.2"}], "pool": [{"name": "four", "sources": ["v4"]}]}
    with (
        DnsServer(zone) as dns,
        PigeonProcess(
            tmp_path / "node",
            delivery=settings,
            dns={"nameservers": [dns.endpoint]},
            mta_sts={"enabled": False},
            tables=tables,
        ) as pigeon,
    ):
        _send(pigeon, "x@three.test")
        [failure] = pigeon.wait_records("TransientFailure", 1)
        said = (
            f"cannot connect to mxa.three.test [127.79.0.31]:{port} from 127.0.0.2: Connection refused; "
            f"nor to mxb.three.test [127.79.0.32]:{port} from 127.0.0.2: Connection refused; "
            "mx6.three.test has no IPv4 address to reach from 127.0.0.2"
        )
        assert (failure["response"]["code"], failure["response"]["text"]) == (451, said), failure


@pytest.mark.parametrize(
    ("reset", "why"), [(True, "Connection reset by peer"), (False, "closed the connection before its greeting")],
    ids=["reset", "closed"],
)  # fmt: skip
def test_a_host_that_ends_every_connection_before_its_greeting_is_a_site_down(
    tmp_path: Path, reset: bool, why: str
) -> None:
    """Found from outside: a host that took TCP and reset it before its greeting was a counted
    attempt (`connection lost`) or a site down (`cannot connect ...: Connection reset by peer`)
    as the reset's timing fell, and a probe that met the first kind logged `site ... is up
    again` though no host had greeted, its mail failing again at once. Ended before a word,
    a connection was not taken: the site is down, every time, and a probe says it still is."""
    with HangUpSink(reset=reset) as sink:
        config = delivery_config(sink.endpoint, retry_interval="1h")  # (sites probed after 1 s, then 2 s)
        with PigeonProcess(tmp_path / "node", **config) as pigeon:
            _send(pigeon, "x@hangup.test")
            pigeon.wait_stderr(f"site {sink.endpoint} is down")
            failures = pigeon.wait_records("TransientFailure", 3, timeout=20)  # (its failure, then two probes')
            assert pigeon.wait_stderr(f"site {sink.endpoint} is still down")
            said = f"cannot connect to [{sink.host}]:{sink.port}: {why}"
            assert [(f["attempt"], f["response"]["code"], f["response"]["text"]) for f in failures] == [
                (0, 451, said)
            ] * len(failures), failures
            assert "is up again" not in pigeon.stderr()
            assert _attempts(pigeon) == [0]
            assert sink.connections == len(failures)
