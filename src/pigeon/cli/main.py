"""`pigeon`: the command line. One sub-command per module in this package."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Final

from pigeon import __version__
from pigeon.node import collector, signals


class _Parser(argparse.ArgumentParser):
    """A parser that refuses arguments it does not know itself, with its own usage: argparse
    leaves a sub-command's unknown ones to the top-level parser, whose usage (`pigeon [-h]
    COMMAND ...`) says nothing of the options `pigeon bounce --durration 1h` got wrong."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed, unknown


COMMANDS: Final = {
    "serve": "serve",
    "config": "config",
    "logs": "logs",
    "passwd": "passwd",
    "inject": "inject",
    **dict.fromkeys(("bounce", "hold", "inspect", "queue", "rebind", "resume", "retry", "suspend"), "admin"),
    "top": "top",
    "cluster": "cluster",
    "dkim": "dkim",
    "shaping": "shaping",
    "quarantine": "quarantine",
}
"""Each sub-command and the module of this package that registers it, in the order `pigeon
--help` lists them."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; given the `command` invoked, only its module is imported.

    Each module imports what its commands need at its top (the node, the admin client, the
    DKIM keys, ...): about a third of a second of imports in all, which every `pigeon`
    process would otherwise pay, the node's workers and every operator command included.
    Without a command it knows (`pigeon --help`, a misspelt one), every module is."""
    parser = _Parser(
        prog="pigeon",
        description="Pigeon, a Mail Transfer Agent.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `pigeon COMMAND --help` for the options and examples of each command.",
    )
    parser.add_argument("--version", action="version", version=f"pigeon {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in wanted:
        importlib.import_module(f"pigeon.cli.{name}").register(commands)
    # Listed only: `main` hands its command line to `pigeon.cli.sendmail` whole, as sendmail's
    # own options (-t, -oi, -fme@x) are no argparse's.
    commands.add_parser("sendmail", help="the sendmail(1) command line: a message on stdin, over SMTP", add_help=False)
    return parser


_SENDMAIL_NAMES: Final = {"sendmail": [], "newaliases": ["-bi"], "mailq": ["-bp"]}
"""The names a link to `pigeon` may have that make it `pigeon sendmail`, with the option each means."""


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    # Invoked as sendmail (a link /usr/sbin/sendmail -> pigeon), it is that command; as
    # newaliases or mailq, sendmail's -bi and -bp (the links Postfix installs too).
    invoked_as = os.path.basename(sys.argv[0]) if argv is None else ""
    if invoked_as in _SENDMAIL_NAMES:
        from pigeon.cli import sendmail

        return sendmail.run([*_SENDMAIL_NAMES[invoked_as], *arguments])
    if arguments[:1] == ["sendmail"]:
        from pigeon.cli import sendmail

        return sendmail.run(arguments[1:])
    if arguments[:1] == ["serve"] and "--check" not in arguments:
        # (Not for `--check`, which starts nothing: its signals stay as they were, and so do
        # those of what a process that ran it in-process starts later.)
        # First, before the imports and the config: a reload or a stop asked for meanwhile
        # must not kill the node; it waits until the node can act on it, and a stop no longer
        # than the start-up allows (`pigeon.node.signals`).
        signals.hold(watch=True)
        # And no cyclic garbage collection until it has started: see `pigeon.node.collector`.
        collector.pause()
    args = build_parser(arguments[0] if arguments else None).parse_args(arguments)
    try:
        result: int = args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`pigeon shaping explain gmail.com | head`): stop quietly, as
        # any Unix tool does. What is left in stdout's buffer must not be flushed at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return result


if __name__ == "__main__":
    sys.exit(main())
