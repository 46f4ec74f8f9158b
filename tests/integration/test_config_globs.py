"""Globs in a real node's configuration: a domain glob written in capitals with a final dot
routes mail as meant; one no domain can match stops `pigeon serve` with exit 2, naming it; a
queue glob matches whole queue names, the domain alone for mail with no tenant nor campaign."""

from __future__ import annotations

import smtplib
import time
from pathlib import Path

from tests.support import zygote
from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config, wait_until


def test_a_route_written_in_capitals_with_a_final_dot_takes_the_mail_of_its_domain(tmp_path: Path) -> None:
    with ScriptedSink() as partner, ScriptedSink() as everyone_else:
        sections = delivery_config(everyone_else.endpoint)
        routes = [{"domain": "Partner.Example.", "next_hop": partner.endpoint, "tls": "disabled"}, *sections["route"]]
        with (
            PigeonProcess(tmp_path / "node", delivery=sections["delivery"], tables={"route": routes}) as pigeon,
            smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client,
        ):
            client.sendmail("a@example.org", ["ann@partner.example"], b"Subject: to the partner\r\n\r\nhi\r\n")
            client.sendmail("a@example.org", ["bob@other.example"], b"Subject: to anyone\r\n\r\nhi\r\n")
            (to_partner,) = partner.wait_for(1)
            (to_others,) = everyone_else.wait_for(1)
    assert to_partner.recipients == ["ann@partner.example"]
    assert to_others.recipients == ["bob@other.example"]


def test_serve_refuses_an_impossible_domain_glob_with_exit_2_naming_the_setting(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text('[[route]]\ndomain = "partner.example"\nnext_hop = "127.0.0.1:2526"\n'
                      '[[shaping]]\ndomain = "*.gmail com"\nconnection_limit = 5\n')  # fmt: skip
    result = zygote.run(["serve", "-c", str(config)], text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == (
        f"pigeon: configuration error: {config}, line 5: [[shaping]] #1 domain: '*.gmail com' holds white space\n"
    )


def test_a_domain_s_mail_with_and_without_a_tenant_needs_both_queue_globs_the_readme_gives(tmp_path: Path) -> None:
    """Mail with no tenant nor campaign is in the queue `<domain>`, which `"*@<domain>"` does
    not match: README's "Queue names" gives both globs for all of a domain's mail."""
    sections = delivery_config("", retry_interval="1s", dsn=False)
    queues = [
        {"name": "both.test", "max_age": "2s"},
        {"name": "*@both.test", "max_age": "2s"},
        {"name": "*@tenants.test", "max_age": "2s"},
    ]
    with ScriptedSink() as sink:
        sink.rcpt_reply = lambda address: "451 4.3.0 later"
        sections["route"][0]["next_hop"] = sink.endpoint
        with PigeonProcess(tmp_path / "node", **sections, tables={"queue": queues}) as pigeon:
            with smtplib.SMTP("127.0.0.1", pigeon.smtp_port) as client:
                for recipient in ("a@both.test", "a@tenants.test"):
                    client.sendmail("a@example.org", [recipient], b"Subject: plain\r\n\r\nhi\r\n")
                    client.sendmail("a@example.org", [recipient], b"X-Tenant: acme\r\nSubject: acme\r\n\r\nhi\r\n")
            expired = wait_until(lambda: len(pigeon.records("Expiration")) == 3 and pigeon.records("Expiration"))
            assert sorted(r["queue"] for r in expired) == ["acme@both.test", "acme@tenants.test", "both.test"]
            time.sleep(1.0)
            assert len(pigeon.records("Expiration")) == 3  # tenants.test's plain mail waits for [delivery] max_age
            assert [m["queue"] for m in pigeon.spool_messages()] == ["tenants.test"]
