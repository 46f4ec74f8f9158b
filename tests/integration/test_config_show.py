"""`pigeon config show` (Postfix's `postconf`, `postconf -n`): the real command on real files."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import msgspec

from pigeon.config.load import ConfigError, load
from pigeon.config.schema import Config
from tests.support.readme import README


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pigeon", *args], capture_output=True, text=True, timeout=60)


def _same(first: Path | None, second: Path) -> None:
    """Whether the files load as the same configuration (a path relative to the working
    directory, as the defaults' are without a file, as the absolute one it names)."""
    assert _plain(load(first)) == _plain(load(second))


def _plain(config: Config) -> object:
    return msgspec.to_builtins(config, enc_hook=lambda v: repr(v.absolute() if isinstance(v, Path) else v))


SECRETS = """\
[redis]
url = "redis://:hunter2-redis@127.0.0.1:6390/0"

[[http.token]]
name = "ops"
token = "tok-0123456789abcdef-secret"
scopes = ["read"]

[[route]]
domain = "example.net"
next_hop = "127.0.0.1:2526"
tls = "disabled"
allow_plaintext_auth = true
auth_username = "relay-user"
auth_password = "hunter2-route"

[[target]]
name = "hook"
kind = "webhook"
url = "https://app.example/in?token=hunter2-query"
secret = "hunter2-webhook"
headers = { Authorization = "Bearer hunter2-header", X-Env = "prod" }

[[target]]
name = "db"
kind = "postgresql"
dsn = "postgresql://app:hunter2-dsn@127.0.0.1:5432/mail"
"""


FILLED = (
    ('token = "***"', 'token = "tok-0123456789abcdef-secret"'),
    ('auth_password = "***"', 'auth_password = "hunter2-route"'),
    ("redis://:***@", "redis://:hunter2-redis@"),
    ("?token=***", "?token=hunter2-query"),
    ('secret = "***"', 'secret = "hunter2-webhook"'),
    ('Authorization = "***"', 'Authorization = "Bearer hunter2-header"'),
    ("app:***@", "app:hunter2-dsn@"),
)
"""Each placeholder of `SECRETS`' output, and the secret it stands for."""


def test_show_prints_every_key_with_defaults_and_its_output_loads_as_the_same_config(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text(
        '[smtp]\nlisten = "127.0.0.1:2525"\nmax_message_size = "10MB"\n\n[spool]\npath = "spool"\n\n'
        '[[route]]\ndomain = "*.example.net"\nnext_hop = "127.0.0.1:2526"\n'
    )
    shown = _cli("config", "show", "-c", str(config))
    assert shown.returncode == 0, shown.stderr
    # What the file sets, as loaded (a size in bytes, a relative path made absolute), and defaults.
    assert '\n[smtp]\nlisten = ["127.0.0.1:2525"]\n' in shown.stdout
    assert "\nmax_message_size = 10000000\n" in shown.stdout
    assert f'\npath = "{tmp_path / "spool"}"\n' in shown.stdout
    assert "\nidle_timeout = 300.0\n" in shown.stdout and "\n[delivery]\n" in shown.stdout
    again = tmp_path / "again.toml"
    again.write_text(shown.stdout)
    _same(config, again)
    checked = _cli("serve", "--check", "-c", str(again))
    assert checked.returncode == 0 and checked.stdout.strip() == f"{again}: ok", checked.stderr


def test_show_changed_prints_only_the_keys_the_file_sets(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text(
        '[smtp]\nmax_message_size = "10MB"\n\n[delivery]\nretry_interval = "2m"\n\n'
        '[[route]]\ndomain = "example.net"\nnext_hop = "127.0.0.1:2526"\n'
    )
    shown = _cli("config", "show", "--changed", "-c", str(config))
    assert shown.returncode == 0, shown.stderr
    body = [line for line in shown.stdout.splitlines() if not line.startswith("#")]
    assert body == [
        "[smtp]",
        "max_message_size = 10000000",
        "",
        "[delivery]",
        "retry_interval = 120.0",
        "",
        "[[route]]",
        'domain = "example.net"',
        'next_hop = "127.0.0.1:2526"',
    ]
    again = tmp_path / "again.toml"
    again.write_text(shown.stdout)
    _same(config, again)


def test_show_without_a_file_prints_the_defaults_which_load_as_the_defaults(tmp_path: Path) -> None:
    shown = _cli("config", "show")
    assert shown.returncode == 0, shown.stderr
    again = tmp_path / "defaults.toml"
    again.write_text(shown.stdout)
    _same(None, again)
    assert _cli("config", "show", "--changed").stdout.strip().startswith("#")  # nothing set


def test_show_redacts_every_secret_and_loads_again_once_they_are_filled_in(tmp_path: Path) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text(SECRETS)
    for changed in ([], ["--changed"]):
        shown = _cli("config", "show", *changed, "-c", str(config))
        assert shown.returncode == 0, shown.stderr
        assert "hunter2" not in shown.stdout and "tok-0123456789abcdef-secret" not in shown.stdout
        assert 'url = "redis://:***@127.0.0.1:6390/0"' in shown.stdout
        assert 'dsn = "postgresql://app:***@127.0.0.1:5432/mail"' in shown.stdout
        assert 'headers = { Authorization = "***", X-Env = "prod" }' in shown.stdout
        assert 'auth_username = "relay-user"' in shown.stdout  # (no secret)
        filled = shown.stdout
        for placeholder, secret in FILLED:
            assert placeholder in filled, placeholder
            filled = filled.replace(placeholder, secret)
        again = tmp_path / "again.toml"
        again.write_text(filled)
        _same(config, again)


def test_every_readme_example_that_loads_alone_shows_as_toml_that_loads_as_itself(tmp_path: Path) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), re.DOTALL)
    shown_some = 0
    for index, block in enumerate(blocks):
        config = tmp_path / f"example{index}.toml"
        config.write_text(block)
        try:
            load(config)
        except ConfigError:
            continue  # (a fragment: it names files or keys of another example)
        if re.search(r"(?m)^\s*(token|secret|auth_password|password|headers)\s*=", block):
            continue  # (its secrets come back as ***: the test above)
        for changed in ([], ["--changed"]):
            shown = _cli("config", "show", *changed, "-c", str(config))
            assert shown.returncode == 0, shown.stderr
            again = tmp_path / f"again{index}.toml"
            again.write_text(shown.stdout)
            _same(config, again)
        shown_some += 1
    assert shown_some >= 3
