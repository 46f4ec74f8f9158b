"""`pigeon config show`'s output loaded as it is, a secret still `***`: refused naming the key and
the mask (not as a token too short), and a secret that merely holds asterisks still loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_cli import pigeon_cli
from tests.integration.test_config_errors_point_at_the_fix import refused

TOKENS = '[[http.token]]\nname = "ops"\ntoken = "tok-0123456789abcdef-secret"\nscopes = ["read"]\n'


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            TOKENS,
            'line 3: [[http.token]] #1 token: "***" is the mask pigeon config show prints: put the secret back',
        ),
        (
            '[redis]\nurl = "redis://:hunter2-redis@127.0.0.1:6390/0"\n',
            'line 2: [redis] url: "***" in it is the mask pigeon config show prints: put the secret back',
        ),
        (
            '[[target]]\nname = "hook"\nkind = "webhook"\nurl = "https://app.example/in"\n'
            'headers = { Authorization = "Bearer hunter2", Content-Type = "application/json" }\n',
            'line 5: [[target]] #1 headers: Authorization: "***" is the mask pigeon config show prints: put the'
            " value back",
        ),
    ],
    ids=["token", "url", "header"],
)
def test_config_show_output_loaded_as_it_is_names_the_masked_secret(tmp_path: Path, text: str, said: str) -> None:
    # Found from outside: it said "token: must be a string of at least 16 characters".
    config = tmp_path / "pigeon.toml"
    config.write_text(text)
    shown = pigeon_cli("config", "show", "--changed", "-c", str(config))
    assert shown.returncode == 0, shown.stderr
    assert "***" in shown.stdout
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("#")  # (the comment line that says secrets are masked)
    assert refused(tmp_path, "\n".join(lines[1:]) + "\n") == said


@pytest.mark.parametrize(
    "secret",
    [
        'token = "a***b-0123456789abcdef"',
        'url = "redis://:pass***word@127.0.0.1:6390/0"',
    ],
    ids=["token", "url"],
)
def test_a_secret_holding_asterisks_that_is_not_the_mask_loads(tmp_path: Path, secret: str) -> None:
    section = '[[http.token]]\nname = "ops"\nscopes = ["read"]\n' if secret.startswith("token") else "[redis]\n"
    config = tmp_path / "pigeon.toml"
    config.write_text(f"{section}{secret}\n")
    result = pigeon_cli("serve", "--check", "-c", str(config))
    assert result.returncode == 0, result.stderr
