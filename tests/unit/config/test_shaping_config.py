"""[[provider]] and [[shaping]] blocks: what is refused, naming the block, its key and its line."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec
import pytest

from pigeon.config.load import ConfigError, load, shaping_problems
from pigeon.config.schema import Config, decode_hook


def _load(tmp_path: Path, text: str) -> None:
    path = tmp_path / "pigeon.toml"
    path.write_text(text)
    load(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[[shaping]]\ndomain = "a.example"\n\n[[shaping]]\nconnection_limit = 3\n',
            "line 4: [[shaping]] #2 domain: missing: give domain",
        ),
        (
            '[[shaping]]\ndomain = "a.example"\nprovider = "gmail"\n',
            "line 3: [[shaping]] #1 provider: give domain or provider, not both",
        ),
        (
            '[[shaping]]\nprovider = "gmial"\n',
            "line 2: [[shaping]] #1 provider: no provider called 'gmial' (did you mean 'gmail'?)",
        ),
        (
            '[delivery]\nprovider_defaults = false\n\n[[shaping]]\nprovider = "yahoo"\n',
            "line 5: [[shaping]] #1 provider: no provider called 'yahoo' (the shipped ones are off",
        ),
        (
            '[[provider]]\nname = "mine"\nmx_suffixes = ["ok.example", "not a host"]\n',
            "line 3: [[provider]] #1 mx_suffixes: 'not a host' is not an MX host suffix",
        ),
        (
            '[[provider]]\nname = "Mine!"\nmx_suffixes = ["ok.example"]\n',
            "line 2: [[provider]] #1 name: 'Mine!' is not a provider name",
        ),
        (
            '[[shaping]]\nprovider = "gmail"\nconnection_limit = 4\n\n'
            '[[shaping]]\nprovider = "yahoo"\nconnection_limit = "five"\n',
            'line 7: [[shaping]] #2 connection_limit: expected a whole number, got a string "five"',
        ),
        (
            '[[shaping]]\nprovider = "gmail"\nmax_message_rate = "fast"\n',
            "line 3: [[shaping]] #1 max_message_rate:",
        ),
    ],
)
def test_a_bad_block_is_refused_naming_its_key_and_line(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text)
    assert expected in str(caught.value)
    assert str(caught.value).startswith(f"{tmp_path / 'pigeon.toml'}, line ")


def test_a_users_provider_may_be_named_by_a_block(tmp_path: Path) -> None:
    text = '[[provider]]\nname = "corp"\nmx_suffixes = ["*.mx.corp.example"]\n\n[[shaping]]\nprovider = "corp"\n'
    _load(tmp_path, text)


def test_every_problem_is_listed_not_only_the_first(tmp_path: Path) -> None:
    text = '[[shaping]]\nprovider = "nobody"\n\n[[shaping]]\ndomain = "x"\nprovider = "gmail"\n'
    path = tmp_path / "pigeon.toml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load(path)
    config = msgspec.convert(tomllib.loads(text), Config, dec_hook=decode_hook)
    problems = shaping_problems(config, path, text)
    assert [p.split(": ", 2)[1] for p in problems] == ["[[shaping]] #1 provider", "[[shaping]] #2 provider"]
