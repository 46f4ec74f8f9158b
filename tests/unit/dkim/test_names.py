"""DKIM domain and selector names: what `pigeon dkim keygen` and `[[dkim]] selector` accept."""

from __future__ import annotations

from pathlib import Path

import pytest

from pigeon.config.load import ConfigError, load
from pigeon.dkim.keys import generate_key, name_problem, write_key


def _config(tmp_path: Path, selector: str) -> Path:
    write_key(tmp_path / "k.pem", generate_key("ed25519-sha256", 0))
    path = tmp_path / "pigeon.toml"
    block = f'domain = "example.com"\nselector = "{selector}"\nprivate_key = "k.pem"\nalgorithm = "ed25519-sha256"\n'
    path.write_text("[[dkim]]\n" + block)
    return path


@pytest.mark.parametrize("name", ["s1\n", "example.com\n", "s1\r\n"])
def test_a_name_ending_in_a_line_break_is_not_a_dns_name(tmp_path: Path, name: str) -> None:
    # `$` matches before a final "\n": such a selector would put a bare LF into the
    # DKIM-Signature header (s=) and into the file name and TOML that keygen writes.
    assert name_problem("--selector", name) is not None
    with pytest.raises(ConfigError, match=r"\[\[dkim\]\] #1 selector"):
        load(_config(tmp_path, name.replace("\r", "\\r").replace("\n", "\\n")))


def test_a_dns_name_is_accepted(tmp_path: Path) -> None:
    assert name_problem("--selector", "s2025.mail") is None
    assert load(_config(tmp_path, "s2025")).dkim[0].selector == "s2025"
