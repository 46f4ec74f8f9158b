"""A `[[route]]` that an earlier one shadows is never used (the first route that matches a
domain wins): the node says so when it starts and when a reload brings one, naming both."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.support.process import PigeonProcess, to_toml

HOP = "127.0.0.1:9"  # never connected to: nothing is sent


def _routes(*domains: str) -> dict[str, object]:
    return {"route": [{"domain": domain, "next_hop": HOP, "tls": "disabled"} for domain in domains]}


def test_a_route_an_earlier_glob_shadows_is_named_at_start_and_at_a_reload(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", **_routes("*.test", "defer.test", "a.example")) as pigeon:
        said = pigeon.stderr()
        assert (
            "[[route]] #2 (domain 'defer.test') is never used: #1 (domain '*.test') comes first and matches "
            "every domain it does (the first route that matches wins): move it up, or remove it"
        ) in said
        assert "'a.example') is never used" not in said
        pigeon.config.update(_routes("a.example", "*.mx.test", "*.test", "b.mx.test"))
        pigeon.config_path.write_text(to_toml(pigeon.config))
        assert pigeon.process is not None
        pigeon.process.send_signal(signal.SIGHUP)
        pigeon.wait_stderr("[[route]] #4 (domain 'b.mx.test') is never used: #2 (domain '*.mx.test')")
        assert "#3 (domain '*.test') is never used" not in pigeon.stderr()


def test_routes_in_a_working_order_say_nothing(tmp_path: Path) -> None:
    with PigeonProcess(tmp_path / "node", **_routes("a.test", "*.mx.test", "*.test", "*")) as pigeon:
        assert "is never used" not in pigeon.stderr()


def _inbound(*routes: dict[str, str]) -> dict[str, object]:
    target = {"name": "app", "kind": "log", "path": "handed.log"}
    return {"target": [target], "inbound": [{**route, "target": "app"} for route in routes]}


def test_an_inbound_route_an_earlier_one_hides_or_one_for_every_domain_is_named_at_start(tmp_path: Path) -> None:
    # Found from outside: a domain route above "reply+*@app.test" took its mail, and
    # recipient = "*" took relayed outbound mail too, both without a word.
    routes = _inbound({"domain": "app.test"}, {"recipient": "reply+*@app.test"}, {"recipient": "*"})
    with PigeonProcess(tmp_path / "node", **routes) as pigeon:
        said = pigeon.wait_stderr("takes mail for every domain")
    assert (
        "[[inbound]] #2 (recipient 'reply+*@app.test') is never used: #1 (domain 'app.test') comes first and "
        "takes every address it does (the first route that matches wins): move it up, or remove it"
    ) in said
    assert "[[inbound]] #3 (recipient '*') takes mail for every domain: what clients of relay_networks" in said
    assert "#3 (recipient '*') is never used" not in said


def test_inbound_routes_in_a_working_order_say_nothing(tmp_path: Path) -> None:
    routes = _inbound({"recipient": "reply+*@app.test"}, {"domain": "app.test"}, {"domain": "*.app.test"})
    with PigeonProcess(tmp_path / "node", **routes) as pigeon:
        said = pigeon.stderr()
    assert "is never used" not in said and "every domain" not in said
