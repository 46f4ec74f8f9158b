"""Domain globs in a real node's configuration: one written in capitals with a final dot
routes mail as meant; one no domain can match stops `pigeon serve` with exit 2, naming it."""

from __future__ import annotations

import smtplib
import subprocess
import sys
from pathlib import Path

from tests.support.process import PigeonProcess
from tests.support.sinks import ScriptedSink, delivery_config


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
    result = subprocess.run([sys.executable, "-m", "pigeon", "serve", "-c", str(config)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        f"pigeon: configuration error: {config}, line 5: [[shaping]] #1 domain: '*.gmail com' holds white space\n"
    )
