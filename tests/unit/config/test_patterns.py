"""Glob settings are checked and normalised at load: a pattern no name can match is refused
naming the setting; one written in capitals or with a final dot matches as a person expects."""

from __future__ import annotations

from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load
from pigeon.config.patterns import PatternError, address_glob, api_pattern, domain_glob, queue_glob, site_glob


@pytest.mark.parametrize(
    ("written", "matched_as"),
    [
        ("Example.COM.", "example.com"),
        ("*.Example.net", "*.example.net"),
        ("*", "*"),
        ("mx[0-9].example.org", "mx[0-9].example.org"),
        ("Bücher.example", "xn--bcher-kva.example"),  # as recipient domains are matched
        ("_dmarc.example.com", "_dmarc.example.com"),
    ],
)
def test_a_domain_glob_is_lower_cased_without_its_final_dot(written: str, matched_as: str) -> None:
    assert domain_glob(written) == matched_as


@pytest.mark.parametrize(
    ("written", "reason"),
    [
        ("exa mple.com", "holds white space"),
        (" example.com", "holds white space"),
        ("user@example.com", "holds '@'"),
        ("a..b", "empty label"),
        (".example.com", "empty label"),
        ("example.com..", "empty label"),
        ("example.com/24", "holds '/', which no host name holds"),
        ("example,com", "holds ',', which no host name holds"),
        ("mx[0-9.example.org", "not closed"),
        ("mx[a b].example.org", "holds white space"),
        ("", "is empty"),
        ("x" * 64 + ".example", "a label of 64 characters"),
    ],
)
def test_an_impossible_domain_glob_is_refused_saying_why(written: str, reason: str) -> None:
    with pytest.raises(PatternError, match=reason.replace("[", r"\[")):
        domain_glob(written)


def test_a_site_glob_normalises_each_host_and_keeps_its_port() -> None:
    assert site_glob("MX1.Example.net.,mx2.example.NET") == "mx1.example.net,mx2.example.net"
    assert site_glob("Relay.Example.:2525") == "relay.example:2525"
    assert site_glob("*.google.com") == "*.google.com"
    assert site_glob("[::1]:2525") == "[::1]:2525"
    for written, reason in (("mx..example.net", "empty label"), ("mx.example.net:", "no port"),
                            ("mx.example.net:smtp", "not a number"), ("a,,b", "empty host"),
                            ("127.0.0.9:99999", "port 99999 is out of range: a port is 1 to 65535"),
                            ("[::1]:0", "port 0 is out of range"), ("mx.example:025", "leading zero: write 25"),
                            ("mx.example:2[5", "'\\[' set that is not closed"), ("mx[1.test", "not closed"),
                            ("[::1", "not closed"), ("[::1]:2[5", "not closed")):  # fmt: skip
        with pytest.raises(PatternError, match=reason):
            site_glob(written)


def test_an_address_glob_lower_cases_it_and_drops_the_final_dot_of_its_domain() -> None:
    assert address_glob("Reply+*@App.Example.") == "reply+*@app.example"
    assert address_glob("*") == "*"
    for written, reason in (("support", "names no domain"), ("@app.example", "nothing before"),
                            ("a@b@c..d", "empty label"), ("help desk@app.example", "white space")):  # fmt: skip
        with pytest.raises(PatternError, match=reason):
            address_glob(written)


