"""`[[source]]` and `[[pool]]`: what a valid egress configuration gives, and each mistake
refused at load with the file, the line of the table it is in, and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load, unbindable_sources
from pigeon.config.schema import PoolMember

EGRESS = """\
[delivery]
pool = "bulk"

[[source]]
name = "ip-2"
bind = "127.0.0.2"
ehlo = "ip2.example"

[[source]]
name = "ip-3"
bind = "127.0.0.3"
ehlo = "ip3.example"

[[source]]
name = "v6"
bind = "::1"

[[pool]]
name = "bulk"
sources = [{source = "ip-2", weight = 3}, {source = "ip-3", weight = 1}]

[[pool]]
name = "transactional"
sources = ["ip-3", "v6"]

[[queue]]
name = "*:acme@*"
pool = "transactional"

[[shaping]]
domain = "*"
source = "ip-3"
connection_limit = 1
"""


def error_of(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pigeon.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load(path)
    return str(caught.value)


def test_sources_pools_and_the_pools_named_elsewhere_load(tmp_path: Path) -> None:
    path = tmp_path / "pigeon.toml"
    path.write_text(EGRESS, encoding="utf-8")
    config = load(path)
    assert [(s.name, s.bind, s.ehlo) for s in config.source] == [
        ("ip-2", "127.0.0.2", "ip2.example"),
        ("ip-3", "127.0.0.3", "ip3.example"),
        ("v6", "::1", ""),
    ]
    assert config.pool[0].sources == [PoolMember(source="ip-2", weight=3), PoolMember(source="ip-3", weight=1)]
    assert config.pool[1].sources == ["ip-3", "v6"]  # bare names: weight 1
    assert config.delivery.pool == "bulk"
    assert config.queue[0].pool == "transactional"
    assert config.shaping[0].source == "ip-3"


def test_without_sources_or_pools_mail_keeps_the_implicit_source(tmp_path: Path) -> None:
    config = load(None)
    assert (config.source, config.pool, config.delivery.pool, config.delivery.source) == ([], [], None, "default")


def _with(replace: str, by: str) -> str:
    assert replace in EGRESS
    return EGRESS.replace(replace, by, 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            _with('{source = "ip-3", weight = 1}', '{source = "ip-4", weight = 1}'),
            "line 20: [[pool]] #1 sources: pool 'bulk': no [[source]] called 'ip-4' (known: 'ip-2', 'ip-3', 'v6')",
        ),
        (
            _with('["ip-3", "v6"]', '["ip-3", "ip-9"]'),
            "line 24: [[pool]] #2 sources: pool 'transactional': no [[source]] called 'ip-9'",
        ),
        (
            _with("weight = 1}", "weight = 0}"),
            "line 20: [[pool]] #1 sources: pool 'bulk': source 'ip-3' has weight 0; weights are whole numbers from 1",
        ),
        (
            _with('["ip-3", "v6"]', "[]"),
            "line 24: [[pool]] #2 sources: pool 'transactional': name at least one [[source]]",
        ),
        (
            _with('["ip-3", "v6"]', '["v6", "v6"]'),
            "[[pool]] #2 sources: pool 'transactional': source 'v6' is listed twice",
        ),
        (
            _with('name = "transactional"', 'name = "bulk"'),
            "line 23: [[pool]] #2 name: two [[pool]]s are called 'bulk'",
        ),
        (_with('name = "ip-3"', 'name = "ip-2"'), "line 10: [[source]] #2 name: two [[source]]s are called 'ip-2'"),
        (
            _with('name = "ip-3"', 'name = "default"'),
            "[[source]] #2 name: source 'default' is the name of the implicit",
        ),
        (_with('name = "ip-3"', 'name = "ip 3"'), "line 10: [[source]] #2 name: source 'ip 3': letters, digits"),
        (
            _with('bind = "127.0.0.3"', 'bind = "127.0.0.300"'),
            "line 11: [[source]] #2 bind: source 'ip-3': '127.0.0.300'",
        ),
        (
            _with('bind = "127.0.0.3"', 'bind = "0.0.0.0"'),
            "line 11: [[source]] #2 bind: source 'ip-3': 0.0.0.0 is the unspecified address (any address of the "
            "machine): give the one address its mail leaves from",
        ),
        (
            _with('bind = "::1"', 'bind = "::"'),
            "line 16: [[source]] #3 bind: source 'v6': :: is the unspecified address",
        ),
        (
            # IPv4-mapped: delivery would try IPv6 MXs only, from an IPv4 address that reaches none.
            _with('bind = "::1"', 'bind = "::ffff:127.0.0.1"'),
            "line 16: [[source]] #3 bind: source 'v6': ::ffff:127.0.0.1 is an IPv4-mapped IPv6 address, "
            'from which no MX can be reached: give its IPv4 form, bind = "127.0.0.1"',
        ),
        (
            _with('bind = "::1"', 'bind = "::FFFF:0.0.0.0"'),
            "line 16: [[source]] #3 bind: source 'v6': ::FFFF:0.0.0.0 is the unspecified address",
        ),
        (
            _with('ehlo = "ip3.example"', 'ehlo = "ip3 example"'),
            "line 12: [[source]] #2 ehlo: source 'ip-3': 'ip3 example'",
        ),
        (_with('pool = "bulk"', 'pool = "bluk"'), "line 2: [delivery] pool: no [[pool]] called 'bluk' (known: 'bulk',"),
        (_with('pool = "transactional"', 'pool = "nope"'), "line 28: [[queue]] #1 pool: queue '*:acme@*': no [[pool]]"),
        (
            _with('source = "ip-3"\nconn', 'source = "ip-7"\nconn'),
            "line 32: [[shaping]] #1 source: no [[source]] called 'ip-7'",
        ),
    ],
)
def test_egress_mistakes_name_the_key_and_its_line(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(tmp_path, text)


UNBINDABLE = _with('bind = "127.0.0.3"', 'bind = "192.0.2.77"')  # TEST-NET-1: on no interface


def test_a_source_address_that_cannot_be_bound_stops_the_nodes_first_start(tmp_path: Path) -> None:
    path = tmp_path / "pigeon.toml"
    path.write_text(UNBINDABLE, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load(path, first_start=True)
    assert f"{path}, line 11: [[source]] #2 bind: source 'ip-3': cannot bind to 192.0.2.77: " in str(caught.value)


def test_later_a_source_address_that_cannot_be_bound_loads_and_is_named_in_a_warning(tmp_path: Path) -> None:
    # A reload, a worker started again, a command reading the file: the address may be gone
    # for a while, and the rest of the node's mail must go on.
    path = tmp_path / "pigeon.toml"
    path.write_text(UNBINDABLE, encoding="utf-8")
    config = load(path)
    assert [source.bind for source in config.source] == ["127.0.0.2", "192.0.2.77", "::1"]
    (warning,) = unbindable_sources(config)
    assert warning.startswith("[[source]] #2 bind: source 'ip-3': cannot bind to 192.0.2.77: ")
    assert "mail from it waits (451 4.4.1) until the address is back" in warning
    path.write_text(EGRESS, encoding="utf-8")
    assert unbindable_sources(load(path)) == []
