"""`pigeon passwd`: add or change an SMTP AUTH user in the users file."""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import Any

from pigeon.cli.common import add_config_option, load_config
from pigeon.listener.passwords import PasswordFileError, set_password

EXAMPLES = """examples:
  pigeon passwd alice                          # asks for the password twice
  echo 's3cret' | pigeon passwd alice --stdin  # for scripts
  pigeon passwd alice --file /etc/pigeon/users
Point [smtp] auth_users at the file to enable AUTH PLAIN and LOGIN.
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "passwd",
        help="add or change an SMTP AUTH user",
        description="Add a user to the users file, or change its password (stored as a salted scrypt hash).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument("user")
    parser.add_argument("--file", type=Path, help="users file (default: [smtp] auth_users of the configuration)")
    parser.add_argument("--stdin", action="store_true", help="read the password from the first line of stdin")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path = args.file if args.file is not None else load_config(args).smtp.auth_users
    if path is None:
        print("pigeon: no users file: give --file, or set [smtp] auth_users in the configuration", file=sys.stderr)
        return 2
    if args.stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"Password for {args.user}: ")
        if getpass.getpass("Again: ") != password:
            print("pigeon: the passwords differ; nothing changed", file=sys.stderr)
            return 1
    if not password:
        print("pigeon: empty password refused; nothing changed", file=sys.stderr)
        return 1
    try:
        set_password(path, args.user, password)
    except (PasswordFileError, OSError) as error:
        print(f"pigeon: {error}", file=sys.stderr)
        return 1
    print(f"{args.user}: password set in {path}")
    return 0
