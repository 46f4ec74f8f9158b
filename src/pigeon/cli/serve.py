"""`pigeon serve`: run a node until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from pigeon.cli.common import add_config_option, load_config
from pigeon.listener.passwords import PasswordFileError
from pigeon.node.node import Node
from pigeon.node.supervisor import Supervisor
from pigeon.redaction import RedactingFormatter, redact
from pigeon.spool.spool import SpoolError

EXAMPLES = """examples:
  pigeon serve                      # defaults: SMTP 127.0.0.1:2525, HTTP 127.0.0.1:8025, data in ./var
  pigeon serve -c /etc/pigeon.toml
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help="run a Pigeon node",
        description="Run a Pigeon node in the foreground until SIGTERM or SIGINT.\n\n"
        'With [node] workers above 1 ("auto", the default, is one per CPU core but one)\n'
        "this process supervises that many worker processes.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    # Used by the supervisor to start its workers; not for people.
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--control", type=Path, help=argparse.SUPPRESS)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    # Spooled mail, logs and keys are nobody else's business: files private to this user.
    os.umask(0o077)
    role = f"w{args.worker}" if args.worker is not None else "main"
    # Every line through `redact`: a library's error may quote a configured URL, password and all.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=config.log.level.upper(), handlers=[handler])
    # Libraries log every line of the IMAP and Redis conversations at DEBUG, message contents
    # and passwords included (and aioimaplib routine replies at INFO): ours say what matters.
    for chatty in ("aioimaplib", "redis", "asyncpg"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    _raise_open_file_limit()
    main: Coroutine[Any, Any, None]
    if args.worker is not None:
        main = Node(config, worker=args.worker, workers=args.workers, control_socket=args.control).run()
    elif config.node.worker_count == 1:
        main = Node(config).run()
    else:
        main = Supervisor(config, args.config, config.node.worker_count).run()
    try:
        _run_loop(main)
    except (SpoolError, PasswordFileError, OSError, RuntimeError) as error:
        print(f"pigeon: cannot start: {redact(str(error))}", file=sys.stderr)
        return 1
    return 0


def _raise_open_file_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: every SMTP connection is a descriptor, and the
    usual soft default (1024) is below `[smtp] max_connections`. Past it, accept() fails with
    EMFILE and new clients wait in the backlog unanswered. Workers inherit the raised limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as error:
            logging.getLogger(__name__).warning("open files limit stays at %d: %s", soft, error)


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        asyncio.run(main)
        return
    uvloop.run(main)
