"""A key file Pigeon cannot read: the reason shown as the operator sees it (redacted, as every
configuration error is), whole, not with a link broken by the masking of URL fragments."""

from __future__ import annotations

from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load
from pigeon.redaction import redact


@pytest.mark.parametrize("content", [b"garbage\n", b""])
def test_a_file_that_is_no_pem_key_is_named_with_a_reason_nothing_masked(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "k.pem").write_bytes(content)
    config = tmp_path / "pigeon.toml"
    config.write_text('[[dkim]]\ndomain = "example.com"\nselector = "s"\nprivate_key = "k.pem"\n')
    with pytest.raises(ConfigError) as raised:
        load(config)
    shown = redact(str(raised.value))  # (what `pigeon serve` and a reload's log say)
    assert f"{tmp_path / 'k.pem'} holds no PEM private key Pigeon can read (Unable to load PEM file." in shown
    assert "MalformedFraming" in shown
    assert "***" not in shown and "://" not in shown
