"""`pigeon COMMAND` imports only the module of that command (`pigeon.cli.main.COMMANDS`), and
that table names every command each module registers: a command missing from it would be
found only by `pigeon --help`, and one named by the wrong module not at all."""

from __future__ import annotations

import argparse
import importlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pigeon.cli.main import COMMANDS, build_parser, main


def test_every_command_is_the_one_its_module_registers() -> None:
    registered: dict[str, str] = {}
    for module in dict.fromkeys(COMMANDS.values()):
        commands = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"pigeon.cli.{module}").register(commands)
        registered |= dict.fromkeys(commands.choices, module)
    assert registered == COMMANDS


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_parser_for_one_command_parses_it_as_the_whole_parser_does(command: str) -> None:
    alone = build_parser(command)._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    whole = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert command in alone
    assert alone[command].format_help() == whole[command].format_help()


def test_help_without_a_command_lists_every_command() -> None:
    listing = build_parser().format_help()
    for command in [*COMMANDS, "sendmail"]:
        assert command in listing


def test_an_operator_command_does_not_import_the_node_nor_other_commands() -> None:
    probe = (
        "import sys\n"
        "from pigeon.cli.main import build_parser\n"
        "build_parser('logs')\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('pigeon.cli.') or m == 'pigeon.node.node')))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert "pigeon.cli.logs" in loaded
    assert not {"pigeon.cli.admin", "pigeon.cli.top", "pigeon.cli.serve", "pigeon.node.node"} & set(loaded)


def test_serve_check_run_in_process_leaves_the_processes_signals_unblocked(tmp_path: Path) -> None:
    # `serve` blocks SIGTERM and SIGHUP until the node can act on them; `--check` starts no node.
    # Held, they stayed blocked in the caller (a test worker) and in all it started later:
    # smtp-sink and `pigeon logs --follow` then outlived their SIGTERM (12 suite failures).
    (tmp_path / "pigeon.toml").write_text("no_such_key = 1\n")
    with pytest.raises(SystemExit):
        main(["serve", "--check", "-c", str(tmp_path / "pigeon.toml")])
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.SIGTERM not in blocked and signal.SIGHUP not in blocked
