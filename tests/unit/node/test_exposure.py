"""What `pigeon.node.exposure` finds: secrets in the config, files others may read, an API
listening beyond loopback in clear."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from pigeon.config.load import load_text
from pigeon.config.schema import Config, Endpoint
from pigeon.node.exposure import (
    Exposure,
    config_secrets,
    http_in_clear,
    readers_besides_us,
    untrusted_dane_resolvers,
)


def _config(**sections: object) -> Config:
    return msgspec.convert(sections, Config)


def test_the_secrets_a_config_holds_are_named() -> None:
    assert config_secrets(_config()) == []
    assert config_secrets(_config(redis={"url": "redis://127.0.0.1:6379/0"})) == []
    held = config_secrets(
        _config(
            redis={"url": "redis://:hunter2@127.0.0.1:6379/0"},
            target=[
                {"kind": "webhook", "name": "plain", "url": "https://app.test/in", "headers": {"X-Source": "pigeon"}},
                {"kind": "webhook", "name": "signed", "url": "https://app.test/in", "secret": "s"},
                {"kind": "webhook", "name": "bearer", "url": "https://app.test/in", "headers": {"Authorization": "B"}},
                {"kind": "postgresql", "name": "db", "dsn": "postgresql://app:pw@127.0.0.1:5432/app"},
                {"kind": "postgresql", "name": "peer", "dsn": "postgresql://app@127.0.0.1:5432/app"},
            ],
        )
    )
    assert held == [
        "the [redis] url's password",
        "[[target]] 'signed''s secrets",
        "[[target]] 'bearer''s secrets",
        "[[target]] 'db''s PostgreSQL password",
    ]


def test_a_file_is_judged_by_its_other_and_group_bits(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("x")
    secret.chmod(0o600)
    assert readers_besides_us(secret) is None
    secret.chmod(0o604)
    assert readers_besides_us(secret) == ("other users", 0o604)
    secret.chmod(0o640)  # its group is ours: how a root-owned file is shared with Pigeon's user
    assert readers_besides_us(secret) is None
    assert readers_besides_us(tmp_path / "missing") is None
    if os.geteuid() == 0:
        stranger = max([*os.getgroups(), os.getegid()]) + 4242  # a group we are not in
        os.chown(secret, -1, stranger)
        found = readers_besides_us(secret)
        assert found is not None and found[0].startswith("the members of group ") and found[1] == 0o640


def test_each_file_is_named_once_while_it_stays_readable(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("")
    users.chmod(0o644)
    config = _config(smtp={"starttls": False}, http={"local_token": False})
    config.smtp.auth_users = users
    exposure = Exposure()
    said = [*exposure.warnings(config, None)]
    assert len(said) == 1 and f"chmod 600 {users}" in said[0]
    assert [*exposure.warnings(config, None)] == []
    users.chmod(0o600)
    assert [*exposure.warnings(config, None)] == []
    users.chmod(0o644)  # made readable again: named again
    assert [*exposure.warnings(config, None)] == said


def test_a_group_is_judged_by_the_groups_of_the_user_the_node_runs_as(tmp_path: Path) -> None:
    """`serve --check` run as root judges a file shared with the node's user's group (README's
    `chgrp pigeon` and 0640) as that user would: not readable by anyone else."""
    secret = tmp_path / "secret"
    secret.write_text("x")
    secret.chmod(0o640)
    group = os.stat(secret).st_gid
    assert readers_besides_us(secret, frozenset({group})) is None
    found = readers_besides_us(secret, frozenset({group + 4242}))
    assert found is not None and found[0].startswith("the members of group ") and found[1] == 0o640


@pytest.mark.parametrize(
    ("listen", "warned"),
    [("127.0.0.1:8025", False), ("[::1]:8025", False), ("localhost:8025", False), ("0.0.0.0:8025", True),
     ("[::]:8025", True), ("192.0.2.7:8025", True)],
)  # fmt: skip
def test_an_api_beyond_loopback_is_said_to_carry_its_tokens_in_clear(listen: str, warned: bool) -> None:
    config = _config()
    config.http.listen = Endpoint(listen)
    said = http_in_clear(config)
    if warned:
        assert said == (
            f"[http] listen {listen} is not a loopback address, and the HTTP listener has no TLS: API bearer "
            "tokens (and what the API answers) cross the network in clear; listen on loopback and put a "
            "TLS-terminating proxy in front for other machines"
        )
    else:
        assert said is None


def test_dane_trusting_nameservers_beyond_loopback_is_said_naming_them_and_localhost_is_loopback(
    tmp_path: Path,
) -> None:
    def said(*nameservers: str, dane: bool = True) -> str | None:
        named = ", ".join(f'"{n}"' for n in nameservers)
        text = f"[dane]\nenabled = {str(dane).lower()}\n[dns]\nnameservers = [{named}]\n"
        config = load_text(text, tmp_path / "p.toml")
        return untrusted_dane_resolvers(config, str(tmp_path / "resolv.conf"))

    assert said("localhost:5389") is None
    assert said("127.0.0.1:53", "[::1]:53") is None
    remote = said("127.0.0.1:53", "192.0.2.53:53")
    assert remote is not None and "[dns] nameservers names 192.0.2.53, not on this host's loopback" in remote
    assert said("192.0.2.53:53", dane=False) is None
    # None named: the system's resolv.conf, whose nameservers are named.
    (tmp_path / "resolv.conf").write_text("search example\nnameserver 10.0.0.2\nnameserver 127.0.0.53\n")
    system = said()
    assert system is not None and f"{tmp_path / 'resolv.conf'} (no [dns] nameservers) names 10.0.0.2, not" in system
    (tmp_path / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    assert said() is None
    (tmp_path / "resolv.conf").unlink()
    unread = said()
    assert unread is not None and "names none that Pigeon could read" in unread
