"""`pigeon dkim keygen`: a key file only its owner reads, the record to publish, and a block
that, pasted into the configuration, starts a node that signs with the key."""

from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from pigeon.config.load import load
from pigeon.dkim.keys import load_key, record_text
from tests.support import zygote


def pigeon_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return zygote.run([*args], text=True, cwd=cwd, timeout=60)


def test_keygen_writes_a_private_key_and_prints_its_record_and_block(tmp_path: Path) -> None:
    result = pigeon_cli("dkim", "keygen", "--domain", "Example.COM.", "--selector", "s2025", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    key_file = tmp_path / "example.com.s2025.pem"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = load_key(key_file, "rsa-sha256")
    assert key.key_size == 2048  # type: ignore[union-attr]
    (record,) = [line for line in result.stdout.splitlines() if " IN TXT " in line]
    assert record.startswith("s2025._domainkey.example.com. IN TXT ")
    strings = re.findall(r'"([^"]*)"', record)
    assert all(len(s) <= 255 for s in strings) and "".join(strings) == record_text(key)
    # The block, pasted into a configuration, loads with this key.
    block = result.stdout[result.stdout.index("[[dkim]]") :]
    (tmp_path / "pigeon.toml").write_text(block)
    (config,) = load(tmp_path / "pigeon.toml").dkim
    assert (config.domain, config.selector, config.private_key) == ("example.com", "s2025", key_file.resolve())
    # Run again, it does not replace the key.
    before = key_file.read_bytes()
    again = pigeon_cli("dkim", "keygen", "--domain", "example.com", "--selector", "s2025", cwd=tmp_path)
    assert again.returncode == 1 and "exists; not replaced" in again.stderr
    assert key_file.read_bytes() == before


def test_keygen_makes_ed25519_keys_too(tmp_path: Path) -> None:
    out = tmp_path / "ed.pem"
    result = pigeon_cli(
        "dkim", "keygen", "--domain", "example.com", "--selector", "ed", "--algorithm", "ed25519-sha256",
        "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    key = load_key(out, "ed25519-sha256")
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert f'ed._domainkey.example.com. IN TXT "{record_text(key)}"' in result.stdout
    assert len(raw) == 32 and 'algorithm = "ed25519-sha256"' in result.stdout


def test_serve_refuses_a_key_that_cannot_sign_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.pem").write_text("not a key\n")
    config = tmp_path / "pigeon.toml"
    config.write_text('[[dkim]]\ndomain = "example.com"\nselector = "s"\nprivate_key = "bad.pem"\n')
    result = pigeon_cli("serve", "-c", str(config), cwd=tmp_path)
    assert result.returncode != 0
    assert "[[dkim]] #1 private_key" in result.stderr and str(tmp_path / "bad.pem") in result.stderr


def test_keygen_refuses_a_domain_or_selector_that_is_not_a_dns_name_and_writes_nothing(tmp_path: Path) -> None:
    for args, named in (
        (["--domain", "bad domain", "--selector", "s1"], "--domain 'bad domain'"),
        (["--domain", "example.com", "--selector", "x y"], "--selector 'x y'"),
        (["--domain", "example.com", "--selector", "s1._domainkey..x"], "--selector"),
    ):
        result = pigeon_cli("dkim", "keygen", *args, cwd=tmp_path)
        assert result.returncode == 2 and named in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []
    # The configuration refuses such a selector too, naming the block.
    (tmp_path / "k.pem").write_text("")
    (tmp_path / "pigeon.toml").write_text('[[dkim]]\ndomain = "example.com"\nselector = "x y"\nprivate_key = "k.pem"\n')
    result = pigeon_cli("serve", "-c", str(tmp_path / "pigeon.toml"), cwd=tmp_path)
    assert result.returncode != 0 and "[[dkim]] #1 selector" in result.stderr, result.stderr


def test_keygen_takes_an_internationalised_domain_and_publishes_its_a_label(tmp_path: Path) -> None:
    result = pigeon_cli("dkim", "keygen", "--domain", "Bücher.Example", "--selector", "s1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    key_file = tmp_path / "xn--bcher-kva.example.s1.pem"
    assert any(line.startswith("s1._domainkey.xn--bcher-kva.example. IN TXT ") for line in result.stdout.splitlines())
    block = result.stdout[result.stdout.index("[[dkim]]") :]
    (tmp_path / "pigeon.toml").write_text(block)
    (config,) = load(tmp_path / "pigeon.toml").dkim
    assert (config.domain, config.private_key) == ("xn--bcher-kva.example", key_file.resolve())


def test_keygen_refuses_bits_for_an_ed25519_key_and_writes_nothing(tmp_path: Path) -> None:
    # An Ed25519 key has one size: a --bits given for it would be silently ignored otherwise.
    result = pigeon_cli(
        "dkim", "keygen", "--domain", "example.com", "--selector", "ed", "--algorithm", "ed25519-sha256",
        "--bits", "4096", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2 and "--bits is for RSA keys" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []
