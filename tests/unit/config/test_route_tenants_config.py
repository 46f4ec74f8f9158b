"""`[[route]] tenants`: what loads, what is refused at load (naming the key and the route), and
which route is a domain's, reserved or not, for every door alike (`pigeon.route_tenants`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load
from pigeon.node.outbound import routes_from
from pigeon.route_tenants import RouteTenants, shared_account_warnings


def _load(tmp_path: Path, routes: str) -> Path:
    path = tmp_path / "pigeon.toml"
    path.write_text(routes)
    return path


def test_a_routes_tenants_reserve_it_and_the_first_matching_route_decides(tmp_path: Path) -> None:
    config = load(
        _load(
            tmp_path,
            '[[route]]\ndomain = "*.globex.test"\nnext_hop = "relay.test:587"\ntenants = ["globex", "initech"]\n'
            '[[route]]\ndomain = "open.globex.test"\nnext_hop = "relay.test:25"\n'
            '[[route]]\ndomain = "*"\nnext_hop = "mx.test:25"\n',
        )
    )
    reserved = RouteTenants.from_config(config.route)
    assert reserved.reserved_for("a.globex.test") == frozenset({"globex", "initech"})
    assert reserved.reserved_for("open.globex.test") == frozenset({"globex", "initech"})  # (#1 comes first)
    assert reserved.reserved_for("example.net") is None
    assert reserved.refusal("a.globex.test", ["initech"]) is None
    refusal = reserved.refusal("a.globex.test", ["acme"])
    assert refusal is not None and (refusal.code, refusal.enhanced) == (550, "5.7.1")
    assert "globex" not in refusal.text.replace("a.globex.test", "") and "initech" not in refusal.text
    assert reserved.refusal("a.globex.test", [None, "globex"]) is None  # (bound to several: may be globex's)
    assert [route.tenants for route in routes_from(config)] == [frozenset({"globex", "initech"}), None, None]


@pytest.mark.parametrize(
    ("route", "said"),
    [
        ('domain = "*"\ntenants = ["globex"]\n', "a route for every domain cannot be reserved for tenants"),
        ('domain = "**"\ntenants = ["globex"]\n', "a route for every domain cannot be reserved for tenants"),
        ('domain = "x.test"\ntenants = []\n', "tenants = [] reserves the route for no tenant"),
        ('domain = "x.test"\ntenants = ["a b"]\n', "route 'x.test': tenant 'a b'"),
    ],
)
def test_a_route_reserved_for_every_domain_or_for_no_tenant_is_refused_at_load(
    tmp_path: Path, route: str, said: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(_load(tmp_path, f'[[route]]\nnext_hop = "relay.test:587"\n{route}'))
    assert "[[route]] #1 tenants" in str(caught.value), caught.value
    assert said in str(caught.value), caught.value


def test_routes_sharing_a_smart_host_account_but_not_reserved_alike_are_warned_about_once(tmp_path: Path) -> None:
    account = 'next_hop = "Relay.test:587"\nauth_username = "globex"\nauth_password = "pw"\n'
    config = load(
        _load(
            tmp_path,
            f'[[route]]\ndomain = "globex-relay.test"\n{account}tenants = ["globex"]\n'
            f'[[route]]\ndomain = "initech-relay.test"\n{account}tenants = ["initech"]\n'
            f'[[route]]\ndomain = "alike.test"\n{account}tenants = ["globex"]\n'
            '[[route]]\ndomain = "own.test"\nnext_hop = "relay.test:587"\nauth_username = "acme"\n'
            'auth_password = "pw"\n',
        )
    )
    # Each route said once, with the first route before it not reserved alike; #4's account is its own.
    warning, third = shared_account_warnings(config.route)
    assert third.startswith("[[route]] #3 (domain 'alike.test') logs in to relay.test:587 as 'globex' as #2 "), third
    assert warning.startswith(
        "[[route]] #2 (domain 'initech-relay.test') logs in to relay.test:587 as 'globex' as #1 (domain "
        "'globex-relay.test') does, and they are not reserved alike (#1: tenant globex's alone; #2: tenant "
        "initech's alone)"
    ), warning
