"""`[[log_hook]]` blocks: a mistake that would fail every batch for ever (a hook never skips
one), or send nothing, is refused at load, naming the block's key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load_text
from pigeon.config.schema import LOG_HOOK_TYPES


def _load(tmp_path: Path, block: str) -> object:
    return load_text(f'[[log_hook]]\nname = "app"\n{block}\n', tmp_path / "pigeon.toml")


def test_a_log_hook_sends_the_outbound_outcomes_in_batches_of_100_by_default(tmp_path: Path) -> None:
    config = load_text('[[log_hook]]\nname = "app"\nurl = "https://app.example/events"\n', tmp_path / "p.toml")
    (hook,) = config.log_hook
    assert hook.types == list(LOG_HOOK_TYPES) and hook.batch == 100 and hook.linger == 1.0


@pytest.mark.parametrize(
    ("block", "said"),
    [
        ('url = "ftp://app.example/"', "scheme 'ftp' is not http or https"),
        ('url = "https://app.example/"\ntypes = ["Delivry"]', "no record type 'Delivry'; did you mean 'Delivery'?"),
        ('url = "https://app.example/"\ntypes = []', 'name at least one record type, or ["*"]'),
        ('url = "https://app.example/"\nheaders = { "Bad Name" = "x" }', "is not an HTTP header field name"),
        (
            'url = "https://app.example/"\nretry_interval = "10s"\nmax_retry_interval = "1s"',
            "at least its retry_interval",
        ),
    ],
)
def test_a_log_hook_that_could_never_send_is_refused_at_load(tmp_path: Path, block: str, said: str) -> None:
    with pytest.raises(ConfigError, match="log_hook") as refused:
        _load(tmp_path, block)
    assert said in str(refused.value)


def test_two_log_hooks_of_one_name_are_refused(tmp_path: Path) -> None:
    block = '[[log_hook]]\nname = "app"\nurl = "http://127.0.0.1:1/"\n'
    with pytest.raises(ConfigError, match="two \\[\\[log_hook\\]\\]s are called 'app'"):
        load_text(block * 2, tmp_path / "pigeon.toml")
