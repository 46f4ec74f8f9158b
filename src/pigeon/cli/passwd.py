"""`pigeon passwd`: add or change an SMTP AUTH user in the users file.

As `htpasswd`, `-c FILE` creates the file (0600) when it does not exist yet; without it a
missing file is an error, so a typo in a path does not quietly start a new, empty list of
users that the node never reads. `-c` here is not `--config` (that one is long-only here).
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import Any

from pigeon.cli.common import load_config
from pigeon.listener.passwords import (
    PasswordFileError,
    binding_problem,
    read_users_file,
    set_password,
    user_name_problem,
)

EXAMPLES = """examples:
  pigeon passwd -c /etc/pigeon/users alice     # creates the file (0600) if missing; asks twice
  pigeon passwd --file /etc/pigeon/users bob   # adds to a file that exists
  echo 's3cret' | pigeon passwd --file /etc/pigeon/users carol --stdin   # for scripts
  pigeon passwd --config /etc/pigeon/pigeon.toml dave   # the file of [smtp] auth_users
  pigeon passwd --file /etc/pigeon/users --tenants acme erin   # erin may send as tenant acme only
Point [smtp] auth_users at the file to enable AUTH PLAIN and LOGIN. A running node reads
the file again at SIGHUP (systemctl reload pigeon): until then a new or changed password
gets 535. A new password keeps the user's tenants (the `:tenants=` of its line) unless
--tenants gives others; without a binding, the user may claim any tenant.
Exits 0 when the password is set; 1 if it was refused (empty, the two differ, the file
cannot be written); 2 for a usage error (no file, a missing one without -c, one that cannot
be read or is no users file, a password piped without --stdin), said before the password is
asked for.
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "passwd",
        help="add or change an SMTP AUTH user",
        description="Add a user to the users file, or change its password (stored as a salted scrypt hash).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML configuration file whose [smtp] auth_users names the users file",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "-c", "--create", type=Path, metavar="FILE", help="users file, created (mode 0600) if it does not exist"
    )
    where.add_argument("--file", type=Path, help="users file, which must exist (default: [smtp] auth_users)")
    parser.add_argument("user")
    parser.add_argument("--stdin", action="store_true", help="read the password from the first line of stdin")
    parser.add_argument(
        "--tenants",
        metavar="A,B",
        help="bind the user to these tenants (comma-separated; '' for none): its mail may claim no other, and "
        "mail claiming none is the tenant's when there is one (default: keep the entry's binding)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path: Path | None = args.create if args.create is not None else args.file
    if path is None:
        path = load_config(args, enough=[("smtp", "auth_users")]).smtp.auth_users
    if path is None:
        print("pigeon: no users file: give -c FILE (to create it) or --file FILE, or set [smtp] auth_users "
              "in the configuration (--config)", file=sys.stderr)  # fmt: skip
        return 2
    # Said before the password is asked for twice, not after.
    if (problem := user_name_problem(args.user)) is not None:
        print(f"pigeon: {args.user!r}: {problem}; nothing changed", file=sys.stderr)
        return 2
    tenants = None if args.tenants is None else [t.strip() for t in args.tenants.split(",") if t.strip()]
    if tenants is not None and (problem := binding_problem(tenants)) is not None:
        print(f"pigeon: --tenants: {problem}; nothing changed", file=sys.stderr)
        return 2
    if not path.parent.is_dir():
        print(f"pigeon: {path}: the directory {path.parent} does not exist; nothing changed", file=sys.stderr)
        return 2
    if args.create is None and not path.exists():
        print(f"pigeon: {path}: no such users file; to create it: pigeon passwd -c {path} {args.user}",
              file=sys.stderr)  # fmt: skip
        return 2
    # The file is read before the password is asked for (twice), not after: a configuration
    # file given for the users file, or one that cannot be read, is a usage error (2).
    try:
        read_users_file(path)
    except PasswordFileError as error:
        print(f"pigeon: {error}", file=sys.stderr)
        return 2
    if args.stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif not _on_a_terminal():
        # getpass would read the pipe, after Python's GetPassWarning naming a file of the
        # interpreter, or ask on the controlling terminal while the password sat in the pipe.
        print("pigeon: stdin is no terminal to ask for the password on: to give it on stdin, add --stdin "
              "(echo PASSWORD | pigeon passwd ... --stdin reads its first line); nothing changed",
              file=sys.stderr)  # fmt: skip
        return 2
    else:
        password = getpass.getpass(f"Password for {args.user}: ")
        if getpass.getpass("Again: ") != password:
            print("pigeon: the passwords differ; nothing changed", file=sys.stderr)
            return 1
    if not password:
        print("pigeon: empty password refused; nothing changed", file=sys.stderr)
        return 1
    try:
        created = set_password(path, args.user, password, tenants)
    except (PasswordFileError, OSError) as error:
        print(f"pigeon: {error}", file=sys.stderr)
        return 1
    print(f"{args.user}: password set in {path}" + (" (created, mode 0600)" if created else ""))
    # A running node reads the file at its start and at SIGHUP only: without this, an operator
    # who added a user sees AUTH refuse it (535) and suspects the password.
    print("a running node takes the change at SIGHUP (systemctl reload pigeon, or kill -HUP its pid); until then "
          "AUTH checks the users it read last")  # fmt: skip
    return 0


def _on_a_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (OSError, ValueError):  # (closed)
        return False
