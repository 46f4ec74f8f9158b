"""`pigeon`: the command line. One sub-command per module in this package."""

from __future__ import annotations

import argparse
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


def build_parser() -> argparse.ArgumentParser:
    # Imported here, not with this module: `main` has things to do before their second of imports.
    from pigeon.cli import admin, cluster, config, dkim, inject, logs, passwd, quarantine, serve, shaping, top

    parser = _Parser(
        prog="pigeon",
        description="Pigeon, a Mail Transfer Agent.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `pigeon COMMAND --help` for the options and examples of each command.",
    )
    parser.add_argument("--version", action="version", version=f"pigeon {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (serve, config, logs, passwd, inject, admin, top, cluster, dkim, shaping, quarantine):
        module.register(commands)
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
    if arguments[:1] == ["serve"]:
        # First, before the imports and the config: a reload or a stop asked for meanwhile
        # must not kill the node; it waits until the node can act on it, and a stop no longer
        # than the start-up allows (`pigeon.node.signals`).
        signals.hold(watch=True)
        # And no cyclic garbage collection until it has started: see `pigeon.node.collector`.
        collector.pause()
    args = build_parser().parse_args(arguments)
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
