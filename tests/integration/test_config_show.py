"""`pigeon config show` (Postfix's `postconf`, `postconf -n`): the real command on real files."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import msgspec
import pytest

from pigeon.config.load import ConfigError, load
from pigeon.config.schema import Config
from tests.support import zygote
from tests.support.readme import README


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run([*args], text=True, timeout=60)


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
headers = { Authorization = "Bearer hunter2-header", X-Env = "hunter2-env", Content-Type = "application/json" }

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
    ('X-Env = "***"', 'X-Env = "hunter2-env"'),
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


def test_show_changed_prints_no_empty_section_header_before_its_array_of_tables(tmp_path: Path) -> None:
    # A file of [[http.token]] blocks alone showed an "[http]" with nothing under it first.
    config = tmp_path / "pigeon.toml"
    config.write_text('[[http.token]]\nname = "ops"\ntoken = "tok-0123456789abcdef"\nscopes = ["read"]\n')
    shown = _cli("config", "show", "--changed", "-c", str(config))
    assert shown.returncode == 0, shown.stderr
    body = [line for line in shown.stdout.splitlines() if not line.startswith("#")]
    assert body == ["[[http.token]]", 'name = "ops"', 'token = "***"', 'scopes = ["read"]']
    # A section with keys of its own keeps its header, before its blocks.
    config.write_text('[http]\nlisten = "127.0.0.1:8025"\n' + config.read_text())
    body = [line for line in _cli("config", "show", "--changed", "-c", str(config)).stdout.splitlines()]
    assert body[1:4] == ["[http]", 'listen = "127.0.0.1:8025"', ""] and body[4] == "[[http.token]]"


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
        assert 'headers = { Authorization = "***", X-Env = "***", Content-Type = "application/json" }' in shown.stdout
        assert 'auth_username = "relay-user"' in shown.stdout  # (no secret)
        filled = shown.stdout
        for placeholder, secret in FILLED:
            assert placeholder in filled, placeholder
            filled = filled.replace(placeholder, secret)
        again = tmp_path / "again.toml"
        again.write_text(filled)
        _same(config, again)


@pytest.mark.parametrize(
    "password",
    ["REDIS SECRET7", "SEC@RET@PW8", "PWD:HAS SPACE@AND9", "%2FENC:ODED10"],
    ids=["space", "at-signs", "colon-space-at", "percent-colon"],
)
def test_show_masks_the_whole_password_of_every_url_whatever_it_holds(tmp_path: Path, password: str) -> None:
    # A password with an unencoded space loads, and a node runs with it; `config show` read the
    # URL as free text, which the space ended before the `@`: the whole password was shown.
    config = tmp_path / "pigeon.toml"
    config.write_text(
        f'[redis]\nurl = "redis://:{password}@127.0.0.1:41391/0"\n\n'
        f'[[target]]\nname = "jobs"\nkind = "sidekiq"\nredis_url = "redis://app:{password}@127.0.0.1:41392/1"\n\n'
        f'[[target]]\nname = "db"\nkind = "postgresql"\ndsn = "postgresql://app:{password}@127.0.0.1:5432/mail"\n\n'
        f'[[target]]\nname = "hook"\nkind = "webhook"\nurl = "https://bob:{password}@app.example/in"\n\n'
        f'[[log_hook]]\nname = "events"\nurl = "https://hook:{password}@logs.example/in"\n'
    )
    assert _cli("serve", "--check", "-c", str(config)).returncode == 0  # (it loads: a node would run with it)
    for changed in ([], ["--changed"]):
        shown = _cli("config", "show", *changed, "-c", str(config))
        assert shown.returncode == 0, shown.stderr
        for part in re.split(r"[ @:%]", password):
            assert not part or part not in shown.stdout, part
        assert 'url = "redis://:***@127.0.0.1:41391/0"' in shown.stdout
        assert 'redis_url = "redis://app:***@127.0.0.1:41392/1"' in shown.stdout
        assert 'dsn = "postgresql://app:***@127.0.0.1:5432/mail"' in shown.stdout
        assert 'url = "https://bob:***@app.example/in"' in shown.stdout
        assert 'url = "https://hook:***@logs.example/in"' in shown.stdout


CREDENTIAL_HEADERS = (
    "Authorization",
    "X-Api-Key",
    "Cookie",
    "X-Credentials",
    "X-Credential",
    "X-Cred",
    "X-Jwt",
    "X-Bearer",
    "X-Hmac",
    "X-Session-Id",
    "Sessionid",
    "X-Access",
    "X-Tenant-Id",
)
"""Header names a credential goes under: those a list of secret words missed among them."""
HARMLESS_HEADERS = {"Content-Type": "application/json", "accept": "application/json", "User-Agent": "pigeon-test/1"}


def test_show_masks_every_header_value_but_a_harmless_ones_of_webhooks_and_log_hooks(tmp_path: Path) -> None:
    headers = {name: f"hunter2-{index}-value" for index, name in enumerate(CREDENTIAL_HEADERS)} | HARMLESS_HEADERS
    table = "{ " + ", ".join(f'"{name}" = "{value}"' for name, value in headers.items()) + " }"
    config = tmp_path / "pigeon.toml"
    config.write_text(
        f'[[target]]\nname = "hook"\nkind = "webhook"\nurl = "https://app.example/in"\nheaders = {table}\n\n'
        f'[[log_hook]]\nname = "events"\nurl = "https://logs.example/in"\nheaders = {table}\n'
    )
    shown = _cli("config", "show", "--changed", "-c", str(config))
    assert shown.returncode == 0, shown.stderr
    assert "hunter2" not in shown.stdout
    masked = ", ".join(f'{name} = "***"' for name in CREDENTIAL_HEADERS)
    harmless = ', Content-Type = "application/json", accept = "application/json", User-Agent = "pigeon-test/1"'
    assert shown.stdout.count(f"headers = {{ {masked}{harmless} }}") == 2, shown.stdout


@pytest.mark.parametrize(
    ("text", "secret", "said"),
    [
        (
            '[redis]\nurl = "redis://:SEC/RET11@127.0.0.1/0"\n',
            "SEC",
            "line 2: [redis] url: not a Redis URL: what follows the host's ':' is no port number (a password that "
            "holds '/', '?' or '#' must have them percent-encoded: %2F, %3F, %23)",
        ),
        (
            '[[target]]\nname = "db"\nkind = "postgresql"\ndsn = "postgresql://app:SE#CRET12@127.0.0.1/mail"\n',
            "SE",
            "line 4: [[target]] #1 dsn: target 'db': not a URL: what follows the host's ':' is no port number",
        ),
        (
            '[[target]]\nname = "hook"\nkind = "webhook"\nurl = "https://bob:SE?CRET13@app.example/in"\n',
            "SE",
            "line 4: [[target]] #1 url: target 'hook': not a URL: what follows the host's ':' is no port number",
        ),
        (
            '[[log_hook]]\nname = "events"\nurl = "https://bob:SE/CRET14@app.example/in"\n',
            "SE",
            "line 3: [[log_hook]] #1 url: log hook 'events': not a URL: what follows the host's ':' is no port",
        ),
        (
            '[[route]]\ndomain = "example.net"\nnext_hop = "127.0.0.1:2526"\nauth_password = 12345678\n',
            "12345678",
            "line 4: [[route]] #1 auth_password: expected a string, got a whole number\n",
        ),
        (
            '[[http.token]]\nname = "ops"\nscopes = ["read"]\ntoken = 1234567890123456\n',
            "1234567890123456",
            "line 4: [[http.token]] #1 token: expected a string, got a whole number\n",
        ),
        (
            '[http]\ntoken = "tok-0123456789abcdef-secret15"\n',
            "secret15",
            "line 2: [[http.token]]: expected a list of tables, got a string\n",
        ),
        (
            '[[target]]\nname = "hook"\nkind = "webhook"\nurl = "https://app.example/in"\nsecret = 987654\n',
            "987654",
            "line 5: [[target]] #1 secret: expected a string, got a whole number\n",
        ),
        (
            '[[log_hook]]\nname = "events"\nurl = "https://app.example/in"\nheaders = "Bearer SECRET16"\n',
            "SECRET16",
            "line 4: [[log_hook]] #1 headers: expected a table, got a string\n",
        ),
        (
            '[[log_hook]]\nname = "events"\nurl = "https://app.example/in"\nheaders = { X-Jwt = 5566778899 }\n',
            "5566778899",
            "line 4: [[log_hook]] #1 headers: each value: expected a string, got a whole number\n",
        ),
        (
            "[redis]\nurl = 20242025\n",
            "20242025",
            "line 2: [redis] url: expected a string, got a whole number\n",
        ),
    ],
    ids=[
        "redis-slash",
        "dsn-hash",
        "webhook-question-mark",
        "log-hook-slash",
        "route-password-number",
        "token-number",
        "token-not-a-table",
        "webhook-secret-number",
        "headers-not-a-table",
        "header-value-number",
        "redis-url-number",
    ],
)
def test_a_config_error_about_a_secret_names_the_key_and_what_is_wrong_never_the_value(
    tmp_path: Path, text: str, secret: str, said: str
) -> None:
    config = tmp_path / "pigeon.toml"
    config.write_text(text)
    for command in (["config", "show"], ["serve", "--check"]):
        refused = _cli(*command, "-c", str(config))
        assert refused.returncode == 2
        assert f"pigeon: configuration error: {config}, {said}" in refused.stderr, refused.stderr
        assert secret not in refused.stderr.replace(str(config), "")


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
