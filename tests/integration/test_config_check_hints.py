"""`pigeon serve --check` on a file with a mistake a Postfix user makes: refused (exit 2),
naming the key, what it holds and what was probably meant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _check(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pigeon.toml").write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "pigeon", "serve", "--check", "-c", "pigeon.toml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("written", "meant"),
    [("10.0.0.1/8", "10.0.0.0/8"), ("192.168.1.7/24", "192.168.1.0/24"), ("2001:db8::1/64", "2001:db8::/64")],
)
def test_a_relay_network_with_host_bits_set_is_refused_naming_the_network_it_probably_meant(
    tmp_path: Path, written: str, meant: str
) -> None:
    # "10.0.0.1/8" was taken as 10.0.0.0/8 without a word: a typo in who may relay (was
    # 10.0.0.1/32 meant?) must not quietly open the relay to a whole network.
    result = _check(tmp_path, f'[smtp]\nrelay_networks = ["127.0.0.0/8", "{written}"]\n')
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(
        f"pigeon: configuration error: pigeon.toml, line 2: [smtp] relay_networks: '{written}' has host bits set:"
        f" did you mean '{meant}'?"
    ), result.stderr
    address = written.split("/")[0]
    assert f"'{address}/{32 if '.' in address else 128}' for the one address" in result.stderr
    assert result.stdout == ""


def test_relay_networks_as_networks_or_addresses_pass_the_check(tmp_path: Path) -> None:
    result = _check(tmp_path, '[smtp]\nrelay_networks = ["10.0.0.0/8", "192.0.2.7", "2001:db8::/64", "::1"]\n')
    assert result.returncode == 0, result.stderr
    assert result.stdout == "pigeon.toml: ok\n"