def test_a_queue_glob_lower_cases_only_its_domain_part() -> None:
    assert queue_glob("Spring:Acme@Example.NET.") == "Spring:Acme@example.net"
    assert queue_glob("newsletter:*") == "newsletter:*"
    assert queue_glob("acme corp@*") == "acme corp@*"  # mail spooled when "X-Tenant: acme corp" kept its space
    with pytest.raises(PatternError):
        queue_glob(" newsletter:*")
    with pytest.raises(PatternError, match="empty label"):
        queue_glob("*@example..net")
    assert queue_glob("c[12]:t4@*") == "c[12]:t4@*"
    with pytest.raises(
        PatternError, match=r"'\[' set that is not closed with '\]' \(for a '\[' itself, write '\[\[\]'\)"
    ):
        queue_glob("c[12:t4@*")  # fnmatch reads the "[" as itself: it matched no queue


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        (
            '[[route]]\ndomain = "exa mple.com"\nnext_hop = "127.0.0.1:25"\n',
            "line 2: [[route]] #1 domain: 'exa mple.com'",
        ),
        ('[[shaping]]\ndomain = "a..b"\nconnection_limit = 2\n', "line 2: [[shaping]] #1 domain: 'a..b'"),
        ('[[reaction]]\nid = "r"\nsite = "mx@example.net"\nmatch = "x"\naction = "suspend"\n',
         "line 3: [[reaction]] #1 site: 'mx@example.net'"),
        ('[[reaction]]\nid = "r"\ndomain = "ex!ample.com"\nmatch = "x"\naction = "suspend"\n',
         "line 3: [[reaction]] #1 domain: 'ex!ample.com'"),
        ('[[reaction]]\nid = "r"\nsite = "[::1"\nmatch = "x"\naction = "suspend"\n',
         "line 3: [[reaction]] #1 site: '[::1' has a '[' set that is not closed"),
        ('[[dkim]]\ndomain = "exa[mple.net"\nselector = "s"\nprivate_key = "k.pem"\n',
         "line 2: [[dkim]] #1 domain: 'exa[mple.net' has a '[' set that is not closed"),
        ('[[queue]]\nname = "*@example..net"\n', "line 2: [[queue]] #1 name: '*@example..net'"),
        ('[[queue]]\nname = "c[12:*"\n', "line 2: [[queue]] #1 name: 'c[12:*' has a '[' set that is not closed"),
        ('[[target]]\nname = "t"\nkind = "log"\npath = "t.log"\n[[inbound]]\ntarget = "t"\ndomain = "app example"\n',
         "line 7: [[inbound]] #1 domain: 'app example'"),
    ],
)  # fmt: skip
def test_a_config_with_an_impossible_glob_is_refused_naming_the_setting(tmp_path: Path, toml: str, named: str) -> None:
    path = tmp_path / "pigeon.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as refused:
        load(path)
    assert f"{path}, {named}" in str(refused.value)


def test_globs_are_loaded_normalised(tmp_path: Path) -> None:
    path = tmp_path / "pigeon.toml"
    path.write_text(
        '[[route]]\ndomain = "Example.NET."\nnext_hop = "127.0.0.1:25"\n'
        '[[shaping]]\ndomain = "*.Example.COM."\nconnection_limit = 2\n'
        '[[reaction]]\nid = "r"\nsite = "MX.Example.NET."\nmatch = "x"\naction = "suspend"\n'
    )
    config = load(path)
    assert (config.route[0].domain, config.shaping[0].domain) == ("example.net", "*.example.com")
    assert config.reaction[0].site == "mx.example.net"


def test_a_site_glob_naming_an_ipv6_literal_matches_that_site_and_no_other() -> None:
    """fnmatch alone reads `[::1]` as a set of ':' and '1': a suspension or reaction for a next
    hop written `[::1]:2525` named no site at all."""
    from pigeon.config.patterns import site_matches
    from pigeon.queue.rules import Selector

    pattern = site_glob("[::1]:2525")
    assert site_matches("[::1]:2525", pattern)
    assert not site_matches("[::2]:2525", pattern) and not site_matches("1:2525", pattern)
    assert Selector(site=pattern).matches_site("[::1]:2525")
    assert Selector(site="[::1]").matches_site("[::1]:2525")  # no port: any port
    assert not Selector(site=pattern).matches_site("[::1]")  # port 25
    assert Selector(site="mx[12].example.net").matches_site("mx2.example.net")  # sets stay sets


def test_the_documented_queue_glob_pattern_takes_no_control_or_format_character_as_the_server_refuses() -> None:
    # The OpenAPI document said a queue glob with "\x12" in a set was valid; the server refused it (400).
    pattern = api_pattern("queue_glob")
    for refused in ("a\x12b", "[]\x12S]", "[!\x00]x", "x\u200by", "a b"):
        assert not pattern.fullmatch(refused), refused
    for taken in ("spring:acme@example.net", "c[12]:t4@*", "[]]x", "é:ü@*"):
        assert pattern.fullmatch(taken), taken
