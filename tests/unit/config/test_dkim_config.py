"""[[dkim]] blocks: refused at load, with the file, line, key and key file named, when they
cannot sign or would sign what does not leave Pigeon."""

from __future__ import annotations

from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load
from pigeon.dkim.keys import generate_key, write_key


def _config(tmp_path: Path, block: str, key: str = "rsa-sha256", extra: str = "") -> Path:
    keys = tmp_path / "keys"
    keys.mkdir(exist_ok=True)
    if not (keys / "k.pem").exists():
        write_key(keys / "k.pem", generate_key(key))  # type: ignore[arg-type]
    path = tmp_path / "pigeon.toml"
    path.write_text(f'{extra}\n[[dkim]]\ndomain = "example.com"\nselector = "s1"\n{block}\n')
    return path


def test_a_block_loads_with_its_key_path_relative_to_the_file(tmp_path: Path) -> None:
    config = load(_config(tmp_path, 'private_key = "keys/k.pem"\nname = "main"'))
    (block,) = config.dkim
    assert block.private_key == tmp_path / "keys" / "k.pem"
    assert (block.algorithm, block.canonicalization, block.over_sign) == ("rsa-sha256", "relaxed/relaxed", True)
    assert {"from", "to", "subject", "date", "message-id", "list-unsubscribe-post"} <= set(block.headers)


def test_a_missing_key_file_is_named(tmp_path: Path) -> None:
    path = _config(tmp_path, 'private_key = "keys/none.pem"')
    with pytest.raises(ConfigError) as caught:
        load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}, line ") and "[dkim] private_key" in message
    assert str(tmp_path / "keys" / "none.pem") in message and "cannot read" in message


def test_a_key_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    path = _config(tmp_path, 'private_key = "keys/k.pem"\nalgorithm = "ed25519-sha256"')
    with pytest.raises(ConfigError, match=r"\[dkim\] private_key: .*k\.pem holds a RSA key, not the Ed25519 key"):
        load(path)


@pytest.mark.parametrize(
    ("block", "extra", "culprit"),
    [
        ('headers = ["from", "x-tenant"]', "", "'x-tenant' is Pigeon's own header"),
        ('over_sign = ["X-Campaign"]', "", "'X-Campaign' is Pigeon's own header"),
        ('headers = ["from", "x-customer"]', '[delivery]\ntenant_header = "X-Customer"', "'x-customer' is Pigeon's"),
    ],
)
def test_signing_an_internal_header_is_refused(tmp_path: Path, block: str, extra: str, culprit: str) -> None:
    path = _config(tmp_path, f'private_key = "keys/k.pem"\n{block}', extra=extra)
    with pytest.raises(ConfigError, match=culprit):
        load(path)


def test_a_header_list_without_from_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[dkim\] headers: .*must include From"):
        load(_config(tmp_path, 'private_key = "keys/k.pem"\nheaders = ["subject"]'))


def test_two_blocks_with_one_name_are_refused(tmp_path: Path) -> None:
    path = _config(tmp_path, 'private_key = "keys/k.pem"\nname = "a"')
    path.write_text(
        path.read_text() + '[[dkim]]\ndomain = "*"\nselector = "s2"\nprivate_key = "keys/k.pem"\nname = "a"\n'
    )
    with pytest.raises(ConfigError, match="two \\[\\[dkim\\]\\] blocks are called 'a'"):
        load(path)


def test_a_bad_selector_is_refused(tmp_path: Path) -> None:
    path = _config(tmp_path, 'private_key = "keys/k.pem"')
    path.write_text(path.read_text().replace('selector = "s1"', 'selector = "s 1"'))
    with pytest.raises(ConfigError, match=r"\[dkim\] selector"):
        load(path)
