"""`pigeon serve --check` on a file with a mistake a Postfix user makes: refused (exit 2),
naming the key, what it holds and what was probably meant."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from pigeon.cli.main import main
from tests.support import zygote
from tests.support.readme import README


def _check(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pigeon.toml").write_text(text)
    return zygote.run(
        ["serve", "--check", "-c", "pigeon.toml"],
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


def _postfix_names() -> list[str]:
    """The main.cf parameters the README's "Migrating from Postfix" maps: its table's left
    column (not the commands), and those of what Pigeon lacks."""
    text = README.read_text().split("### Migrating from Postfix", 1)[1].split("\n## ", 1)[0]
    names: list[str] = []
    for row in re.findall(r"^\| (.*?) \| .* \|$", text, re.MULTILINE):
        for quoted in re.findall(r"`([^`]+)`", row):
            name = quoted.split(" = ", 1)[0]
            if re.fullmatch(r"[a-z][a-z0-9]*_[a-z0-9_]*|relayhost|myhostname|mynetworks", name):
                names.append(name)
    lacks = text.split("What Pigeon lacks", 1)[1]
    names += re.findall(r"\*\*`([a-z0-9_]+)`\*\*", lacks)  # - **`notify_classes`**: ...
    for listed in re.findall(r"\*\*[^*`]+\*\* \(([^)]*)\)", lacks):  # - **Recipient rewriting** (`a`, `b`)
        names += re.findall(r"`([a-z0-9_]+)`", listed)
    return list(dict.fromkeys(names))


def test_the_readme_migration_table_names_the_postfix_parameters_the_hints_are_checked_for() -> None:
    names = _postfix_names()
    assert {"relayhost", "maximal_queue_lifetime", "mynetworks", "header_checks", "virtual_alias_maps"} <= set(names)
    assert not {"mailq", "postqueue", "postsuper", "max_age"} & set(names)


@pytest.mark.parametrize("name", _postfix_names())
@pytest.mark.parametrize("section", ["", "[smtp]\n", "[delivery]\n"])
def test_a_postfix_parameter_in_the_file_is_refused_saying_what_takes_its_place(
    tmp_path: Path, name: str, section: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `maximal_queue_lifetime` got "unknown key" alone, `relayhost` "keys go under a [section]",
    # `hopcount_limit` in [delivery] "did you mean 'connection_limit'?": a Postfix user is told
    # what Pigeon has in its place, wherever the name was written.
    (tmp_path / "pigeon.toml").write_text(f"{section}{name} = 1\n")
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--check", "-c", str(tmp_path / "pigeon.toml")])
    assert exited.value.code == 2
    said = capsys.readouterr().err
    header = section.strip()
    where = f"{header} {name}" if header else name
    assert f"line {1 + bool(section)}: {where}: unknown key: Postfix's {name}" in said, said
    assert "did you mean" not in said and "keys go under" not in said, said


def test_a_postfix_parameter_is_pointed_at_what_takes_its_place(tmp_path: Path) -> None:
    said = _check(tmp_path, 'relayhost = "[smtp.corp.test]:587"\n').stderr
    assert said == (
        "pigeon: configuration error: pigeon.toml, line 1: relayhost: unknown key: Postfix's relayhost is here"
        ' a [[route]] with domain = "*" and next_hop = "host:port" (see the README, "Migrating from Postfix")\n'
    )
    said = _check(tmp_path, '[delivery]\nmaximal_queue_lifetime = "5d"\n').stderr
    assert (
        "[delivery] maximal_queue_lifetime: unknown key: Postfix's maximal_queue_lifetime is here [delivery] max_age"
        in said
    )
