"""A provider's limits hold for all its domains together, whichever MX hosts led there."""

from __future__ import annotations

import json
import smtplib
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.dns import DnsServer, Zone
from tests.support.process import PigeonProcess, free_port
from tests.support.sinks import ScriptedSink, peak_connections, wait_until

LIMIT = 2  # the provider's connection_limit; [delivery] allows 32 per site
PER_DOMAIN = 60  # enough waiting for each ready queue to want LIMIT connections of its own


def _queues(pigeon: PigeonProcess) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{pigeon.http_port}/api/v1/queues")
    request.add_header("Authorization", f"Bearer {pigeon.local_token}")
    with urllib.request.urlopen(request, timeout=5) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def test_a_providers_connection_limit_holds_across_its_domains_together(tmp_path: Path) -> None:
    port = free_port()  # [delivery] smtp_port: every MX host's port here
    # Two recipient domains, each with MX hosts of its own (two sites, two ready queues),
    # both under the provider's suffix.
    zone = Zone(
        {
            "one.test": [("MX", 10, "mx1.in.provider.test"), ("MX", 20, "mx2.in.provider.test")],
            "two.test": [("MX", 10, "gw7.eu.in.provider.test")],
            "mx1.in.provider.test": [("A", "127.0.0.1")],
            "mx2.in.provider.test": [("A", "127.0.0.1")],
            "gw7.eu.in.provider.test": [("A", "127.0.0.1")],
        }
    )
    with (
        DnsServer(zone) as dns,
        ScriptedSink(port=port, slow=0.05) as sink,
        PigeonProcess(
            tmp_path / "node",
            delivery={"enabled": True, "smtp_port": port, "dsn": False, "tls": "disabled", "idle_timeout": "1s"},
            dns={"nameservers": [dns.endpoint], "timeout": "1s"},
            provider=[{"name": "bigmail", "mx_suffixes": ["*.in.provider.test"]}],
            shaping=[{"provider": "bigmail", "connection_limit": LIMIT}],
        ) as pigeon,
        smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client,
    ):
        for n in range(PER_DOMAIN):  # interleaved: both ready queues have mail all along
            for domain in ("one.test", "two.test"):
                client.sendmail("a@example.org", [f"slow@{domain}"], f"Subject: {n}\r\n\r\nhi\r\n".encode())
        ready = wait_until(lambda: [r for r in _queues(pigeon)["ready"] if r["provider"]], timeout=10)
        assert {r["provider"] for r in ready} == {"bigmail"}
        sink.wait_for(2 * PER_DOMAIN, timeout=60)
        deliveries = pigeon.wait_records("Delivery", 2 * PER_DOMAIN)
    sites = {r["site"] for r in deliveries}
    assert sites == {f"mx1.in.provider.test,mx2.in.provider.test:{port}", f"gw7.eu.in.provider.test:{port}"}
    # Each site alone could have had LIMIT connections (or 32): together they had LIMIT.
    assert peak_connections(sink.connections) == LIMIT
