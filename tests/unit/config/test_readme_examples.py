"""The README's configuration examples load as pasted (with the files they name beside them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load
from pigeon.listener.tls import ensure_self_signed
from tests.support.readme import readme_toml

ROUTES = "[[route]]                    # skip MX lookup"


def test_the_routes_queues_and_shaping_example_loads_as_pasted(tmp_path: Path) -> None:
    # Found from outside: it named a [[pool]] it did not define, so it stopped the start.
    certificate, _ = ensure_self_signed(tmp_path / "tls", "relay.example")
    shutil.copy(certificate, tmp_path / "relay-ca.pem")  # the file its ca_file names, beside it
    (tmp_path / "relay-password").write_text("secret\n")  # and its auth_password_file
    (tmp_path / "pigeon.toml").write_text(readme_toml(ROUTES))

    config = load(tmp_path / "pigeon.toml")

    (route,) = config.route
    assert (route.next_hop, route.tls, route.ca_file) == (
        "smtp.relay.example:587",
        "required",
        tmp_path / "relay-ca.pem",
    )
    assert (route.auth_username, route.auth_password_file) == ("pigeon@relay.example", tmp_path / "relay-password")
    assert [q.name for q in config.queue] == ["newsletter:*"] and [s.domain for s in config.shaping] == ["gmail.com"]


def test_the_routes_example_without_its_ca_file_says_the_file_must_be_there(tmp_path: Path) -> None:
    (tmp_path / "pigeon.toml").write_text(readme_toml(ROUTES))
    with pytest.raises(
        ConfigError, match=r"\[\[route\]\] #1 ca_file: route '\*\.example\.net': CA file .* does not exist"
    ):
        load(tmp_path / "pigeon.toml")
    assert "must be there when it loads" in readme_toml(ROUTES)


def test_the_implicit_tls_smart_host_example_loads_as_pasted(tmp_path: Path) -> None:
    text = readme_toml("[[route]]                    # smart host on port 465")
    password = tmp_path / "ses-password"
    password.write_text("secret\n")
    (tmp_path / "pigeon.toml").write_text(text.replace("/etc/pigeon/ses-password", str(password)))
    (route,) = load(tmp_path / "pigeon.toml").route
    assert (route.next_hop, route.tls, route.auth_username) == (
        "email-smtp.eu-west-1.amazonaws.com:465",
        "implicit",
        "AKIAEXAMPLE",
    )


def test_the_tenant_binding_example_loads_as_pasted(tmp_path: Path) -> None:
    (tmp_path / "pigeon.toml").write_text(readme_toml('[[http.token]]\nname = "acme-app"'))
    app, admin = load(tmp_path / "pigeon.toml").http.token
    assert (app.name, app.scopes, app.tenants) == ("acme-app", ["inject"], ["acme"])
    assert (admin.name, admin.scopes, admin.tenants) == ("acme-admin", ["admin", "read"], ["acme"])
